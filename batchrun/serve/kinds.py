"""How long the engine pool may keep its kind (generate or embed) while a batch of the other
kind waits: KIND_SWITCH_S, or BATCHRUN_SERVE_KIND_SWITCH_S when set (docs/serve-kinds.md)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from batchrun.errors import BatchrunError

# A switch of the engine pool between generate and embed batches stops one set of engines and
# starts another (on GPUs, minutes of loading weights). When a batch of the other kind comes
# first in the queue's order, the pool switches as soon as its own kind has no work left
# (nothing pending, nothing in flight): an idle pool holds no batch back. While its kind has
# work (its batches' passes, and new batches of it), it keeps that kind, but no longer than the
# waiting batch has waited KIND_SWITCH_S: then it takes no new work, finishes what it holds and
# switches. So a long batch of one kind cannot hold off the other kind for more than about
# KIND_SWITCH_S, and a busy mix of both kinds switches at most about once per KIND_SWITCH_S.
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
