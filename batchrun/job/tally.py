"""The one per-record step of a job's counts: what one journaled result adds to them.

Three folds read a job's journal: the running job's state (`JobState`, from the outcomes it
journals), the summary `status` reads (`Summary.fold_many`, from the journal's bytes) and the
replay of a journal the summary's rules cannot follow. Each keeps its own way of knowing
whether a record is a request's first attempt (a per-request table, or the journal's attempt
numbers), and hands every result to `Tally.add`: the totals, the per-worker and the per-model
figures are counted here and nowhere else, so the three agree by construction.

The figures' meanings are docs/metrics.md's glossary; in short:

- a worker's `attempts` and `completion_tokens` are the engine attempts it ran (neither a
  duplicate's copy nor an answer from the cache, which no engine ran);
- an `ActiveTime` is the time at least one of an entity's engine attempts was in the engine
  (from reaching it, `time - latency_s`, to its result): a worker's or a model's rate is over
  its own active time, so a pause between runs, an engine's start or an idle worker never
  dilutes it.
"""

from __future__ import annotations

from typing import Any

# Where a result came from: the engine ran it, it copies an identical request's outcome
# (run/dedup.py), or the cross-job answer cache answered it (run/answer_cache.py).
ENGINE, COPY, CACHED = 0, 1, 2


class ActiveTime:
    """The union of [start, end] intervals, folded in the order their ends come (the journal's):
    time covered by at least one, gaps left out. O(1) memory."""

    __slots__ = ("closed", "end", "start")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, closed: float = 0.0, start: float = 0.0, end: float = 0.0) -> None:
        self.closed = closed  # seconds of the segments before the current one
        self.start = start  # the current segment (start == end == 0: none yet)
        self.end = end

    def add(self, start: float, end: float) -> None:
        """Cover [start, end]."""
        if start > self.end:
            # A gap: nothing was in the engine between the current segment's end and `start`.
            self.closed += self.end - self.start
            self.start, self.end = start, end
            return
        if end > self.end:
            self.end = end
        if start < self.start:
            # (Never reaches back past the previous segment: `start` <= its end merges the two,
            # the gap between them covered; the earlier part is already counted.)
            self.start = start

    @property
    def seconds(self) -> float:
        """The time covered."""
        return self.closed + self.end - self.start

    def dump(self) -> list[float]:
        """As the summary file keeps it."""
        return [self.closed, self.start, self.end]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.dump() == other.dump()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dump()!r})"

    @classmethod
    def load(cls, data: list[float]) -> ActiveTime:
        """From `dump`'s list."""
        closed, start, end = data
        return cls(float(closed), float(start), float(end))


class WorkerFigures:
    """One worker's engine attempts, their generated tokens, and its active time."""

    __slots__ = ("active", "attempts", "completion_tokens")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, attempts: int = 0, completion_tokens: int = 0, active: ActiveTime | None = None
    ) -> None:
        self.attempts = attempts
        self.completion_tokens = completion_tokens
        self.active = ActiveTime() if active is None else active

    def add(self, tokens: int, start: float, end: float) -> None:
        """One engine attempt, in the engine from `start` to `end`, that generated `tokens`."""
        self.attempts += 1
        self.completion_tokens += tokens
        self.active.add(start, end)

    def tokens_per_s(self) -> float | None:
        """Generated tokens a second of its active time; None before any."""
        seconds = self.active.seconds
        return round(self.completion_tokens / seconds, 2) if seconds > 0 else None

    def requests_per_s(self) -> float | None:
        """Engine attempts a second of its active time; None before any."""
        seconds = self.active.seconds
        return round(self.attempts / seconds, 3) if seconds > 0 else None

    def dump(self) -> list[Any]:
        """As the summary file keeps it."""
        return [self.attempts, self.completion_tokens, self.active.dump()]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.dump() == other.dump()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dump()!r})"

    @classmethod
    def load(cls, data: list[Any]) -> WorkerFigures:
        """From `dump`'s list."""
        attempts, tokens, active = data
        return cls(int(attempts), int(tokens), ActiveTime.load(active))


class ModelFigures:
    """One model's (or adapter's) requests done and succeeded, tokens, engine attempts, and its
    active time."""

    __slots__ = (
        "active",
        "completion_tokens",
        "done",
        "engine_attempts",
        "engine_completion_tokens",
        "prompt_tokens",
        "succeeded",
    )

    def __init__(self, values: list[Any] | None = None) -> None:
        done, ok, prompt, completion, engine, engine_tokens, active = values or (
            0, 0, 0, 0, 0, 0, None,
        )  # fmt: skip
        self.done, self.succeeded = int(done), int(ok)
        self.prompt_tokens, self.completion_tokens = int(prompt), int(completion)
        self.engine_attempts, self.engine_completion_tokens = int(engine), int(engine_tokens)
        self.active = ActiveTime() if active is None else ActiveTime.load(active)

    def tokens_per_s(self) -> float | None:
        """The engine's generated tokens a second of this model's active time."""
        seconds = self.active.seconds
        return round(self.engine_completion_tokens / seconds, 2) if seconds > 0 else None

    def dump(self) -> list[Any]:
        """As the summary file keeps it."""
        return [
            self.done,
            self.succeeded,
            self.prompt_tokens,
            self.completion_tokens,
            self.engine_attempts,
            self.engine_completion_tokens,
            self.active.dump(),
        ]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.dump() == other.dump()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dump()!r})"


