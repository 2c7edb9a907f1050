"""The job's manifest: read, stamped and written atomically; where its input is."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from batchrun.errors import BatchrunError
from batchrun.job.files import write_json_atomic
from batchrun.job.paths import MANIFEST_NAME, JobPaths

FORMAT_VERSION = 1


def new_job_id() -> str:
    """A fresh job id."""
    return f"batch_{uuid.uuid4().hex[:24]}"


def load_manifest(paths: JobPaths) -> dict[str, Any]:
    """Read the manifest, with a clear message when the directory is not a job or the file is bad."""
    if paths.root.exists() and not paths.root.is_dir():
        raise BatchrunError(f"no job at {paths.root}: it is a file, not a job directory")
    if not paths.root.is_dir():
        raise BatchrunError(f"no job at {paths.root}: the directory does not exist")
    if not paths.manifest.exists():
        if paths.journal.exists():
            raise BatchrunError(
                f"the job at {paths.root} has a journal but no {MANIFEST_NAME}; it cannot be "
                "resumed without it (export still writes the journal's results). If a submit "
                "was stopped while validating its input, run that submit again"
            )
        raise BatchrunError(
            f"no job at {paths.root}: there is no {MANIFEST_NAME} (start one with submit)"
        )
    try:
        data = json.loads(paths.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BatchrunError(f"the manifest {paths.manifest} cannot be read: {e}") from e
    if not isinstance(data, dict) or "job_id" not in data:
        raise BatchrunError(f"the manifest {paths.manifest} is not a batchrun manifest")
    return data


def save_manifest(paths: JobPaths, manifest: dict[str, Any]) -> None:
    """Stamp and atomically write the manifest."""
    manifest["updated_at"] = time.time()
    write_json_atomic(paths.manifest, manifest)


def input_location(paths: JobPaths, path: Path) -> dict[str, str]:
    """The manifest's fields for the input's place: absolute, and relative to the job directory.

    The relative one lets a job moved together with its input (a project directory renamed)
    find the file again.
    """
    absolute = path.resolve()
    location = {"input_path": str(absolute)}
    with contextlib.suppress(ValueError):  # no relative path between two drives (Windows)
        location["input_relpath"] = os.path.relpath(absolute, paths.root.resolve())
    return location


def find_input(paths: JobPaths, manifest: dict[str, Any]) -> Path | None:
    """The job's input file: at its recorded absolute path, else relative to the job directory."""
    candidates = [Path(manifest["input_path"])]
    relative = manifest.get("input_relpath")
    if isinstance(relative, str):
        candidates.append(paths.root / relative)
    for candidate in candidates:
        try:
            if candidate.is_file():
                return candidate.resolve()
        except OSError:  # a directory on the way that cannot be entered: not found there
            continue
    return None


def recorded_runner(manifest: dict[str, Any]) -> int | None:
    """The pid of the process the manifest says runs the job, if that process is alive.

    Read-only, unlike `lock_holder`: probing the lock takes it for an instant, which could make a
    `resume` starting at that moment think the job runs; export must never disturb a run.
    """
    runs = manifest.get("runs") or []
    if manifest.get("status") != "running" or not runs or not isinstance(runs[-1], dict):
        return None
    pid = runs[-1].get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # killed: the job is interrupted, not running
    except PermissionError:
        pass  # alive, another user's
    return pid
