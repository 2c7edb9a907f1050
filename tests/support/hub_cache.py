"""A Hugging Face hub cache built on disk, so that hub ids resolve offline in the tests.

huggingface_hub's layout (which vLLM reads through it): `<HF_HOME>/hub/models--ORG--NAME/` holds
`blobs/<etag>` (the files' contents), `snapshots/<commit>/<file>` (links into blobs) and
`refs/<branch>` (the commit a branch points at). The blobs here link to the files of a model
directory (the packaged default model, converted), so that nothing is copied.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# A commit hash is 40 hex digits; any will do for a cache made by hand.
COMMIT = hashlib.sha1(b"batchrun test snapshot").hexdigest()


def make_hub_cache(
    hf_home: Path,
    source: Path,
    *,
    repo_id: str = HUB_ID,
    commit: str = COMMIT,
    branch: str = "main",
) -> Path:
    """Put the files of model directory `source` into the cache under `hf_home` as `repo_id` at
    `commit`, with `branch` pointing at it; return the snapshot directory."""
    org_name = repo_id.replace("/", "--")
    repo = hf_home / "hub" / f"models--{org_name}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir()):
        if not item.is_file() or item.name.startswith("."):
            continue  # the conversion's marker is no model file
        etag = hashlib.sha256(f"{item.name}:{item.stat().st_size}".encode()).hexdigest()
        blob = repo / "blobs" / etag
        if not blob.exists():
            blob.symlink_to(item.resolve())
        link = snapshot / item.name
        if not link.exists():
            # Relative, as huggingface_hub writes them.
            link.symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs" / branch).write_text(commit, encoding="utf-8")
    return snapshot
