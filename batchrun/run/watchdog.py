"""Workers that stop answering: an engine hung mid-run (an NCCL collective or a driver call that
never returns), or a start that never reports ready.

A worker process sends a heartbeat from its loop between engine steps (workers/child.py), as well
as its results; the scheduler tells the watchdog of every message (`heard`). A worker holding
requests that has sent nothing for its stall limit is hung: the scheduler kills it (with its
process group), puts its requests back to pending and starts a fresh one (HangPolicy below).
Heartbeats come between steps, so the limit bounds one engine step (the prompts added before it
included), not a request's whole generation: a long answer keeps beating.

The default limit is `STALL_FLOOR_S`, or `STALL_PER_SEQUENCE_S` per sequence the engine runs at
once when that is more: one step runs every sequence in the window (a decode, or a prefill chunk),
and its time grows with them. Seen: a step of 64 sequences of the 135M model takes about half a
second on this project's 2-core CPUs, and a GPU step is well under a second; the floor leaves
room for steps hundreds of times slower (a large model on a CPU, a long prefill chunk).
`--stall-timeout` replaces it.

A local worker process is also watched for its start (`--start-timeout`, or
BATCHRUN_START_TIMEOUT): one that has not reported ready within it is killed, and its start counts
as failed (run/restarts.py decides whether to try again). A Ray actor bounds each step of its own
start (workers/ray_start.py) and sends no heartbeats: it is watched for neither.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchrun.config import (
    DEFAULT_START_TIMEOUT,
    STALL_FLOOR_S,
    STALL_PER_SEQUENCE_S,
    EngineSettings,
)
from batchrun.console.text import plural
from batchrun.run.restarts import MAX_DEATHS_WITHOUT_PROGRESS, RestartPolicy
from batchrun.workers.messages import MessageKind
from batchrun.workers.process import Worker, WorkerDeath

if TYPE_CHECKING:
    from batchrun.run.reporting import RunStats

# The watchdog looks at most this often (the scheduler's loop turns far more often).
CHECK_EVERY_S = 0.25


def stall_limit(settings: EngineSettings, held: int) -> float:
    """Seconds a worker holding `held` requests may go without a message before it is hung."""
    if settings.stall_timeout is not None:
        return float(settings.stall_timeout)
    running = min(held, settings.window)
    return max(STALL_FLOOR_S, STALL_PER_SEQUENCE_S * running)


def start_limit(settings: EngineSettings) -> float:
    """Seconds a worker may take to report ready."""
    if settings.start_timeout is not None:
        return float(settings.start_timeout)
    return DEFAULT_START_TIMEOUT


@dataclass
class _Heard:
    """When the watchdog last heard from one process of a worker (its generation)."""

    generation: int
    at: float
    beats: bool = False


@dataclass(frozen=True)
class Stall:
    """A worker found hung (`starting`: never ready) after `limit` seconds, holding `held`."""

    worker: Worker
    starting: bool
    limit: float
    held: int


class Watchdog:
    """Notices workers that have gone silent; the scheduler decides what to do with them."""

    def __init__(self) -> None:
        self._heard: dict[int, _Heard] = {}
        self._next_check = 0.0

    def started(self, w: Worker, now: float | None = None) -> None:
        """A process of `w` was just started: its clocks begin now."""
        self._heard[w.index] = _Heard(w.generation, time.monotonic() if now is None else now)

    def heard(self, w: Worker, kind: MessageKind, now: float | None = None) -> None:
        """`w`'s current process sent a message of `kind` (any message is a sign of life)."""
        at = time.monotonic() if now is None else now
        h = self._heard.get(w.index)
        if h is None or h.generation != w.generation:
            h = self._heard[w.index] = _Heard(w.generation, at)
        h.at = at
        if kind is MessageKind.HEARTBEAT:
            h.beats = True

    def overdue(self, workers: Iterable[Worker], now: float | None = None) -> list[Stall]:
        """The workers silent past their limit: hung with requests held, or not ready in time."""
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return []
        self._next_check = now + CHECK_EVERY_S
        found: list[Stall] = []
        for w in workers:
            if w.retired or w.process is None:
                continue
            h = self._heard.get(w.index)
            if h is None or h.generation != w.generation:
                h = self._heard[w.index] = _Heard(w.generation, now)
            if not w.ready:
                if not w.start_watched:
                    continue  # a Ray actor bounds each step of its start (workers/ray_start.py)
                limit = start_limit(w.settings)
                if now - h.at > limit:
                    found.append(Stall(w, True, limit, len(w.inflight)))
                continue
            if not w.inflight:
                # Idle: nothing is owed, so silence is no sign; the clock starts with new work.
                h.at = now
                continue
            if not h.beats:
                continue
            limit = stall_limit(w.settings, len(w.inflight))
            if now - h.at > limit:
                found.append(Stall(w, False, limit, len(w.inflight)))
        return found


