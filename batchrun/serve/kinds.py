"""How long the engine pool may keep its kind (generate or embed) while a batch of the other
kind waits: KIND_SWITCH_S, or BATCHRUN_SERVE_KIND_SWITCH_S when set (docs/serve-kinds.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from batchrun.errors import BatchrunError

# A switch stops one set of engines and starts another (on GPUs, minutes of loading weights);
# how this bound holds the pool to its kind and when it switches: serve/kind_switch.py.
KIND_SWITCH_ENV = "BATCHRUN_SERVE_KIND_SWITCH_S"
KIND_SWITCH_S = 120.0


def kind_switch_after(environ: Mapping[str, str] = os.environ) -> float:
    """The longest a batch of another kind waits while the pool's kind has work, before the pool
    switches to it (KIND_SWITCH_S, or BATCHRUN_SERVE_KIND_SWITCH_S when set).

    Raises:
        BatchrunError: the variable is not a number of seconds, 0 or more.
    """
    raw = environ.get(KIND_SWITCH_ENV, "").strip()
    if not raw:
        return KIND_SWITCH_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise BatchrunError(
            f"{KIND_SWITCH_ENV} must be a number of seconds, 0 or more, not {raw!r}"
        )
    return seconds
