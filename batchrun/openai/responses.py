"""The old name of batchrun.openai.response_bodies, kept only while batchrun/workers/child.py
(being changed elsewhere) imports it: point that import at response_bodies, then delete this."""

from __future__ import annotations

from batchrun.openai.response_bodies import failure, holds_no_float

__all__ = ["failure", "holds_no_float"]
