"""A worker's environment for the platform it runs on: CUDA settings for a GPU worker, the CPU
backend's for the others, decided from the worker's own environment before vLLM or torch load.

The decision is the parent's layout (workers/devices.py): a GPU worker is given GPUs in
CUDA_VISIBLE_DEVICES, a CPU worker none. Nothing here asks torch (`torch.cuda.is_available()`
initialises the CUDA driver in the worker, and vLLM then starts its tensor-parallel ranks with
`fork`, which fails in them with "CUDA error: initialization error").

On CUDA: vLLM's own engine-core process stays on (it overlaps scheduling and output handling with
the GPU's forward pass), its ranks are spawned, torch answers `is_available()` from NVML from the
worker's first line (vLLM sets that only when it is imported), and vLLM's INFO lines (the KV cache's size,
preemptions) go to the worker's log. On the CPU backend: the engine core runs inside the worker
(a core polling for a scheduler process costs a CPU job a core of two), and vLLM's warnings for
its developers stay out of the log. Variables that tune the CPU backend (VLLM_CPU_*, the OpenMP
threads and cores batchrun gives a CPU worker) never reach a GPU worker: a CPU-sized thread count
in every rank of a GPU engine only makes them contend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Literal

Platform = Literal["cuda", "cpu"]

# A CUDA_VISIBLE_DEVICES entry that names a GPU: an ordinal, or a GPU-/MIG- UUID. Anything else
# ("", "-1", Slurm's "NoDevFiles") names none, and CUDA stops reading the list at it.
_GPU_ENTRY = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")
CPU_ONLY_NAMES = frozenset({"OMP_NUM_THREADS", "BATCHRUN_CPU_AFFINITY", "BATCHRUN_CPU_SHARED_WITH"})
CPU_ONLY_PREFIXES = ("VLLM_CPU_",)
# vLLM's default max_num_seqs for offline use (its LLM class) by device, from vLLM 0.32's
# EngineArgs.get_batch_defaults: 1024 on GPUs of 70 GiB or more other than the A100 (H100, H200)
# and on every GPU of 160 GiB or more (B200); 256 elsewhere.
_LARGE_GPU_MIB = 70 * 1024
_HUGE_GPU_MIB = 160 * 1024
LARGE_GPU_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_SEQS = 256


def worker_platform(env: Mapping[str, str]) -> Platform:
    """ "cuda" when a worker's environment gives it GPUs (CUDA_VISIBLE_DEVICES names one), else
    "cpu"."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "cpu"
    first = value.split(",", 1)[0].strip()
    return "cuda" if _GPU_ENTRY.fullmatch(first) else "cpu"


def is_cpu_only(name: str) -> bool:
    """Whether environment variable `name` tunes the CPU backend only."""
    return name in CPU_ONLY_NAMES or name.startswith(CPU_ONLY_PREFIXES)


def platform_settings(platform: Platform) -> dict[str, str]:
    """The variables batchrun sets for a worker on `platform` (a user's own values win)."""
    if platform == "cuda":
        return {
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "VLLM_LOGGING_LEVEL": "INFO",
            # torch.cuda.is_available() then asks NVML instead of initialising CUDA. `import vllm`
            # sets it too, but only from then on: this covers what runs before it.
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
        }
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "ERROR"}


def worker_environment(inherited: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a worker: the parent's (`inherited`), less what does not fit its
    platform, with the worker's `own` variables on top and its platform's settings by default."""
    platform = worker_platform(own)
    env = dict(inherited)
    env.update(own)
    if platform == "cuda":
        for name in [n for n in env if is_cpu_only(n)]:
            del env[name]
    for name, value in platform_settings(platform).items():
        env.setdefault(name, value)
    return env


def apply_worker_environment(own: Mapping[str, str], environ: MutableMapping[str, str]) -> Platform:
    """Make `environ` (this process's os.environ) the worker's environment; return its platform."""
    wanted = worker_environment(environ, own)
    for name in [n for n in environ if n not in wanted]:
        del environ[name]
    # Only what changes: rewriting every variable moves the environment out of the memory
    # setproctitle takes over for the worker's name (`batchrun-worker N` in ps).
    for name, value in wanted.items():
        if environ.get(name) != value:
            environ[name] = value
    return worker_platform(own)


def default_max_num_seqs(memory_total_mib: int | None, name: str | None) -> int:
    """vLLM's own default number of sequences at once for a GPU of that memory and model name
    (DEFAULT_MAX_NUM_SEQS when either is unknown): the cap a batch-size search on it may reach."""
    if memory_total_mib is None:
        return DEFAULT_MAX_NUM_SEQS
    if memory_total_mib >= _HUGE_GPU_MIB:
        return LARGE_GPU_MAX_NUM_SEQS
    if memory_total_mib >= _LARGE_GPU_MIB and "a100" not in (name or "").lower():
        return LARGE_GPU_MAX_NUM_SEQS
    return DEFAULT_MAX_NUM_SEQS
