"""Why an engine failed to start, read from vLLM's own words, so the restart policy can answer
each cause as it calls for (run/restarts.py) instead of halving the batch size for all of them.

The wordings are vLLM 0.32's (`vllm/v1/worker/utils.py`, `vllm/v1/worker/cpu_worker.py`,
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
    # One sequence of max_model_len tokens does not fit in the KV cache: only a shorter
    # --max-model-len (vLLM estimates the longest that fits) or more memory helps.
    MAX_MODEL_LEN = "max_model_len"
    # No KV cache block fits at all after the weights and the profiling pass.
    NO_KV_CACHE = "no_kv_cache"
    # An allocation failed while the engine profiled or warmed up (PyTorch's out-of-memory
    # error): those passes are sized by max_num_seqs (vLLM itself advises lowering it when the
    # sampler warm-up runs out), so a smaller batch can help.
    OOM = "oom"
    # A failure known to pass (NCCL's "unhandled system error", a port taken meanwhile).
    TRANSIENT = "transient"
    # Anything else.
    OTHER = "other"


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


# vLLM on CUDA: "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired
# GPU memory utilization (0.9, 71.27 GiB)", or "... is less than the engine's budget after
# excluding external process's weights (...)". On the CPU backend: "Available memory on node 0
# (...) on startup is less than desired CPU memory utilization (...)", and at KV cache
# allocation "... is less than requested memory for kv (...)".
_FREE_MEMORY = re.compile(
    r"free memory on device .*? on startup is less than"
    r"|available memory on node .*? is less than (desired cpu memory utilization|requested memory)",
    re.IGNORECASE | re.DOTALL,
)
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
    if _FREE_MEMORY.search(message):
        return StartFailure(StartKind.FREE_MEMORY, message)
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


def classify(message: str, oom: bool, log_text: str | None) -> StartFailure:
    """Classify a start-up failure; when the message only points at another process's error,
    the cause is read from `log_text` (the worker's log since this start)."""
    if is_wrapper(message) and log_text:
        cause = root_cause(log_text)
        if cause is not None:
            name, _, text = cause.partition(":")
            found = classify_message(cause, oom=is_oom_message(name, text))
            return StartFailure(found.kind, cause, found.estimate, from_log=True)
    return classify_message(message, oom)


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