class Tally:
    """A job's counts over the results and invalid lines folded so far (see the module
    docstring); `add` is the one per-result step."""

    __slots__ = (
        "attempts",
        "cache_hits",
        "completion_tokens",
        "deduplicated",
        "done",
        "engine_attempts",
        "engine_completion_tokens",
        "first_time",
        "invalid",
        "last_time",
        "per_model",
        "per_worker",
        "prompt_tokens",
        "succeeded",
    )

    def __init__(self) -> None:
        self.done = 0  # requests with a finished attempt
        self.succeeded = 0  # requests whose last attempt succeeded
        self.invalid = 0
        self.attempts = 0  # every result journaled, copies and cache hits included
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.deduplicated = 0
        self.cache_hits = 0
        self.engine_attempts = 0
        self.engine_completion_tokens = 0
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.per_worker: dict[str, WorkerFigures] = {}
        self.per_model: dict[str, ModelFigures] = {}

    def _seen(self, t: float) -> None:
        if t > 0:  # 0: no time (the journal's are seconds since the epoch)
            first, last = self.first_time, self.last_time
            if first is None or t < first:
                self.first_time = t
            if last is None or t > last:
                self.last_time = t

    def add_invalid(self, t: float) -> None:
        """One invalid input line, journaled at `t`."""
        self.invalid += 1
        self._seen(t)

    def add(
        self,
        t: float,
        latency: float,
        prompt: int,
        completion: int,
        new: bool,
        ok_change: int,
        source: int,
        worker: int | None,
        model: str | None,
    ) -> None:
        """One result journaled at `t`: `new` when it is its request's first finished attempt,
        `ok_change` what it does to the succeeded count (+1, 0, -1), `source` ENGINE, COPY or
        CACHED, `latency` its time in the engine, `worker` who ran it, `model` the name its
        record gives (None: the job's one)."""
        self._seen(t)
        self.attempts += 1
        self.done += new
        self.succeeded += ok_change
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        engine = source == ENGINE
        if engine:
            self.engine_attempts += 1
            self.engine_completion_tokens += completion
        elif source == COPY:
            self.deduplicated += 1
        else:
            self.cache_hits += 1
        timed = engine and t > 0
        if worker is not None and timed:
            key = str(worker)
            stats = self.per_worker.get(key)
            if stats is None:
                stats = self.per_worker[key] = WorkerFigures()
            stats.add(completion, t - latency, t)
        if model is not None:
            counts = self.per_model.get(model)
            if counts is None:
                counts = self.per_model[model] = ModelFigures()
            counts.done += new
            counts.succeeded += ok_change
            counts.prompt_tokens += prompt
            counts.completion_tokens += completion
            if engine:
                counts.engine_attempts += 1
                counts.engine_completion_tokens += completion
                if timed:
                    counts.active.add(t - latency, t)

    def dump(self) -> dict[str, Any]:
        """As the summary file keeps it."""
        return {
            "done": self.done,
            "succeeded": self.succeeded,
            "invalid": self.invalid,
            "attempts": self.attempts,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "deduplicated": self.deduplicated,
            "cache_hits": self.cache_hits,
            "engine_attempts": self.engine_attempts,
            "engine_completion_tokens": self.engine_completion_tokens,
            "first_time": self.first_time,
            "last_time": self.last_time,
            "per_worker": {k: w.dump() for k, w in self.per_worker.items()},
            "per_model": {k: m.dump() for k, m in self.per_model.items()},
        }

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.dump() == other.dump()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dump()!r})"

    @classmethod
    def load(cls, data: dict[str, Any]) -> Tally:
        """From `dump`'s dict; raises (KeyError, TypeError, ValueError) on a malformed one."""
        tally = cls()
        for name in (
            "done", "succeeded", "invalid", "attempts", "prompt_tokens", "completion_tokens",
            "deduplicated", "cache_hits", "engine_attempts", "engine_completion_tokens",
        ):  # fmt: skip
            value = data[name]
            if type(value) is not int or value < 0:
                raise ValueError(name)
            setattr(tally, name, value)
        for name in ("first_time", "last_time"):
            value = data[name]
            setattr(tally, name, None if value is None else float(value))
        if tally.succeeded > tally.done:
            raise ValueError("succeeded")
        tally.per_worker = {str(k): WorkerFigures.load(v) for k, v in data["per_worker"].items()}
        tally.per_model = {str(k): ModelFigures(v) for k, v in data["per_model"].items()}
        return tally
