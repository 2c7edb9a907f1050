"""What nvidia-smi says about this machine's GPUs: the GPUs, their MIG slices, the driver.

nvidia-smi is run with a bound on its time (`BATCHRUN_NVIDIA_SMI_TIMEOUT` seconds, default 5): a
GPU fallen off the bus can make it hang. One that is on PATH but fails or hangs is an error that
names it (NvidiaSmiError), never "no GPU": a machine whose GPUs cannot be read must not quietly
run on its CPU. Its absence from PATH is "no GPU".
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 5.0

# `nvidia-smi -L`: a GPU, then its MIG slices (when MIG is on), indented:
#   GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-...)
#     MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-...)
_GPU_LINE = re.compile(r"GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[^)\s]+)\)")
_MIG_LINE = re.compile(r"MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")
_CUDA_VERSION = re.compile(r"CUDA Version:\s*([0-9.]+)")
_DRIVER_VERSION = re.compile(r"Driver Version:\s*([0-9.]+)")
_PROFILE_GB = re.compile(r"\.(\d+)gb$")


class NvidiaSmiError(Exception):
    """nvidia-smi is on PATH but failed or hung: the GPUs cannot be known."""


@dataclass(frozen=True)
class MigSlice:
    """One MIG slice of a GPU, as `nvidia-smi -L` lists it."""

    index: int  # within its GPU
    uuid: str  # MIG-...
    profile: str  # 1g.10gb


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as nvidia-smi lists it (its index is nvidia-smi's: PCI bus order)."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int | None
    migs: tuple[MigSlice, ...] = ()


@dataclass(frozen=True)
class Inventory:
    """What nvidia-smi reported: the GPUs, the driver's version and the CUDA version it supports."""

    gpus: tuple[PhysicalGpu, ...]
    driver: str | None
    cuda: str | None


def timeout_s() -> float:
    """How long one nvidia-smi call may take (BATCHRUN_NVIDIA_SMI_TIMEOUT, default 5 s)."""
    try:
        value = float(os.environ.get("BATCHRUN_NVIDIA_SMI_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def run_smi(*args: str) -> str:
    """nvidia-smi's output for `args`; NvidiaSmiError when it fails or outlives the timeout.

    It runs in its own session, and the whole session is killed on time-out: a hung nvidia-smi
    (or a wrapper script's child) would otherwise hold its pipes open and hang the caller too.
    """
    limit = timeout_s()
    try:
        proc = subprocess.Popen(
            ["nvidia-smi", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
    except OSError as e:
        raise NvidiaSmiError(f"nvidia-smi could not be run: {e.strerror or e}") from None
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise NvidiaSmiError(f"nvidia-smi did not answer within {limit:g} s") from None
    if proc.returncode != 0:
        said = " ".join((err.strip() or out.strip()).split())[:200]
        raise NvidiaSmiError(
            f"nvidia-smi failed (exit {proc.returncode})" + (f": {said}" if said else "")
        )
    return out


def present() -> bool:
    """Whether nvidia-smi is on PATH."""
    return shutil.which("nvidia-smi") is not None


def inventory() -> Inventory | None:
    """The GPUs nvidia-smi lists, with their MIG slices; None when nvidia-smi is not on PATH.

    Raises NvidiaSmiError when it is there but fails or hangs.
    """
    if not present():
        return None
    listing = run_smi("-L")
    rows = run_smi(
        "--query-gpu=index,uuid,name,memory.total,driver_version",
        "--format=csv,noheader,nounits",
    )
    header = run_smi()
    memory: dict[str, int | None] = {}
    drivers: list[str] = []
    for row in rows.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 5:
            continue
        memory[cells[1]] = _integer(cells[3])
        drivers.append(cells[4])
    gpus = [replace_memory(g, memory.get(g.uuid)) for g in parse_listing(listing)]
    driver = _DRIVER_VERSION.search(header)
    cuda = _CUDA_VERSION.search(header)
    return Inventory(
        gpus=tuple(gpus),
        driver=driver.group(1) if driver else (drivers[0] if drivers else None),
        cuda=cuda.group(1) if cuda else None,
    )


def parse_listing(text: str) -> list[PhysicalGpu]:
    """The GPUs and MIG slices of `nvidia-smi -L` output (memory unknown: None)."""
    gpus: list[PhysicalGpu] = []
    for line in text.splitlines():
        gpu = _GPU_LINE.search(line)
        if gpu is not None:
            gpus.append(PhysicalGpu(int(gpu.group(1)), gpu.group(3), gpu.group(2), None))
            continue
        mig = _MIG_LINE.search(line)
        if mig is not None and gpus:
            last = gpus[-1]
            slice_ = MigSlice(int(mig.group(2)), mig.group(3), mig.group(1))
            gpus[-1] = PhysicalGpu(
                last.index, last.uuid, last.name, last.memory_total_mib, (*last.migs, slice_)
            )
    return gpus


def replace_memory(gpu: PhysicalGpu, memory_total_mib: int | None) -> PhysicalGpu:
    """`gpu` with its total memory filled in."""
    return PhysicalGpu(gpu.index, gpu.uuid, gpu.name, memory_total_mib, gpu.migs)


def mig_memory_mib(profile: str) -> int | None:
    """A MIG slice's memory from its profile's name (`1g.10gb` -> 10240 MiB)."""
    found = _PROFILE_GB.search(profile)
    return int(found.group(1)) * 1024 if found else None


def _integer(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
