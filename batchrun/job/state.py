"""A job's state, derived from its journal (the one source of truth)."""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from batchrun.job.inputmap import load_input_map
from batchrun.job.journal import read_records
from batchrun.job.manifest import Manifest
from batchrun.job.paths import JobPaths
from batchrun.openai.records import Outcome, Request


class RequestStatus(IntEnum):
    """Where a request (or an input line) stands: the one status scale run, status and export share.

    Derived from its last journal record; ints underneath, so that the per-request tables of a
    million-line job stay plain int arrays and dicts.
    """

    OK = 0
    FAILED_RETRYABLE = 1  # a failed attempt another may fix (engine error, OOM), attempts left
    FAILED_FINAL = 2  # a failed attempt that would fail the same way (a 400), or attempts spent
    INVALID = 3  # an input line that failed validation: it never runs
    PENDING = 4  # a request with no finished attempt yet


OK, FAILED_RETRYABLE, FAILED_FINAL, INVALID, PENDING = RequestStatus


class Attempts(Mapping[str, int]):
    """Attempts per request, kept compactly: a request with a finished attempt (in `last`) has
    one unless `more` says how many; most have one, so a million-request job keeps no second
    table of a million entries (about 40 bytes a request)."""

    __slots__ = ("_last", "more")

    def __init__(self, last: dict[str, int]) -> None:
        self._last = last
        self.more: dict[str, int] = {}

    def __getitem__(self, cid: str) -> int:
        n = self.more.get(cid)
        if n is not None:
            return n
        if cid in self._last:
            return 1
        raise KeyError(cid)

    def get(self, cid: str, default: Any = None) -> Any:  # type: ignore[override]
        """Attempts of `cid`, or `default` when it has none."""
        n = self.more.get(cid)
        if n is not None:
            return n
        return 1 if cid in self._last else default

    def __contains__(self, cid: object) -> bool:
        return cid in self._last

    def __iter__(self) -> Iterator[str]:
        return iter(self._last)

    def __len__(self) -> int:
        return len(self._last)

    def total(self) -> int:
        """Attempts of every request together."""
        return len(self._last) + sum(self.more.values()) - len(self.more)


