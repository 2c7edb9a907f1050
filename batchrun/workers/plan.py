"""Which workers a run starts: Ray actors, or local processes with their output in log files."""

from __future__ import annotations

import contextlib
from pathlib import Path

from batchrun.config import EngineSettings
from batchrun.workers.devices import worker_envs
from batchrun.workers.process import Worker


def plan_workers(
    settings: EngineSettings,
    *,
    ray: str | None,
    gpus: list[str] | None,
    workers: int | None,
    logs: Path,
) -> tuple[type[Worker], list[dict[str, str]]]:
    """The worker class and one environment per worker: one actor per GPU group (or `workers`)
    on the Ray cluster `ray`, else local processes, each writing its output to logs/worker-N.log."""
    if ray:
        from batchrun.workers import ray as ray_backend

        ray_backend.connect(ray, workers)
        # Per node: a tensor-parallel group never spans nodes.
        gpus_per_node = ray_backend.node_gpus()
        count = ray_backend.actor_count(gpus_per_node, settings.tensor_parallel_size, workers)
        return ray_backend.RayWorker, [{} for _ in range(count)]
    job = str(logs.parent.resolve())
    envs = worker_envs(
        settings.engine, gpus, settings.tensor_parallel_size, workers, job, device=settings.device
    )
    with contextlib.suppress(OSError):  # without it, worker output goes to the terminal
        logs.mkdir(exist_ok=True)
        for i, env in enumerate(envs):
            env["BATCHRUN_WORKER_LOG"] = str((logs / f"worker-{i}.log").resolve())
    return Worker, envs
