"""A job's status as `batchrun status --json` prints it and `batchrun.Job.status()` returns it:
one strict JSON object, the same for both."""

from __future__ import annotations

import json
import math
from typing import Any


def status_json(status: dict[str, Any]) -> str:
    """`status` (job/status.py's job_status) as one line of strict JSON: a value that is no
    finite number (a probe's rate of an old job, say) is null, never the NaN or Infinity strict
    parsers refuse."""
    return json.dumps(_finite(status), allow_nan=False)


def _finite(value: Any) -> Any:
    """`value` with every float that is no finite number replaced by None (JSON has none)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
