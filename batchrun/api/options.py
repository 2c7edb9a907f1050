"""The Python API's options: the CLI's long options in snake_case (`batch_size=8` is
`--batch-size 8`), made into the core's RunOptions by the path the commands take, and a bad
value refused with the line the CLI prints for it.

Each value goes first through the click parameter the CLI's command declares for its flag
(batchrun/options/: type, range, choices, the callback's check), so a number out of range or a
choice not listed is refused in the parser's own line, as the CLI's is (`Invalid value for
'--batch-size' (env var: 'BATCHRUN_BATCH_SIZE'): 0 is not in the range 1<=x<=2048.`); then by
the core's checks (config.py, run/options.py, run/jobs.py: options together, such as the
batch-size bounds), whose OptionError is said as the CLI's usage error says it.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

from batchrun.config import GivenOptions, OptionError
from batchrun.models.named import split_model_values
from batchrun.options import engine
from batchrun.options.values import CliLine, cli_value
from batchrun.run.options import RunOptions

# The engine options by name (a GivenOptions field each; `models` is --model's NAME=PATH
# values, made here), as the CLI's table declares them.
_TABLE = {option.name: option for option in engine.ENGINE_OPTIONS}
ENGINE_OPTIONS: tuple[str, ...] = tuple(_TABLE)


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


def given_options(function: str, values: Mapping[str, Any], *, override: bool) -> GivenOptions:
    """The engine options given to `function` as the CLI's parser hands them to the core: an
    unknown name is a TypeError naming it, as Python's own is; each value converted as the
    CLI's command converts its flag (`override`: resume's and retry-failed's, which replace the
    job's own), a bad one refused in its line; `model` and `lora_modules` take one value or a
    list, `gpus` a list too."""
    fields: dict[str, Any] = {}
    for name, value in values.items():
        option = _TABLE.get(name)
        if option is None:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
        if value is None:
            continue  # not given, as a flag left out
        if isinstance(value, str) and typing.get_origin(option.type) is list:
            value = [value]  # a repeated option given once
        if name == "gpus" and isinstance(value, list | tuple):
            value = ",".join(str(g) for g in value)
        fields[name] = cli_value(option, value, override=override)
    if "model" in fields:  # one plain --model, or NAME=PATH ones (models/named.py)
        fields["model"], fields["models"] = split_model_values(fields["model"])
    return GivenOptions(**fields)


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
    except CliLine:
        raise  # the parser's line already
    except OptionError as e:
        raise OptionError(e.options, usage_line(e), exit_code=e.exit_code) from None
