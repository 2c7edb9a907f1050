"""The checks a run makes before it creates anything: the doctor's (workers/diagnosis.py).

A job of an engine that uses GPUs refuses to start, in one line with the way out, on a problem
that would stop or cripple it (the CPU build of vLLM with GPUs listed, nvidia-smi failing, GPU
ids that name no visible GPU, ...); one that only wastes GPUs (left idle by the tensor-parallel
grouping) starts, and the warning is returned for the caller to say.
"""

from __future__ import annotations

from batchrun.errors import BatchrunError
from batchrun.run.options import RunOptions


def preflight(options: RunOptions) -> list[str]:
    """Refuse (BatchrunError) a run that would not run as expected; returns its warnings.

    Engines that use no GPU (echo) are never refused. On Ray the GPUs are the cluster's, not
    this machine's: the actors' own start says what they find.
    """
    settings = options.settings
    if not settings.spec.uses_gpus or options.ray:
        return []
    from batchrun.workers.diagnosis import diagnose

    found = diagnose(
        gpus=options.gpus,
        tensor_parallel_size=settings.tensor_parallel_size,
        workers=options.workers,
        device=settings.device,
    )
    for problem in found.problems:
        if problem.fatal:
            raise BatchrunError(problem.line())
    return [f"warning: {p.line()}" for p in found.problems]
