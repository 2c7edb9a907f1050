"""Several models on several workers at once: each worker runs one model's lines (its lane), the
workers shared out among the models by each one's share of the work, and a worker whose model
has run out moves to the model with the most work left per worker.

A lane is one model's requests: its source (the plan of its lines), what went back to pending
from its workers, and its answer cache. The scheduler (run/scheduler.py) feeds each worker from
its own lane only, so that no request ever reaches an engine of another model; restarts, back-off
and poison isolation stay per worker, and so per lane.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from batchrun.config import EngineSettings
from batchrun.job.shards import ShardReader
from batchrun.openai.records import Outcome, Request
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.poison import Isolator
from batchrun.workers.process import Suspects

# A worker whose model has run out moves to another that already has workers only when that
# one has at least this many of its worker's batches still to send: a move costs an engine start
# (minutes for a large model), more than a few batches' share of the work is worth.
MOVE_BATCHES = 4


@dataclass
class Lane:
    """One model's requests: where they come from, and what went back to pending."""

    name: str
    source: Iterator[Request]
    # The model's settings (None: the workers' own, a job of one model).
    settings: EngineSettings | None = None
    pending: deque[Request] = field(default_factory=deque)
    # The requests not taken from the source yet (counted before the run; an estimate after an
    # answer cache or the plan's deduplication took some).
    left: int = 0
    exhausted: bool = False

    def to_send(self) -> int:
        """Requests this lane still has to send to a worker (pending, then untaken)."""
        return len(self.pending) + (0 if self.exhausted else max(self.left, 1))


class Lanes:
    """The lanes of a run, and the lane each worker takes from."""

    def __init__(self, lanes: dict[str, Lane], lane_of: Callable[[Request], str] | None) -> None:
        self.by_name = lanes
        # The lane of a request (None: one lane, every request's).
        self.lane_of = lane_of
        self.of_worker: dict[int, str] = {}

    @classmethod
    def single(cls, source: Iterator[Request], pending: deque[Request]) -> Lanes:
        """One lane for every worker: a run of one model."""
        return cls({"": Lane("", source, pending=pending)}, None)

    def of(self, worker: int) -> Lane:
        """The lane worker `worker` takes from."""
        return self.by_name[self.of_worker.get(worker, "")]

    def settings_of(self, name: str) -> EngineSettings:
        """The settings of lane `name`'s model."""
        settings = self.by_name[name].settings
        assert settings is not None, "a lane of several has its model's settings"
        return settings

    def done(self) -> bool:
        """Whether no lane has anything left to send."""
        return all(lane.exhausted and not lane.pending for lane in self.by_name.values())

    def owns(self, group: Suspects, name: str) -> bool:
        """Whether a group of suspects (of one model: one worker held them) is lane `name`'s."""
        return self.lane_of is None or self.lane_of(group.requests[0]) == name

    def suspects(self, isolator: Isolator, name: str) -> int:
        """The suspects of lane `name` still to run alone."""
        return sum(len(g.requests) for g in isolator.groups if self.owns(g, name))

    def start(self, workers: Sequence[int]) -> list[tuple[int, str]]:
        """Give each of `workers` its first lane, by each lane's share of the work (`share_out`)."""
        starts = share_out({n: lane.left for n, lane in self.by_name.items()}, len(workers))
        self.of_worker.update(zip(workers, starts, strict=False))
        return list(zip(workers, starts, strict=False))

    def move(
        self, worker: int, others: Sequence[int], isolator: Isolator, batch: int
    ) -> str | None:
        """The lane idle worker `worker` moves to when its own has nothing left to run (`others`:
        the live workers besides it), or None: it stays."""
        own = self.of(worker)
        if own.to_send() or self.suspects(isolator, own.name):
            return None
        work = {n: x.to_send() + self.suspects(isolator, n) for n, x in self.by_name.items()}
        on: dict[str, int] = {}
        for other in others:
            name = self.of_worker[other]
            on[name] = on.get(name, 0) + 1
        target = next_lane(work, on, batch)
        if target is not None:
            self.of_worker[worker] = target
        return target


def share_out(counts: Mapping[str, int], workers: int) -> list[str]:
    """The model each of `workers` workers starts on: every model with work gets one, largest
    first, while workers last; the rest go by each model's share (largest remainder)."""
    names = sorted((n for n, c in counts.items() if c > 0), key=lambda n: -counts[n])
    if not names or workers <= 0:
        return []
    if workers <= len(names):
        return names[:workers]
    total = sum(counts[n] for n in names)
    spare = workers - len(names)
    exact = {n: spare * counts[n] / total for n in names}
    extra = {n: int(exact[n]) for n in names}
    rest = spare - sum(extra.values())
    for n in sorted(names, key=lambda n: -(exact[n] - extra[n]))[:rest]:
        extra[n] += 1
    return [n for n in names for _ in range(1 + extra[n])]


def next_lane(work: Mapping[str, int], workers_on: Mapping[str, int], batch: int) -> str | None:
    """Where a worker whose lane ran out goes: the lane with the most `work` left to send per
    worker, if it has no worker or enough to be worth an engine start (`batch`: the worker's
    window); None: stay."""
    best: str | None = None
    best_share = 0.0
    for name, left in work.items():
        if left <= 0:
            continue
        on = workers_on.get(name, 0)
        if on and left < MOVE_BATCHES * batch * on:
            continue
        share = left / (on + 1) if on else float("inf")
        if best is None or share > best_share:
            best, best_share = name, share
    return best


class RoutedAnswers(AnswerCache):
    """The answer caches of several models as one: each request looked up in, and stored to,
    its own model's (run/answer_cache.py keys a cache by model)."""

    def __init__(self, caches: Mapping[str, AnswerCache], lane_of: Callable[[Request], str]):
        self.caches = dict(caches)
        self.lane_of = lane_of
        first = next(iter(self.caches.values()))
        super().__init__(first.root, "")  # its own key is never used: each model's is

    def lookup(self, requests: Sequence[Request]) -> tuple[list[Request], list[Outcome]]:
        """Each request looked up in its model's cache: those to run, and the answers found."""
        run: list[Request] = []
        hits: list[Outcome] = []
        for name, group in _by_lane(requests, self.lane_of).items():
            r, h = self.caches[name].lookup(group)
            run += r
            hits += h
        return run, hits

    def store(
        self, pairs: Iterable[tuple[Outcome, Request]], shards: ShardReader | None = None
    ) -> None:
        """Each answer stored in its model's cache."""
        by: dict[str, list[tuple[Outcome, Request]]] = {}
        for outcome, request in pairs:
            by.setdefault(self.lane_of(request), []).append((outcome, request))
        for name, group in by.items():
            self.caches[name].store(group, shards)


def _by_lane(
    requests: Sequence[Request], lane_of: Callable[[Request], str]
) -> dict[str, list[Request]]:
    by: dict[str, list[Request]] = {}
    for r in requests:
        by.setdefault(lane_of(r), []).append(r)
    return by
