"""The job summary's counts (`Summary`): what `summary.json` holds, its file format, and how one
journal record (`SummaryRecord`) folds into them. Reading, checking and keeping the summary
against the journal is job/summary.py's (its docstring gives the fold's rules)."""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchrun.job.tally import (
    CACHED,
    COPY,
    ENGINE,
    ModelFigures,
    Tally,
    TallyFigure,
    TallyTotals,
)
from batchrun.job.timing import LightRecord, LogHistogram, Timing

# Bumped whenever a field's meaning changes: a summary of another version is rebuilt.
SUMMARY_VERSION = 6


class SummaryRecord(LightRecord):
    """The journal fields the summary reads (bodies are skipped, never decoded)."""

    generation: str | None = None
    model: str | None = None


def _source(rec: SummaryRecord) -> int:
    """Where a record's result came from (job/tally.py's ENGINE, COPY, CACHED)."""
    return COPY if rec.copy_of is not None else CACHED if rec.cached else ENGINE


@dataclass
class Summary(TallyTotals):
    """A job's counts as of journal offset `offset` (see job/summary.py's docstring): the
    journal's records folded by `fold_many` into a `Tally` (job/tally.py, the one per-record
    step), with latency and errors (`timing`) beside them."""

    offset: int = 0
    check: str = ""
    generation: str | None = None
    tally: Tally = field(default_factory=Tally)
    # job/timing.py's figures: latency and queue-wait histograms, errors by code.
    timing: dict[str, Any] = field(default_factory=dict)

    # The counts, as the tally keeps them (docs/metrics.md's glossary names each).
    done = TallyFigure[int]()  # requests with a finished attempt
    succeeded = TallyFigure[int]()  # requests whose last attempt succeeded
    attempts = TallyFigure[int]()  # every result journaled, copies and cache hits included
    first_time = TallyFigure[float | None]()  # when the first record counted was journaled
    last_time = TallyFigure[float | None]()  # when the last record counted was journaled
    # Per model a record names (several models, or adapters: run/model_routes.py).
    per_model = TallyFigure[dict[str, ModelFigures]]()

    @property
    def failed(self) -> int:
        """Requests whose last attempt failed."""
        return self.done - self.succeeded

    def pending(self, requests: int) -> int:
        """Of a job's `requests` valid requests, those with no finished attempt yet."""
        return max(0, requests - self.done)

    def to_json(self) -> bytes:
        """The summary file's content."""
        data = {
            "version": SUMMARY_VERSION,
            "offset": self.offset,
            "check": self.check,
            "generation": self.generation,
            "tally": self.tally.dump(),
            "timing": self.timing,
        }
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
            summary = cls(
                offset=obj["offset"],
                check=obj["check"],
                generation=obj["generation"],
                tally=Tally.load(obj["tally"]),
                timing=obj["timing"],
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if type(summary.offset) is not int or summary.offset < 0:
            return None
        if not isinstance(summary.check, str) or not isinstance(summary.timing, dict):
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
        counts come from a replay; the record that broke the rules is not counted).

        Not counted: another input generation's invalid lines, records of requests whose line
        left the input file, kinds this version does not know. What a record adds is
        `Tally.add`'s; here only which records count, and whether each is a request's first
        attempt (the journal's attempt numbers say: job/summary.py's docstring).
        """
        counted: list[SummaryRecord] = []
        keep = counted.append
        generation = self.generation
        tally = self.tally
        add_group = tally.add_group
        # Records journaled together (one append: the same time and worker) are summed and
        # counted as one group, the same step `Tally.add` takes for each (job/tally.py).
        at: float | None = None
        by: int | None = None
        n = new = ok = prompt = completion = engine = engine_tokens = 0
        copies = first_copies = 0
        longest = 0.0
        done, succeeded = tally.done, tally.succeeded  # as the group's counts will leave them
        for rec in records:
            kind = rec.kind
            if kind == "invalid":
                if rec.generation != generation:
                    continue  # another input generation's invalid line
                keep(rec)
                tally.add_invalid(rec.time)
                continue
            if kind != "result":
                continue  # a kind this version does not count
            if current is not None and rec.custom_id not in current:
                continue  # its line left the input file: no longer part of the job
            attempt = rec.attempt
            if attempt < 1 or rec.custom_id is None:
                break
            if attempt == 1:
                done += 1
            elif succeeded >= done:
                break  # a retry with no failed request before it to replace
            keep(rec)
            t, worker, model = rec.time, rec.worker, rec.model
            if model is not None:
                if n:  # (never both in one journal: kept in order all the same)
                    add_group(
                        at, by, n, new, ok, prompt, completion, engine, engine_tokens,  # type: ignore[arg-type]
                        copies, first_copies, longest,
                    )  # fmt: skip
                    n = new = ok = prompt = completion = engine = engine_tokens = 0
                    copies = first_copies = 0
                    longest = 0.0
                tally.add(
                    t, rec.latency_s or 0.0, rec.prompt_tokens, rec.completion_tokens,
                    attempt == 1, int(rec.ok), _source(rec), worker, model,
                )  # fmt: skip
                succeeded += rec.ok
                continue
            if n and (t != at or worker != by):
                add_group(
                    at, by, n, new, ok, prompt, completion, engine, engine_tokens,  # type: ignore[arg-type]
                    copies, first_copies, longest,
                )  # fmt: skip
                n = new = ok = prompt = completion = engine = engine_tokens = 0
                copies = first_copies = 0
                longest = 0.0
            at, by = t, worker
            n += 1
            new += attempt == 1
            if rec.ok:
                ok += 1
                succeeded += 1
            prompt += rec.prompt_tokens
            tokens = rec.completion_tokens
            completion += tokens
            if rec.copy_of is not None:
                copies += 1
                first_copies += attempt == 1
            elif not rec.cached:
                engine += 1
                engine_tokens += tokens
                latency = rec.latency_s
                if latency is not None and latency > longest:
                    longest = latency
        else:
            if n:
                add_group(
                    at, by, n, new, ok, prompt, completion, engine, engine_tokens,  # type: ignore[arg-type]
                    copies, first_copies, longest,
                )  # fmt: skip
            return counted
        return None  # a record that cannot follow what the summary says: not to be used

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
            failed = saved["failed_by_code"]
            timing.failed_by_code = {str(k): int(v) for k, v in failed.items()}
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
            "failed_by_code": dict(timing.failed_by_code),
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
