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

from typing import Any, Generic, TypeVar, overload

# Where a result came from: the engine ran it, it copies an identical request's outcome
# (run/dedup.py), or the cross-job answer cache answered it (run/answer_cache.py).
ENGINE, COPY, CACHED = 0, 1, 2

T = TypeVar("T")


class _Dumped:
    """Figures compared and shown by what the summary file keeps of them (`dump`)."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # mutable: never a dict key

    def dump(self) -> Any:
        """As the summary file keeps it."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.dump() == other.dump()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dump()!r})"


class ActiveTime(_Dumped):
    """The union of [start, end] intervals, folded in the order their ends come (the journal's):
    the time covered by at least one, gaps left out, in O(1) memory.

    Intervals that end together (results journaled at one instant) are held as one, the
    earliest start of them, until a later end comes: however they are ordered or grouped, the
    state is the same. Exact for intervals whose starts reach back at most into the segment
    before the current one (a result journaled late; a gap that was only the order results came
    in is closed).
    """

    __slots__ = ("closed", "end", "pend_end", "pend_start", "prev_end", "prev_start", "start")

    def __init__(self, *values: float) -> None:
        closed, prev_start, prev_end, start, end, pend_start, pend_end = values or (0.0,) * 7
        self.closed = closed  # seconds of the segments before the previous one
        self.prev_start, self.prev_end = prev_start, prev_end  # the previous segment
        self.start, self.end = start, end  # the current one (0, 0: none yet)
        self.pend_start, self.pend_end = pend_start, pend_end  # those ending at pend_end

    def add(self, start: float, end: float) -> None:
        """Cover [start, end]."""
        if end == self.pend_end:
            if start < self.pend_start:
                self.pend_start = start
            return
        if end > self.pend_end:
            if self.pend_end:
                self._cover(self.pend_start, self.pend_end)
            self.pend_start, self.pend_end = start, end
            return
        self._cover(start, end)  # an end before the held one's (a clock set back)

    def _cover(self, start: float, end: float) -> None:
        if start > self.end:
            # A gap: nothing was covered between the current segment's end and `start`.
            self.closed += self.prev_end - self.prev_start
            self.prev_start, self.prev_end = self.start, self.end
            self.start, self.end = start, end
            return
        if end > self.end:
            self.end = end
        if start < self.start:
            if start <= self.prev_end and self.prev_end > 0:
                # It bridges the gap before the current segment: the two are one.
                self.start = min(start, self.prev_start)
                self.prev_start = self.prev_end = 0.0
            else:
                self.start = start

    @property
    def seconds(self) -> float:
        """The time covered."""
        settled = ActiveTime(*self.dump())
        if settled.pend_end:
            settled._cover(settled.pend_start, settled.pend_end)
        return (
            settled.closed + (settled.prev_end - settled.prev_start) + (settled.end - settled.start)
        )

    def rate(self, amount: int, digits: int) -> float | None:
        """`amount` a second of the time covered, to `digits` places; None before any time."""
        seconds = self.seconds
        return round(amount / seconds, digits) if seconds > 0 else None

    def dump(self) -> list[float]:
        """As the summary file keeps it."""
        return [
            self.closed, self.prev_start, self.prev_end, self.start, self.end,
            self.pend_start, self.pend_end,
        ]  # fmt: skip

    @classmethod
    def load(cls, data: list[float]) -> ActiveTime:
        """From `dump`'s list."""
        if len(data) != 7:
            raise ValueError("active time")
        return cls(*(float(x) for x in data))


class WorkerFigures(_Dumped):
    """One worker's engine attempts, their generated tokens, and its active time."""

    __slots__ = ("active", "attempts", "completion_tokens")

    def __init__(
        self, attempts: int = 0, completion_tokens: int = 0, active: ActiveTime | None = None
    ) -> None:
        self.attempts = attempts
        self.completion_tokens = completion_tokens
        self.active = ActiveTime() if active is None else active

    def tokens_per_s(self) -> float | None:
        """Generated tokens a second of its active time; None before any."""
        return self.active.rate(self.completion_tokens, 2)

    def requests_per_s(self) -> float | None:
        """Engine attempts a second of its active time; None before any."""
        return self.active.rate(self.attempts, 3)

    def dump(self) -> list[Any]:
        """As the summary file keeps it."""
        return [self.attempts, self.completion_tokens, self.active.dump()]

    @classmethod
    def load(cls, data: list[Any]) -> WorkerFigures:
        """From `dump`'s list."""
        attempts, tokens, active = data
        return cls(int(attempts), int(tokens), ActiveTime.load(active))


class ModelFigures(_Dumped):
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
        return self.active.rate(self.engine_completion_tokens, 2)

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


# A tally's counts and its times, in the order the summary file keeps them (`Tally.dump`).
_COUNTS = (
    "done", "succeeded", "invalid", "attempts", "prompt_tokens", "completion_tokens",
    "deduplicated", "cache_hits", "engine_attempts", "engine_completion_tokens",
)  # fmt: skip
_TIMES = ("first_time", "last_time")


