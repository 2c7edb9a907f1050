"""The restart policy: what happens to a dead worker and to the requests it held.

Mixed into the Scheduler (run/scheduler.py), whose state it works on. An out-of-memory death backs
off (half the batch size, the requests back to pending, not an attempt); a death during start-up
gives the worker up; any other death with requests held isolates them (`poison.Isolator`) until
the one that kills a worker on its own fails alone; a death holding nothing counts towards giving
the worker up. Every death is written, with what the worker held, to the worker's log.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.console.text import command, plural
from batchrun.engines.oom import kv_cache_too_small
from batchrun.errors import BatchrunError
from batchrun.job.records import ResultRecord
from batchrun.openai.records import Outcome, Request
from batchrun.run.poison import ENGINE_CRASH, Isolator, crash_outcome, restarts_bound
from batchrun.run.sizing import back_off
from batchrun.workers.process import Worker, WorkerDeath

if TYPE_CHECKING:
    from batchrun.run.scheduler import Reporter, RunStats

# A worker that dies this many times in a row holding no request and finishing none is given up on.
MAX_DEATHS_WITHOUT_PROGRESS = 3
# The most custom_ids written to a worker's log at its death (the rest are counted).
LOGGED_IDS = 200


class RestartPolicy:
    """Dead workers: back off, isolate, or give up (the Scheduler supplies the state below)."""

    workers: list[Worker]
    pending: deque[Request]
    isolator: Isolator
    reporter: Reporter
    on_back_off: Callable[[int], None] | None
    job_dir: Path | str

    def _record(self, outcome: Outcome, request: Request, index: int) -> ResultRecord:
        raise NotImplementedError  # the Scheduler's

    def _journal(
        self,
        records: list[ResultRecord],
        outcomes: list[Outcome],
        stats: RunStats,
        plain: bool = False,
    ) -> None:
        raise NotImplementedError  # the Scheduler's

    def _requeue(self, w: Worker) -> int:
        """Put back what `w` held, untested: suspects stay suspects, the rest go back to pending."""
        held = w.take_inflight()
        if w.isolating is not None:
            self.isolator.put_back(dataclasses.replace(w.isolating, requests=held))
            w.isolating = None
        else:
            self.pending.extendleft(reversed(held))
        return len(held)

    def _on_death(
        self, w: Worker, stats: RunStats, stop_on_oom: bool
    ) -> list[tuple[Outcome, Request]]:
        """Deal with a dead worker; return the failed outcomes of requests found to crash it."""
        death = w.death
        assert death is not None
        progressed = w.results > 0
        if death.oom or death.during_start:
            requeued = self._requeue(w)
            w.stop(timeout=5)
            back = (
                f"; {plural(requeued, 'in-flight request')} go{'es' if requeued == 1 else ''} "
                "back to pending"
                if requeued
                else ""
            )
            if not death.oom:
                self._give_up(w, f"the engine failed to start: {death.message}")
                return []
            budget = w.settings.kv_cache_memory_bytes
            if death.during_start and budget is not None and kv_cache_too_small(death.message):
                # The KV cache's size is fixed: backing off would only start it again and again.
                # vLLM's first sentence only: its advice (more gpu_memory_utilization) does not
                # apply to a budget in bytes.
                said = death.message.split(". ", 1)[0]
                self._give_up(
                    w,
                    f"--kv-cache-memory-bytes {budget:,} is too small for this model and "
                    f"--max-model-len ({said}); give it more, or leave it out to size the KV "
                    "cache from --gpu-memory-utilization",
                )
                return []
            size = w.settings.window
            self.reporter.event(f"{w.label} ran out of memory at batch size {size}{back}")
            if stop_on_oom:
                stats.oom = True
                return []
            smaller = back_off(size)
            if smaller is None:
                self._give_up(w, f"out of memory even at batch size 1 ({death.message})")
                return []
            self.reporter.event(f"{w.label}: backing off, batch size {size} -> {smaller}")
            w.settings.window = smaller
            w.settings.max_num_seqs = smaller
            if self.on_back_off is not None:
                self.on_back_off(smaller)
            return []
        held = w.take_inflight()
        group, w.isolating = w.isolating, None
        deaths = (group.deaths if group is not None else 0) + 1
        w.stop(timeout=5)
        _log_death(w, death, held)
        if not held:
            w.deaths_without_progress = 0 if progressed else w.deaths_without_progress + 1
            self.reporter.event(f"{w.label} died: {death.message}; starting a fresh one")
            if w.deaths_without_progress >= MAX_DEATHS_WITHOUT_PROGRESS:
                self._give_up(
                    w,
                    f"the engine worker died {MAX_DEATHS_WITHOUT_PROGRESS} times in a row "
                    f"without finishing a request (last: {death.message})",
                )
            return []
        w.deaths_without_progress = 0
        iso = self.isolator
        if len(held) == 1:
            request = held[0]
            outcome = crash_outcome(request, death.message, w.log)
            iso.on_found()
            cost = f"; finding it took {deaths} restart{'s' if deaths != 1 else ''}"
            self.reporter.event(
                f"{w.label} died running request {request.custom_id!r} (line {request.line}) "
                f"on its own: {death.message}. It is recorded as failed ({ENGINE_CRASH}) "
                f"and not retried{cost}; the job goes on"
            )
            if iso.engine_looks_broken():
                # Journaled before giving up, which raises when no other worker is left.
                self._journal([self._record(outcome, request, w.index)], [outcome], stats)
                stats.crashed += 1
                self._give_up(
                    w,
                    f"{iso.streak} requests in a row crashed the engine worker on their own with "
                    f"none finishing in between, so the engine itself looks broken (last: "
                    f"{death.message}); they are recorded as failed ({ENGINE_CRASH}). Once the "
                    f"engine is fixed, `{command('resume', self.job_dir)}` runs the rest and "
                    f"`{command('retry-failed', self.job_dir)}` runs them again",
                )
                return []
            return [(outcome, request)]
        iso.suspect(held, deaths)
        how = "running a group of {} suspects alone" if group else "holding {} requests"
        bound = restarts_bound(len(held))
        self.reporter.event(
            f"{w.label} died {how.format(len(held))}: {death.message}. Running them again in "
            f"halves, each alone, to find the one that crashes it (at most {bound} more "
            f"restart{'s' if bound != 1 else ''}); starting a fresh worker"
        )
        return []

    def _give_up(self, w: Worker, reason: str) -> None:
        w.retired = True
        if any(not other.retired for other in self.workers):
            self.reporter.event(f"{w.label} retired: {reason}; the other workers go on")
            return
        raise BatchrunError(f"{reason}. Everything finished so far is saved")


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
