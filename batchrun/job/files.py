"""Atomic state files: a crash leaves the old file or the new one, never a mix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from batchrun.errors import BatchrunError


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BatchrunError(f"cannot write {path}: {e.strerror or e}") from e


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
