"""A job's run options: those given on the command line over the job's saved ones, their checks,
and the overrides that resume and retry-failed save into the job."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from batchrun.config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MIN_BATCH,
    MAX_ATTEMPTS_LIMIT,
    MAX_BATCH_SIZE,
    EngineSettings,
    GivenOptions,
    OptionError,
    check_gpus,
    check_number,
    parse_gpus,
)
from batchrun.job.manifest import Manifest, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.models.adapters import merge_adapters, parse_lora_modules, same_adapters
from batchrun.models.named import apply_given_models, refuse_more_models, refuse_plain_model
from batchrun.openai.media import use_media_policy
from batchrun.run.media_options import MEDIA_OPTION_PARSERS, media_policy_of
from batchrun.run.planner import DEFAULT_ORDER, ORDERS

# Where the runner says what it does before a run starts (the model conversion, the overrides).
Notify = Callable[[str], None]
# What a command's run of a job does (the manifest's Run.mode): submit's run, tune's search
# alone, resume's run of what is left, retry-failed's pass over what failed.
RunMode = Literal["submit", "tune", "resume", "retry"]


@dataclass
class RunOptions:
    """How to run a job's engine workers (saved in the manifest so `resume` reuses them)."""

    settings: EngineSettings = field(default_factory=EngineSettings)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch_size: int | None = None  # fixed by hand; None: search
    min_batch: int = DEFAULT_MIN_BATCH
    # None: by device (devices.batch_ceiling: vLLM's own default for the workers' GPUs).
    max_batch: int | None = None
    gpus: list[str] | None = None
    workers: int | None = None
    progress: bool = True
    # A Ray cluster address ("local" starts one here); per run, not saved: a job started on Ray
    # can be resumed without it and the other way round.
    ray: str | None = None
    # The dispatch plan (run/planner.py), saved so that resume and retries plan alike.
    order: str = DEFAULT_ORDER
    # --cache-dir: answers reused across jobs (run/answer_cache.py); saved by submit, and
    # a resume or retry-failed given one (flag or BATCHRUN_CACHE_DIR) uses that one instead.
    cache_dir: Path | None = None

    @classmethod
    def from_given(cls, given: GivenOptions, *, progress: bool, ray: str | None) -> RunOptions:
        """The options of a new job: those given, the defaults for the rest."""
        options = cls(progress=progress, ray=ray)
        options.apply(given)
        return options

    def get(self, name: str) -> Any:
        """The value of a GivenOptions field (e.g. `dtype`, `min_batch_size`) in these options."""
        if name in _SETTINGS_FIELDS:
            return getattr(self.settings, name)
        return getattr(self, _RUN_FIELDS.get(name, name))

    def apply(self, given: GivenOptions) -> dict[str, tuple[Any, Any]]:
        """Put the options given over these; returns what changed, as {name: (old, new)}."""
        changed: dict[str, tuple[Any, Any]] = {}
        for name, value in given.given().items():
            if name == "models":  # --model NAME=PATH, given more than once (models/named.py)
                models = apply_given_models(self.settings, value, set(given.given()))
                if models is not None:
                    changed["model"] = models  # said as --model NAME=PATH,...
                continue
            if name == "model":
                refuse_plain_model(self.settings)
            new = parse_gpus(value) if name == "gpus" else value
            if name in MEDIA_OPTION_PARSERS:
                new = MEDIA_OPTION_PARSERS[name](value)
            old = self.get(name)
            if name == "lora_modules":
                new = parse_lora_modules(value)
                if same_adapters(old, new):
                    continue  # their fingerprints stay, checked before the run
            if new == old:
                continue
            changed[name] = (old, new)
            if name in _SETTINGS_FIELDS:
                setattr(self.settings, name, new)
            else:
                setattr(self, _RUN_FIELDS.get(name, name), new)
        return changed

    def check(self) -> None:
        """Refuse values no run could take, before they are saved into a job (OptionError)."""
        self.settings.check()
        # Every command that reads a job's input checks its options first: the reader's media
        # checks use the job's limits from here on (openai/media.py).
        use_media_policy(media_policy_of(self.settings))
        check_number("--max-attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        if self.batch_size is not None:
            check_number("--batch-size", self.batch_size, 1, MAX_BATCH_SIZE)
        check_number("--min-batch-size", self.min_batch, 1, MAX_BATCH_SIZE)
        if self.max_batch is not None:
            check_number("--max-batch-size", self.max_batch, 1, MAX_BATCH_SIZE)
        if self.max_batch is not None and self.min_batch > self.max_batch:
            raise OptionError(
                ("--min-batch-size", "--max-batch-size"),
                f"the lower bound {self.min_batch} is above the upper bound {self.max_batch}",
            )
        if self.workers is not None:
            check_number("--workers", self.workers, 1)
        if self.order not in ORDERS:
            raise OptionError("--order", f"must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.gpus is not None:
            check_gpus(self.gpus)
            tp = self.settings.tensor_parallel_size
            # Known before any worker starts only when the GPUs are named (otherwise the
            # visible ones are counted when the workers start).
            if self.settings.spec.uses_gpus and self.ray is None and len(self.gpus) < tp:
                raise OptionError(
                    ("--tensor-parallel-size", "--gpus"),
                    f"{tp} GPUs per engine need at least {tp} GPUs, but --gpus names "
                    f"{len(self.gpus)}",
                )


# GivenOptions fields that live in EngineSettings, and those named differently in RunOptions.
_SETTINGS_FIELDS = frozenset(
    {
        "engine",
        "model",
        "revision",
        "tokenizer",
        "served_model_name",
        "max_model_len",
        "dtype",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "enforce_eager",
        "seed",
        "kv_cache_memory_bytes",
        "reasoning_parser",
        "device",
        "stall_timeout",
        "request_timeout",
        "start_timeout",
        "lora_modules",
        "max_loras",
        "max_lora_rank",
        "max_cpu_loras",
        "allowed_local_media_path",
        "allowed_media_domains",
        "media_fetch_timeout",
        "max_media_bytes",
        "limit_mm_per_prompt",
        "base_url",
        "max_concurrency",
        "priority",
    }
)
_RUN_FIELDS = {"min_batch_size": "min_batch", "max_batch_size": "max_batch"}


def options_from(manifest: Manifest, progress: bool) -> RunOptions:
    """The options the job saved, as saved: RunOptions.check says which one is bad, if any."""
    bounds = manifest.batch_bounds
    if not (bounds is not None and len(bounds) == 2):
        bounds = [DEFAULT_MIN_BATCH, None]
    return RunOptions(
        settings=EngineSettings.from_dict(manifest.engine),
        max_attempts=manifest.max_attempts,
        batch_size=manifest.batch_size,
        min_batch=bounds[0] or DEFAULT_MIN_BATCH,
        max_batch=bounds[1],
        gpus=manifest.gpus,
        workers=manifest.workers,
        progress=progress,
        order=manifest.order,
        cache_dir=Path(manifest.cache_dir) if manifest.cache_dir else None,
    )


def merge_options(options: RunOptions, given: GivenOptions) -> dict[str, tuple[Any, Any]]:
    """Put the options given over the job's and check the result; returns what changed.

    A bad value given is a usage error (exit 2). A bad value the job saved (by an older
    batchrun, or edited by hand) would fail every run: the message says which option replaces it.
    """
    old_adapters = options.settings.lora_modules
    one_model = not options.settings.models
    changed = options.apply(given)
    refuse_more_models(one_model, options.settings)
    if "lora_modules" in changed:
        # The same names only: the job's lines were checked against them.
        options.settings.lora_modules = merge_adapters(old_adapters, options.settings.lora_modules)
    try:
        options.check()
    except OptionError as e:
        named = {"--" + name.replace("_", "-") for name in given.given()}
        if named & set(e.options):
            raise
        flags = " / ".join(e.options)
        raise OptionError(
            e.options,
            f"the job's saved {flags} {e}; pass {' or '.join(e.options)} to replace it",
            exit_code=1,
        ) from e
    return changed


def save_overrides(
    paths: JobPaths,
    manifest: Manifest,
    options: RunOptions,
    changed: dict[str, tuple[Any, Any]],
    notify: Notify,
) -> list[str]:
    """Save the options that replaced the job's into its manifest, and say so before the run."""
    if not changed:
        return []
    if "batch_size" in changed:
        manifest.batch_size, manifest.batch_size_source = options.batch_size, "fixed"
    elif {"min_batch_size", "max_batch_size"} & changed.keys():
        size = manifest.batch_size
        fixed = manifest.batch_size_source == "fixed"
        top = options.max_batch if options.max_batch is not None else MAX_BATCH_SIZE
        if size and not fixed and not options.min_batch <= size <= top:
            # Found within the old bounds: search again within the new ones.
            manifest.batch_size, manifest.batch_size_source = None, None
    manifest.engine = options.settings.to_dict()
    manifest.model = options.settings.model_name
    manifest.max_attempts = options.max_attempts
    manifest.batch_bounds = [options.min_batch, options.max_batch]
    manifest.gpus = options.gpus
    manifest.workers = options.workers
    manifest.order = options.order
    manifest.overrides.append(
        {"at": time.time(), "options": {k: {"old": o, "new": n} for k, (o, n) in changed.items()}}
    )
    save_manifest(paths, manifest)
    lines = [_describe_override(name, old, new) for name, (old, new) in changed.items()]
    notify("overrides: " + ", ".join(lines))
    return lines


def _describe_override(name: str, old: Any, new: Any) -> str:
    """`--dtype bfloat16 (was banana)`; a switch shows as itself (`--no-enforce-eager`)."""

    def shown(value: Any) -> str:
        if value is None:
            return "not set"
        if isinstance(value, bool):
            return f"--{'' if value else 'no-'}{name.replace('_', '-')}"
        if isinstance(value, list):  # --gpus; --lora-modules as NAME=PATH
            return ",".join(
                f"{v['name']}={v['path']}" if isinstance(v, dict) else str(v) for v in value
            )
        return str(value)

    flag = shown(new) if isinstance(new, bool) else f"--{name.replace('_', '-')} {shown(new)}"
    return f"{flag} (was {shown(old)})"
