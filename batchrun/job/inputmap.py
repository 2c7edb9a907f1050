"""The input file as a forced resume read it: each valid request's current line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from batchrun.errors import BatchrunError
from batchrun.job.files import atomic_write
from batchrun.job.manifest import Manifest
from batchrun.job.paths import INPUT_MAP_PREFIX, JobPaths, command


@dataclass(frozen=True)
class InputMap:
    """The input file as the last forced resume read it: each valid request's line number.

    A job whose input never changed has none (the journal's line numbers are the file's). After
    `resume --force`, requests whose custom_id left the file are no longer part of the job, and
    a finished request's line is where it is now, not where it was when it ran. `generation`
    tags the invalid-line records of that reading in the journal; older ones are another file's.
    """

    generation: str
    lines: dict[str, int]


def write_input_map(paths: JobPaths, generation: str, requests: Iterable[tuple[str, int]]) -> str:
    """Atomically write the input map of `generation` (custom_id, line pairs); return its name.

    One `[custom_id, line]` JSON array a line, streamed: a million requests never sit in memory.
    """
    name = f"{INPUT_MAP_PREFIX}{generation}.jsonl"

    def write(f: IO[bytes]) -> None:
        for custom_id, line in requests:
            f.write(json.dumps([custom_id, line], ensure_ascii=False).encode("utf-8") + b"\n")

    atomic_write(paths.root / name, write)
    return name


def load_input_map(paths: JobPaths, manifest: Manifest) -> InputMap | None:
    """The job's input map, or None when its input never changed (no forced resume)."""
    info = manifest.input_map
    if info is None:
        return None
    path = paths.root / info.file
    lines: dict[str, int] = {}
    try:
        with path.open("rb") as f:
            for raw in f:
                custom_id, line = json.loads(raw)
                lines[str(custom_id)] = int(line)
    except OSError as e:
        raise BatchrunError(
            f"cannot read the job's input map {path}: {e.strerror or e}; "
            f"`{command('resume', paths.root, '--force')}` writes it again"
        ) from e
    except (ValueError, TypeError):
        raise BatchrunError(
            f"the job's input map {path} is corrupt; "
            f"`{command('resume', paths.root, '--force')}` writes it again"
        ) from None
    return InputMap(info.generation, lines)
