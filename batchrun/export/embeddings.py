"""An embedding as a body holds it (a float list, or OpenAI's base64 of little-endian float32):
its size read from the raw JSON, and its floats."""

from __future__ import annotations

import base64
import binascii
import json
import sys
from array import array

import msgspec


def raw_embedding_size(raw: msgspec.Raw) -> int | None:
    """How many floats an embedding (its JSON) holds; None when it is not one."""
    data = bytes(raw)
    if data.startswith(b"["):
        inner = data[1:-1]
        if b'"' in inner or b"[" in inner or b"{" in inner:
            return len(json.loads(data))  # not a flat list of numbers: count what json reads
        # Numbers hold no commas: a flat list's size is its commas, plus one unless empty.
        return inner.count(b",") + 1 if inner.strip() else 0
    if data.startswith(b'"'):  # base64
        try:
            return len(base64.b64decode(json.loads(data), validate=True)) // 4
        except (binascii.Error, ValueError):
            return None
    return None


def embedding(vector: object) -> list[float] | None:
    """An embedding's floats, from a float list or OpenAI's base64 (little-endian float32)."""
    if isinstance(vector, list):
        return vector
    if isinstance(vector, str):
        try:
            raw = base64.b64decode(vector, validate=True)
        except (binascii.Error, ValueError):
            return None
        values = array("f", raw[: len(raw) // 4 * 4])
        if sys.byteorder == "big":
            values.byteswap()
        return values.tolist()
    return None
