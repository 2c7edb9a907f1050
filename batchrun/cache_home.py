"""Where batchrun keeps what it caches across jobs on this machine: converted models, the batch
sizes found per set-up (run/tuning.py) and the names an engine's package lists
(engines/names_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Cache root: $BATCHRUN_HOME, else $XDG_CACHE_HOME/batchrun, else ~/.cache/batchrun.

    (BATCHRUN_CACHE_DIR is --cache-dir's, the answers reused across jobs: another cache.)
    """
    explicit = os.environ.get("BATCHRUN_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "batchrun"