class HangPolicy:
    """Silent workers: a hung one is replaced, its requests back to pending (not an attempt); one
    that never got ready is a start-up failure (the restart policy's to answer)."""

    def __init__(self, restarts: RestartPolicy, watchdog: Watchdog) -> None:
        # The restart policy's workers, reporter and journaling are this policy's too.
        self.restarts = restarts
        self.watchdog = watchdog

    def watch(self, stats: RunStats, stop_on_oom: bool) -> None:
        """Deal with every worker the watchdog finds silent past its limit."""
        for stall in self.watchdog.overdue(self.restarts.workers):
            if stall.starting:
                self._on_start_timeout(stall, stats, stop_on_oom)
            else:
                self._on_hang(stall)

    def _on_hang(self, stall: Stall) -> None:
        """Kill a hung worker and put what it held back to pending; a fresh one takes over."""
        w = stall.worker
        progressed = w.results > 0
        held = self.restarts.requeue(w)
        what = (
            f"{w.label} hung: no result for {stall.limit:g} s with "
            f"{plural(held, 'request')} in flight"
        )
        _note_in_log(w, f"{what}; killed")
        w.kill()
        # As deaths are: a worker that hangs again and again finishing nothing is given up on.
        w.deaths_without_progress = 0 if progressed else w.deaths_without_progress + 1
        if w.deaths_without_progress >= MAX_DEATHS_WITHOUT_PROGRESS:
            self.restarts.give_up(
                w,
                f"the engine worker hung {MAX_DEATHS_WITHOUT_PROGRESS} times in a row without "
                f"finishing a request (no result for {stall.limit:g} s each time); if the engine "
                "is only slow, give it longer with --stall-timeout",
            )
            return
        self.restarts.reporter.event(f"{what}; restarting")

    def _on_start_timeout(self, stall: Stall, stats: RunStats, stop_on_oom: bool) -> None:
        """A worker that never reported ready: killed, and dealt with as a failed start."""
        w = stall.worker
        w.death = WorkerDeath(
            oom=False,
            message=(
                f"it did not report ready within {stall.limit:g} s of its start (waited for the "
                "engine to start: model load, compilation, device set-up; --start-timeout)"
            ),
            during_start=True,
        )
        _note_in_log(w, f"{w.label} killed: {w.death.message}")
        w.kill()
        crashed = self.restarts.on_death(w, stats, stop_on_oom)
        if crashed:  # none for a start-up failure; journaled all the same if a policy finds one
            records = [
                self.restarts.journaling.record_outcome(outcome, request, w.index)
                for outcome, request in crashed
            ]
            self.restarts.journaling.journal_records(
                records, [outcome for outcome, _ in crashed], stats
            )

    def replace(self, w: Worker, reason: str) -> None:
        """Replace a worker that asked for it (its engine cannot abort a timed-out request)."""
        held = self.restarts.requeue(w)
        w.kill()
        self.restarts.reporter.event(
            f"{w.label} restarting: {reason}; {plural(held, 'request')} back to pending"
        )


def _note_in_log(w: Worker, text: str) -> None:
    """Say in the worker's log why it ends there (its last lines are the engine's own)."""
    if not w.log:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open(w.log, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(f"\n=== [batchrun {stamp}] {text} (pid {w.pid})\n")
    except OSError:
        pass  # the log is an aid; a full or read-only disk must not stop the job here
