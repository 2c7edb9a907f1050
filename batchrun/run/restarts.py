"""The restart policy: what happens to a dead worker and to the requests it held; and what a
worker's start says, and why one started before starts again (`start_events`, `restart_reason`).

An object the Scheduler (run/scheduler.py) holds and calls, given what it works on when it is
made: the workers, the suspects, where a worker's requests go back to, and how an outcome is
journaled (the scheduler's `Recording`, run/recording.py).

- A death during start-up is answered by its cause (engines/startup.py), with the line its cause
  calls for (run/start_advice.py): too little free memory (held by other processes, at start or
  for the KV cache) waits and starts again at the same batch size (at most `MAX_STARTS` starts),
  then gives up naming what holds the memory and the option to lower; a setting that cannot work
  gives up at once, on its first start, naming the option that fixes it: a max model length whose
  one sequence does not fit the KV cache, a memory fraction that leaves the KV cache nothing
  (raise it), a KV cache larger than the whole memory, a model larger than the device; an
  out-of-memory error while the engine profiles (sized by the batch) backs off; anything else
  (NCCL, a port race, unknown) is tried again after a wait, `MAX_STARTS` starts in all. A tensor-parallel rank's error reaches the worker only as "WorkerProc initialization
  failed": its cause is read from the worker's log.
- An out-of-memory death while running backs off (half the batch size, the requests back to
  pending, not an attempt), unless it looks like one request's doing (the same requests ran out
  twice, or a handful did): then, as for any other death with requests held, they are isolated
  (`poison.Isolator`) until the one that kills a worker on its own fails alone (`engine_crash`,
  or `request_oom` when it ran out of memory); a death holding nothing counts towards giving the
  worker up. Every death while running is written, with what the worker held, to its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.console.text import plural
from batchrun.engines import startup
from batchrun.engines.startup import StartFailure, StartKind
from batchrun.errors import BatchrunError, GaveUp
from batchrun.job.paths import command
from batchrun.openai.records import Outcome, Request
from batchrun.run.poison import (
    ENGINE_CRASH,
    REQUEST_OOM,
    Isolator,
    crash_outcome,
    oom_outcome,
    restarts_bound,
)
from batchrun.run.sizing import back_off
from batchrun.run.start_advice import free_memory_advice, give_up_advice
from batchrun.workers.process import Worker, WorkerDeath

if TYPE_CHECKING:
    from batchrun.run.parts import Events, RunFigures
    from batchrun.run.recording import Recording
    from batchrun.run.reporting import Reporter, RunStats

# A worker that dies this many times in a row holding no request and finishing none is given up on.
MAX_DEATHS_WITHOUT_PROGRESS = 3
# The most custom_ids written to a worker's log at its death (the rest are counted).
LOGGED_IDS = 200
# The most starts in a row of a worker whose start fails for a reason that waiting may cure
# (memory still held, NCCL, a port race, anything unknown), and the waits between them.
MAX_STARTS = 3
FREE_MEMORY_WAITS_S = (10.0, 20.0)
START_RETRY_WAITS_S = (3.0, 10.0)
# An out-of-memory death with at most this many requests running is one request's doing, not
# the batch's: its requests are isolated, and the one that runs out alone fails (request_oom).
SMALL_OOM = 4


class RestartPolicy:
    """Dead workers: back off, isolate, or give up."""

    def __init__(
        self,
        workers: list[Worker],
        isolator: Isolator,
        reporter: Reporter,
        journaling: Recording,
        pending_for: Callable[[Worker], deque[Request]],
        *,
        job_dir: Path | str,
        on_back_off: Callable[[int], None] | None,
        metrics: RunFigures,
        events: Events,
    ) -> None:
        self.workers = workers
        self.isolator = isolator
        self.reporter = reporter
        self.journaling = journaling
        # Where the requests a worker held go back to (its lane's pending, run/lanes.py).
        self.pending_for = pending_for
        # The job's directory, for the commands a message suggests.
        self.job_dir = job_dir
        # Told the new size after an out-of-memory back-off (the job and the size cache keep it).
        self.on_back_off = on_back_off
        self.metrics = metrics
        self.events = events

    def requeue(self, w: Worker) -> int:
        """Put back what `w` held, untested: suspects stay suspects, the rest go back to pending."""
        held = w.take_inflight()
        if w.isolating is not None:
            self.isolator.put_back(dataclasses.replace(w.isolating, requests=held))
            w.isolating = None
        else:
            self.pending_for(w).extendleft(reversed(held))
        return len(held)

    def on_death(
        self, w: Worker, stats: RunStats, stop_on_oom: bool
    ) -> list[tuple[Outcome, Request]]:
        """Deal with a dead worker; return the failed outcomes of requests found to crash it."""
        death = w.death
        assert death is not None
        if death.stops_job:  # the engine says nothing can succeed (a key the server refuses)
            self.requeue(w)
            w.stop(timeout=5)
            self.give_up(w, death.message)
            return []
        if death.during_start:
            self._on_start_failure(w, death, stats, stop_on_oom)
            return []
        w.start_failures = 0
        if death.oom and not self._one_request_oom(w):
            self._back_off(w, death, stats, stop_on_oom, start_cause=None)
            return []
        return self._isolate(w, death, stats)

    def _one_request_oom(self, w: Worker) -> bool:
        """Whether an out-of-memory death while running looks like one request's doing, not the
        batch's: it ran suspects alone, or a handful of requests, or the very requests that ran
        out last time. Otherwise the held set is remembered, for the next time."""
        held = frozenset(w.inflight)
        if not held:
            return False
        running = min(len(held), w.settings.window)
        if w.isolating is not None or running <= SMALL_OOM or held == w.oom_held:
            w.oom_held = frozenset()
            return True
        w.oom_held = held
        return False

    def _on_start_failure(
        self, w: Worker, death: WorkerDeath, stats: RunStats, stop_on_oom: bool
    ) -> None:
        """A worker that died before it was ready: each cause gets its own answer."""
        cause = startup.classify(death.message, death.oom, startup.log_since_start(w.log))
        kind = cause.kind
        if kind is StartKind.OOM:
            self._back_off(w, death, stats, stop_on_oom, start_cause=cause)
            return
        self.requeue(w)
        w.stop(timeout=5)
        said = startup.first_sentence(cause.message)
        if not cause.retried:  # a setting that cannot work: starting again would only fail
            self.give_up(w, give_up_advice(w.settings, cause, said))
            return
        w.start_failures += 1
        if w.start_failures < MAX_STARTS:
            wait = _start_wait(kind, w.start_failures)
            w.start_not_before = time.monotonic() + wait
            why = {
                StartKind.FREE_MEMORY: "not enough free memory",
                StartKind.KV_OVER_FREE: "not enough free memory for the KV cache",
                StartKind.TRANSIENT: "a failure that usually passes",
            }.get(kind, "the engine failed to start")
            self.reporter.event(
                f"{w.label} could not start ({why}: {said}); starting it again in {wait:g}s at "
                f"batch size {w.settings.window} (start {w.start_failures + 1} of {MAX_STARTS})"
            )
            return
        if kind in (StartKind.FREE_MEMORY, StartKind.KV_OVER_FREE):
            self.give_up(w, free_memory_advice(w.settings, cause, said, MAX_STARTS))
            return
        rank = " (read from its log)" if cause.from_log else ""
        self.give_up(
            w,
            f"the engine failed to start {MAX_STARTS} times in a row: "
            f"{' '.join(cause.message.split())}{rank}",
        )

    def _back_off(
        self,
        w: Worker,
        death: WorkerDeath,
        stats: RunStats,
        stop_on_oom: bool,
        start_cause: StartFailure | None,
    ) -> None:
        """Out of memory for the batch's size: the requests back to pending, half the size."""
        requeued = self.requeue(w)
        w.stop(timeout=5)
        back = (
            f"; {plural(requeued, 'in-flight request')} go{'es' if requeued == 1 else ''} "
            "back to pending"
            if requeued
            else ""
        )
        size = w.settings.window
        where = " while starting" if start_cause is not None else ""
        rank = (
            f" (read from its log: {start_cause.message})"
            if start_cause is not None and start_cause.from_log
            else ""
        )
        self.reporter.event(f"{w.label} ran out of memory at batch size {size}{where}{rank}{back}")
        if stop_on_oom:
            stats.oom = True
            return
        smaller = back_off(size)
        if smaller is None:
            self.give_up(w, f"out of memory even at batch size 1 ({death.message})")
            return
        self.reporter.event(f"{w.label}: backing off, batch size {size} -> {smaller}")
        w.settings.window = smaller
        w.settings.max_num_seqs = smaller
        self.metrics.backed_off()
        self.events.write("oom_backoff", worker=w.index, batch_size=smaller)
        if self.on_back_off is not None:
            self.on_back_off(smaller)

    def _isolate(
        self, w: Worker, death: WorkerDeath, stats: RunStats
    ) -> list[tuple[Outcome, Request]]:
        """A death with requests held that any of them may have caused: isolate them."""
        progressed = w.results > 0
        held = w.take_inflight()
        group, w.isolating = w.isolating, None
        deaths = (group.deaths if group is not None else 0) + 1
        w.stop(timeout=5)
        _log_death(w, death, held)
        if not held:
            w.deaths_without_progress = 0 if progressed else w.deaths_without_progress + 1
            self.reporter.event(f"{w.label} died: {death.message}; starting a fresh one")
            if w.deaths_without_progress >= MAX_DEATHS_WITHOUT_PROGRESS:
                self.give_up(
                    w,
                    f"the engine worker died {MAX_DEATHS_WITHOUT_PROGRESS} times in a row "
                    f"without finishing a request (last: {death.message})",
                )
            return []
        w.deaths_without_progress = 0
        iso = self.isolator
        code = REQUEST_OOM if death.oom else ENGINE_CRASH
        if len(held) == 1:
            request = held[0]
            if death.oom:
                outcome = oom_outcome(request, death.message)
                how = "ran out of memory"
            else:
                outcome = crash_outcome(request, death.message, w.log)
                how = "died"
            iso.on_found()
            cost = f"; finding it took {deaths} restart{'s' if deaths != 1 else ''}"
            self.reporter.event(
                f"{w.label} {how} running request {request.custom_id!r} (line {request.line}) "
                f"on its own: {death.message}. It is recorded as failed ({code}) "
                f"and not retried{cost}; the job goes on"
            )
            if iso.engine_looks_broken():
                # Journaled before giving up, which raises when no other worker is left.
                self.journaling.journal_records(
                    [self.journaling.record_outcome(outcome, request, w.index)], [outcome], stats
                )
                stats.crashed += 1
                self.give_up(
                    w,
                    f"{iso.streak} requests in a row crashed the engine worker on their own with "
                    f"none finishing in between, so the engine itself looks broken (last: "
                    f"{death.message}); they are recorded as failed ({code}). Once the "
                    f"engine is fixed, `{command('resume', self.job_dir)}` runs the rest and "
                    f"`{command('retry-failed', self.job_dir)}` runs them again",
                    says_how=True,
                )
                return []
            return [(outcome, request)]
        iso.suspect(held, deaths)
        how = "running a group of {} suspects alone" if group else "holding {} requests"
        bound = restarts_bound(len(held))
        verb = "ran out of memory" if death.oom else "died"
        find = "needs more memory than the engine has" if death.oom else "crashes it"
        self.reporter.event(
            f"{w.label} {verb} {how.format(len(held))}: {death.message}. Running them again in "
            f"halves, each alone, to find the one that {find} (at most {bound} more "
            f"restart{'s' if bound != 1 else ''}); starting a fresh worker"
        )
        return []

    def give_up(self, w: Worker, reason: str, *, says_how: bool = False) -> None:
        """Retire `w` for `reason`; the last one stops the run (`says_how`: `reason` names the
        commands that go on, else the CLI adds the one that does)."""
        w.retired = True
        if any(not other.retired for other in self.workers):
            self.reporter.event(f"{w.label} retired: {reason}; the other workers go on")
            return
        stop = BatchrunError if says_how else GaveUp
        raise stop(f"{reason}. Everything finished so far is saved")


