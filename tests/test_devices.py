"""GPU ids as CUDA means them, MIG slices, a failing or hung nvidia-smi, and the batch-size cache
key of each worker's own device: on emulated GPU machines (a fake nvidia-smi first on PATH)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fakes.gpus import (
    A100,
    emulate_machine,
    gpu,
    mig,
    no_nvidia_smi_path,
)

from batchrun.errors import BatchrunError
from batchrun.workers import devices, nvidia
from batchrun.workers.builds import torch_cuda_version
from batchrun.workers.devices import device_key, worker_envs

Machine = Callable[..., None]
ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.fixture(autouse=True)
def fresh_inventory() -> Iterator[None]:
    """nvidia-smi's answers are kept a few seconds; each test's machine is its own."""
    devices._CACHE.clear()
    yield
    devices._CACHE.clear()


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    """machine(gpus, visible=..., **spec): this process on an emulated GPU machine."""

    def make(gpus: list[dict[str, Any]], visible: str | None = None, **spec: Any) -> None:
        emulate_machine(monkeypatch, tmp_path, {"gpus": gpus, **spec}, visible)

    return make


def gpu_envs(*cuda_visible: str) -> list[dict[str, str]]:
    return [{"CUDA_VISIBLE_DEVICES": c, **ORDER} for c in cuda_visible]


def test_gpus_are_ordinals_within_the_visible_list(machine: Machine) -> None:
    """A Slurm allocation of GPUs 4-7: --gpus 0,1 are its first two, never physical 0 and 1."""
    machine([gpu(i) for i in range(8)], visible="4,5,6,7")
    assert worker_envs("vllm", ["0", "1"], 1, None) == gpu_envs("4", "5")
    assert worker_envs("vllm", ["0", "1"], 2, None) == gpu_envs("4,5")
    assert worker_envs("vllm", None, 2, None) == gpu_envs("4,5", "6,7")
    # A UUID picks the GPU it names; the worker gets the parent's own entry for it.
    assert worker_envs("vllm", [gpu(6)["uuid"]], 1, None) == gpu_envs("6")
    # Without CUDA_VISIBLE_DEVICES every GPU nvidia-smi lists is visible, by its index.
    machine([gpu(i) for i in range(4)])
    assert worker_envs("vllm", ["2", "3"], 2, None) == gpu_envs("2,3")


def test_an_id_that_names_no_visible_gpu_is_refused_naming_the_visible_ones(
    machine: Machine,
) -> None:
    machine([gpu(i) for i in range(8)], visible="4,5")
    with pytest.raises(BatchrunError) as caught:
        worker_envs("vllm", ["0", "4"], 1, None)
    assert str(caught.value) == (
        "--gpus 0,4: 4 is not a visible GPU; visible: 0 (4: NVIDIA H100 80GB HBM3), "
        "1 (5: NVIDIA H100 80GB HBM3) (--gpus takes ordinals within that list, or UUIDs)"
    )


@pytest.mark.parametrize("value", ["NoDevFiles", "", "-1", "none"])
def test_cuda_visible_devices_that_means_no_gpu(machine: Machine, value: str) -> None:
    """Slurm's NoDevFiles (and "", -1, none) hide every GPU: the workers run on the CPU, and
    the value is never taken as a device name."""
    machine([gpu(i) for i in range(2)], visible=value)
    assert devices.visible_devices().gpus == []
    envs = worker_envs("vllm", None, 1, None)
    assert all("CUDA_VISIBLE_DEVICES" not in env for env in envs)
    with pytest.raises(BatchrunError, match=r"^--gpus 0: 0 is not a visible GPU; no GPU is"):
        worker_envs("vllm", ["0"], 1, None)


def test_all_means_every_gpu(machine: Machine) -> None:
    machine([gpu(i) for i in range(3)], visible="all")
    assert worker_envs("vllm", None, 1, None) == gpu_envs("0", "1", "2")


def test_mig_slices_are_the_devices_and_tensor_parallelism_across_them_is_refused(
    machine: Machine,
) -> None:
    slices = [mig(1, 0), mig(1, 1, "3g.40gb")]
    machine([gpu(0), gpu(1, A100, mig=slices)])
    listed = devices.visible_devices().gpus
    assert [(g.id, g.entry, g.name, g.mig, g.memory_total_mib) for g in listed] == [
        (0, "0", "NVIDIA H100 80GB HBM3", None, 81559),
        (1, slices[0]["uuid"], A100, "1g.10gb", 10240),
        (2, slices[1]["uuid"], A100, "3g.40gb", 40960),
    ]
    assert worker_envs("vllm", ["1", "2"], 1, None) == gpu_envs(
        slices[0]["uuid"], slices[1]["uuid"]
    )
    with pytest.raises(BatchrunError) as caught:
        worker_envs("vllm", ["1", "2"], 2, None)
    assert str(caught.value) == (
        f"--tensor-parallel-size 2 cannot span MIG slices ({slices[0]['uuid']},"
        f"{slices[1]['uuid']}): CUDA gives a process one slice; run --tensor-parallel-size 1 "
        "(one worker per slice), or use whole GPUs"
    )


def test_gpus_left_over_by_the_grouping_are_named(machine: Machine) -> None:
    machine([gpu(i) for i in range(3)])
    layout = devices.group_gpus(devices.visible_devices().gpus, 2, None)
    assert [[g.entry for g in group] for group in layout.groups] == [["0", "1"]]
    assert [g.entry for g in layout.idle] == ["2"]


def test_a_failing_nvidia_smi_is_an_error_never_no_gpu(machine: Machine) -> None:
    machine(
        [gpu(0)],
        fail={
            "code": 9,
            "message": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        },
    )
    with pytest.raises(BatchrunError) as caught:
        worker_envs("vllm", None, 1, None)
    assert str(caught.value) == (
        "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate with "
        "the NVIDIA driver.: the GPUs cannot be known; fix the driver, or pass --device cpu"
    )
    # The echo engine takes no GPU: it never asks.
    assert worker_envs("echo", None, 1, 2) == [{}, {}]


def test_a_hung_nvidia_smi_is_cut_off_and_named(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine([gpu(0)], hang=True)
    monkeypatch.setenv("BATCHRUN_NVIDIA_SMI_TIMEOUT", "0.5")
    started = time.monotonic()
    with pytest.raises(nvidia.NvidiaSmiError, match=r"^nvidia-smi did not answer within 0.5 s$"):
        devices.visible_devices()
    assert time.monotonic() - started < 5


def test_no_nvidia_smi_is_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", no_nvidia_smi_path(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.visible_devices().gpus == []
    assert device_key([{}]) == "cpu"


def test_the_cache_key_is_each_worker_s_own_device(machine: Machine) -> None:
    """Not nvidia-smi's first GPU: a worker on an A100 (or on a MIG slice) is keyed by it."""
    slices = [mig(2, 0)]
    machine([gpu(0), gpu(1, A100, memory_mib=81920), gpu(2, A100, mig=slices)])
    assert device_key([{"CUDA_VISIBLE_DEVICES": "1"}]) == "cuda:NVIDIA A100-SXM4-80GB 81920MiB"
    assert (
        device_key([{"CUDA_VISIBLE_DEVICES": slices[0]["uuid"]}])
        == "cuda:NVIDIA A100-SXM4-80GB 10240MiB MIG 1g.10gb"
    )
    assert device_key(gpu_envs("0", "0")) == "cuda:NVIDIA H100 80GB HBM3 81559MiB"
    assert device_key(gpu_envs("0,1")) == (
        "cuda:NVIDIA H100 80GB HBM3 81559MiB,NVIDIA A100-SXM4-80GB 81920MiB"
    )
    assert device_key([{"CUDA_VISIBLE_DEVICES": ""}]) == "cpu"