@dataclass
class JobState:
    """What the journal says: per request, attempts and how the last one ended; totals."""

    last: dict[str, int] = field(default_factory=dict)
    attempts: Attempts = field(init=False)
    invalid: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_time: float | None = None
    last_time: float | None = None
    # Per worker index: [attempts, completion tokens, first time, last time].
    per_worker: dict[str, list[float]] = field(default_factory=dict)
    # After a forced resume (see InputMap): only these custom_ids are part of the job, and only
    # invalid-line records tagged with this generation are the current file's.
    current: Container[str] | None = None
    generation: str | None = None
    # Results copied from an identical request's outcome (run/dedup.py): engine runs saved.
    deduplicated: int = 0
    # Results answered from the cross-job answer cache (run/answer_cache.py): engine runs saved.
    cache_hits: int = 0
    # Kept as records are folded, so that these counts cost O(1) to read: requests whose last
    # attempt succeeded, and attempts.
    ok: int = 0
    tried: int = 0

    def __post_init__(self) -> None:
        self.attempts = Attempts(self.last)

    @property
    def succeeded(self) -> int:
        """Requests whose last attempt succeeded."""
        return self.ok

    @property
    def failed(self) -> int:
        """Requests whose last attempt failed."""
        return len(self.last) - self.ok

    def is_done(self, custom_id: str) -> bool:
        """Whether the request has any finished attempt."""
        return custom_id in self.last

    def pending(self, requests: int) -> int:
        """Of a job's `requests` valid requests, those with no finished attempt yet."""
        return max(0, requests - len(self.last))

    def is_not_done(self, request: Request) -> bool:
        """Whether the request still waits for its first finished attempt."""
        return request.custom_id not in self.last

    def record(self, rec: dict[str, Any]) -> None:
        """Fold one journal record into the state."""
        invalid = rec.get("kind") == "invalid"
        if invalid:
            # Untagged records are submit's; tagged ones a forced resume's (of `generation` only).
            if rec.get("generation") != self.generation:
                return
        elif self.current is not None and rec["custom_id"] not in self.current:
            return  # its line left the input file: no longer part of the job
        t = rec.get("time")
        if isinstance(t, (int, float)):
            self.first_time = t if self.first_time is None else min(self.first_time, t)
            self.last_time = t if self.last_time is None else max(self.last_time, t)
        if invalid:
            self.invalid += 1
            return
        cid = rec["custom_id"]
        last = self.last
        if cid in last:
            more = self.attempts.more
            more[cid] = more.get(cid, 1) + 1
        self.tried += 1
        self.ok -= last.get(cid) == OK
        if rec.get("ok"):
            last[cid] = OK
            self.ok += 1
        else:
            last[cid] = FAILED_RETRYABLE if rec.get("retryable") else FAILED_FINAL
        if "copy_of" in rec:
            self.deduplicated += 1
        if rec.get("cached"):
            self.cache_hits += 1
        self.prompt_tokens += int(rec.get("prompt_tokens") or 0)
        tokens = int(rec.get("completion_tokens") or 0)
        self.completion_tokens += tokens
        worker = rec.get("worker")
        if worker is not None and isinstance(t, (int, float)):
            stats = self.per_worker.get(str(worker))
            if stats is None:
                self.per_worker[str(worker)] = [1, tokens, t, t]
            else:
                stats[0] += 1
                stats[1] += tokens
                stats[2] = min(stats[2], t)
                stats[3] = max(stats[3], t)

    def record_results(
        self, outcomes: Sequence[Outcome], worker: int | None, t: float
    ) -> list[int]:
        """Fold in the results of attempts as `record` folds their journal records (all from
        worker `worker`, at time `t`; None: answered without one, from the answer cache),
        without building the records; return their attempt numbers."""
        more, last, current = self.attempts.more, self.last, self.current
        numbers: list[int] = []
        counted = prompt_tokens = tokens = ok = hits = 0
        for outcome in outcomes:
            cid = outcome.custom_id
            n = more.get(cid)
            attempt = n + 1 if n is not None else (2 if cid in last else 1)
            numbers.append(attempt)
            if current is not None and cid not in current:
                continue  # its line left the input file: no longer part of the job
            if attempt > 1:
                more[cid] = attempt
                ok -= last.get(cid) == OK
            if outcome.ok:
                last[cid] = OK
                ok += 1
            else:
                last[cid] = FAILED_RETRYABLE if outcome.retryable else FAILED_FINAL
            prompt_tokens += int(outcome.prompt_tokens or 0)
            tokens += int(outcome.completion_tokens or 0)
            counted += 1
            if outcome.extra and outcome.extra.get("cached"):
                hits += 1
        self.ok += ok
        self.cache_hits += hits
        if not counted:
            return numbers
        self.tried += counted
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += tokens
        if self.first_time is None or t < self.first_time:
            self.first_time = t
        if self.last_time is None or t > self.last_time:
            self.last_time = t
        if worker is None:
            return numbers
        key = str(worker)
        stats = self.per_worker.get(key)
        if stats is None:
            self.per_worker[key] = [counted, tokens, t, t]
        else:
            stats[0] += counted
            stats[1] += tokens
            stats[2] = min(stats[2], t)
            stats[3] = max(stats[3], t)
        return numbers


def replay(paths: JobPaths, manifest: Manifest | None = None, end: int | None = None) -> JobState:
    """Derive the job's state from its journal (the one source of truth), up to byte `end`.

    With the manifest, of the input file as it is now: after a forced resume, requests that left
    the file and the old file's invalid lines are not counted (see InputMap).
    """
    input_map = load_input_map(paths, manifest) if manifest is not None else None
    state = JobState()
    if input_map is not None:
        state.current, state.generation = input_map.lines, input_map.generation
    for rec in read_records(paths.journal, end=end):
        state.record(rec)
    return state
