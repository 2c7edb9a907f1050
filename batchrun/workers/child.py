"""The worker process: runs one engine, keeps a window of requests in it, streams outcomes back.

What it says and hears: workers/messages.py. A step's outcomes go back with each body
pre-encoded (a ``msgspec.Raw`` of its journal JSON: see journal.encode_body), in `Results` of at
most MESSAGE_BYTES of bodies each.

The worker never waits for a group of requests to finish: after every engine step it sends what
finished and tops the engine up from its local queue, so vLLM's continuous batching stays busy.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, assert_never

import msgspec

from batchrun import timeline
from batchrun.config import EngineSettings
from batchrun.engines.base import (
    Abortable,
    CacheCounting,
    FlowControlled,
    KvCacheSized,
    StopsJob,
)
from batchrun.job.journal import encode_body
from batchrun.job.shards import ShardWriter, new_shard_name, seen_shards
from batchrun.openai.records import Outcome, Request
from batchrun.openai.response_bodies import failure, holds_no_float
from batchrun.openai.vectors import PLACEHOLDER, split_vectors
from batchrun.workers.messages import (
    Add,
    Cache,
    Fatal,
    Heartbeat,
    Ready,
    Restart,
    Results,
    Stats,
    Stop,
    ToWorker,
    Window,
)
from batchrun.workers.outbox import Outbox
from batchrun.workers.platform_env import apply_worker_environment
from batchrun.workers.process_group import die_with_parent, lead_own_group

# The cyclic garbage collector collects its first generation every this many allocations of
# containers not yet freed (CPython's default: 700), in a worker and in the parent while it runs
# (run/memory.fewer_collections). At tens of thousands of results a second the default is
# thousands of collections, each going over the young requests and results in flight again: a
# tenth of either process's time. Here they die by reference count, not in cycles.
GC_THRESHOLD = 20_000
# The most bytes of pre-encoded bodies in one "results" message (see `_messages`).
MESSAGE_BYTES = 96 * 1024
# Seconds between a busy worker's heartbeats ("stats"); config.MIN_STALL_TIMEOUT is two of them.
HEARTBEAT_S = 1.0


def _redirect_output(log: str | None, name: str) -> None:
    """Send the worker's stdout and stderr (vLLM's start-up lines, a C-level crash's last words)
    to its log file in the job directory, so the terminal keeps batchrun's own lines and the
    progress bar; without a log file, stdout goes to stderr (never into a pipe reading results).
    """
    with contextlib.suppress(OSError):
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            os.write(fd, f"\n=== worker {name}, pid {os.getpid()}, {stamp} ===\n".encode())
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        else:
            os.dup2(2, 1)


def _pin_to_cpus(cpus: str | None) -> None:
    """Keep this worker (and the OpenMP threads it starts) on its share of the cores."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def worker_main(
    conn: Connection,
    settings_dict: dict[str, Any],
    env: dict[str, str],
    name: str,
    parent_pid: int,
) -> None:
    """Entry point of the worker process (spawned, so no state is inherited by accident)."""
    # Its own session and process group, before it starts anything: the engine's processes (a
    # rank per GPU) join it, and the parent kills the group, not the worker alone.
    lead_own_group()
    # Armed before anything slow; a parent already gone (`parent_pid` is not the parent any
    # more) means exit now, or this worker would run on with nobody to stop it.
    die_with_parent(parent_pid)
    # The parent decides how to stop, not the worker: a SIGINT or SIGTERM sent to the worker
    # anyway (a service manager signalling every process of its unit) is set aside. A worker
    # that died of it would be restarted by a parent that has not handled its own signal yet.
    # The parent stops a worker by message, then SIGKILL to its group; if the parent dies, so
    # does the group (die_with_parent).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        # Spawned with both blocked (see process._stop_signals_blocked): one that came meanwhile
        # is dropped now that they are ignored.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    # The platform's settings (platform_env.py): vLLM's INFO lines on a GPU, its warnings for
    # its developers (no tcmalloc, no Triton, ...) kept out on a CPU; no CPU tuning on a GPU.
    apply_worker_environment(env, os.environ)
    _pin_to_cpus(env.get("BATCHRUN_CPU_AFFINITY"))
    _redirect_output(env.get("BATCHRUN_WORKER_LOG"), name)
    # Libraries' deprecation notices are for their developers too.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # multiprocessing's resource tracker (a process of its own, started by the engine) warns of
    # "leaked semaphores" when the worker ends with os._exit, as it always does.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(f"batchrun-worker {name}")
    settings = EngineSettings.from_dict(settings_dict)
    started = time.monotonic()
    timeline.mark("engine_start")
    try:
        from batchrun.engines.base import create_engine

        engine = create_engine(settings)
    except BaseException as e:
        _send_fatal(conn, e)
        os._exit(3)
    threshold = gc.get_threshold()
    if 0 < threshold[0] < GC_THRESHOLD:
        gc.set_threshold(GC_THRESHOLD, *threshold[1:])
    conn.send(
        Ready(
            pid=os.getpid(),
            start_s=time.monotonic() - started,
            peak_memory_mb=peak_memory_mb(),
            kv_cache=engine.kv_cache_size() if isinstance(engine, KvCacheSized) else None,
            sampling_defaults=getattr(engine, "sampling_defaults", None),
            timeline=_ready_marks(),
        )
    )
    # A job's run has the worker write its results' bodies itself (job/shards.py).
    shards = seen_shards(env)
    outbox = Outbox(conn, ShardWriter(shards, new_shard_name(name)) if shards else None)
    try:
        # An engine with its own flow control times its own requests (engines/base.py).
        timeout = None if isinstance(engine, FlowControlled) else settings.request_timeout
        _loop(outbox, engine, settings.window, timeout)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away: nothing left to report to
    except BaseException as e:
        outbox.close()  # the results that finished first: the parent journals them
        _send_fatal(conn, e)
        _exit(engine, conn, 4, outbox)
    _exit(engine, conn, 4 if outbox.failed else 0, outbox)


