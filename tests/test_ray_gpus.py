"""Ray on GPU clusters, emulated: a cluster of Ray nodes on this machine that declare GPUs they do
not have (Ray schedules by the numbers each node declares; the echo engine needs no GPU).

Placement groups for tensor parallelism, the refusal when no node holds a tensor-parallel group,
a bound on every wait of an actor's start, Ray's out-of-memory kills counted as OOM, the
driver's CPU-only settings kept from GPU actors, and per-GPU memory read from NVML (a fake
`pynvml`).
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.jobs import journal_records, submit_echo
from support.lines import chat_input

from batchrun.errors import BatchrunError
from batchrun.workers import ray_start
from batchrun.workers.messages import Fatal, Ready, Stats
from batchrun.workers.ray import actor_env, death_is_oom, lost

# The words of Ray 2.x when its memory monitor kills a worker (the raylet's message templates,
# filled in as they are on a node).
RAY_OOM_KILL = (
    "Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 10.0.0.7, ID: 6a1f) was 30.12GB used / 31.20GB limit (0.965)\n"
    "Ray killed this worker (ID: 9c2e) because it was the most recently scheduled task"
)
# Ray's words for an actor that died any other way (a SIGKILL, a segfault): they name the
# kernel's OOM killer as one possible cause, which must not count as out of memory.
RAY_ACTOR_DIED = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: EngineActor\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
    "Some common causes include: (1) the process was killed by the OOM killer due to high "
    "memory usage, (2) ray stop --force was called, or (3) the worker crashed unexpectedly due "
    "to SIGSEGV or another unexpected error."
)


# -- which clusters can hold a worker ------------------------------------------------------------


def test_a_tensor_parallel_group_no_node_can_hold_is_refused_in_one_line() -> None:
    """4 nodes x 1 GPU at TP 2: 4 GPUs in all, none of them two on one node."""
    with pytest.raises(BatchrunError) as e:
        ray_start.actor_count([1.0, 1.0, 1.0, 1.0], 2, None)
    assert str(e.value) == (
        "--tensor-parallel-size 2 needs 2 GPUs on one node, and no node of the Ray cluster has "
        "that many (4 nodes with 1 GPU); use --tensor-parallel-size 1 or less, or add a node "
        "with 2 GPUs"
    )
    with pytest.raises(BatchrunError) as e:
        ray_start.actor_count([2.0, 0.0, 1.0, 2.0], 4, 3)  # --workers given: refused all the same
    assert "no node of the Ray cluster has that many (2 nodes with 2 GPUs, 1 node with 1 GPU)" in (
        str(e.value)
    )


def test_actors_are_counted_per_node_and_a_cpu_cluster_is_not_refused() -> None:
    # 2 nodes of 3 GPUs at TP 2: one group per node (6 // 2 would be 3, and one never starts).
    assert ray_start.actor_count([3.0, 3.0], 2, None) == 2
    assert ray_start.actor_count([8.0, 0.0], 4, None) == 2
    assert ray_start.actor_count([0.0, 0.0], 2, None) == 1  # no GPU: CPU actors
    assert ray_start.actor_count([], 1, 5) == 5


def test_every_step_of_an_actors_start_is_bounded_by_the_start_timeout() -> None:
    """By default: 120 s to place the actor and create it, 1800 s for its engine to start;
    --start-timeout (BATCHRUN_START_TIMEOUT) bounds every step."""
    assert ray_start.start_timeouts(None) == ray_start.StartTimeouts(120.0, 120.0, 1800.0)
    assert ray_start.start_timeouts(7.5) == ray_start.StartTimeouts(7.5, 7.5, 7.5)


# -- what an actor's death means -----------------------------------------------------------------


def test_rays_out_of_memory_kills_count_as_oom() -> None:
    """Ray's OutOfMemoryError (its memory monitor killed the task), and an actor it killed for
    memory, back off like a CUDA OOM; any other loss of an actor does not."""
    from ray.exceptions import ActorDiedError, OutOfMemoryError, RayActorError

    oom = OutOfMemoryError(RAY_OOM_KILL)  # type: ignore[no-untyped-call]
    assert death_is_oom(oom)
    assert lost(oom) == Fatal(
        oom=True,
        message="Ray killed the actor for memory: Task was killed due to the node running "
        "low on memory.",
    )
    killed = RayActorError(error_msg=ActorDiedError.BASE_ERROR_MSG + "\n" + RAY_OOM_KILL)
    assert death_is_oom(killed)
    assert lost(killed).oom is True
    died = RayActorError(error_msg=RAY_ACTOR_DIED)
    assert not death_is_oom(died)
    assert lost(died) == Fatal(
        oom=False,
        message="the Ray actor was lost: The actor died unexpectedly before finishing this task.",
    )


# -- what an actor's environment holds -----------------------------------------------------------

DRIVER_ENV = {
    "HF_HOME": "/data/hf",
    "VLLM_LOGGING_LEVEL": "INFO",
    "BATCHRUN_HOME": "/data/batchrun",
    # A CPU head's own settings: its engine's KV space and thread binding, its core claims.
    "VLLM_CPU_KVCACHE_SPACE": "8",
    "VLLM_CPU_OMP_THREADS_BIND": "0-3",
    "OMP_NUM_THREADS": "4",
    "BATCHRUN_CPU_CLAIMS_DIR": "/tmp/claims",
    "BATCHRUN_CPU_SHARED_WITH": "job-1",
}


def test_gpu_actors_never_get_the_drivers_cpu_only_settings() -> None:
    assert actor_env(DRIVER_ENV, gpus=True) == {
        "HF_HOME": "/data/hf",
        "VLLM_LOGGING_LEVEL": "INFO",
        "BATCHRUN_HOME": "/data/batchrun",
    }
    # Actors on a CPU-only cluster run vLLM's CPU backend: its settings go with them; the core
    # claims of this machine never do.
    assert actor_env(DRIVER_ENV, gpus=False) == {
        "HF_HOME": "/data/hf",
        "VLLM_LOGGING_LEVEL": "INFO",
        "BATCHRUN_HOME": "/data/batchrun",
        "VLLM_CPU_KVCACHE_SPACE": "8",
        "VLLM_CPU_OMP_THREADS_BIND": "0-3",
    }


class FakeNvml(types.ModuleType):
    """`pynvml` for two GPUs (index 0 and 1, or by UUID) whose memory in use is set by the test."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.used = {"GPU-aaaa": 1000 * 2**20, "GPU-bbbb": 3000 * 2**20}
        self.order = ["GPU-aaaa", "GPU-bbbb"]

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return self.order[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid not in self.used:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return types.SimpleNamespace(used=self.used[handle], total=80 * 2**30)


@pytest.fixture
def saved_environ() -> Iterator[None]:
    """os.environ as it was before the test, back after it (an actor's body, run in this
    process, changes it as it would its own process's)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_gpu_memory_is_read_per_device_by_ordinal_or_uuid(nvml: FakeNvml) -> None:
    from batchrun.workers.gpu_memory import gpu_memory_mb

    assert gpu_memory_mb(["0", "1"]) == [1000.0, 3000.0]
    assert gpu_memory_mb(["GPU-bbbb"]) == [3000.0]
    assert gpu_memory_mb(["GPU-cccc"]) is None  # one NVML does not know: no reading at all
    assert gpu_memory_mb([]) is None


def test_a_tensor_parallel_actor_reports_its_gpus_peak_memory_from_nvml(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, saved_environ: None
) -> None:
    """The actor's body, in this process, given GPUs 0 and 1 by Ray: the peak it reports is the
    most in use on one of its GPUs (the engine's ranks are other processes), kept as a peak;
    and the driver's CPU-only settings, inherited on a local cluster, are gone from its
    environment."""
    import ray

    from batchrun.config import EngineSettings
    from batchrun.workers.ray import EngineActor

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "192.0.2.1")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [0, 1])
    for name in ("VLLM_CPU_KVCACHE_SPACE", "BATCHRUN_CPU_SHARED_WITH", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, DRIVER_ENV[name])
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    actor = EngineActor(EngineSettings(engine="echo", tensor_parallel_size=2).to_dict(), {})
    assert not {"VLLM_CPU_KVCACHE_SPACE", "BATCHRUN_CPU_SHARED_WITH", "OMP_NUM_THREADS"} & set(
        os.environ
    )
    # A GPU worker's settings, as a local one gets them: ranks spawned, vLLM's INFO log kept.
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    info = actor.start()
    assert isinstance(info, Ready) and info.gpus == ["0", "1"]
    assert (info.peak_memory_mb, actor.gpu_peaks) == (3000.0, [1000.0, 3000.0])
    nvml.used["GPU-aaaa"] = 5000 * 2**20
    nvml.used["GPU-bbbb"] = 2000 * 2**20
    assert actor.stats() == Stats(5000.0, gpu_memory_mb=[5000.0, 3000.0])


# -- a cluster of nodes with GPUs ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[str]:
    """A head node declaring 2 GPUs and a second node declaring 1: 3 GPUs, at most 2 on a node."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 3, "num_gpus": 2, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]


@pytest.fixture
def connected(gpu_cluster: str) -> Iterator[Any]:
    """This process connected to the cluster (as a second driver, beside the job's)."""
    import ray

    ray.init(address=gpu_cluster, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def submit(tmp_path: Path, address: str, *args: str, n: int = 40, **env: str) -> Any:
    src = chat_input(tmp_path / "in.jsonl", n, "m")
    return submit_echo(
        src, tmp_path / "job", "--batch-size", "4", "--ray", address, *args, env=env, timeout=120
    )


@pytest.mark.ray
def test_tp_larger_than_any_node_is_refused_before_any_actor(
    gpu_cluster: str, tmp_path: Path
) -> None:
    """TP 3 on nodes of 2 and 1 GPUs: 3 GPUs in all, but an actor asking for 3 on one node would
    wait forever. Refused in one line, at once."""
    started = time.monotonic()
    r = submit(tmp_path, gpu_cluster, "--tensor-parallel-size", "3")
    assert time.monotonic() - started < 60
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --tensor-parallel-size 3 needs 3 GPUs on one node, and no node of the Ray "
        "cluster has that many (1 node with 2 GPUs, 1 node with 1 GPU); use "
        "--tensor-parallel-size 2 or less, or add a node with 3 GPUs"
    )
    assert "Traceback" not in r.stderr


@pytest.mark.ray
def test_a_tensor_parallel_actor_runs_in_a_strict_pack_placement_group(
    connected: Any, gpu_cluster: str, tmp_path: Path
) -> None:
    from ray.util import placement_group_table

    before = set(placement_group_table())
    r = submit(tmp_path, gpu_cluster, "--tensor-parallel-size", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(journal_records(tmp_path / "job")) == 40
    groups = [g for pg, g in placement_group_table().items() if pg not in before]
    assert len(groups) == 1, groups
    assert groups[0]["bundles"] == {0: {"GPU": 2.0, "CPU": 1.0}}
    assert groups[0]["strategy"] == "STRICT_PACK"
    assert groups[0]["state"] == "REMOVED"  # given back when the job ended


@pytest.mark.ray
def test_a_placement_group_that_cannot_be_placed_times_out_naming_it(
    connected: Any, gpu_cluster: str, tmp_path: Path
) -> None:
    """Both GPUs of the only node with two are held by another driver: the worker's placement
    group waits BATCHRUN_START_TIMEOUT seconds, then its start fails naming what it waited for
    (it used to wait forever)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    held = placement_group([{"GPU": 2.0}], strategy="STRICT_PACK")
    connected.get(held.ready(), timeout=60)
    try:
        started = time.monotonic()
        # No pause between its starts (3 s, then 10, by default): the time-out is what is tested.
        r = submit(
            tmp_path,
            gpu_cluster,
            "--tensor-parallel-size",
            "2",
            BATCHRUN_START_TIMEOUT="3",
            BATCHRUN_START_RETRY_DELAY_S="0",
        )
        took = time.monotonic() - started
    finally:
        remove_placement_group(held)
    assert r.returncode == 1, r.stderr[-3000:]
    assert took < 90
    assert (
        "timed out after 3s waiting for the placement group of ray worker 0 (2 GPUs and 1 CPU "
        "on one node) to be placed: no node has that much free; raise --start-timeout "
        "(BATCHRUN_START_TIMEOUT) to wait longer" in r.stderr
    ), r.stderr[-3000:]
    assert "Traceback" not in r.stderr


def test_the_size_cache_key_of_actors_is_the_clusters_gpus_not_the_drivers() -> None:
    """Under Ray the batch-size cache is keyed by the GPU models Ray found on the cluster's nodes
    (and the GPUs per actor), never by the driver's first GPU."""
    from batchrun.workers.devices import DEVICE_KEY_ENV, device_key
    from batchrun.workers.ray import cluster_device_key

    resources = {"CPU": 64.0, "GPU": 8.0, "accelerator_type:H100": 2.0}
    assert cluster_device_key(resources, 2) == "ray:cuda:H100 x2"
    assert cluster_device_key({"CPU": 8.0, "GPU": 1.0}, 1) == "ray:cuda:gpu"
    assert cluster_device_key({"CPU": 8.0}, 1) == "cpu"
    key = cluster_device_key(resources, 1)
    assert device_key([{DEVICE_KEY_ENV: key}, {DEVICE_KEY_ENV: key}]) == "ray:cuda:H100"
