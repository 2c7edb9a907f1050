"""The parent's handle on one worker process: start it, feed it, hear from it, notice when it dies."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import multiprocessing.util  # registers its exit handler now, so that ours runs before it
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar, assert_never

from batchrun import timeline
from batchrun.config import EngineSettings
from batchrun.openai.records import Outcome, Request
from batchrun.workers.child import worker_main
from batchrun.workers.gpu_release import wait_for_gpus
from batchrun.workers.messages import (
    Add,
    Cache,
    Eof,
    Fatal,
    FromWorker,
    Heartbeat,
    Inbox,
    Ready,
    Restart,
    Results,
    Stats,
    Stop,
    Window,
)
from batchrun.workers.process_group import kill_group, wait_group_gone

_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"
_NONE = object()  # an attribute a module does not have
_CUSTOM_ID = operator.attrgetter("custom_id")
# The process groups of the workers started and not yet seen gone (each named by its worker's
# pid): what kill_all_workers kills, ranks of workers already dead included.
_GROUPS: set[int] = set()


class _Channel:
    """The parent's end of a worker's pipe, closed once both of its users are done with it: the
    scheduler's thread (which sends) and the reader thread (which receives, see _pump).

    Neither closes it under the other. A close while the reader is inside `recv` (between
    taking the descriptor's number and reading it) frees the number for the next worker's new
    pipe: the old reader then reads, and garbles, the new worker's messages, and the new
    worker's own reader, seeing a stream cut mid-message, reports it dead while it runs. A
    close by the reader under a send would turn the number over to any file opened next (a
    journal), and the send would write into it.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._users = 2
        self._lock = threading.Lock()

    def let_go(self) -> None:
        """One user is done with the channel; the last one closes it."""
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.conn.close()


@dataclass
class WorkerDeath:
    """Why a worker went away: its last words (if any) and whether it was an out-of-memory failure."""

    oom: bool
    message: str
    during_start: bool
    traceback: str | None = None
    # The engine said no restart can help (engines/base.py StopsJob): the job stops.
    stops_job: bool = False


@dataclass
class Suspects:
    """Requests to run alone on a worker, and the deaths that led to them (run/poison.py)."""

    requests: list[Request]
    deaths: int


@dataclass
class Worker:
    """One engine worker process and the requests it holds."""

    # Whether the parent's watchdog bounds its start (run/watchdog.py): a Ray actor bounds each
    # step of its own (workers/ray_start.py).
    start_watched: ClassVar[bool] = True

    index: int
    settings: EngineSettings
    env: dict[str, str]
    process: Any = None
    ready: bool = False
    pid: int | None = None
    start_s: float = 0.0
    started_at: float = 0.0
    # The moments of its last start, as its ready message gave them (batchrun/timeline.py).
    timeline: dict[str, float] = field(default_factory=dict)
    # Set when the current process's channel closes: it is exiting (or gone).
    said_bye: threading.Event = field(default_factory=threading.Event)
    inflight: dict[str, Request] = field(default_factory=dict)
    results: int = 0
    death: WorkerDeath | None = None
    generation: int = 0
    peak_memory_mb: float | None = None
    deaths_without_progress: int = 0
    retired: bool = False
    # The group of suspects it runs alone (see poison.py): nothing else is sent to it meanwhile.
    isolating: Suspects | None = None
    # vLLM's prefix-cache counters, prompt tokens looked up and found cached, summed over every
    # process this worker started; and the current process's own, as it last reported them.
    cache_queries: int = 0
    cache_hits: int = 0
    cache_seen: tuple[int, int] = (0, 0)
    # Start-up failures in a row that are retried (run/restarts.py), and the monotonic time
    # before which the next start must not begin (a wait for memory, a port, NCCL to settle).
    start_failures: int = 0
    start_not_before: float = 0.0
    # The custom_ids it held when it last ran out of memory while running: the same set running
    # out again points at one of them, not at the batch's size.
    oom_held: frozenset[str] = frozenset()
    # Its engine's KV cache as the ready message gave it, (tokens, tokens a block); None when the
    # engine reports none (echo): the planner's admission then sets no limit.
    kv_cache: tuple[int, int] | None = None
    # The model's generation-config defaults its engine applies (engines/vllm/model_defaults.py).
    sampling_defaults: dict[str, Any] | None = None
    # A flow-controlled engine's window as it last reported it (engines/base.py FlowControlled).
    flow_window: int | None = None
    _channel: _Channel | None = field(default=None, repr=False)

    @property
    def conn(self) -> Connection | None:
        """The parent's end of the current process's pipe (None: no process, or let go of)."""
        return self._channel.conn if self._channel is not None else None

    @property
    def log(self) -> str | None:
        """The file the worker's own output goes to, if any."""
        return self.env.get("BATCHRUN_WORKER_LOG")

    @property
    def label(self) -> str:
        """How the worker is named in messages."""
        gpus = self.env.get("CUDA_VISIBLE_DEVICES")
        return f"worker {self.index}" + (f" (GPU {gpus})" if gpus else "")

    def start(self, inbox: Inbox) -> None:
        """Spawn the process; its messages arrive in `inbox` as (index, generation, message)."""
        self._let_go()  # a dead process's channel, if its death was not followed by a stop
        self._clear_gpus()
        timeline.mark("worker_spawn")
        ctx = mp.get_context("spawn")
        # The first spawn starts multiprocessing's resource tracker, a process of its own with this
        # environment. The workers end with os._exit (an engine cannot be shut down cleanly
        # from every state), so at exit it would warn of "leaked semaphore objects" that the
        # exit already freed: noise after every real run.
        os.environ.setdefault("PYTHONWARNINGS", _QUIET_TRACKER)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        # Not a daemon: a vLLM engine with tensor parallelism starts children of its own.
        process = ctx.Process(
            target=worker_main,
            args=(child_conn, self.settings.to_dict(), self.env, str(self.index), os.getpid()),
            name=f"batchrun-worker-{self.index}",
        )
        try:
            start_shielded(process)
        except BaseException:
            # A Ctrl-C mid-spawn included: no half-started process for stop() to join.
            parent_conn.close()
            child_conn.close()
            raise
        self.process = process
        child_conn.close()
        self._channel = _Channel(parent_conn)
        self.pid = self.process.pid
        _GROUPS.add(self.pid)  # the worker makes its pid its group's id first thing
        self.ready = False
        self.results = 0
        self.death = None
        self.started_at = time.monotonic()
        self.generation += 1
        self.cache_seen = (0, 0)  # a new engine counts from zero
        self.said_bye = threading.Event()
        # A reader thread drains the pipe continuously, so that neither side can block the other
        # on a full pipe buffer.
        threading.Thread(
            target=_pump,
            args=(self._channel, inbox, self.index, self.generation, self.said_bye),
            daemon=True,
        ).start()

    def send(self, requests: Sequence[Request]) -> None:
        """Hand requests to the worker; they count as in flight until their outcome comes back."""
        assert self.conn is not None
        self.inflight.update(zip(map(_CUSTOM_ID, requests), requests, strict=True))
        # A dead worker's death is noticed through its pipe's end-of-file, not here.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            self.conn.send(Add(requests if type(requests) is list else list(requests)))

    def handle(self, message: FromWorker) -> list[tuple[Outcome, Request]]:
        """Apply one message from the worker; return the outcomes it carried with their requests."""
        match message:
            case Results():
                pairs: list[tuple[Outcome, Request]] = []
                pop = self.inflight.pop
                for o in message.outcomes:
                    request = pop(o.custom_id, None)
                    if request is not None:  # else a stale answer for a request already re-queued
                        pairs.append((o, request))
                self.results += len(pairs)
                return pairs
            case Cache(queries=queries, hits=hits):
                # The engine's counters since it started: add what is new since the last report.
                self.cache_queries += queries - self.cache_seen[0]
                self.cache_hits += hits - self.cache_seen[1]
                self.cache_seen = (queries, hits)
            case Stats():
                if message.peak_memory_mb is not None:
                    self.peak_memory_mb = message.peak_memory_mb
                if message.window is not None:
                    self.flow_window = message.window
            case Ready():
                self.ready = True
                self.start_s = message.start_s
                self.timeline = dict(message.timeline)
                self.peak_memory_mb = message.peak_memory_mb
                self.kv_cache = message.kv_cache
                self.sampling_defaults = message.sampling_defaults or None
            case Fatal():
                self.death = WorkerDeath(
                    oom=message.oom,
                    message=message.message,
                    during_start=not self.ready,
                    traceback=message.traceback,
                    stops_job=message.stops_job,
                )
            case Eof():
                self._on_eof()
            case Heartbeat() | Restart():
                pass  # the watchdog's and the scheduler's
            case _:
                assert_never(message)
        return []

    def _on_eof(self) -> None:
        """The worker's channel closed: it is gone. Say why, if its last words did not."""
        if self.process is not None:
            self.process.join(timeout=10)
        if self.pid is not None:
            kill_group(self.pid)  # its ranks, now orphans that would hold its GPUs
        if self.death is None:
            code = self.process.exitcode if self.process is not None else None
            how = (
                f"killed by signal {-code}"
                if code is not None and code < 0
                else f"exit code {code}"
            )
            log = self.log
            self.death = WorkerDeath(
                oom=False,
                message=f"the worker process died ({how})"
                + (f"; its output: {log}" if log else ""),
                during_start=not self.ready,
            )

    def _let_go(self) -> None:
        """Send nothing more to the current process (its channel closes once its reader is
        done with it too)."""
        if self._channel is not None:
            self._channel.let_go()
        self._channel = None

    def describe(self) -> dict[str, Any]:
        """Where the worker runs, for `status`."""
        return {"kind": "process", "pid": self.pid, "gpus": self.env.get("CUDA_VISIBLE_DEVICES")}

    def set_window(self, window: int) -> None:
        """Change how many requests the worker keeps inside its engine at once."""
        self.settings.window = window
        assert self.conn is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
            self.conn.send(Window(window))

    def take_inflight(self) -> list[Request]:
        """Remove and return the requests the worker held (to go back to pending)."""
        held = list(self.inflight.values())
        self.inflight.clear()
        return held

    def stop(self, timeout: float = 10.0, *, leave: bool = False) -> None:
        """Ask the worker to stop; kill it if it does not (or if a second Ctrl-C cuts the wait).

        `leave`: once the worker has closed its channel (its engine shut down where it has
        processes of its own, everything it answered sent), its process's exit is not waited
        for: the kernel freeing its memory, 0.6 s for a CPU engine's 9 GB KV cache, is off the
        caller's path (a run's very end: every result is journaled, the command is about to
        exit). A thread reaps it.
        """
        if self.process is None:
            return
        try:
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    self.conn.send(Stop())
            if leave:
                if self.said_bye.wait(timeout) and self.process.is_alive():
                    self._leave()
                    return
            else:
                self.process.join(timeout=timeout)
            timeline.stamp("worker_exited")
        finally:
            if self.process is not None:
                self._make_sure_stopped()

    def _make_sure_stopped(self) -> None:
        """Kill the worker if it is still running, and forget it."""
        assert self.process is not None
        # Reached on a KeyboardInterrupt too: a worker left running would never be told to stop,
        # and the exiting parent would wait for it forever.
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self._let_go()
        self.process = None
        self._end_group()

    def _leave(self) -> None:
        """Forget a worker whose process is exiting, and reap it (and its group) in a thread."""
        process, pid = self.process, self.pid
        # multiprocessing's exit handler joins every child it started: this one must not hold up
        # the command's exit (it dies with it in any case: die_with_parent).
        mp_children: set[Any] = getattr(mp.process, "_children", set())
        mp_children.discard(process)
        self._let_go()
        self.process = None
        timeline.stamp("worker_left")

        def reap() -> None:
            process.join()
            if pid is not None and pid in _GROUPS:
                kill_group(pid)  # ranks that outlived it
                if wait_group_gone(pid):
                    _GROUPS.discard(pid)

        threading.Thread(target=reap, name=f"reap-worker-{self.index}", daemon=True).start()

    def kill(self) -> None:
        """Stop the worker at once, with every process it started."""
        if self.process is not None and self.process.is_alive():
            if self.pid is not None:
                kill_group(self.pid)
            self.process.kill()
        self.stop(timeout=5)

    def _end_group(self) -> None:
        """Kill what is left of the worker's process group (ranks that outlived it) and wait,
        within a bound, until it is gone: the next engine on these GPUs needs their memory."""
        if self.pid is None or self.pid not in _GROUPS:
            return
        kill_group(self.pid)
        if wait_group_gone(self.pid):
            _GROUPS.discard(self.pid)

    def _clear_gpus(self) -> None:
        """Before a start: the last process's group gone, and its GPUs' memory given back."""
        if self.generation > 0:
            self._end_group()
        wait_for_gpus(self.env)


def start_shielded(process: BaseProcess) -> None:
    """Start a spawned process with SIGINT and SIGTERM blocked from its first instruction."""
    # The first spawn of a process starts multiprocessing's resource tracker, and that start
    # blocks the same two signals around its own spawn and then *unblocks* them (bpo-33613),
    # whatever the mask was before: inside our block, the worker would be spawned with them open
    # (a Ctrl-C while it imports: a traceback on the terminal). Started first, it leaves ours be.
    resource_tracker.ensure_running()
    with _stop_signals_blocked(), _callers_script_kept_out():
        process.start()


@contextlib.contextmanager
def _callers_script_kept_out() -> Iterator[None]:
    """Spawn a worker without the caller's `__main__`: multiprocessing's spawn runs the script
    that started the parent again in each child (its top level, unless guarded by `if __name__
    == "__main__"`), and a script read from stdin not at all (the child looks for a file named
    `<stdin>` and dies). A worker needs nothing of it (its target and arguments are batchrun's),
    so the spawn is told of no main module: its preparation reads `__main__.__spec__` and
    `__file__`, hidden from it here for the moment of the start."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    spec, file = main.__dict__.get("__spec__"), main.__dict__.get("__file__", _NONE)
    main.__spec__ = None
    if file is not _NONE:
        del main.__file__
    try:
        yield
    finally:
        main.__spec__ = spec
        if file is not _NONE:
            main.__file__ = file


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in this thread while a worker is spawned: the child inherits the
    mask, so a Ctrl-C or SIGTERM to the process group cannot hit it while Python starts (a
    traceback on the terminal, a worker dead) before it sets them aside (worker_main ignores
    them, then unblocks them). Here a signal stays pending, or another thread takes it: the
    parent still sees it."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def kill_all_workers() -> None:
    """SIGKILL every worker process still running, without waiting for them."""
    # Their groups first: the ranks a worker started, alive or orphaned by its death.
    for pgid in list(_GROUPS):
        kill_group(pgid)
    # Every child multiprocessing started, not only those a Worker got to record.
    for process in mp.active_children():
        with contextlib.suppress(Exception):
            process.kill()


@atexit.register
def _kill_leftover_workers() -> None:
    """At exit, kill any worker an interrupted shutdown left running.

    Registered after multiprocessing's own exit handler, so it runs first: that handler joins
    every non-daemon child, and would wait forever for a worker nobody told to stop.
    """
    kill_all_workers()
    for process in mp.active_children():
        with contextlib.suppress(Exception):
            process.join(timeout=5)


def _pump(
    channel: _Channel,
    inbox: Inbox,
    index: int,
    gen: int,
    said_bye: threading.Event,
) -> None:
    """Forward every message of one worker to the scheduler's inbox, then an "eof"."""
    try:
        while True:
            inbox.put((index, gen, channel.conn.recv()))
    except Exception:
        # EOF: the worker is gone. Anything else (a message cut short as it died, one that does
        # not unpickle) leaves the channel unusable all the same: its end, never a silent thread.
        pass
    finally:
        channel.let_go()
    said_bye.set()
    inbox.put((index, gen, Eof()))
