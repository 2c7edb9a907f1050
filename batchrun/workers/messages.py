"""Every message between a worker and its parent: one kind each, one typed Struct each.

Parent -> worker process: `Add` (requests to run), `Window` (how many to keep in the engine),
`Stop`. Worker -> parent: `Ready` (the engine started), `Results` (outcomes, each body
pre-encoded: workers/child.py), `Cache` (the engine's prefix-cache counters, sent before the
results of a step that changed them), `Stats` (a local worker's heartbeat, every
child.HEARTBEAT_S; a flow-controlled engine's window), `Heartbeat` (this worker beats that
often: sent before its first step; a Ray actor's relay sends one each second its polls return),
`Restart` (replace me: a request timed out in an engine that cannot abort it), `Fatal` (the
engine failed: its last words). `Eof` is never sent: the parent's reader of a worker puts it in
the inbox when the worker's channel closes. A Ray actor answers its calls with the same Structs
(`Ready` or `Fatal` from its start, `PollReply` from a poll, `Stats`), which its relay thread
passes on as the same messages.

Every message crosses a process boundary pickled (a multiprocessing pipe, a Ray call): a Struct
pickles as its class and its fields, and is not tracked by the cyclic garbage collector
(gc=False: a message refers to plain values, requests and outcomes, never back to itself). A
`Results` costs a few microseconds more to pickle and unpickle than the `("results", list)` tuple
it replaced, once per message of some hundreds of outcomes. A reader dispatches on the Struct's
type (`match`, ending in `assert_never`), so mypy checks the fields of each kind and that every
kind is handled; the kind enum names a message where its fields are not needed (the watchdog).
"""

from __future__ import annotations

import enum
import queue
from typing import Any, ClassVar, TypeAlias

import msgspec

from batchrun.openai.records import Outcome, Request


class MessageKind(enum.Enum):
    """The kinds of message between a worker and its parent."""

    # parent -> worker
    ADD = "add"
    WINDOW = "window"
    STOP = "stop"
    # worker -> parent
    READY = "ready"
    RESULTS = "results"
    CACHE = "cache"
    STATS = "stats"
    HEARTBEAT = "heartbeat"
    RESTART = "restart"
    FATAL = "fatal"
    EOF = "eof"


class Message(msgspec.Struct, frozen=True, gc=False):
    """A message between a worker and its parent; each kind is a subclass."""

    kind: ClassVar[MessageKind]


# -- parent -> worker ----------------------------------------------------------------------------


class Add(Message, frozen=True, gc=False):
    """Requests to queue behind those the worker holds."""

    kind: ClassVar[MessageKind] = MessageKind.ADD
    requests: list[Request]


class Window(Message, frozen=True, gc=False):
    """How many requests the worker keeps inside its engine at once from now on."""

    kind: ClassVar[MessageKind] = MessageKind.WINDOW
    size: int


class Stop(Message, frozen=True, gc=False):
    """Stop: send nothing more, close the channel, exit."""

    kind: ClassVar[MessageKind] = MessageKind.STOP


# -- worker -> parent ----------------------------------------------------------------------------


class Ready(Message, frozen=True, gc=False):
    """The engine started: where it runs and what the parent plans with."""

    kind: ClassVar[MessageKind] = MessageKind.READY
    pid: int
    start_s: float
    peak_memory_mb: float | None = None
    # (tokens, tokens a block), or None where the engine reports none: the planner's KV budget
    # (run/admission.py).
    kv_cache: tuple[int, int] | None = None
    # The model's sampling defaults for unset fields (engines/vllm/model_defaults.py).
    sampling_defaults: dict[str, Any] | None = None
    # Its start's moments (batchrun/timeline.py), for the job's event log; a local worker's only.
    timeline: dict[str, float] = {}
    # Where a Ray actor runs: its node's IP address, its GPUs (as CUDA_VISIBLE_DEVICES names
    # them); none for a local worker.
    node: str | None = None
    gpus: list[str] = []


class Results(Message, frozen=True, gc=False):
    """Outcomes that finished, each body its journal JSON (a `msgspec.Raw`: workers/child.py)."""

    kind: ClassVar[MessageKind] = MessageKind.RESULTS
    outcomes: list[Outcome]


class Cache(Message, frozen=True, gc=False):
    """The engine's prefix-cache counters since it started: prompt tokens looked up, found."""

    kind: ClassVar[MessageKind] = MessageKind.CACHE
    queries: int
    hits: int


class Stats(Message, frozen=True, gc=False):
    """How the worker is doing; from a local worker, also its heartbeat. None: not in this one."""

    kind: ClassVar[MessageKind] = MessageKind.STATS
    peak_memory_mb: float | None = None
    # A flow-controlled engine's window (engines/base.py FlowControlled): the job's batch size.
    window: int | None = None
    # A Ray actor's most memory in use on each of its GPUs (NVML), in MiB.
    gpu_memory_mb: list[float] | None = None


class Heartbeat(Message, frozen=True, gc=False):
    """This worker beats at least every `every_s` seconds while its engine steps (run/watchdog.py)."""

    kind: ClassVar[MessageKind] = MessageKind.HEARTBEAT
    every_s: float


class Restart(Message, frozen=True, gc=False):
    """Replace this worker, for `reason` (its engine cannot abort a timed-out request)."""

    kind: ClassVar[MessageKind] = MessageKind.RESTART
    reason: str


class Fatal(Message, frozen=True, gc=False):
    """The engine failed: its last words. `stops_job`: no restart can help (engines/base.py)."""

    kind: ClassVar[MessageKind] = MessageKind.FATAL
    oom: bool
    message: str
    traceback: str | None = None
    stops_job: bool = False


class Eof(Message, frozen=True, gc=False):
    """The worker's channel closed (said by the parent's reader, never sent by a worker)."""

    kind: ClassVar[MessageKind] = MessageKind.EOF


class PollReply(msgspec.Struct, frozen=True, gc=False):
    """A Ray actor's answer to a poll: what finished, a failure, its prefix-cache counters."""

    outcomes: list[Outcome]
    fatal: Fatal | None = None
    cache: Cache | None = None


ToWorker: TypeAlias = Add | Window | Stop
FromWorker: TypeAlias = Ready | Results | Cache | Stats | Heartbeat | Restart | Fatal | Eof
# A worker's message as the scheduler's inbox holds it: (worker index, its generation, message).
Delivery: TypeAlias = tuple[int, int, FromWorker]
Inbox: TypeAlias = queue.Queue[Delivery]
