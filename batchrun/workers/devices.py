"""Which GPUs there are, as CUDA numbers them, without importing torch: one worker per GPU or
tensor-parallel group.

GPU ids are CUDA's: an ordinal within this process's visible list (CUDA_VISIBLE_DEVICES when set,
else every GPU nvidia-smi lists, in PCI bus order), or a GPU's (or MIG slice's) UUID. A worker's
CUDA_VISIBLE_DEVICES holds the parent's own entries for the GPUs it takes (`--gpus 0,1` under
CUDA_VISIBLE_DEVICES=4,5,6,7 gives workers 4 and 5), so that a Slurm allocation's GPUs are the
only ones used. A GPU with MIG on counts as its slices (CUDA shows a process slices, never the
parent GPU), given to workers by their MIG UUIDs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from batchrun.engine_registry import EngineSpec, engine_spec
from batchrun.errors import BatchrunError
from batchrun.workers import nvidia
from batchrun.workers.cpu_layout import cpu_worker_envs
from batchrun.workers.cuda_visible import EntryProblem, read_entries, visible_entries
from batchrun.workers.platform_env import DEFAULT_MAX_NUM_SEQS, default_max_num_seqs

DEVICES = ("auto", "cpu", "cuda")
# nvidia-smi's numbering is PCI bus order; CUDA's default is "fastest first". Workers are given
# ids read against nvidia-smi's list, so they must number GPUs the same way.
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@dataclass(frozen=True)
class Gpu:
    """One GPU (or MIG slice) this process may use."""

    id: int  # CUDA's ordinal within the visible list: what --gpus takes
    entry: str  # what a worker's CUDA_VISIBLE_DEVICES holds for it (the parent's own entry)
    uuid: str | None
    name: str | None
    memory_total_mib: int | None
    mig: str | None = None  # the MIG profile (1g.10gb) of a slice; None for a whole GPU

    def to_dict(self) -> dict[str, object]:
        """As `batchrun doctor --json` lists it: its fields but `entry` (the parent's own
        CUDA_VISIBLE_DEVICES entry, which --gpus does not take)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "entry"}

    def describe(self) -> str:
        """`0 (4: NVIDIA H100 80GB HBM3)`: the id --gpus takes, the entry, the model."""
        what = self.name or "unknown GPU"
        if self.mig:
            what += f" MIG {self.mig}"
        entry = f"{self.entry}: " if self.entry != str(self.id) else ""
        return f"{self.id} ({entry}{what})"

    def key(self) -> str:
        """What its cached batch sizes depend on: the model, its memory, the MIG profile."""
        parts = [self.name or self.entry]
        if self.memory_total_mib:
            parts.append(f"{self.memory_total_mib}MiB")
        if self.mig:
            parts.append(f"MIG {self.mig}")
        return " ".join(parts)


@dataclass(frozen=True)
class Visible:
    """The GPUs this process may use, and where the list came from."""

    gpus: list[Gpu]
    # CUDA_VISIBLE_DEVICES as set (None: unset).
    cuda_visible_devices: str | None
    inventory: nvidia.Inventory | None
    # Its entries that make the GPUs other than it says (workers/cuda_visible.py).
    problems: tuple[EntryProblem, ...] = ()


_CACHE: dict[tuple[str, str], tuple[float, nvidia.Inventory | None]] = {}
_CACHE_S = 10.0


def gpu_inventory() -> nvidia.Inventory | None:
    """nvidia-smi's inventory, read at most once every few seconds (the pre-flight check, the
    layout and the cache key all ask). NvidiaSmiError when it fails or hangs."""
    key = (os.environ.get("PATH", ""), os.environ.get("BATCHRUN_NVIDIA_SMI_TIMEOUT", ""))
    hit = _CACHE.get(key)
    if hit is not None and time.monotonic() - hit[0] < _CACHE_S:
        return hit[1]
    found = nvidia.inventory()
    _CACHE.clear()
    _CACHE[key] = (time.monotonic(), found)
    return found


