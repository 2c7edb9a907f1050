"""A tiny engine for scripts/gpu_oom_check.py: each step allocates memory in proportion to the
requests it runs, so batchrun's real workers and restart policy meet real out-of-memory errors.

On CUDA a step allocates `running x per-sequence` bytes on the GPU (per sequence: the free memory
at start divided by `BATCHRUN_GPU_CHECK_FIT + 0.5`), so it runs out above FIT requests at once
with PyTorch's own `torch.OutOfMemoryError`. A request whose body says `"huge": true` asks for
twice the device on its own. Without CUDA (`BATCHRUN_GPU_CHECK_DEVICE=cpu`), the same limits are
simulated with an exception shaped like PyTorch's, and torch is not imported at all.

`BATCHRUN_GPU_CHECK_RANK_PIDS=<file>`: the engine also starts a child process that holds GPU
memory, ignores SIGTERM and SIGINT and never exits on its own (a tensor-parallel rank stuck in
NCCL); its pid is appended to the file.

The engine is registered in each worker process by `worker_main_with_engine`, which the check
makes the worker's entry point (the registry is a fixed table: this engine is not batchrun's).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

ENGINE = "gpu-check"

# A rank: holds 1 GiB of GPU memory (none on the CPU), ignores polite signals, never exits.
_RANK_CODE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "if sys.argv[1] == 'cuda':\n"
    "    import torch\n"
    "    held = torch.ones(1 << 28, device='cuda')\n"
    "    torch.cuda.synchronize()\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


class OutOfMemoryError(RuntimeError):
    """Shaped like torch.OutOfMemoryError (CPU mode only: on CUDA the real one is raised)."""


def register() -> None:
    """Add this engine to batchrun's registry in this process."""
    from batchrun import engine_registry as registry

    if ENGINE not in registry.ENGINES:
        registry.ENGINES[ENGINE] = registry.EngineSpec(
            name=ENGINE,
            summary="",
            factory_path="gpu_check_engine:AllocEngine",
            model="none",
            cache_device=ENGINE,
            uses_gpus=False,
        )


def worker_main_with_engine(*args: Any) -> None:
    """batchrun's worker entry point, with this engine registered first."""
    register()
    from batchrun.workers.child import worker_main

    worker_main(*args)


class AllocEngine:
    """Finishes every request it runs in one step, after allocating memory for all of them."""

    def __init__(self, settings: Any) -> None:
        self.cuda = os.environ.get("BATCHRUN_GPU_CHECK_DEVICE", "cpu") == "cuda"
        fit = float(os.environ.get("BATCHRUN_GPU_CHECK_FIT", "6"))
        self.running: list[Any] = []
        self.ranks: list[subprocess.Popen[bytes]] = []
        if self.cuda:
            import torch

            self.torch = torch
            free, self.total = torch.cuda.mem_get_info()
            self.per_seq = int(free / (fit + 0.5))
        else:
            self.total = 1 << 30
            self.per_seq = int(self.total / (fit + 0.5))
        record = os.environ.get("BATCHRUN_GPU_CHECK_RANK_PIDS")
        if record:
            rank = subprocess.Popen(
                [sys.executable, "-c", _RANK_CODE, "cuda" if self.cuda else "cpu"],
                stdin=subprocess.DEVNULL,
            )
            self.ranks.append(rank)
            with open(record, "a", encoding="utf-8") as f:
                f.write(f"{rank.pid}\n")

    def add(self, request: Any) -> None:
        """Queue a request: it runs in the next step."""
        self.running.append(request)

    def step(self) -> list[Any]:
        """Allocate for every running request, then finish them all."""
        from batchrun.openai.records import Outcome

        need = len(self.running) * self.per_seq
        if any(r.body.get("huge") for r in self.running):
            need += 2 * self.total
        if self.cuda:
            torch = self.torch
            block = torch.empty(need, dtype=torch.uint8, device="cuda")
            block.fill_(1)
            torch.cuda.synchronize()
            del block
        elif need > self.total:
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {need / 2**30:.2f} GiB (simulated on the "
                f"CPU: {len(self.running)} requests running)"
            )
        done = [
            Outcome(
                custom_id=r.custom_id, ok=True, status_code=200, body={"ran": len(self.running)}
            )
            for r in self.running
        ]
        self.running.clear()
        return done

    def has_unfinished(self) -> bool:
        """Whether a request is waiting for a step."""
        return bool(self.running)

    def close(self) -> None:
        """Nothing to release: the process exits (its stuck rank, on purpose, does not)."""
        self.running.clear()
