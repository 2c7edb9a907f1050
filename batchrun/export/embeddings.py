"""An embedding as a body holds it (a float list, or OpenAI's base64 of little-endian float32):
its size read from the raw JSON, its floats; and an embeddings body as its request asked for it.

The journal keeps every vector as base64 float32 (openai/vectors.py); a body that begins with
`"export_encoding": "float"` was asked for floats, and `float_body` writes it so: each value the
float64 of the engine's float32 (its shortest round-trip text), NaN and the infinities as null
(JSON has neither; OpenAI's API and vLLM's server write null too). A base64 request's body, and a
float list journaled by an earlier version, are written as they are.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from array import array
from typing import Any

import msgspec

from batchrun.openai.vectors import FLOAT_MARK, FLOAT_MARK_PREFIX, float32_values, json_floats

_DECODER = msgspec.json.Decoder()
# The characters of base64 text (padding included): what `bytes.translate` deletes.
_BASE64_TEXT = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_ENCODER = msgspec.json.Encoder()


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
        text = data[1:-1]
        if len(text) % 4 == 0 and not text.translate(None, _BASE64_TEXT):
            # Its size from its length, not decoding it (export reads every vector once more).
            return (len(text) * 3 // 4 - (len(text) - len(text.rstrip(b"=")))) // 4
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


def embedding_value(vector: object) -> bytes | list[float] | None:
    """An embedding for a column: a base64 vector as its float32 bytes (not decoded into
    floats: results.parquet takes them as they are), a float list as it is; None otherwise."""
    if isinstance(vector, list):
        return vector
    if isinstance(vector, str) and len(vector) % 4 == 0:
        try:
            data = binascii.a2b_base64(vector)
        except (binascii.Error, ValueError):
            return None
        return data[: len(data) // 4 * 4]
    return None


def float_body(raw: bytes) -> bytes | None:
    """The body an embeddings request that asked for floats gets, as JSON, from its journaled
    form; None when `raw` (a journaled body's JSON) is not one, to be written as it is."""
    if not raw.startswith(FLOAT_MARK_PREFIX):
        return None
    try:
        body = _DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    if not isinstance(body, dict):
        return None
    return _ENCODER.encode(as_requested(body))


def as_requested(body: dict[str, Any]) -> dict[str, Any]:
    """A journaled embeddings body as its request asked for it: with `"export_encoding":
    "float"`, that key dropped and each base64 vector a float list; any other body as it is."""
    if body.get(FLOAT_MARK) != "float" or not isinstance(body.get("data"), list):
        return body
    out = {k: v for k, v in body.items() if k != FLOAT_MARK}
    out["data"] = [_float_item(item) for item in body["data"]]
    return out


def _float_item(item: Any) -> Any:
    """One embedding of a journaled body, its base64 vector as floats."""
    if not isinstance(item, dict) or type(item.get("embedding")) is not str:
        return item
    try:
        # Not b64decode(validate=True): its check is a regular expression over the whole text,
        # ten times the decoding's cost; the journal's base64 is batchrun's own.
        data = binascii.a2b_base64(item["embedding"])
    except (binascii.Error, ValueError):
        return item
    return {**item, "embedding": json_floats(float32_values(data))}
