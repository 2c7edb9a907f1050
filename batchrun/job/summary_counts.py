"""The job summary's counts (`Summary`): what `summary.json` holds, its file format, and how one
journal record (`SummaryRecord`) folds into them. Reading, checking and keeping the summary
against the journal is job/summary.py's (its docstring gives the fold's rules)."""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchrun.job.timing import LightRecord, LogHistogram, Timing

# Bumped whenever a field's meaning changes: a summary of another version is rebuilt.
SUMMARY_VERSION = 3


class SummaryRecord(LightRecord):
    """The journal fields the summary reads (bodies are skipped, never decoded)."""

    generation: str | None = None
    model: str | None = None


@dataclass
class Summary:
    """A job's counts as of journal offset `offset` (see job/summary.py's docstring)."""

    offset: int = 0
    check: str = ""
    generation: str | None = None
    done: int = 0
    succeeded: int = 0
    invalid: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_time: float | None = None
    last_time: float | None = None
    deduplicated: int = 0
    cache_hits: int = 0
    # What the engine itself did: attempts and generated tokens of results that are neither a
    # duplicate's copy nor an answer from the cache (throughput counts these).
    engine_attempts: int = 0
    engine_completion_tokens: int = 0
    # Per worker index: [attempts, completion tokens, first time, last time].
    per_worker: dict[str, list[float]] = field(default_factory=dict)
    # Per model a record names (several models, or adapters: run/model_routes.py): [requests done,
    # succeeded, prompt tokens, completion tokens, first time, last time].
    per_model: dict[str, list[float]] = field(default_factory=dict)
    # job/timing.py's figures: latency and queue-wait histograms, errors by code.
    timing: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        """Requests whose last attempt failed."""
        return self.done - self.succeeded

    def pending(self, requests: int) -> int:
        """Of a job's `requests` valid requests, those with no finished attempt yet."""
        return max(0, requests - self.done)

    def to_json(self) -> bytes:
        """The summary file's content."""
        data = {"version": SUMMARY_VERSION, **self.__dict__}
        return json.dumps(data, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> Summary | None:
        """The summary in `data`; None when it is torn, of another version or malformed."""
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.pop("version", None) != SUMMARY_VERSION:
            return None
        try:
            summary = cls(**obj)
        except TypeError:
            return None
        ints = (summary.offset, summary.done, summary.succeeded, summary.invalid, summary.attempts)
        if not all(type(v) is int and v >= 0 for v in ints) or summary.succeeded > summary.done:
            return None
        if not isinstance(summary.check, str) or not isinstance(summary.per_worker, dict):
            return None
        if not isinstance(summary.per_model, dict):
            return None
        if not isinstance(summary.timing, dict):
            return None
        return summary

    def fold(self, rec: SummaryRecord, current: Container[str] | None = None) -> bool | None:
        """Fold one journal record in (see `fold_many`). True: counted; None: not part of the
        job as it is now, so not counted anywhere; False: the record cannot follow what the
        summary says."""
        counted = self.fold_many((rec,), current)
        if counted is None:
            return False
        return True if counted else None

    def fold_many(
        self, records: Iterable[SummaryRecord], current: Container[str] | None = None
    ) -> list[SummaryRecord] | None:
        """Fold journal records in, in order, as `JobState.record` would (only requests in
        `current`, when given); return those counted (the timing folds the same ones), or None
        when one cannot follow what the summary says (the summary is then not to be used: the
        counts come from a replay).

        Not counted: another input generation's invalid lines, records of requests whose line
        left the input file, kinds this version does not know. One loop with the counts in
        locals: a running job's summary folds every record it journals.
        """
        counted: list[SummaryRecord] = []
        keep = counted.append
        generation = self.generation
        first, last = self.first_time, self.last_time
        done, succeeded = self.done, self.succeeded
        invalid = attempts = deduplicated = cache_hits = engine = engine_tokens = 0
        prompt_tokens = completion_tokens = 0
        per_model, per_worker = self.per_model, self.per_worker
        for rec in records:
            kind = rec.kind
            if kind == "invalid":
                if rec.generation != generation:
                    continue  # another input generation's invalid line
            elif kind != "result":
                continue  # a kind this version does not count
            elif current is not None and rec.custom_id not in current:
                continue  # its line left the input file: no longer part of the job
            keep(rec)
            t = rec.time
            timed = t > 0  # 0: no time (the journal's are seconds since the epoch)
            if timed:  # comparisons, not min()/max(): this runs for every record journaled
                if first is None or t < first:
                    first = t
                if last is None or t > last:
                    last = t
            if kind == "invalid":
                invalid += 1
                continue
            attempt = rec.attempt
            if attempt < 1 or rec.custom_id is None:
                return None
            attempts += 1
            if attempt == 1:
                done += 1
            elif succeeded >= done:
                return None  # a retry with no failed request before it to replace
            ok = rec.ok
            if ok:
                succeeded += 1
            tokens = rec.completion_tokens
            if rec.copy_of is not None:
                deduplicated += 1
            elif rec.cached:
                cache_hits += 1
            else:
                engine += 1
                engine_tokens += tokens
            prompt_tokens += rec.prompt_tokens
            completion_tokens += tokens
            model = rec.model
            if model is not None:
                counts = per_model.get(model)
                if counts is None:
                    counts = per_model[model] = [0, 0, 0, 0, t, t]
                counts[0] += attempt == 1
                counts[1] += ok
                counts[2] += rec.prompt_tokens
                counts[3] += tokens
                if timed:
                    if t < counts[4] or not counts[4]:
                        counts[4] = t
                    if t > counts[5]:
                        counts[5] = t
            worker = rec.worker
            if worker is not None and timed:
                stats = per_worker.get(str(worker))
                if stats is None:
                    per_worker[str(worker)] = [1, tokens, t, t]
                else:
                    stats[0] += 1
                    stats[1] += tokens
                    if t < stats[2]:
                        stats[2] = t
                    if t > stats[3]:
                        stats[3] = t
        self.first_time, self.last_time = first, last
        self.done, self.succeeded = done, succeeded
        self.invalid += invalid
        self.attempts += attempts
        self.deduplicated += deduplicated
        self.cache_hits += cache_hits
        self.engine_attempts += engine
        self.engine_completion_tokens += engine_tokens
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        return counted

    def timing_of(self, run_starts: Sequence[float]) -> Timing:
        """The summary's timing figures, to fold more records into."""
        timing = Timing(run_starts)
        saved = self.timing
        if saved:
            _load_histogram(timing.latency, saved["latency"])
            _load_histogram(timing.queue, saved["queue"])
            timing.attempts = int(saved["attempts"])
            timing.failed = int(saved["failed"])
            timing.invalid = int(saved["invalid"])
            timing.by_code = {str(k): int(v) for k, v in saved["by_code"].items()}
        return timing

    def keep_timing(self, timing: Timing) -> None:
        """Store `timing`'s figures in the summary."""
        self.timing = {
            "latency": _dump_histogram(timing.latency),
            "queue": _dump_histogram(timing.queue),
            "attempts": timing.attempts,
            "failed": timing.failed,
            "invalid": timing.invalid,
            "by_code": dict(timing.by_code),
        }


def _dump_histogram(h: LogHistogram) -> dict[str, Any]:
    return {
        "buckets": {str(k): v for k, v in h.buckets.items()},
        "count": h.count,
        "total": h.total,
    }


def _load_histogram(h: LogHistogram, data: dict[str, Any]) -> None:
    h.buckets = {int(k): int(v) for k, v in data["buckets"].items()}
    h.count = int(data["count"])
    h.total = float(data["total"])
