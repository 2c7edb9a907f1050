"""Why an engine failed to start, read from vLLM's own words, so the restart policy can answer
each cause as it calls for (run/restarts.py) instead of halving the batch size for all of them.

The wordings are vLLM 0.32's, of its CUDA and CPU builds (`vllm/v1/worker/utils.py`,
`vllm/v1/worker/cpu_worker.py`, `vllm/v1/worker/gpu_model_runner.py`,
`vllm/v1/core/kv_cache_utils.py`, `vllm/v1/executor/multiproc_executor.py`,
`vllm/v1/engine/utils.py`). Pure functions over text: nothing here imports vLLM or torch, and
the one that reads a file (`log_since_start`) only reads it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

from batchrun.engines.oom import is_oom_message, kv_cache_too_small


class StartKind(enum.Enum):
    """What kind of start-up failure a message describes."""

    # Less memory free on the device (or host, on the CPU backend) than the fraction asks for:
    # something else holds it, maybe a process still exiting. Waiting may help; a smaller batch
    # does not (the fraction is of the whole device).
    FREE_MEMORY = "free_memory"
    # The KV cache's share (--kv-cache-memory-bytes, or what the fraction leaves after the
    # model) is more than the memory free when the cache is allocated (the CPU backend): held
    # by something else, so waiting may help, unless the share is more than the whole memory.
    KV_OVER_FREE = "kv_over_free"
    # One sequence of max_model_len tokens does not fit in the KV cache: only a shorter
    # --max-model-len (vLLM estimates the longest that fits) or more memory helps.
    MAX_MODEL_LEN = "max_model_len"
    # The memory fraction does not even cover the model and the engine: the KV cache's share is
    # zero or negative (CUDA: no cache block fits; the CPU backend: a negative "requested memory
    # for kv"). Only a larger --gpu-memory-utilization helps: not retried.
    NO_KV_CACHE = "no_kv_cache"
    # The model itself is larger than the device's (or machine's) memory: no setting of the
    # fraction helps, only more devices or a smaller model. Not retried.
    MODEL_TOO_LARGE = "model_too_large"
    # An allocation failed while the engine profiled or warmed up (PyTorch's out-of-memory
    # error): those passes are sized by max_num_seqs (vLLM itself advises lowering it when the
    # sampler warm-up runs out), so a smaller batch can help.
    OOM = "oom"
    # A failure known to pass (NCCL's "unhandled system error", a port taken meanwhile).
    TRANSIENT = "transient"
    # Anything else.
    OTHER = "other"


# Failures that starting again, after a wait, may cure (memory held by a process still
# exiting, NCCL, a port race, anything unknown); the others are settings that cannot work.
RETRIED_KINDS = frozenset(
    {StartKind.FREE_MEMORY, StartKind.KV_OVER_FREE, StartKind.TRANSIENT, StartKind.OTHER}
)


@dataclass(frozen=True)
class MemoryFigures:
    """The GiB figures of one of vLLM's memory messages (None where it gives none)."""

    # Free (available) and total memory of the device or memory node.
    free_gib: float
    total_gib: float
    # What the memory fraction asks for: its share of the total.
    requested_gib: float | None = None
    # The KV cache's share: --kv-cache-memory-bytes, or the fraction's share less what the
    # engine process already holds (the model and the engine itself); may be negative.
    kv_gib: float | None = None
    # Whether the memory is the CPU's (vLLM's CPU backend) rather than a GPU's.
    on_cpu: bool = False

    @property
    def engine_gib(self) -> float | None:
        """What the engine process held before its KV cache (the model, the engine itself): the
        fraction's share less the KV cache's, when the message gives both."""
        if self.requested_gib is None or self.kv_gib is None:
            return None
        return self.requested_gib - self.kv_gib


@dataclass(frozen=True)
class StartFailure:
    """A classified start-up failure: its kind, the text it was read from, vLLM's estimate."""

    kind: StartKind
    # The message the kind was read from (the worker's, or a rank's line from the worker's log).
    message: str
    # MAX_MODEL_LEN: vLLM's "estimated maximum model length" (None when vLLM gave none).
    estimate: int | None = None
    # Whether `message` came from the worker's log (a tensor-parallel rank's or the engine
    # core's own error) rather than from the exception the worker caught.
    from_log: bool = False
    # The memory figures vLLM's message gives (the memory kinds), None otherwise.
    memory: MemoryFigures | None = None

    @property
    def retried(self) -> bool:
        """Whether starting again after a wait may cure it: a setting that cannot work (a KV
        cache larger than the whole memory included) is not tried again."""
        if self.kind is StartKind.KV_OVER_FREE and self.memory is not None:
            kv = self.memory.kv_gib
            return kv is None or kv <= self.memory.total_gib
        return self.kind in RETRIED_KINDS


