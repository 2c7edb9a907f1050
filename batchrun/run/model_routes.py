"""Several base models in one job, run model by model: each model's lines in a pass of their own
(the run, then its retry passes), the workers stopped and started with the next model between
passes, so that each worker starts each model's engine once per run. The journal, the job's
state, resume, retry-failed, the poison isolation and export see nothing of it: a request is a
request, whichever model answers it, and a resume killed mid-job runs what is left of each model.

A one-model job (adapters or not) is one pass, as before: `ModelRoute.names` has one name and no
filter. With several workers (GPUs) and several models with work left, the run pass is one pass
of all of them at once instead: the workers shared out among the models by each one's share of
the work (run/lanes.py); the retry passes stay model by model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.job.manifest import Manifest
from batchrun.models.adapters import prepare_adapters
from batchrun.models.config_file import vocab_size
from batchrun.models.named import adapters_of, model_names, settings_for
from batchrun.openai.records import Request
from batchrun.openai.routing import KnownModels, named_model
from batchrun.openai.token_ids import Vocabularies
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.model_prep import prepare_model
from batchrun.run.options import Notify
from batchrun.run.source import InputIndex, requests

if TYPE_CHECKING:
    from batchrun.run.scheduler import Scheduler


def prepare_models(settings: EngineSettings, notify: Notify) -> KnownModels | None:
    """Find each model and check each adapter before a run (run/model_prep.py, models/adapters.py);
    returns the names lines may give (None: one model, no adapters, any one name)."""
    if not settings.models:
        prepare_model(settings, notify)  # the base's served name is known from here on
        check_served_names(settings)
        return prepare_adapters(settings)
    names = model_names(settings)
    check_served_names(settings)
    for adapter in settings.lora_modules:
        base = adapter.get("base_model_name")
        if base is not None and base not in names:
            raise BatchrunError(
                f"adapter {adapter['name']!r} is for the base model {base!r}, but the job runs "
                f"{', '.join(names)}"
            )
    for entry in settings.models:
        one = settings_for(settings, entry["name"])
        prepare_model(one, notify)
        entry["model"], entry["commit"] = one.model, one.model_commit
        prepare_adapters(one)  # sets the fingerprints of the adapters, shared with `settings`
    first = settings.models[0]
    settings.model, settings.model_commit = first["model"], first["commit"]
    settings.model_name = first["name"]
    return known_models(settings)


def check_served_names(settings: EngineSettings) -> None:
    """Refuse an adapter named like a base model: served names (base models and adapters) are
    one namespace, since a line's body.model picks one of them, and a name meaning two things
    would be answered by whichever the router tries first (BatchrunError, before a job exists)."""
    names = model_names(settings)
    which = "the job's base model" if len(names) == 1 else "one of the job's models"
    for adapter in settings.lora_modules:
        if adapter["name"] in names:
            raise BatchrunError(
                f"adapter {adapter['name']!r} has the name of {which}; give it another name"
            )


def known_models(settings: EngineSettings) -> KnownModels | None:
    """The names a line's body.model may give: every base model's and adapter's (None for a
    one-model job without adapters)."""
    if not settings.models:
        if not settings.lora_modules:
            return None
        return KnownModels(settings.model_name, tuple(a["name"] for a in settings.lora_modules))
    names = model_names(settings)
    owners = tuple((a["name"], name) for name in names[1:] for a in adapters_of(settings, name))
    return KnownModels(
        names[0],
        tuple(a["name"] for a in settings.lora_modules),
        others=tuple(names[1:]),
        adapter_bases=owners,
    )


def vocabularies(settings: EngineSettings) -> Vocabularies | None:
    """The vocabulary size of each of the job's base models (after prepare_models), against
    which its lines' token ids are checked (openai/token_ids.py); None when none is known (an
    engine that loads no model here, a .gguf file, a hub snapshot without its config.json)."""
    sizes: dict[str, int] = {}
    for name in model_names(settings):
        size = vocab_size(settings_for(settings, name) if settings.models else settings)
        if size is not None:
            sizes[name] = size
    return Vocabularies(sizes, known_models(settings)) if sizes else None


def submitted_models(manifest: Manifest) -> KnownModels | None:
    """The names a job's lines were checked against when it was submitted (None: one model
    without adapters, any one name)."""
    return known_models(EngineSettings.from_dict(manifest.engine))


def job_vocabularies(manifest: Manifest) -> Vocabularies | None:
    """The vocabulary sizes a job's lines were checked against when it was submitted (None: a
    job from before they were, or whose models' sizes were not known)."""
    if not manifest.vocab_sizes:
        return None
    return Vocabularies(manifest.vocab_sizes, submitted_models(manifest))


class ModelRoute:
    """Which base model answers each request, and the switch between the models' passes."""

    def __init__(self, settings: EngineSettings, cache_dir: Path | None = None) -> None:
        self.settings = settings
        self.known = known_models(settings) if settings.models else None
        self.names = model_names(settings)
        self.cache_dir = cache_dir
        self.current: str | None = None

    def name_of(self, request: Request) -> str:
        """The base model's name that answers `request` (the name answers report for a line
        naming none)."""
        if self.known is None:
            return self.names[0]
        model = request.body.get("model")
        return self.known.base_of(model if isinstance(model, str) and model else None)

    def record_name(self, request: Request) -> str:
        """What a request's journal record names as its model: the name its line gave (a base
        model or an adapter), else the model that answers it."""
        return named_model(request.body, self.settings.model_name)

    def only(self, name: str, want: Callable[[Request], bool]) -> Callable[[Request], bool]:
        """`want` restricted to the requests model `name` answers."""
        if self.known is None:
            return want
        return lambda r: want(r) and self.name_of(r) == name

    def counts(
        self, want: Callable[[Request], bool], input_path: Path, index: InputIndex | None
    ) -> dict[str, int]:
        """How many of the requests `want` takes each model answers (read from the input)."""
        counts = dict.fromkeys(self.names, 0)
        for request in requests(input_path, want, index):
            counts[self.name_of(request)] += 1
        return counts

    def ids_of(
        self, name: str, ids: set[str], input_path: Path, index: InputIndex | None
    ) -> set[str]:
        """Those of `ids` whose requests model `name` answers (read from the input)."""
        if self.known is None:
            return ids
        want = self.only(name, lambda r: r.custom_id in ids)
        return {r.custom_id for r in requests(input_path, want, index)}

    def use(self, scheduler: Scheduler, name: str) -> None:
        """Run what comes next on model `name`: the workers stop (they hold nothing between
        passes) and start with it when next needed; the answer cache is that model's."""
        if self.known is None or name == self.current:
            return
        settings = settings_for(self.settings, name)
        if self.current is not None:
            scheduler.reporter.event(f"switching to model {name}")
        answers = None if self.cache_dir is None else AnswerCache.open(self.cache_dir, settings)
        scheduler.switch_model(settings, answers)
        self.current = name
