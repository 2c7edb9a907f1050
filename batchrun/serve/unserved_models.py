"""A batch taken up again by a server restarted with another set of `--model` names (or
adapters): each unfinished line naming a model this server does not run ends as an error record
`model_not_found` (as submit's record for an unknown name), journaled once; the other lines run.

Decided on disk, as everything in serve is: the names the batch was accepted with are those its
manifest saved (its engine settings), the names this server runs are its own, and the error
records are in the batch's journal before any line of it runs again (a kill after them: the next
start finds those lines done). The same set of names as the batch's: nothing is read or written.

A server of one model without adapters answers any name (OpenAI's rule: a file names one model,
any name); a batch accepted by such a server keeps that rule on such a server, whatever its name.
A batch accepted for several models (or adapters) and taken up by a server of one model is
checked against that model's name: only its lines (and those naming none) run there.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from batchrun.config import EngineSettings
from batchrun.job.journal_records import ResultRecord, result_record
from batchrun.job.manifest import Manifest
from batchrun.openai.records import Outcome, Request
from batchrun.openai.routing import MODEL_NOT_FOUND, KnownModels
from batchrun.run.model_routes import job_vocabularies, known_models, submitted_models
from batchrun.run.source import InputIndex, requests
from batchrun.serve.router import ActiveJob

# OpenAI answers a request naming a model it does not have with 404.
NOT_FOUND_STATUS = 404
# Records journaled in one append.
APPEND_EVERY = 1024


# The names a batch's lines were checked against when it was accepted (None: one model
# without adapters, any one name).
accepted_models = submitted_models


def served_models(settings: EngineSettings, manifest: Manifest) -> KnownModels | None:
    """The names this server answers a batch's lines with (None: any one name, as before): its
    own models and adapters; or, on a server of one model without adapters, that model's name
    alone for a batch accepted for several models or adapters."""
    known = known_models(settings)
    if known is None and accepted_models(manifest) is not None:
        return KnownModels(settings.model_name)
    return known


def _names(served: KnownModels) -> str:
    """The models a server runs, as submit's `model_not_found` message lists them."""
    if served.others:
        return ", ".join([*served.bases, *sorted(served.adapters)])
    return ", ".join([f"{served.base} (the base model)", *sorted(served.adapters)])


def not_found_message(model: str | None, served: KnownModels) -> str:
    """The error record's message for a line naming a model this server does not run."""
    why = "(it was restarted with other models since the batch was accepted)"
    if model is None:
        return f"body.model is missing and this server runs several models {why}; known: " + (
            _names(served)
        )
    return f"body.model {model!r} is no model of this server {why}; known: {_names(served)}"


def _unserved(model: object, served: KnownModels) -> bool:
    """Whether a line naming `model` in body.model is not answered by `served`'s models."""
    if isinstance(model, str) and model:
        return model not in served
    return served.needs_name


@dataclass
class Unserved:
    """The error records for a batch's unfinished lines of models this server does not run."""

    batch_id: str
    served: KnownModels
    records: list[ResultRecord] = field(default_factory=list)
    by_model: Counter[str] = field(default_factory=Counter)

    def journal(self, job: ActiveJob) -> None:
        """Journal the records into the batch's job (in its state and counts too)."""
        for at in range(0, len(self.records), APPEND_EVERY):
            part = self.records[at : at + APPEND_EVERY]
            job.journal.append(part)
            for rec in part:
                job.state.record(dict(rec))
            job.failed += len(part)

    def line(self) -> str:
        """The server's one line about it, at start-up."""
        models = ", ".join(f"{name} ({n})" for name, n in self.by_model.most_common())
        return (
            f"batch {self.batch_id}: {len(self.records)} unfinished line"
            f"{'s' if len(self.records) != 1 else ''} of model{'s' if len(self.by_model) > 1 else ''}"
            f" {models} end as {MODEL_NOT_FOUND} errors: this server runs "
            + ", ".join([*self.served.bases, *sorted(self.served.adapters)])
        )


def unserved(job: ActiveJob, settings: EngineSettings) -> Unserved | None:
    """The error records for `job`'s unfinished lines (never run, or failed with a retry left)
    whose model the server running `settings` does not run; None when it runs every name the
    batch was accepted with (a restart with the same models reads nothing)."""
    accepted = accepted_models(job.manifest)
    served = served_models(settings, job.manifest)
    if served is None or served == accepted:
        return None
    retry = job.state.retryable(job.facts.max_attempts)

    def want(r: Request) -> bool:
        unfinished = job.state.is_not_done(r) or r.custom_id in retry
        return unfinished and _unserved(r.body.get("model"), served)

    found = Unserved(job.batch_id, served)
    now = round(time.time(), 3)
    # Read by the rules the batch was accepted with: exactly its valid lines, whatever their model.
    index = InputIndex(accepted, job_vocabularies(job.manifest))
    for request in requests(job.facts.input_path, want, index):
        model = request.body.get("model")
        named = model if isinstance(model, str) and model else None
        error = {"code": MODEL_NOT_FOUND, "message": not_found_message(named, served)}
        outcome = Outcome(request.custom_id, False, NOT_FOUND_STATUS, error=error)
        rec = result_record(outcome, request.line, retry.get(request.custom_id, 0) + 1, now)
        rec["model"] = named or job.manifest.model or ""  # status counts it under its model
        found.records.append(rec)
        found.by_model[named or "(none)"] += 1
    return found if found.records else None
