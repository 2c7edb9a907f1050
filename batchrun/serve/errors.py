"""An API error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ApiError(Exception):
    """A request the API refuses: its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict[str, Any]:
        """The JSON body of the response."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def not_found(what: str, ident: str) -> ApiError:
    """404 for an id that is not one of ours (shown with repr: it may hold anything)."""
    return ApiError(404, f"No such {what}: {ident!r}", code="not_found")


# Where a path starts: not inside a longer name or path.
_START = r"(?<![\w.\-/~])"
# A path's components under the root: ids and fixed names (`batch_…`, `journal.jsonl`, `.upload-…`).
_COMPONENT = r"/[\w.\-]+"
# Where it ends: not inside a longer name (a full stop after it may end a sentence).
_END = r"(?![\w\-]|\.[\w.\-])"


def _spellings(path: Path) -> list[str]:
    """The ways a message may spell `path`: as given, absolute and resolved (longest first)."""
    forms = {str(path), str(path.absolute())}
    with contextlib.suppress(OSError, RuntimeError):
        forms.add(str(path.resolve()))
    # "." (a root given as the working directory) would match any dot: its paths are relative.
    return sorted((f for f in forms if f not in ("", ".")), key=len, reverse=True)


def _inside(match: re.Match[str]) -> str:
    """A path under the root, as its place inside the root (a full stop after it kept)."""
    tail = match["tail"].rstrip(".")
    return (tail[1:] or "the server's root") + match["tail"][len(tail) :]


def without_paths(message: str, root: Path, names: Mapping[Path, str] | None = None) -> str:
    """`message` as a client may see it, with none of the server's paths: each path in `names`
    becomes its name (a file's id), any other under `root` its place inside the root."""
    for path, name in (names or {}).items():
        literal = name.replace("\\", "\\\\")  # a replacement, not a template
        for form in _spellings(path):
            message = re.sub(_START + re.escape(form) + r"(?!/)" + _END, literal, message)
    for form in _spellings(root):
        # A relative root alone may be a plain word ("root"): only a path under it is one.
        tail = f"(?P<tail>(?:{_COMPONENT})" + ("*)" if Path(form).is_absolute() else "+)")
        message = re.sub(_START + re.escape(form) + tail + _END, _inside, message)
    return message
