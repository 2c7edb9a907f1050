"""The model a job runs: --model checked, or the embedded default model converted once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.run.options import Notify


def prepare_model(settings: EngineSettings, notify: Notify) -> None:
    """Set the model to load and the name responses report: check --model, or convert the
    embedded default model once (in a child process, so that this process, the journal's owner,
    never imports torch or transformers)."""
    from batchrun import models

    if settings.spec.model == "none":
        settings.model_name = Path(settings.model).name if settings.model else "echo"
        return
    if settings.model is not None:
        settings.model, settings.model_name = models.resolve_model(settings.model)
        return
    if not models.default_model_ready():
        models.packaged_gguf()  # a clear message when the package is missing
        notify("converting the embedded default model once (about 20 s)...")
        proc = subprocess.run(
            [sys.executable, "-m", "batchrun.models"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
            raise BatchrunError(f"could not prepare the default model: {last}")
    settings.model_name = models.DEFAULT_MODEL_NAME
