"""Embeddings as float32 bytes: how a vector travels from the engine to the journal, and how the
journal's form becomes the body a request asked for.

An engine pools float32 values (a float16 model's are widened exactly). A response body holds
each vector as OpenAI's base64 of its little-endian float32 bytes on its way to the journal,
whatever `encoding_format` the request asked: 5,464 bytes of JSON for 1,024 values, where a
JSON float list takes about 20,400, and the bytes are the engine's own, NaN and infinities
included. A body whose request asked for floats (the default) says so with the key
`FLOAT_MARK` ("export_encoding": "float"), its first: export writes such a body's vectors as
float lists (export/embeddings.py) and drops the key. A body without it is written as it is: a
base64 request's, or a float list journaled by an earlier version.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Sequence

# The key, first in a journaled embeddings body, that says its request asked for float lists.
FLOAT_MARK = "export_encoding"
# How a journaled body with that key begins, as the journal's compact JSON writes it.
FLOAT_MARK_PREFIX = b'{"' + FLOAT_MARK.encode() + b'":"float"'


def float32_bytes(values: Sequence[float] | bytes) -> bytes:
    """A vector as little-endian float32 bytes (bytes are taken as such already)."""
    if isinstance(values, (bytes, bytearray, memoryview)):
        return bytes(values)
    packed = array("f", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def float32_values(data: bytes) -> list[float]:
    """The floats of little-endian float32 bytes, each exactly its float32 value."""
    values = array("f")
    values.frombytes(data[: len(data) // 4 * 4])
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def base64_of(data: bytes) -> str:
    """OpenAI's base64 encoding of an embedding's little-endian float32 bytes."""
    return base64.b64encode(data).decode("ascii")


def json_floats(values: list[float]) -> list[float | None]:
    """A vector's floats as JSON can hold them: NaN and the infinities become null, as OpenAI's
    API (and vLLM's server, through pydantic) writes them; every other value is itself."""
    # A sum of float32 values cannot overflow a float64, and NaN or an infinity carries through
    # it: one C loop decides for the whole vector.
    if math.isfinite(sum(values)):
        return values  # type: ignore[return-value]  # list is invariant; no copy on the hot path
    return [x if math.isfinite(x) else None for x in values]
