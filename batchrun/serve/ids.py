"""The ids the server hands out, and the check that an id is one of them.

Every path under the root is built from an id that passed `is_file_id` / `is_batch_id`: an id
that is not ours (`../x`, unknown, percent-encoded) is a 404 before any path is made from it.
"""

from __future__ import annotations

import hashlib
import re
import secrets

_FILE_ID = re.compile(r"file-[0-9a-f]{24}")
_BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")


def new_file_id() -> str:
    """A fresh file id, OpenAI-shaped (`file-...`)."""
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    """A fresh batch id, OpenAI-shaped (`batch_...`)."""
    return f"batch_{secrets.token_hex(12)}"


def new_error_id() -> str:
    """A fresh id for an unexpected error: in its 500 answer and beside its traceback in the log."""
    return f"err_{secrets.token_hex(8)}"


def output_file_id(batch_id: str, label: str) -> str:
    """The id of a batch's output (`label`: output or errors): the same every time it is made, so
    that a finisher killed between making the file and saving its id in the batch's record makes
    the same file again, never a second one."""
    digest = hashlib.sha256(f"{batch_id}/{label}".encode()).hexdigest()
    return f"file-{digest[:24]}"


def is_file_id(value: str) -> bool:
    """Whether `value` has the exact shape of a file id this server makes."""
    return _FILE_ID.fullmatch(value) is not None


def is_batch_id(value: str) -> bool:
    """Whether `value` has the exact shape of a batch id this server makes."""
    return _BATCH_ID.fullmatch(value) is not None
