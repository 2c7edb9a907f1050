"""The default model as the tests find it: converted into this session's cache on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.paths import ROOT


def default_model_dir() -> Path:
    """The default model in this session's cache (converted there on first use)."""
    out = subprocess.run(
        [sys.executable, "-m", "batchrun.models"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return Path(out.stdout.strip().splitlines()[-1])


def default_model_with(tmp: Path, name: str, own: str) -> tuple[Path, Path]:
    """A model directory tmp/NAME: the default model's files linked, all but `own`, which the
    caller writes. Returns the new directory and the default model's."""
    source = default_model_dir()
    model = tmp / name
    model.mkdir()
    for item in source.iterdir():
        if item.name != own:
            (model / item.name).symlink_to(item)
    return model, source