def _exit(engine: Any, conn: Connection, code: int, outbox: Outbox | None = None) -> None:
    """End the worker process. Every result is with the parent by now, so nothing the engine
    holds is worth a wait: an engine that runs in this process alone (vLLM's engine core on a
    CPU) is not shut down, since the exit frees all it holds and its shutdown cost the user 1.9 s
    at the end of every job; one with processes of its own (vLLM's engine core and ranks on a
    GPU) is, so that they end cleanly (the parent kills what is left of the group either way).
    The channel is closed before the exit, so that the parent knows at once that all is said:
    the kernel's freeing of the process's memory (0.6 s for 9 GB) comes before its files close."""
    if outbox is not None:
        with contextlib.suppress(Exception):
            outbox.close()  # what is queued goes first
    if multiprocessing.active_children():
        with contextlib.suppress(Exception):
            engine.close()
    with contextlib.suppress(OSError):
        conn.close()
    os._exit(code)


def _ready_marks() -> dict[str, float]:
    """The worker's moments up to now, "ready" among them."""
    timeline.mark("ready")
    return timeline.marks()


def peak_memory_mb() -> float | None:
    """Peak accelerator memory reserved by this process (CUDA), else its peak resident memory."""
    torch = sys.modules.get("torch")
    try:
        # is_initialized only: is_available would initialise the CUDA driver in this process
        # where nothing used it, and vLLM would then start its ranks by fork, which fails.
        if torch is not None and torch.cuda.is_initialized():
            return float(torch.cuda.max_memory_reserved()) / 2**20
    except Exception:
        pass
    from batchrun.peak_memory import peak_rss_kib

    return peak_rss_kib() / 1024.0


def _send_fatal(conn: Connection, exc: BaseException) -> None:
    from batchrun.engines.oom import is_oom

    stops = isinstance(exc, StopsJob)
    message = str(exc) if stops else f"{type(exc).__name__}: {exc}".strip()
    text = traceback.format_exc()
    # Into the worker's log too (stderr is redirected there), beside the engine's own lines.
    with contextlib.suppress(Exception):
        sys.stderr.write(text)
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        conn.send(Fatal(oom=is_oom(exc), message=message, traceback=text, stops_job=stops))


class Feeder:
    """Keeps up to `window` requests inside the engine and tops it up after every step.

    With a `request_timeout`, a request still running that many seconds after it entered the
    engine is aborted there and answered as failed (code `timeout`, retryable). The clock starts
    at the engine, not at the worker's queue: waiting behind the window is batchrun's buffering,
    not the request being stuck. An engine that cannot abort keeps the request; `restart` then
    says why the worker should be replaced.
    """

    def __init__(self, engine: Any, window: int, request_timeout: float | None = None) -> None:
        self.engine = engine
        self.window = window
        self.queue: deque[Request] = deque()
        self.active = 0
        self.request_timeout = request_timeout
        # With a request timeout: custom_id -> (when it entered the engine, the request), in the
        # order they entered, so the oldest is first.
        self.entered: dict[str, tuple[float, Request]] = {}
        self.abort: Callable[[str], None] | None = (
            engine.abort if isinstance(engine, Abortable) else None
        )
        self.restart: str | None = None

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return self.active == 0 and not self.queue

    def add(self, requests: list[Request]) -> None:
        """Queue requests behind those already waiting."""
        self.queue.extend(requests)

    def pump(self) -> list[Outcome]:
        """Top the engine up to the window, run one step, return what finished."""
        out: list[Outcome] = []
        timed = self.request_timeout is not None
        while self.queue and self.active < self.window:
            request = self.queue.popleft()
            immediate = self.engine.add(request)
            if immediate is None:
                self.active += 1
                if timed:
                    self.entered[request.custom_id] = (time.monotonic(), request)
            else:
                out.append(immediate)
        if self.active:
            finished = self.engine.step()
            self.active -= len(finished)
            out.extend(finished)
            if timed:
                entered = self.entered
                for outcome in finished:
                    entered.pop(outcome.custom_id, None)
                if entered:
                    out.extend(self._expire())
        return out

    def _expire(self) -> list[Outcome]:
        """Abort the requests past the timeout; return their `timeout` failures."""
        limit = self.request_timeout
        assert limit is not None
        now = time.monotonic()
        expired: list[tuple[str, float, Request]] = []
        for custom_id, (at, request) in self.entered.items():
            if now - at < limit:
                break  # the rest entered later
            expired.append((custom_id, at, request))
        out: list[Outcome] = []
        for custom_id, at, request in expired:
            del self.entered[custom_id]
            if self.abort is not None:
                self.abort(custom_id)
                self.active -= 1
            else:
                # Still in the engine: its late answer, if any, is dropped by the parent.
                self.restart = (
                    f"a request passed --request-timeout {limit:g} s and this engine cannot "
                    "abort it"
                )
            out.append(
                failure(
                    request,
                    "timeout",
                    f"the request did not finish within {limit:g} s of reaching the engine "
                    "(--request-timeout); it was aborted",
                    status_code=504,
                    retryable=True,
                    latency_s=now - at,
                )
            )
        return out


