"""How long the engine pool keeps its kind (generate or embed) for a batch of the other kind:
KIND_SWITCH_S, or BATCHRUN_SERVE_KIND_SWITCH_S when set (docs/serve-kinds.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from batchrun.errors import BatchrunError

# A switch of the engine pool between generate and embed batches stops one set of engines and
# starts another (on GPUs, minutes of loading weights). So when a batch of the other kind comes
# first in the queue's order, the pool keeps its kind while that kind has work left (its
# batches' passes, and new batches of it), and, its work done, until it has run KIND_SWITCH_S
# in all; either way no longer than that batch has waited KIND_SWITCH_S. Batches of the two
# kinds arriving in turn then cost at most one switch per KIND_SWITCH_S, not one per batch,
# and none waits much more than KIND_SWITCH_S for its kind's engines (docs/serve-kinds.md).
KIND_SWITCH_ENV = "BATCHRUN_SERVE_KIND_SWITCH_S"
KIND_SWITCH_S = 120.0


def kind_switch_after(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds a batch of another kind waits before the pool switches to it (KIND_SWITCH_S, or
    BATCHRUN_SERVE_KIND_SWITCH_S when set).

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
