"""Hugging Face hub ids: found in huggingface_hub's cache (HF_HOME, HF_HUB_CACHE), downloading
only a config.json when online and nothing when HF_HUB_OFFLINE is set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from batchrun.errors import BatchrunError

# -- hub ids ---------------------------------------------------------------------------------------


def is_hub_id(value: str) -> bool:
    """Whether `value` is a syntactically valid Hugging Face repo id (`NAME` or `ORG/NAME`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


@dataclass(frozen=True)
class HubSnapshot:
    """A hub repo found in huggingface_hub's cache: the commit the revision resolved to."""

    repo_id: str
    commit: str
    path: Path


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads ($HF_HUB_CACHE, else $HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE forbids huggingface_hub (and vLLM) any network access."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def resolve_hub(
    repo_id: str, revision: str | None, *, option: str = "--model", need: str | None = "config.json"
) -> HubSnapshot:
    """Find `repo_id` at `revision` the way vLLM and huggingface_hub do: in their cache, or (when
    online) on the hub, downloading only the file `need`. A BatchrunError names the id and
    where it looked when it cannot be found."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    try:
        found = snapshot_download(repo_id, revision=revision, allow_patterns=[need] if need else [])
    except LocalEntryNotFoundError:
        raise BatchrunError(_not_cached(option, repo_id, at)) from None
    except GatedRepoError:
        raise BatchrunError(
            f"{option} {repo_id}: a gated repository on the Hugging Face hub; accept its terms "
            "on huggingface.co and set HF_TOKEN"
        ) from None
    except RevisionNotFoundError:
        raise BatchrunError(
            f"{option} {repo_id}: no revision {revision} on the Hugging Face hub"
        ) from None
    except RepositoryNotFoundError:
        raise BatchrunError(
            f"{option} {repo_id}: no such repository on the Hugging Face hub (or a private one: "
            "set HF_TOKEN)"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BatchrunError(
            f"{option} {repo_id}{at}: the Hugging Face hub failed: {first}"
        ) from None
    path = Path(str(found))
    if need is not None and not (path / need).is_file():
        raise BatchrunError(
            f"{option} {repo_id}{at}: the repository has no {need} (a GGUF-only repository? "
            "download its .gguf file and pass its path, with --tokenizer naming the base model)"
        )
    return HubSnapshot(repo_id=repo_id, commit=path.name, path=path)


def _not_cached(option: str, repo_id: str, at: str) -> str:
    """The one line for a hub id that is neither cached nor downloadable."""
    where = f"not in the Hugging Face cache at {hub_cache_dir()} (set by HF_HOME or HF_HUB_CACHE)"
    if hub_offline():
        # huggingface_hub takes either variable as offline mode.
        flag = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        return (
            f"{option} {repo_id}{at}: {where}, and {flag} is set, so it cannot be "
            f"downloaded; download it first (hf download {repo_id}) or unset {flag}"
        )
    return (
        f"{option} {repo_id}{at}: {where}, and the Hugging Face hub could not be reached; "
        "check the network (or HF_ENDPOINT), or download it where the hub is reachable"
    )


def check_tokenizer(tokenizer: str) -> str:
    """A --tokenizer value: a local directory (made absolute) or a hub id found in the cache."""
    path = Path(tokenizer).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if path.exists():
        raise BatchrunError(
            f"--tokenizer {tokenizer}: a file; expected a tokenizer (or model) directory or a "
            "Hugging Face hub id"
        )
    if not is_hub_id(tokenizer):
        raise BatchrunError(
            f"--tokenizer {tokenizer}: no such directory, and not a Hugging Face hub id (ORG/NAME)"
        )
    # Only the repo must be there: tokenizers come in several file layouts.
    resolve_hub(tokenizer, None, option="--tokenizer", need=None)
    return tokenizer