def test_nvidia_smi_listing_with_mig_is_read() -> None:
    text = (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n"
        "  MIG 2g.20gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0a9b1c2d-0000-1111-2222-333344445555)\n"
    )
    listed = nvidia.parse_listing(text)
    assert [(g.index, g.name, [(s.index, s.profile) for s in g.migs]) for g in listed] == [
        (0, "NVIDIA A100-SXM4-80GB", [(0, "1g.10gb"), (1, "2g.20gb")]),
        (1, "NVIDIA H100 80GB HBM3", []),
    ]
    assert listed[0].migs[1].uuid == "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb"


def test_torch_s_cuda_version_from_its_label() -> None:
    assert torch_cuda_version("2.13.0+cu128") == "12.8"
    assert torch_cuda_version("2.11.0+cu130") == "13.0"
    assert torch_cuda_version("2.13.0+cpu") is None
    assert torch_cuda_version("2.13.0") == "unknown"
    assert torch_cuda_version(None) is None


def test_search_ceiling_is_vllms_own_default_for_the_workers_gpus(machine: Machine) -> None:
    """Left out, --max-batch-size is vLLM's own default for the device (1024 on an H100), not the
    CPU's 256; the smallest device of a job decides; workers with no GPU get 256."""
    machine([gpu(0), gpu(1, name="NVIDIA L4", memory_mib=23034), gpu(2, name=A100)])
    assert devices.batch_ceiling(gpu_envs("0")) == 1024
    assert devices.batch_ceiling(gpu_envs("0", "1")) == 256
    # vLLM gives an A100 80GB the smaller default (its "a100" exception), as batchrun does.
    assert devices.batch_ceiling(gpu_envs("2")) == 256
    assert devices.batch_ceiling([{"CUDA_VISIBLE_DEVICES": ""}]) == 256
