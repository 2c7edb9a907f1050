"""A job's figures as strict JSON (the report page's data): a float that is no finite number (an
overflowed cost, say) is null, never the NaN or Infinity that strict parsers refuse."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every float that is no finite number replaced by None (JSON has none)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def strict_dumps(value: Any, **options: Any) -> str:
    """`json.dumps` of `value` made finite (see `finite`): always strict JSON."""
    return json.dumps(finite(value), allow_nan=False, **options)
