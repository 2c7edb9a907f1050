"""Several base models in one job (`--model NAME=PATH_OR_HUB_ID`, repeated): parsed, checked,
saved with the job, and each one's settings for the pass that runs its lines.

A `--model` value holding `=` is the named form; a hub id (ORG/NAME) never holds one, and a path
that does is written with its name first (`--model m=/data/a=b`: the first `=` splits). One named
value is the same as `--model PATH --served-model-name NAME`; two or more make a job of several
models, saved as EngineSettings.models [{"name", "model"}] (the first also in `model` and
`served_model_name`, so that everything reading one model sees the first). Lines then name
their model in body.model (openai/routing.py); an adapter belongs to the model its JSON form's
`base_model_name` names, else to the first.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from batchrun.config import EngineSettings, OptionError

NamedModel = dict[str, Any]


def split_model_values(values: list[str] | None) -> tuple[str | None, list[str] | None]:
    """--model's values as given: (the plain value, None), or (None, the NAME=PATH values)."""
    if not values:
        return None, None
    if len(values) == 1 and "=" not in values[0]:
        return values[0], None
    return None, list(values)


def parse_models(values: list[str]) -> list[NamedModel]:
    """The models of `--model NAME=PATH` values, each {"name", "model"} (an existing path made
    absolute, a hub id as given). OptionError (a usage error) for a plain value among named
    ones, an empty name or path, or a name given twice."""
    models: list[NamedModel] = []
    for value in values:
        if "=" not in value:
            raise OptionError(
                "--model",
                f"mixes a plain value with NAME=PATH values ({value!r}); with several models "
                "give each as NAME=PATH",
            )
        name, model = (part.strip() for part in value.split("=", 1))
        if not name:
            raise OptionError("--model", f"gives a model no name: {value!r}")
        if not model:
            raise OptionError("--model", f"gives the model {name!r} no path or hub id: {value!r}")
        if any(m["name"] == name for m in models):
            raise OptionError("--model", f"names the model {name!r} twice")
        path = Path(model).expanduser()
        models.append({"name": name, "model": str(path.absolute()) if path.exists() else model})
    return models


def apply_models(settings: EngineSettings, models: list[NamedModel], given: set[str]) -> None:
    """Put parsed --model NAME=PATH values into `settings` (`given`: the other options given,
    some of which apply to one model only)."""
    if "served_model_name" in given:
        raise OptionError(
            "--served-model-name",
            "cannot be given with --model NAME=PATH (NAME is the name answers report)",
        )
    if len(models) > 1:
        for option in ("revision", "tokenizer"):
            if option in given or getattr(settings, option) is not None:
                raise OptionError(
                    "--" + option, "applies to one model; leave it out with several --model"
                )
    settings.model = models[0]["model"]
    settings.served_model_name = models[0]["name"]
    settings.models = models if len(models) > 1 else []


def merge_models(old: list[NamedModel], new: list[NamedModel]) -> None:
    """Refuse --model values given to resume or retry-failed that rename a job's models: its
    lines were checked against the names (their paths may change)."""
    if [m["name"] for m in old] != [m["name"] for m in new]:
        names = ", ".join(m["name"] for m in old)
        raise OptionError(
            "--model",
            f"cannot change a job's model names (its lines were checked against them): the job "
            f"has {names}; give the same names, or submit a new job",
        )


def adapters_of(settings: EngineSettings, name: str) -> list[dict[str, Any]]:
    """The adapters of the base model `name`: those whose base_model_name names it, and (for
    the first model) those naming none."""
    first = settings.models[0]["name"] if settings.models else settings.model_name
    return [
        a
        for a in settings.lora_modules
        if a.get("base_model_name") == name or (a.get("base_model_name") is None and name == first)
    ]


def model_names(settings: EngineSettings) -> list[str]:
    """The job's base models' names, the first one first (one name for a one-model job)."""
    return [m["name"] for m in settings.models] or [settings.model_name]


def settings_for(settings: EngineSettings, name: str) -> EngineSettings:
    """The settings a worker runs the model `name` with (the job's own for a one-model job)."""
    if not settings.models:
        return settings
    model = next(m for m in settings.models if m["name"] == name)
    return dataclasses.replace(
        settings,
        model=model["model"],
        served_model_name=name,
        model_name=name,
        model_commit=model.get("commit"),
        lora_modules=adapters_of(settings, name),
        models=[],
    )


def apply_given_models(
    settings: EngineSettings, values: list[str], given: set[str]
) -> tuple[list[str], list[str]] | None:
    """Put --model NAME=PATH values (as typed) over `settings`, a job's saved ones or the
    defaults; returns (old, new) as NAME=PATH texts when they change what the settings held."""
    new = parse_models(values)
    if settings.models:
        merge_models(settings.models, new)
        old = [f"{m['name']}={m['model']}" for m in settings.models]
    else:
        old = [f"{settings.served_model_name or settings.model_name}={settings.model}"]
    texts = [f"{m['name']}={m['model']}" for m in new]
    if texts == old:
        return None
    apply_models(settings, new, given)
    return old, texts


def refuse_more_models(one_model: bool, settings: EngineSettings) -> None:
    """Refuse --model values that make a job of one model (`one_model`: before they were put
    over it) a job of several: its lines were read by the one-model rules."""
    if one_model and settings.models:
        raise OptionError(
            "--model",
            f"cannot give the job of one model ({settings.model_name}) several models: its "
            "lines were checked for one; submit a new job",
        )


def refuse_plain_model(settings: EngineSettings) -> None:
    """Refuse a plain --model given to resume or retry-failed for a job of several models."""
    if settings.models:
        names = ", ".join(model_names(settings))
        raise OptionError(
            "--model", f"the job runs several models ({names}); give each as NAME=PATH"
        )
