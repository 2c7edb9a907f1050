"""Latency, queue wait and errors of a job, read from its journal in one streaming pass with
bounded memory (quantiles from a log-scale histogram), for `status`, the summary and `report`.

Latency is the engine's (`latency_s`: from a request reaching the engine to its result). Queue
wait is from the start of the run that ran an attempt to the attempt reaching the engine
(`time - latency_s`, the run's start from the manifest): what /metrics' queue histogram counts,
plus the wait in the worker's own queue.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

# Quantiles within 1% of the value: a bucket per 2% step, from a microsecond to ten days.
_STEP = math.log(1.02)
_FLOOR = 1e-6


class LogHistogram:
    """Counts by log-scale bucket: quantiles to within 1%, in memory that does not grow."""

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        """Count one value (seconds; negative ones count as zero)."""
        self.add_many([value])

    def add_many(self, values: list[float]) -> None:
        """Count each of `values` (a list comprehension, not a call a value: the summary of a
        running job folds every result it journals)."""
        if not values:
            return
        log, floor, step = math.log, _FLOOR, _STEP
        buckets = self.buckets
        get = buckets.get
        for key in [-1 if v <= floor else int(log(v / floor) / step) for v in values]:
            buckets[key] = get(key, 0) + 1
        self.count += len(values)
        total = self.total
        for v in values:  # one at a time, in order: the same total however records are batched
            if v > 0.0:
                total += v
        self.total = total

    def quantile(self, q: float) -> float | None:
        """The value below which a fraction `q` of those counted lie; None when none were."""
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen >= rank:
                return 0.0 if key < 0 else _FLOOR * math.exp((key + 0.5) * _STEP)
        return None  # not reached

    def counts(self) -> list[tuple[float, float, int]]:
        """(low, high, count) of each bucket counted, in order."""
        out = []
        for key in sorted(self.buckets):
            low = 0.0 if key < 0 else _FLOOR * math.exp(key * _STEP)
            high = _FLOOR if key < 0 else _FLOOR * math.exp((key + 1) * _STEP)
            out.append((low, high, self.buckets[key]))
        return out


class LightRecord(msgspec.Struct):
    """The journal fields the statistics read (the body is skipped, never decoded)."""

    kind: str
    time: float = 0.0
    custom_id: str | None = None
    line: int = 0
    ok: bool = False
    error: dict[str, Any] | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempt: int = 1
    worker: int | None = None
    copy_of: str | None = None
    cached: bool = False


_DECODER = msgspec.json.Decoder(LightRecord)


def light_records(journal: Path) -> Iterator[LightRecord]:
    """The journal's whole records, lightly decoded (a corrupt or torn line is skipped)."""
    try:
        f = journal.open("rb")
    except OSError:
        return
    with f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return
            try:
                yield _DECODER.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue


class RunStarts:
    """When each run of the job started: the run an attempt belongs to is the last to start
    before it."""

    def __init__(self, starts: Sequence[float]) -> None:
        self.starts = sorted(starts)

    def of(self, t: float) -> float | None:
        """The start of the run that was running at `t`."""
        i = bisect.bisect_right(self.starts, t)
        return self.starts[i - 1] if i else None


class Timing:
    """Latency, queue wait and error counts, folded in one record at a time."""

    def __init__(self, run_starts: Sequence[float]) -> None:
        self.latency = LogHistogram()
        self.queue = LogHistogram()
        self.runs = RunStarts(run_starts)
        self.attempts = 0
        self.failed = 0
        self.invalid = 0
        self.by_code: dict[str, int] = {}
        # Failed attempts alone, by code (by_code counts invalid lines too, some under the same
        # codes): what a retry cannot fix is told from these (job/lasting.py).
        self.failed_by_code: dict[str, int] = {}

    def add(self, rec: LightRecord) -> None:
        """Fold in one journal record."""
        self.add_many((rec,))

    def add_many(self, records: Iterable[LightRecord]) -> None:
        """Fold in journal records, in one loop (this runs for every record a job journals)."""
        latencies: list[float] = []
        waits: list[float] = []
        starts = self.runs.starts
        attempts = failed = 0
        for rec in records:
            kind = rec.kind
            if kind != "result":
                if kind == "invalid":
                    self.invalid += 1
                    self._code(rec)
                continue
            # Every result counts as an attempt (docs/metrics.md): a duplicate's copy and an
            # answer from the cache too, as the summary's `attempts` counts them; only the
            # engine's own attempts have a latency and a queue wait.
            attempts += 1
            if not rec.ok:
                failed += 1
                code = self._code(rec)
                self.failed_by_code[code] = self.failed_by_code.get(code, 0) + 1
            latency = rec.latency_s
            if latency is not None and rec.copy_of is None and not rec.cached:
                latencies.append(latency)
                entered = rec.time - latency
                i = bisect.bisect_right(starts, entered)  # the run that was running then
                if i:
                    waits.append(entered - starts[i - 1])
        self.attempts += attempts
        self.failed += failed
        self.latency.add_many(latencies)
        self.queue.add_many(waits)

    def _code(self, rec: LightRecord) -> str:
        code = str((rec.error or {}).get("code") or "unknown")
        self.by_code[code] = self.by_code.get(code, 0) + 1
        return code

    def summary(self) -> dict[str, Any]:
        """As `status --json` shows it: p50/p99 in seconds, error rates over attempts and
        invalid lines."""
        seen = self.attempts + self.invalid
        return {
            "latency_s": _quantiles(self.latency),
            "queue_s": _quantiles(self.queue),
            "errors": {
                "attempts": self.attempts,
                "failed": self.failed,
                "invalid": self.invalid,
                "rate": round((self.failed + self.invalid) / seen, 6) if seen else None,
                "by_code": {
                    code: {"count": n, "rate": round(n / seen, 6)}
                    for code, n in sorted(self.by_code.items(), key=lambda kv: -kv[1])
                },
                "failed_by_code": dict(sorted(self.failed_by_code.items(), key=lambda kv: -kv[1])),
            },
        }


def _quantiles(h: LogHistogram) -> dict[str, float | None]:
    p50, p99 = h.quantile(0.5), h.quantile(0.99)
    return {
        "p50": None if p50 is None else round(p50, 6),
        "p99": None if p99 is None else round(p99, 6),
    }
