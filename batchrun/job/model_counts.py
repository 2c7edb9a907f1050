"""A job's counts per model and per LoRA adapter, for `status --json`'s `models` and the tables:
requests, completed, failed, pending, tokens.

The requests per model are counted when the input is validated (the manifest's
`model_requests`); what finished, from the job's summary, which folds each journal record under
the model it names (job/summary_counts.py). A job of one model and no adapters has one entry,
its whole counts.
"""

from __future__ import annotations

from typing import Any

from batchrun.job.manifest import Manifest
from batchrun.job.summary_counts import Summary
from batchrun.job.tally import ModelFigures


def model_counts(
    manifest: Manifest, summary: Summary, job_tokens_per_s: float | None = None
) -> dict[str, dict[str, Any]]:
    """Each base model's and adapter's counts, by the name lines give (`adapter_of`: the base
    model an adapter runs on; None for a base model). A job of one model and no adapters has one
    entry, the job's whole counts and its throughput (`job_tokens_per_s`, over the run time)."""
    engine = manifest.engine
    bases = [m["name"] for m in engine.get("models") or []] or [manifest.model or "model"]
    owners = {
        a["name"]: a.get("base_model_name") or bases[0] for a in engine.get("lora_modules") or []
    }
    if not manifest.model_requests:
        whole = ModelFigures(
            [summary.done, summary.succeeded, summary.prompt_tokens, summary.completion_tokens,
             summary.engine_attempts, summary.engine_completion_tokens, None]
        )  # fmt: skip
        return {bases[0]: _row(manifest.requests, whole, None, job_tokens_per_s)}
    names = [*bases, *owners]
    names += [n for n in manifest.model_requests if n not in names]  # none: kept for safety
    return {
        name: _row(
            manifest.model_requests.get(name, 0),
            summary.per_model.get(name) or ModelFigures(),
            owners.get(name),
        )
        for name in names
    }


def _row(
    requests: int, counts: ModelFigures, adapter_of: str | None, tokens_per_s: float | None = None
) -> dict[str, Any]:
    return {
        "adapter_of": adapter_of,
        "requests": requests,
        "completed": counts.succeeded,
        "failed": counts.done - counts.succeeded,
        "pending": max(0, requests - counts.done),
        "tokens": {"prompt": counts.prompt_tokens, "completion": counts.completion_tokens},
        # The engine's generated tokens a second of the model's own active time (the time one
        # of its attempts was in the engine: job/tally.py), so a model that waited its turn
        # in a job of several is not diluted; the job's throughput for a job of one model.
        "completion_tokens_per_s": counts.tokens_per_s() if tokens_per_s is None else tokens_per_s,
    }


def several(models: dict[str, dict[str, Any]]) -> bool:
    """Whether the per-model table says more than the job's own counts (several models, or an
    adapter)."""
    return len(models) > 1 or any(row["adapter_of"] for row in models.values())