def _log_death(w: Worker, death: WorkerDeath, held: Sequence[Request]) -> None:
    """Append the death and the custom_ids the worker held to its log, after its own last words
    (a Python traceback, which the worker writes there itself)."""
    if not w.log:
        return
    ids = ", ".join(repr(r.custom_id) for r in held[:LOGGED_IDS])
    more = f" and {len(held) - LOGGED_IDS} more" if len(held) > LOGGED_IDS else ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    text = (
        f"\n=== [batchrun {stamp}] {w.label} (pid {w.pid}) died: {death.message}\n"
        + f"=== in flight at its death ({len(held)}): {ids or '(none)'}{more}\n"
    )
    try:
        with open(w.log, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
    except OSError:
        pass  # the log is an aid; a full or read-only disk must not stop the job here


def _start_wait(kind: StartKind, failures: int) -> float:
    """Seconds to wait before start number `failures + 1` (BATCHRUN_START_RETRY_DELAY_S: all)."""
    given = os.environ.get("BATCHRUN_START_RETRY_DELAY_S", "").strip()
    if given:
        with contextlib.suppress(ValueError):
            return max(0.0, float(given))
    memory = kind in (StartKind.FREE_MEMORY, StartKind.KV_OVER_FREE)
    waits = FREE_MEMORY_WAITS_S if memory else START_RETRY_WAITS_S
    return waits[min(failures, len(waits)) - 1]


def start_events(w: Worker, model: str | None = None) -> list[str]:
    """The lines the run's log gets as `w` starts (`model`: the one it runs, when a job runs
    several at once)."""
    where = f"pid {w.pid}, " if w.pid else ""
    if w.env.get("BATCHRUN_CPU_AFFINITY"):
        where += f"CPU cores {w.env['BATCHRUN_CPU_AFFINITY']}, "
    of = f" for model {model}" if model else ""
    lines = [
        f"{w.label} starting {w.settings.engine} engine{of} ({where}batch size {w.settings.window})"
    ]
    if w.env.get("BATCHRUN_CPU_SHARED_WITH"):
        lines.append(
            f"{w.label}: every CPU core already runs the model of another batchrun job "
            f"({w.env['BATCHRUN_CPU_SHARED_WITH']}); both run slowly while they share them. "
            "Give each job its own cores with OMP_NUM_THREADS (half each, say)"
        )
    return lines


def restart_reason(w: Worker, stopped_for: Mapping[int, str]) -> str:
    """Why `w`, started before, starts again: its death's kind, or why it was stopped
    (`stopped_for`, by index; a worker killed by the watchdog, hung, leaves no death of its own)."""
    death = w.death
    if death is None:
        return stopped_for.get(w.index, "hang")
    if death.oom:
        return "oom"
    return "start_failure" if death.during_start else "crash"
