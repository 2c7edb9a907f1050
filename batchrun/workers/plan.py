"""Which workers a run starts: Ray actors, or local processes with their output in log files."""

from __future__ import annotations

import contextlib
from pathlib import Path

from batchrun.config import EngineSettings
from batchrun.job.shards import SHARD_DIR_ENV, SHARD_PROBE_ENV, leave_probe
from batchrun.workers.devices import DEVICE_KEY_ENV, worker_envs
from batchrun.workers.process import Worker


def plan_workers(
    settings: EngineSettings,
    *,
    ray: str | None,
    gpus: list[str] | None,
    workers: int | None,
    logs: Path,
    shards: Path | None = None,
) -> tuple[type[Worker], list[dict[str, str]]]:
    """The worker class and one environment per worker: one actor per GPU group (or `workers`)
    on the Ray cluster `ray`, else local processes, each writing its output to logs/worker-N.log
    and, given `shards` (a job's run), its results' bodies to a shard there (job/shards.py)."""
    if ray:
        from batchrun.workers import ray as ray_backend

        resources = ray_backend.connect(ray, workers)
        # Per node: a tensor-parallel group never spans nodes.
        gpus_per_node = ray_backend.node_gpus()
        tp = settings.tensor_parallel_size
        count = ray_backend.actor_count(gpus_per_node, tp, workers)
        # The actors' devices are the cluster's, not this machine's (devices.device_key).
        key = ray_backend.cluster_device_key(resources, tp)
        envs = [{DEVICE_KEY_ENV: key} for _ in range(count)]
        # An actor whose node sees the job directory writes its shard there; the others send
        # their results whole (job/shards.py `seen_shards`).
        if shards is not None and (token := leave_probe(shards)) is not None:
            for env in envs:
                env[SHARD_DIR_ENV] = str(shards.resolve())
                env[SHARD_PROBE_ENV] = token
        return ray_backend.RayWorker, envs
    job = str(logs.parent.resolve())
    envs = worker_envs(
        settings.engine, gpus, settings.tensor_parallel_size, workers, job, device=settings.device
    )
    with contextlib.suppress(OSError):  # without it, worker output goes to the terminal
        logs.mkdir(exist_ok=True)
        for i, env in enumerate(envs):
            env["BATCHRUN_WORKER_LOG"] = str((logs / f"worker-{i}.log").resolve())
    if shards is not None:
        for env in envs:
            env[SHARD_DIR_ENV] = str(shards.resolve())
    return Worker, envs