def visible_devices(environ: Mapping[str, str] | None = None) -> Visible:
    """The GPUs this process may use, in CUDA's order. NvidiaSmiError when nvidia-smi is on
    PATH but fails or hangs (and CUDA_VISIBLE_DEVICES does not already say "no GPU")."""
    env = os.environ if environ is None else environ
    value = env.get("CUDA_VISIBLE_DEVICES")
    entries = visible_entries(value)
    if entries == []:
        return Visible([], value, None)
    found = gpu_inventory()
    gpus, problems = read_visible(entries, found)
    return Visible(gpus, value, found, tuple(problems))


def resolve_entries(entries: list[str] | None, found: nvidia.Inventory | None) -> list[Gpu]:
    """The GPUs that CUDA_VISIBLE_DEVICES's `entries` (None: all) name, in their order (see
    `read_visible`)."""
    return read_visible(entries, found)[0]


def read_visible(
    entries: list[str] | None, found: nvidia.Inventory | None
) -> tuple[list[Gpu], list[EntryProblem]]:
    """The GPUs that CUDA_VISIBLE_DEVICES's `entries` (None: all) name, in their order, each
    once, and the entries' problems (workers/cuda_visible.py).

    Without nvidia-smi the entries are taken as they are (name and memory unknown). With it, an
    entry it does not list ends the list, as it ends CUDA's; so does one with any other problem
    (a repeat, an empty entry, the other form of id).
    """
    reading = read_entries(entries, found) if entries is not None else None
    if found is None:
        named = reading.named if reading is not None else []
        gpus = [
            Gpu(i, n.entry, n.entry if n.entry.startswith(("GPU-", "MIG-")) else None, None, None)
            for i, n in enumerate(named)
        ]
        return gpus, reading.problems if reading is not None else []
    units: list[Gpu] = []

    def add(gpu: nvidia.PhysicalGpu, entry: str | None) -> None:
        if not gpu.migs:
            units.append(
                Gpu(len(units), entry or str(gpu.index), gpu.uuid, gpu.name, gpu.memory_total_mib)
            )
            return
        for s in gpu.migs:
            mig_entry = entry if entry == s.uuid else s.uuid
            units.append(
                Gpu(
                    len(units),
                    mig_entry,
                    s.uuid,
                    gpu.name,
                    nvidia.mig_memory_mib(s.profile),
                    s.profile,
                )
            )

    if reading is None:
        for gpu in found.gpus:
            add(gpu, None)
        return units, []
    for item in reading.named:
        physical, mig = item.gpu, item.mig
        assert physical is not None  # nvidia-smi listed it
        if mig is not None:
            units.append(
                Gpu(
                    len(units),
                    item.entry,
                    mig.uuid,
                    physical.name,
                    nvidia.mig_memory_mib(mig.profile),
                    mig.profile,
                )
            )
        else:
            add(physical, item.entry)
    return units, reading.problems


def select_gpus(visible: Visible, requested: list[str] | None) -> list[Gpu]:
    """The visible GPUs `--gpus` picks (None: all of them): ordinals within the visible list, or
    UUIDs. A BatchrunError naming the visible GPUs for an id that names none of them."""
    if requested is None:
        return list(visible.gpus)
    picked: list[Gpu] = []
    for r in requested:
        gpu = _pick(visible.gpus, r)
        if gpu is None:
            raise BatchrunError(
                f"--gpus {','.join(requested)}: {r} is not a visible GPU; "
                f"{describe_visible(visible)} (--gpus takes ordinals within that list, or UUIDs)"
            )
        if gpu in picked:
            raise BatchrunError(f"--gpus {','.join(requested)} names GPU {gpu.id} twice")
        picked.append(gpu)
    return picked


def _pick(gpus: list[Gpu], wanted: str) -> Gpu | None:
    if wanted.isdigit():
        return gpus[int(wanted)] if int(wanted) < len(gpus) else None
    return next((g for g in gpus if wanted in (g.uuid, g.entry)), None)


