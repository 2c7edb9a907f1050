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
import binascii
import math
import sys
from array import array
from collections.abc import Sequence
from typing import Any

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


# What an embedding split out of its body (`split_vectors`) leaves in the body's JSON: an empty
# base64 text. No other place in a record can hold these bytes: inside a JSON string every
# quote is escaped, and the keys around a body's are the journal's own.
PLACEHOLDER = b'"embedding":""'


def split_vectors(body: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]] | None:
    """An embeddings body with its vectors taken out: the body with each base64 embedding an
    empty text (`PLACEHOLDER`), and each vector's float32 bytes, in order; None when `body` holds
    none, or one whose base64 would not come back the same (`fill_vectors` must give the
    body's exact text back)."""
    data = body.get("data")
    if body.get("object") != "list" or not isinstance(data, list) or not data:
        return None
    items: list[Any] = []
    vectors: list[bytes] = []
    for item in data:
        text = item.get("embedding") if isinstance(item, dict) else None
        if type(text) is not str:
            items.append(item)
            continue
        try:
            raw = binascii.a2b_base64(text, strict_mode=True)
        except (binascii.Error, ValueError):
            return None
        # Canonical base64 only (padding, no stray bits): what comes back is the same text.
        if binascii.b2a_base64(raw, newline=False) != text.encode("ascii"):
            return None
        vectors.append(raw)
        items.append({**item, "embedding": ""})
    if not vectors:
        return None
    return {**body, "data": items}, vectors


def fill_vectors(data: bytes, vectors: Sequence[bytes]) -> bytes:
    """`data` (a body's JSON, or a journal line holding it) with each `PLACEHOLDER` given its
    vector's base64 back, in order: the bytes before `split_vectors`. ValueError when the
    placeholders and the vectors do not pair up."""
    parts = data.split(PLACEHOLDER)
    if len(parts) != len(vectors) + 1:
        raise ValueError(f"{len(parts) - 1} embeddings in the body, {len(vectors)} vectors")
    out = [parts[0]]
    for vector, rest in zip(vectors, parts[1:], strict=True):
        out += (b'"embedding":"', binascii.b2a_base64(vector, newline=False), b'"', rest)
    return b"".join(out)