def _messages(out: list[Outcome]) -> list[list[Outcome]]:
    """`out` with each body pre-encoded, in messages of about MESSAGE_BYTES of bodies at most.

    A body goes as its journal JSON (cheaper to pickle; the parent writes the bytes as they
    are). The parent's malloc gives every block past 128 KiB fresh pages from the system
    (run/memory.py), which the kernel must fault in and zero: a step's worth of large bodies
    (1,024 embeddings of 1,024 dimensions: 6 MB) in one message cost it more in page faults
    than in anything else; messages under that size reuse its heap.
    """
    messages: list[list[Outcome]] = [[]]
    size = 0
    for outcome in out:
        body = outcome.body
        if type(body) is dict:
            body = outcome.body = encode_outcome(outcome, body)
        n = len(body) if type(body) is msgspec.Raw else 0
        if outcome.vectors is not None:  # they travel in the same message
            n += sum(map(len, outcome.vectors))
        if size + n > MESSAGE_BYTES and messages[-1]:
            messages.append([])
            size = 0
        messages[-1].append(outcome)
        size += n
    return messages


def encode_outcome(outcome: Outcome, body: dict[str, Any]) -> dict[str, Any] | msgspec.Raw:
    """A body as its journal JSON; an embeddings body's vectors split out into
    `outcome.vectors` (float32 bytes, which the journal keeps once, as binary: job/vectors.py)."""
    split = split_vectors(body)
    if split is not None:
        rest, vectors = split
        data = encode_body(rest, floats=not holds_no_float(rest))
        # Each placeholder must pair with its vector (see openai/vectors.py PLACEHOLDER).
        if type(data) is msgspec.Raw and bytes(data).count(PLACEHOLDER) == len(vectors):
            outcome.vectors = vectors
            return data
    return encode_body(body, floats=not holds_no_float(body))


def _loop(outbox: Outbox, engine: Any, window: int, request_timeout: float | None = None) -> None:
    conn = outbox.conn  # heard from here; said through the outbox, in order
    feeder = Feeder(engine, window, request_timeout)
    # The parent watches a worker that beats (run/watchdog.py): say so before the first step,
    # which may be the one that never returns.
    outbox.send(Heartbeat(HEARTBEAT_S))
    last_stats = time.monotonic()
    # An engine with a prefix cache counts its lookups (engines/base.py, CacheCounting).
    counters = engine.prefix_cache_counters if isinstance(engine, CacheCounting) else None
    cache_sent = (0, 0)
    flow = engine.flow_window if isinstance(engine, FlowControlled) else None
    window_sent = 0
    while True:
        # Block only when there is nothing to do; otherwise just drain what has arrived.
        while conn.poll(None if feeder.idle else 0):
            message: ToWorker = conn.recv()
            match message:
                case Add():
                    feeder.add(message.requests)
                case Window():
                    feeder.window = message.size
                case Stop():
                    return
                case _:
                    assert_never(message)
        out = feeder.pump()
        if out:
            if counters is not None and (cache := counters()) != cache_sent:
                outbox.send(Cache(*cache))
                cache_sent = cache
            if flow is not None and (window := flow()) != window_sent:
                # Before the results, so the parent has it with the last one (its batch size).
                outbox.send(Stats(window=window))
                window_sent = window
            for part in _messages(out):
                outbox.send(Results(part))
            if feeder.restart is not None:
                outbox.send(Restart(feeder.restart))
                feeder.restart = None
        now = time.monotonic()
        if now - last_stats >= HEARTBEAT_S:
            # Also the heartbeat: sent between steps, so a step that never returns stops it.
            # With a flow-controlled engine's window: the batch size the job shows.
            outbox.send(Stats(peak_memory_mb(), window=flow() if flow is not None else None))
            last_stats = now
        if outbox.failed:
            return  # the shard cannot be written (the parent was told), or the parent is gone