def describe_visible(visible: Visible) -> str:
    """`visible: 0 (4: NVIDIA H100), 1 (5: NVIDIA H100)`, or why none is."""
    if visible.gpus:
        return "visible: " + ", ".join(g.describe() for g in visible.gpus)
    if (
        visible.cuda_visible_devices is not None
        and visible_entries(visible.cuda_visible_devices) == []
    ):
        return f"no GPU is visible (CUDA_VISIBLE_DEVICES={visible.cuda_visible_devices!r})"
    if visible.inventory is None:
        return "no GPU is visible (no nvidia-smi on PATH)"
    if visible.inventory.gpus and visible.problems:
        return (
            f"no GPU is visible (CUDA_VISIBLE_DEVICES={visible.cuda_visible_devices!r} names none "
            f"of the GPUs nvidia-smi lists: {listed(visible.inventory)})"
        )
    return "no GPU is visible (nvidia-smi lists none)"


def listed(found: nvidia.Inventory) -> str:
    """nvidia-smi's GPUs by index: `0, 1`."""
    return ", ".join(str(g.index) for g in found.gpus)


@dataclass(frozen=True)
class GpuLayout:
    """The workers a GPU job starts: each its GPUs; `idle` the GPUs no group takes."""

    groups: list[list[Gpu]]
    idle: list[Gpu]


def group_gpus(gpus: list[Gpu], tensor_parallel_size: int, workers: int | None) -> GpuLayout:
    """One group of `tensor_parallel_size` GPUs per worker (at most `workers` of them).

    BatchrunError when fewer GPUs than one group needs are given, or a group would span MIG
    slices (CUDA shows a process one slice only: tensor parallelism cannot cross them)."""
    tp = max(1, tensor_parallel_size)
    names = ",".join(g.entry for g in gpus)
    if len(gpus) < tp:
        raise BatchrunError(
            f"--tensor-parallel-size {tp} needs {tp} GPUs, but only {len(gpus)} are given ({names})"
        )
    if tp > 1 and any(g.mig for g in gpus):
        raise BatchrunError(
            f"--tensor-parallel-size {tp} cannot span MIG slices ({names}): CUDA gives a process "
            "one slice; run --tensor-parallel-size 1 (one worker per slice), or use whole GPUs"
        )
    groups = [gpus[i : i + tp] for i in range(0, len(gpus) - tp + 1, tp)]
    taken = len(groups) * tp
    idle = gpus[taken:]
    if workers is not None:
        groups = groups[:workers]
    return GpuLayout(groups, idle)


