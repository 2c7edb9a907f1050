"""A job's state replayed from its journal (the one source of truth)."""

from __future__ import annotations

from batchrun.job.inputmap import load_input_map
from batchrun.job.journal import read_records
from batchrun.job.manifest import Manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import JobState


def replay(paths: JobPaths, manifest: Manifest | None = None, end: int | None = None) -> JobState:
    """Derive the job's state from its journal (the one source of truth), up to byte `end`.

    With the manifest, of the input file as it is now: after a forced resume, requests that left
    the file and the old file's invalid lines are not counted (see InputMap).
    """
    input_map = load_input_map(paths, manifest) if manifest is not None else None
    state = JobState(journal=paths.journal)
    if input_map is not None:
        state.current, state.generation = input_map.lines, input_map.generation
    for rec in read_records(paths.journal, end=end):
        state.record(rec)
    return state