# vLLM's memory messages (vllm/v1/worker/utils.py `request_memory`, vllm/v1/worker/cpu_worker.py),
# read with their figures (GiB rounded to 2 places; a negative KV share written as such).
# CUDA, at start-up, memory held by other processes: "Free memory on device cuda:0 (10.5/79.19
# GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB)", or "... is less
# than the engine's budget after excluding external process's weights (0.9, 60.0 GiB)".
_CUDA_FREE = re.compile(
    r"free memory on device \S+ \((?P<free>[-\d.]+)/(?P<total>[-\d.]+) GiB\) on startup is less "
    r"than (?:desired GPU memory utilization |the engine's budget[^(]*)"
    r"\([\d.]+, (?P<requested>[-\d.]+) GiB\)",
    re.IGNORECASE,
)
# CUDA, weights another process holds take more than the fraction's share: "Externally held
# weights on device cuda:0 (70.0/79.19 GiB) exceed the desired GPU memory utilization (0.5, ...)".
_CUDA_EXTERNAL = re.compile(
    r"externally held weights on device \S+ \((?P<held>[-\d.]+)/(?P<total>[-\d.]+) GiB\) "
    r"exceed the desired GPU memory utilization \([\d.]+, (?P<requested>[-\d.]+) GiB\)",
    re.IGNORECASE,
)
# The CPU backend, at start-up: "Available memory on node 0 (11.2/23.4 GiB) on startup is less
# than desired CPU memory utilization (0.92, 21.5 GiB)".
_CPU_FREE = re.compile(
    r"available memory on node \S+ \((?P<free>[-\d.]+)/(?P<total>[-\d.]+) GiB\) on startup is "
    r"less than desired CPU memory utilization \([\d.]+, (?P<requested>[-\d.]+) GiB\)",
    re.IGNORECASE,
)
# The CPU backend, when it allocates the KV cache: "Available memory on node 0 (5.85/11.96 GiB)
# on kv cache allocation is less than requested memory for kv (-0.32/1.17 GiB)": the KV share
# (the fraction's 1.17 GiB less what the process holds; here negative) against what is free;
# with --kv-cache-memory-bytes "... for kv (2.0 GiB)", the bytes asked for alone.
_CPU_KV = re.compile(
    r"available memory on node \S+ \((?P<free>[-\d.]+)/(?P<total>[-\d.]+) GiB\) on kv cache "
    r"allocation is less than requested memory for kv "
    r"\((?P<kv>[-\d.]+)(?:/(?P<requested>[-\d.]+))? GiB\)",
    re.IGNORECASE,
)
# The same messages without their figures in vLLM 0.32's form (another version's wording).
_FREE_MEMORY = re.compile(
    r"free memory on device .*? on startup is less than"
    r"|available memory on node .*? is less than desired cpu memory utilization",
    re.IGNORECASE,
)
_KV_OVER_FREE = re.compile(
    r"available memory on node .*? is less than requested memory for kv", re.IGNORECASE
)
# vLLM on CUDA logs this (then raises PyTorch's own out-of-memory error) when the weights do not
# fit the GPU while it loads them (vllm/v1/worker/gpu_model_runner.py, load_model).
_LOAD_OOM = "failed to load model - not enough gpu memory"
# "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is
# needed, which is larger than the available KV cache memory (2.1 GiB). Based on the available
# memory, the estimated maximum model length is 17344. ..." (and an older wording).
_MAX_SEQ_LEN = re.compile(
    r"kv cache is needed, which is larger than the available kv cache memory"
    r"|larger than the maximum number of tokens that can be stored in kv cache",
    re.IGNORECASE,
)
_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)", re.IGNORECASE)
_TRANSIENT = re.compile(
    r"unhandled system error"  # NCCL: a socket, a shared-memory segment, a peer not up yet
    r"|address already in use"  # a port another process took between choosing and binding
    r"|errno 98\b"
    r"|connection refused"
    r"|resource temporarily unavailable",
    re.IGNORECASE,
)
# Messages that only say the real error happened in another process and was logged there:
# a tensor-parallel rank (WorkerProc), or vLLM's engine-core process.
_WRAPPERS = (
    "workerproc initialization failed",
    "engine core initialization failed",
    "workerproc failed to start",
    "enginecore failed to start",
)
# An exception's last line in a traceback, after vLLM's "(Worker_TP1 pid=123) " prefix, if any.
_PREFIX = re.compile(r"^\s*\([A-Za-z0-9_]+ pid=\d+\)\s*")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit))(?::\s*(.*))?$")
# The header the worker writes to its log at every start (workers/child.py).
_START_HEADER = "\n=== worker "
# The most of a worker's log read back: its last start's lines are at the end.
_LOG_TAIL_BYTES = 1 << 20


def is_wrapper(message: str) -> bool:
    """Whether a message only points at another process's error (a TP rank, the engine core)."""
    lowered = message.lower()
    return any(w in lowered for w in _WRAPPERS)


