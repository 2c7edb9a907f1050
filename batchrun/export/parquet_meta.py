"""The pandas metadata results.parquet carries, so that pandas reads its columns as it would
have written them, built without importing pandas."""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

# Integer columns that may be null (status_code: an invalid line's is), read back by pandas as
# Int32, not as float64 when any row is null and as int32 otherwise: the same dtype in every file.
_NULLABLE_INTS = {"status_code"}


def pandas_metadata(pa: Any, schema: Any) -> dict[bytes, bytes] | None:
    """The metadata pyarrow writes for a pandas frame of `schema`'s columns (object columns for
    text and nested values), built without pandas (its import alone takes a fifth of a second);
    None where pandas is not installed."""
    try:
        pandas_version = importlib.metadata.version("pandas")
    except importlib.metadata.PackageNotFoundError:
        return None

    def numpy_name(t: Any) -> str:
        return {"double": "float64", "float": "float32"}.get(str(t), str(t))  # ints: their own

    def pandas_type(t: Any) -> str:
        if pa.types.is_string(t):
            return "unicode"
        if pa.types.is_list(t):
            return f"list[{pandas_type(t.value_type)}]"
        if pa.types.is_nested(t):
            return "object"
        return numpy_name(t)

    columns = [
        {
            "name": col.name,
            "field_name": col.name,
            "pandas_type": pandas_type(col.type),
            "numpy_type": (
                "Int32"
                if col.name in _NULLABLE_INTS
                else "object"
                if pa.types.is_string(col.type) or pa.types.is_nested(col.type)
                else numpy_name(col.type)
            ),
            "metadata": None,
        }
        for col in schema
    ]
    pandas = {
        "index_columns": [],
        "column_indexes": [],
        "columns": columns,
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": pandas_version,
    }
    return {b"pandas": json.dumps(pandas).encode("utf8")}
