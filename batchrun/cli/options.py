"""The options the commands share: the job directory, --ray, --no-progress, and the engine options
(declared once in batchrun/options/engine.py, which the Python API converts its values through
too), given to submit, tune, resume and retry-failed by a decorator."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from batchrun.config import GivenOptions
from batchrun.models.named import split_model_values
from batchrun.options.engine import ENGINE_OPTIONS


def _job_dir(value: str) -> Path:
    """--job-dir as a path; an empty one would make the current directory the job."""
    if not value.strip():
        raise typer.BadParameter("must name a directory, not be empty")
    return Path(value)


def _job_dir_option(help: str) -> Any:
    """--job-dir (-j, BATCHRUN_JOB_DIR), as a command declares it."""
    return typer.Option(
        "--job-dir",
        "-j",
        envvar="BATCHRUN_JOB_DIR",
        help=help,
        show_default=False,
        parser=_job_dir,
        metavar="DIR",  # typer 0.28 would name it after the parser: <_job_dir>
    )


JobDir = Annotated[Path, _job_dir_option("The job directory.")]
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
# A str, not a Path: a Path would fold the "//" of s3://BUCKET/KEY into one slash.
InputFile = Annotated[
    str,
    typer.Argument(
        help="OpenAI batch input file (JSONL): a path, or a URL (s3://BUCKET/KEY.jsonl, or any fsspec URL whose package is installed) fetched once into the job directory.",
        metavar="INPUT_FILE",
        show_default=False,
    ),
]
NewJobDir = Annotated[
    Path | None,
    _job_dir_option("The job directory to create. \\[default: jobs/<input file name>]"),
]


# --api-key: the remote engine's key. Not an engine option: those are saved into the job, and
# the key must never be. It reaches the workers through this process's environment.
API_KEY_ENV = "BATCHRUN_REMOTE_API_KEY"  # engines/remote/urls.py reads it
_API_KEY = inspect.Parameter(
    "api_key",
    inspect.Parameter.KEYWORD_ONLY,
    default=None,
    annotation=Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="Remote engine: the server's API key, sent as Authorization: Bearer; never "
            "written to the job. \\[default: OPENAI_API_KEY]",
            show_default=False,
            rich_help_panel="Engine options",
        ),
    ],
)


def use_api_key(key: str | None) -> None:
    """Make `--api-key` the key this run's workers send (the environment: never the job)."""
    if key is not None:
        if not key.strip():
            raise typer.BadParameter("must not be empty", param_hint="'--api-key'")
        os.environ[API_KEY_ENV] = key


def engine_options(
    *, override: bool, leave_out: tuple[str, ...] = ()
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the engine options; it receives them packed, as `options: GivenOptions`.

    With `override` (resume, retry-failed) they replace what the job saved; `leave_out` drops
    options a command has no use for (tune searches the batch size: it takes none).
    """
    specs = [o for o in ENGINE_OPTIONS if o.name not in leave_out]

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "options"]
        # A command with its own --api-key (serve: the key its clients send) takes no remote one.
        remote_key = () if "api_key" in signature.parameters else (_API_KEY,)

        @functools.wraps(func)
        def run(**kwargs: Any) -> None:
            if remote_key:
                use_api_key(kwargs.pop("api_key"))
            values = {o.name: kwargs.pop(o.name) for o in specs}
            if "model" in values:  # one plain --model, or NAME=PATH ones (models/named.py)
                values["model"], values["models"] = split_model_values(values["model"])
            given = GivenOptions(**values)
            func(**kwargs, options=given)

        # Typer reads a command's options from its signature.
        params = [*own, *(o.parameter(override=override) for o in specs), *remote_key]
        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return run

    return decorate