def gpu_env(group: list[Gpu]) -> dict[str, str]:
    """A GPU worker's environment: its GPUs, numbered as nvidia-smi numbers them."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(g.entry for g in group), **DEVICE_ORDER}


def worker_envs(
    engine: str,
    gpus: list[str] | None,
    tensor_parallel_size: int,
    workers: int | None,
    job: str = "",
    device: str = "auto",
) -> list[dict[str, str]]:
    """The environment of each worker: one per group of `tensor_parallel_size` GPUs.

    An engine that uses no GPU (echo; see engine_registry.py) starts `workers` workers (default
    1). One that does (vLLM), on a machine with no GPU or with `device` "cpu", starts `workers`
    workers (default 1) on the CPU, sharing its cores (`job` names the run in its claim on them).
    """
    if not engine_spec(engine).uses_gpus:
        return [{} for _ in range(workers or 1)]
    if device == "cpu":
        # Hidden from the engine: vLLM's CPU build must not be shown GPUs it cannot use.
        return [
            {**env, "CUDA_VISIBLE_DEVICES": ""} for env in cpu_worker_envs(workers or 1, job=job)
        ]
    try:
        visible = visible_devices()
    except nvidia.NvidiaSmiError as e:
        raise BatchrunError(
            f"{e}: the GPUs cannot be known; fix the driver, or pass --device cpu"
        ) from None
    picked = select_gpus(visible, gpus)
    if not picked:
        if device == "cuda":
            raise BatchrunError(f"--device cuda: {describe_visible(visible)}")
        return cpu_worker_envs(workers or 1, job=job)
    layout = group_gpus(picked, tensor_parallel_size, workers)
    return [gpu_env(g) for g in layout.groups]


# A worker's device for the batch-size cache when the parent cannot see it (a Ray actor's).
DEVICE_KEY_ENV = "BATCHRUN_DEVICE_KEY"


def cache_device(spec: EngineSpec, envs: Sequence[Mapping[str, str]] = ()) -> str:
    """The device part of the batch-size cache key for engine `spec` on workers with
    environments `envs`: the engine's own when it names one, else the workers' GPUs (or cpu)."""
    return spec.cache_device if spec.cache_device is not None else device_key(envs)


def search_ceiling(spec: EngineSpec, envs: Sequence[Mapping[str, str]] = ()) -> int:
    """The top of the batch-size search for engine `spec` when --max-batch-size is left out:
    vLLM's own default for the workers' GPUs (1024 on an H100), else 256."""
    return batch_ceiling(envs) if spec.uses_gpus else DEFAULT_MAX_NUM_SEQS


def device_key(envs: Sequence[Mapping[str, str]]) -> str:
    """The device part of the batch-size cache key of workers with environments `envs`: the
    model, memory and MIG profile of the GPUs each worker's CUDA_VISIBLE_DEVICES names ("cpu"
    for workers with none). A Ray actor's env names its key (DEVICE_KEY_ENV: its cluster's GPUs);
    any other env with no CUDA_VISIBLE_DEVICES is keyed by this process's first visible GPU."""
    keys: list[str] = []
    for env in envs or [{}]:
        key = _worker_key(env)
        if key not in keys:
            keys.append(key)
    return " + ".join(sorted(keys))


def batch_ceiling(envs: Sequence[Mapping[str, str]]) -> int:
    """The top of the batch-size search when --max-batch-size is left out: on GPUs, vLLM's own
    default number of sequences for the smallest of the workers' devices (1024 on an H100,
    256 on smaller ones); on the CPU, 256 (config.DEFAULT_MAX_BATCH)."""
    ceilings = []
    for env in envs or [{}]:
        gpus = _worker_gpus(env)
        if not gpus:
            ceilings.append(DEFAULT_MAX_NUM_SEQS)
            continue
        smallest = min(gpus, key=lambda g: g.memory_total_mib or 0)
        ceilings.append(default_max_num_seqs(smallest.memory_total_mib, smallest.name))
    return min(ceilings)


def _worker_gpus(env: Mapping[str, str]) -> list[Gpu]:
    """The GPUs a worker with environment `env` runs on (a Ray actor's: this process's first)."""
    try:
        if "CUDA_VISIBLE_DEVICES" in env:
            entries = visible_entries(env["CUDA_VISIBLE_DEVICES"])
            gpus = [] if entries == [] else resolve_entries(entries, gpu_inventory())
        else:
            gpus = visible_devices().gpus[:1]
    except nvidia.NvidiaSmiError:
        entries = visible_entries(env.get("CUDA_VISIBLE_DEVICES")) or []
        gpus = resolve_entries(entries, None)
    return gpus


def _worker_key(env: Mapping[str, str]) -> str:
    if DEVICE_KEY_ENV in env:  # a Ray actor's: its cluster's GPUs (workers/plan.py)
        return env[DEVICE_KEY_ENV]
    gpus = _worker_gpus(env)
    if not gpus:
        return "cpu"
    names = [g.key() for g in gpus]
    if len(set(names)) == 1:
        return f"cuda:{names[0]}" + (f" x{len(names)}" if len(names) > 1 else "")
    return "cuda:" + ",".join(names)