class Tally(_Dumped):
    """A job's counts over the results and invalid lines folded so far (see the module
    docstring); `add` is the one per-result step."""

    __slots__ = (
        "_by_index",
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
        # Requests whose first finished attempt copied an identical one's outcome: each once,
        # however many of its attempts were copies (a failed representative's retries copy
        # their failure again).
        self.deduplicated = 0
        self.cache_hits = 0
        self.engine_attempts = 0
        self.engine_completion_tokens = 0
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.per_worker: dict[str, WorkerFigures] = {}
        self.per_model: dict[str, ModelFigures] = {}
        self._by_index: dict[int, WorkerFigures] = {}  # per_worker's, by int index

    def add_invalid(self, t: float) -> None:
        """One invalid input line, journaled at `t`."""
        self.invalid += 1
        if t > 0:
            self._seen(t)

    def _seen(self, t: float) -> None:
        first = self.first_time
        if first is None or t < first:
            self.first_time = t
        last = self.last_time
        if last is None or t > last:
            self.last_time = t

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
        engine, copy = source == ENGINE, source == COPY
        self.add_group(
            t, worker, 1, int(new), ok_change, prompt, completion, int(engine),
            completion if engine else 0, int(copy), int(copy and new), latency if engine else 0.0,
        )  # fmt: skip
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
                if t > 0:
                    counts.active.add(t - latency, t)

    def add_group(
        self,
        t: float,
        worker: int | None,
        results: int,
        new: int,
        ok_change: int,
        prompt: int,
        completion: int,
        engine: int,
        engine_tokens: int,
        copies: int,
        first_copies: int,
        latency: float,
    ) -> None:
        """Results journaled together at `t` (one worker's, of no model named), as sums: `new`
        of them their requests' first finished attempt, `ok_change` to the succeeded count,
        `engine` of them run by the engine (generating `engine_tokens`; the longest in the
        engine for `latency`), `copies` copied from a duplicate (`first_copies` of them their
        requests' first finished attempt), the rest from the cache.

        The step every fold takes for every result (`add` is a group of one): the worker's
        active time gains [t - latency, t], the union of its results' own time in the engine,
        since they all end at `t`.
        """
        if t > 0:  # 0: no time (the journal's are seconds since the epoch)
            self._seen(t)
        self.attempts += results
        self.done += new
        self.succeeded += ok_change
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.engine_attempts += engine
        self.engine_completion_tokens += engine_tokens
        self.deduplicated += first_copies
        self.cache_hits += results - engine - copies
        if engine and worker is not None and t > 0:
            stats = self._by_index.get(worker)
            if stats is None:
                stats = self._worker(worker)
            stats.attempts += engine
            stats.completion_tokens += engine_tokens
            active = stats.active
            begun = t - latency
            # (Results journaled at one instant: no call for all but the first.)
            if t != active.pend_end or begun < active.pend_start:
                active.add(begun, t)

    def _worker(self, index: int) -> WorkerFigures:
        """Worker `index`'s figures, made when first seen (by index too: no str() a result)."""
        key = str(index)
        stats = self.per_worker.get(key)
        if stats is None:
            stats = self.per_worker[key] = WorkerFigures()
        self._by_index[index] = stats
        return stats

    def dump(self) -> dict[str, Any]:
        """As the summary file keeps it."""
        dumped: dict[str, Any] = {name: getattr(self, name) for name in _COUNTS + _TIMES}
        dumped["per_worker"] = {k: w.dump() for k, w in self.per_worker.items()}
        dumped["per_model"] = {k: m.dump() for k, m in self.per_model.items()}
        return dumped

    @classmethod
    def load(cls, data: dict[str, Any]) -> Tally:
        """From `dump`'s dict; raises (KeyError, TypeError, ValueError) on a malformed one."""
        tally = cls()
        for name in _COUNTS:
            value = data[name]
            if type(value) is not int or value < 0:
                raise ValueError(name)
            setattr(tally, name, value)
        for name in _TIMES:
            value = data[name]
            setattr(tally, name, None if value is None else float(value))
        if tally.succeeded > tally.done:
            raise ValueError("succeeded")
        tally.per_worker = {str(k): WorkerFigures.load(v) for k, v in data["per_worker"].items()}
        tally.per_model = {str(k): ModelFigures(v) for k, v in data["per_model"].items()}
        return tally


class TallyFigure(Generic[T]):
    """A figure of the holder's `tally`, read (never set) on the holder under the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, holder: None, owner: type) -> TallyFigure[T]: ...
    @overload
    def __get__(self, holder: object, owner: type) -> T: ...
    def __get__(self, holder: object, owner: type) -> T | TallyFigure[T]:
        if holder is None:
            return self
        figure: T = getattr(holder.tally, self.name)  # type: ignore[attr-defined]
        return figure

    def __set__(self, holder: object, value: T) -> None:
        raise AttributeError(f"{self.name} is the tally's: it cannot be set")


class TallyTotals:
    """The figures a `Tally` keeps, read on the object that holds it as `tally` (the running
    job's `JobState`, the summary's `Summary`): the same names and meanings on both."""

    tally: Tally

    invalid = TallyFigure[int]()  # invalid input lines (of the input's current generation)
    prompt_tokens = TallyFigure[int]()  # of every result
    completion_tokens = TallyFigure[int]()  # of every result, copies and cache hits included
    # Generated tokens of the attempts the engine ran (neither copies nor cache hits).
    engine_completion_tokens = TallyFigure[int]()
    engine_attempts = TallyFigure[int]()  # results the engine ran (neither copies nor hits)
    # Requests first answered with a copy of an identical one's outcome (run/dedup.py), once each.
    deduplicated = TallyFigure[int]()
    cache_hits = TallyFigure[int]()  # results from the cross-job cache (run/answer_cache.py)
    # Per worker index: its engine attempts, their tokens, its active time.
    per_worker = TallyFigure[dict[str, WorkerFigures]]()
