"""The rules of a /v1/embeddings body: the input (strings or token ids) and its options."""

from __future__ import annotations

from typing import Any

from batchrun.openai.fields import FieldCheck, check_string, input_items, int_in
from batchrun.openai.invalid import bad, describe, show

MAX_EMBEDDING_INPUTS = 2048
ENCODING_FORMATS = ("float", "base64")
# What body.input must be, as its error messages say.
_NEEDS = "an embeddings request needs a string or an array of them"
_KINDS = "a string, an array of strings, an array of token ids or an array of token id arrays"


def check_input(body: dict[str, Any]) -> None:
    value = input_items(body, _NEEDS, _KINDS)
    if value is None:
        return
    if len(value) > MAX_EMBEDDING_INPUTS:
        bad(f"body.input may hold at most {MAX_EMBEDDING_INPUTS} items, got {len(value)}")
    first = value[0]
    if isinstance(first, int) and not isinstance(first, bool):
        _check_token_ids("body.input", value)
        return
    for i, item in enumerate(value):
        where = f"body.input[{i}]"
        if isinstance(first, str):
            if not isinstance(item, str):
                bad(f"{where} must be a string like the items before it, got {describe(item)}")
            if not item:
                bad(f"{where} must not be empty")
        elif isinstance(first, list):
            if not isinstance(item, list):
                bad(
                    f"{where} must be an array of token ids like the items before it, got {describe(item)}"
                )
            _check_token_ids(where, item)
        else:
            bad(
                f"{where} must be a string, a token id or an array of token ids, got {describe(item)}"
            )


def embedding_inputs(value: Any) -> list[str | list[int]]:
    """A valid embeddings body's `input` as a list of items: strings or token id lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and isinstance(value[0], int):
        return [list(value)]
    return list(value) if isinstance(value, list) else []


def _check_token_ids(where: str, ids: list[Any]) -> None:
    if not ids:
        bad(f"{where} must not be an empty array")
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            bad(
                f"{where}[{i}] must be a token id (a whole number, 0 or more), got {describe(token)}"
            )


def _check_encoding_format(key: str, value: object) -> None:
    if value not in ENCODING_FORMATS:
        bad(
            f"body.{key} must be one of {', '.join(map(repr, ENCODING_FORMATS))}, got {show(value)}"
        )


EMBEDDING_CHECKS: dict[str, FieldCheck] = {
    "encoding_format": _check_encoding_format,
    "dimensions": int_in(1, None),
    "user": check_string,
}
