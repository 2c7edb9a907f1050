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


def model_counts(manifest: Manifest, summary: Summary) -> dict[str, dict[str, Any]]:
    """Each base model's and adapter's counts, by the name lines give (`adapter_of`: the base
    model an adapter runs on; None for a base model)."""
    engine = manifest.engine
    bases = [m["name"] for m in engine.get("models") or []] or [manifest.model or "model"]
    owners = {
        a["name"]: a.get("base_model_name") or bases[0] for a in engine.get("lora_modules") or []
    }
    if not manifest.model_requests:
        return {
            bases[0]: _row(
                manifest.requests,
                [
                    summary.done,
                    summary.succeeded,
                    summary.prompt_tokens,
                    summary.completion_tokens,
                    summary.first_time or 0.0,
                    summary.last_time or 0.0,
                ],
                None,
            )
        }
    names = [*bases, *owners]
    names += [n for n in manifest.model_requests if n not in names]  # none: kept for safety
    return {
        name: _row(
            manifest.model_requests.get(name, 0),
            summary.per_model.get(name, [0, 0, 0, 0, 0.0, 0.0]),
            owners.get(name),
        )
        for name in names
    }


def _row(requests: int, counts: list[float], adapter_of: str | None) -> dict[str, Any]:
    done, succeeded, prompt, completion, first, last = (
        counts if len(counts) == 6 else [*counts, 0.0, 0.0]
    )
    span = last - first
    done, succeeded = int(done), int(succeeded)
    return {
        "adapter_of": adapter_of,
        "requests": requests,
        "completed": succeeded,
        "failed": done - succeeded,
        "pending": max(0, requests - done),
        "tokens": {"prompt": int(prompt), "completion": int(completion)},
        # Generated tokens a second, from its first answer to its last (the job's span, for a
        # job of one model; resumes' pauses count, as the job's own throughput's do).
        "completion_tokens_per_s": round(completion / span, 2) if span > 0 else None,
    }


def several(models: dict[str, dict[str, Any]]) -> bool:
    """Whether the per-model table says more than the job's own counts (several models, or an
    adapter)."""
    return len(models) > 1 or any(row["adapter_of"] for row in models.values())
