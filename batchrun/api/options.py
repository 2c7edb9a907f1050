"""The Python API's options: the CLI's long options in snake_case (`batch_size=8` is
`--batch-size 8`), made into the core's RunOptions by the path the commands take, and a bad
value refused with the line the CLI prints for it.

The values are checked by the core's own checks (config.py, run/options.py, run/jobs.py), the
ones that also guard what resume saves into a job; the CLI's parser (click) refuses a number out
of range or a choice it does not list before they run, in its own words ("0 is not in the range
1<=x<=2048"), where the API gives the core's ("must be at least 1 and at most 2048, got 0").
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

from batchrun.config import GivenOptions, OptionError
from batchrun.models.named import split_model_values
from batchrun.run.options import RunOptions

# The engine options by GivenOptions field (`models` is --model given NAME=PATH, made here).
ENGINE_OPTIONS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(GivenOptions) if f.name != "models"
)
# Options the CLI repeats (one value, or a list of them).
_REPEATED = frozenset({"model", "lora_modules"})


class EngineOptions(TypedDict, total=False):
    """The engine options run, submit, Job.resume and Job.retry_failed take: the CLI's
    (`batchrun submit --help`, docs/commands.md), in snake_case. On resume and retry_failed
    they replace the job's own, as the CLI's do."""

    engine: str
    model: str | list[str]
    revision: str
    tokenizer: str
    served_model_name: str
    max_model_len: int
    dtype: str
    gpu_memory_utilization: float
    tensor_parallel_size: int
    enforce_eager: bool
    seed: int
    batch_size: int
    min_batch_size: int
    max_batch_size: int
    max_attempts: int
    gpus: str | list[str | int]
    workers: int
    kv_cache_memory_bytes: int
    order: str
    reasoning_parser: str
    device: str
    stall_timeout: float
    request_timeout: float
    start_timeout: float
    lora_modules: str | list[str]
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    allowed_local_media_path: str
    allowed_media_domains: str
    media_fetch_timeout: float
    max_media_bytes: int
    limit_mm_per_prompt: str
    base_url: str
    max_concurrency: int
    priority: int


def flag(name: str) -> str:
    """The CLI's flag of an option (`batch_size` -> `--batch-size`)."""
    return "--" + name.replace("_", "-")


def given_options(function: str, values: Mapping[str, Any]) -> GivenOptions:
    """The engine options given to `function` as the CLI's parser hands them to the core: an
    unknown name is a TypeError naming it, as Python's own is; a value of the wrong kind is
    refused with the core's words; `model` and `lora_modules` take one value or a list, `gpus`
    a list too."""
    hints = typing.get_type_hints(GivenOptions)
    fields: dict[str, Any] = {}
    for name, value in values.items():
        if name not in ENGINE_OPTIONS:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
        if value is None:
            continue  # not given, as a flag left out
        if name in _REPEATED and isinstance(value, str):
            value = [value]
        if name == "gpus" and isinstance(value, list | tuple):
            value = ",".join(str(g) for g in value)
        _check_kind(name, value, hints[name])
        fields[name] = value
    if "model" in fields:  # one plain --model, or NAME=PATH ones (models/named.py)
        fields["model"], fields["models"] = split_model_values(fields["model"])
    return GivenOptions(**fields)


def _check_kind(name: str, value: Any, hint: Any) -> None:
    """Refuse a value the CLI's parser could never have made for this option (OptionError)."""
    kinds = [k for k in typing.get_args(hint) if k is not type(None)]
    kind = typing.get_origin(kinds[0]) or kinds[0]
    if kind is bool:
        ok, what = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, what = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif kind is float:
        ok, what = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif kind is list:
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        what = "a string or a list of strings"
    else:
        ok, what = isinstance(value, str), "a string"
    if not ok:
        raise OptionError(flag(name), f"must be {what}, got {value!r}")


def new_job_options(
    given: GivenOptions,
    *,
    progress: bool,
    ray: str | None,
    cache_dir: str | os.PathLike[str] | None,
) -> RunOptions:
    """A new job's options (submit's): those given over the defaults, as the CLI makes them."""
    options = RunOptions.from_given(given, progress=progress, ray=ray)
    options.cache_dir = Path(cache_dir) if cache_dir is not None else None
    return options


def usage_line(error: OptionError) -> str:
    """The line the CLI prints for a bad option value: click's usage error, which names the
    options (`Invalid value for '--min-batch-size' / '--max-batch-size': ...`); for a value the
    job saved (exit 1), the message alone, as the CLI's `error:` line has it."""
    if error.exit_code != 2:
        return str(error)
    names = " / ".join(repr(option) for option in error.options)
    return f"Invalid value for {names}: {error}"


@contextmanager
def cli_lines() -> Iterator[None]:
    """Raise a bad option as the CLI says it: an OptionError whose message is the CLI's line."""
    try:
        yield
    except OptionError as e:
        raise OptionError(e.options, usage_line(e), exit_code=e.exit_code) from None