def max_model_len_estimate(message: str) -> int | None:
    """vLLM's estimate of the longest model length that fits its KV cache, if the message has one."""
    found = _ESTIMATE.search(message)
    return int(found.group(1)) if found else None


def classify_message(message: str, oom: bool = False) -> StartFailure:
    """The kind of start-up failure `message` says; `oom`: the worker found an out-of-memory
    exception in the chain (for PyTorch's OutOfMemoryError, whatever its message)."""
    memory = memory_failure(message)
    if memory is not None:
        return memory
    if _MAX_SEQ_LEN.search(message):
        return StartFailure(StartKind.MAX_MODEL_LEN, message, max_model_len_estimate(message))
    if kv_cache_too_small(message):
        return StartFailure(StartKind.NO_KV_CACHE, message)
    if oom:
        return StartFailure(StartKind.OOM, message)
    if _TRANSIENT.search(message):
        return StartFailure(StartKind.TRANSIENT, message)
    return StartFailure(StartKind.OTHER, message)


def root_cause(log_text: str) -> str | None:
    """The error another process logged (a TP rank's, the engine core's): the first exception
    line that names a known cause (memory, max seq len, NCCL), else the first exception line that
    is not a wrapper; None when the text has none."""
    first: str | None = None
    for raw in log_text.splitlines():
        line = _PREFIX.sub("", raw).strip()
        match = _EXCEPTION_LINE.match(line)
        if match is None or is_wrapper(line):
            continue
        found = classify_message(line, oom=is_oom_message(match.group(1), match.group(2) or ""))
        if found.kind is not StartKind.OTHER:
            return line
        if first is None:
            first = line
    return first


def memory_failure(message: str) -> StartFailure | None:
    """The memory kind of `message`, with its figures; None for no memory message of vLLM's."""
    text = " ".join(message.split())
    figures = _figures(text)
    if figures is not None:
        return StartFailure(figures[0], message, memory=figures[1])
    if _FREE_MEMORY.search(text):
        return StartFailure(StartKind.FREE_MEMORY, message)
    if _KV_OVER_FREE.search(text):
        return StartFailure(StartKind.KV_OVER_FREE, message)
    return None


def _figures(text: str) -> tuple[StartKind, MemoryFigures] | None:
    """The kind and figures of a memory message of vLLM's (on one line); None for any other."""
    found = _CPU_KV.search(text)
    if found is not None:
        requested = found["requested"]
        memory = MemoryFigures(
            float(found["free"]),
            float(found["total"]),
            float(requested) if requested is not None else None,
            float(found["kv"]),
            on_cpu=True,
        )
        engine = memory.engine_gib
        if engine is None or float(found["kv"]) > 0:
            return StartKind.KV_OVER_FREE, memory
        # The fraction's share does not cover what the process holds before its KV cache;
        # past the whole memory, no fraction would.
        too_large = engine >= memory.total_gib
        return (StartKind.MODEL_TOO_LARGE if too_large else StartKind.NO_KV_CACHE), memory
    for pattern, on_cpu in ((_CUDA_FREE, False), (_CPU_FREE, True)):
        found = pattern.search(text)
        if found is not None:
            free, total = float(found["free"]), float(found["total"])
            memory = MemoryFigures(free, total, float(found["requested"]), on_cpu=on_cpu)
            return StartKind.FREE_MEMORY, memory
    found = _CUDA_EXTERNAL.search(text)
    if found is not None:
        held, requested = float(found["held"]), float(found["requested"])
        memory = MemoryFigures(0.0, float(found["total"]), requested, requested - held)
        return StartKind.NO_KV_CACHE, memory
    return None


def classify(message: str, oom: bool, log_text: str | None) -> StartFailure:
    """Classify a start-up failure; when the message only points at another process's error,
    the cause is read from `log_text` (the worker's log since this start). An out-of-memory
    error while vLLM loads the weights (its log says so) is a model too large for the device."""
    found = classify_message(message, oom)
    if is_wrapper(message) and log_text:
        cause = root_cause(log_text)
        if cause is not None:
            name, _, text = cause.partition(":")
            of = classify_message(cause, oom=is_oom_message(name, text))
            found = StartFailure(of.kind, cause, of.estimate, from_log=True, memory=of.memory)
    if found.kind is StartKind.OOM and log_text and _LOAD_OOM in log_text.lower():
        return StartFailure(StartKind.MODEL_TOO_LARGE, found.message, from_log=found.from_log)
    return found


def log_since_start(path: str | Path | None) -> str | None:
    """The worker's log from its last start on (its last `=== worker` header), at most the last
    megabyte; None when there is no log or it cannot be read."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    at = text.rfind(_START_HEADER)
    return text[at + 1 :] if at >= 0 else text


def first_sentence(message: str) -> str:
    """vLLM's first sentence, on one line: its facts, without its advice (which names Python
    arguments, not batchrun's options)."""
    return " ".join(message.split()).split(". ", 1)[0].rstrip(".")
