"""The job directory: manifest, lock, and what happens when its files are damaged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from batchrun.errors import BatchrunError
from batchrun.job.files import write_json_atomic
from batchrun.job.inputmap import InputMap, load_input_map, write_input_map
from batchrun.job.journal import JournalWriter
from batchrun.job.lock import job_lock, lock_holder
from batchrun.job.manifest import InputMapRef, Manifest, Run, load_manifest, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import replay


def test_manifest_is_replaced_atomically_and_leaves_no_temp_file(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    save_manifest(paths, manifest(requests=1))
    save_manifest(paths, manifest(requests=2))
    assert load_manifest(paths).requests == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def manifest(**fields: Any) -> Manifest:
    """A manifest with the fields every job has."""
    base: dict[str, Any] = dict(
        job_id="j1", created_at=1.0, input_path="/in.jsonl", input_sha256="0" * 64,
        input_bytes=10, requests=1, invalid=0,
    )  # fmt: skip
    return Manifest(**{**base, **fields})


def test_a_manifest_written_is_read_back_typed_and_as_indented_json(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    written = manifest(engine={"engine": "echo"}, batch_size=8, batch_size_source="search")
    written.runs.append(Run(mode="submit", started_at=2.0, pid=7))
    written.input_map = InputMapRef("input-map-x.jsonl", "x")
    save_manifest(paths, written)
    assert load_manifest(paths) == written
    data = json.loads(paths.manifest.read_text())
    assert data["runs"] == [
        {"mode": "submit", "started_at": 2.0, "pid": 7, "ray": None, "ended_at": None,
         "wall_s": None, "status": None, "prefix_cache": None, "deduplicated": None,
         "usd_per_hour": None, "units": None}
    ]  # fmt: skip
    assert data["input_map"] == {"file": "input-map-x.jsonl", "generation": "x"}
    assert paths.manifest.read_text().startswith('{\n  "format": 1,\n  "job_id": "j1",')


def test_a_manifest_from_an_older_version_loads(tmp_path: Path) -> None:
    """Fields added later have defaults; keys this version does not know are ignored."""
    paths = JobPaths(tmp_path)
    old = {"job_id": "j0", "created_at": 1.0, "input_path": "/in.jsonl", "input_sha256": "ab",
           "input_bytes": 3, "requests": 2, "invalid": 1, "a_key_from_elsewhere": [1]}  # fmt: skip
    write_json_atomic(paths.manifest, old)
    loaded = load_manifest(paths)
    assert (loaded.job_id, loaded.requests, loaded.runs, loaded.status) == (
        "j0",
        2,
        [],
        "validated",
    )


def test_a_manifest_with_a_field_of_the_wrong_type_is_named_damaged(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    data = msgspec.to_builtins(manifest())
    data["requests"] = "many"
    write_json_atomic(paths.manifest, data)
    with pytest.raises(
        BatchrunError, match=r"is damaged: Expected `int`, got `str` - at `\$\.requests`"
    ):
        load_manifest(paths)


def test_missing_manifest_with_a_journal_says_what_is_wrong(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    paths.journal.write_text("")
    with pytest.raises(BatchrunError, match=r"has a journal but no manifest\.json"):
        load_manifest(paths)


def test_manifest_that_is_not_json(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    paths.manifest.write_text("{garbage")
    with pytest.raises(BatchrunError, match="cannot be read"):
        load_manifest(paths)
    write_json_atomic(paths.manifest, {"something": "else"})
    with pytest.raises(BatchrunError, match="not a batchrun manifest"):
        load_manifest(paths)


def test_lock_refuses_a_second_holder_and_names_the_pid(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from batchrun.job.paths import JobPaths; from batchrun.job.lock import job_lock\n"
            "with job_lock(JobPaths(Path(sys.argv[1]))):\n    print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert lock_holder(paths) == holder.pid
        with (
            pytest.raises(BatchrunError, match=f"already running in process {holder.pid}"),
            job_lock(paths),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    # The holder died without cleaning up: its pid is still in the file, but the lock is free.
    assert paths.lock.read_text().strip() == str(holder.pid)
    assert lock_holder(paths) is None
    with job_lock(paths):
        assert lock_holder(paths) is not None


def test_a_temporary_manifest_left_by_a_killed_write_goes_when_the_lock_is_taken(
    tmp_path: Path,
) -> None:
    paths = JobPaths(tmp_path)
    save_manifest(paths, manifest())
    stale = tmp_path / ".manifest.json.4242.tmp"
    stale.write_text('{"job_id": "half')
    with job_lock(paths):
        assert not stale.exists()
    assert load_manifest(paths).job_id == "j1"


def test_replay_of_a_forced_resume_counts_only_the_file_as_it_is_now(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    with JournalWriter(paths.journal) as w:
        w.append(
            [
                {"kind": "invalid", "custom_id": None, "line": 2, "error": {}},  # submit's
                {"kind": "result", "custom_id": "gone", "line": 1, "ok": True},
                {"kind": "result", "custom_id": "kept", "line": 3, "ok": True},
                {"kind": "invalid", "custom_id": None, "line": 5, "error": {}, "generation": "g"},
            ]
        )
    name = write_input_map(paths, "g", iter([("kept", 1), ("new", 2)]))
    forced = manifest(input_map=InputMapRef(name, "g"))
    state = replay(paths, forced)
    assert (state.succeeded, state.failed, state.invalid, set(state.last)) == (1, 0, 1, {"kept"})
    # Without the manifest's map: every result, and submit's invalid line only.
    state = replay(paths)
    assert (state.succeeded, state.invalid) == (2, 1)
    assert load_input_map(paths, forced) == InputMap("g", {"kept": 1, "new": 2})
    (tmp_path / name).write_text("not json\n")
    with pytest.raises(BatchrunError, match=r"input map .* is corrupt; `batchrun resume"):
        replay(paths, forced)
