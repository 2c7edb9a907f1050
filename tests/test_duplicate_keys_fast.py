"""The duplicate-key check's quick test (openai/duplicate_keys.py) gives the exact answer: the
same as parsing every line with all its pairs kept, whatever whitespace and escapes the line has."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from batchrun.openai.duplicate_keys import duplicate_key


def reference(raw: bytes) -> tuple[str, str] | None:
    """The first key given twice on the line or in its body: every pair kept, checked by hand."""
    found: dict[int, str] = {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        made = dict(items)
        seen: set[str] = set()
        for k, _ in items:
            if k in seen:
                found.setdefault(id(made), k)
                break
            seen.add(k)
        return made

    obj = json.loads(raw, object_pairs_hook=pairs)
    if id(obj) in found:
        return "", found[id(obj)]
    body = obj.get("body")
    if isinstance(body, dict) and id(body) in found:
        return "body.", found[id(body)]
    return None


def check(raw: bytes) -> tuple[str, str] | None:
    got = duplicate_key(raw, msgspec.json.decode(raw))
    assert got == reference(raw), raw
    return got


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # Compact, as most files are: the count of `":` pairs.
        (b'{"custom_id":"a","body":{"max_tokens":1,"max_tokens":2}}\n', ("body.", "max_tokens")),
        (b'{"custom_id":"a","custom_id":"b","body":{}}\n', ("", "custom_id")),
        (b'{"custom_id":"a","body":{"prompt":"x"}}\n', None),
        # json.dumps' default separators: a space after the colon, none after a quote.
        (b'{"custom_id": "a", "body": {"n": 1, "n": 2}}\n', ("body.", "n")),
        # Whitespace between a key and its colon: the exact search.
        (b'{"custom_id" : "a", "body" : {"n" : 1, "n"\t: 2}}\n', ("body.", "n")),
        (b'{"custom_id" : "a", "body" : {"n" : 1}}\r\n', None),
        # A quote and colon inside a string: more key ends than keys, so the full parse says.
        (b'{"custom_id":"a\\":","body":{"prompt":"b\\":\\":"}}\n', None),
        (b'{"custom_id":"a\\":","body":{"prompt":"x","prompt":"y"}}\n', ("body.", "prompt")),
        # A key given twice deeper down is not the line's nor the body's.
        (b'{"custom_id":"a","body":{"messages":[{"role":"user","role":"x"}]}}\n', None),
        (b'{"custom_id":"a","body":{"messages":[],"m":{},"m":[]}}\n', ("body.", "m")),
    ],
)
def test_duplicate_key_cases(raw: bytes, expected: tuple[str, str] | None) -> None:
    assert check(raw) == expected


def _value(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(6 if depth < 3 else 3)
    if pick == 0:
        return rng.choice(['a":', 'b" :', "c", 'say " hi', "\u00e9"])
    if pick == 1:
        return rng.randrange(100)
    if pick == 2:
        return None
    if pick == 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return _object(rng, depth + 1)


def _object(rng: random.Random, depth: int) -> list[tuple[str, Any]]:
    keys = [rng.choice("abcd") for _ in range(rng.randrange(4))]
    return [(k, _value(rng, depth)) for k in keys]


def _dump(value: Any, rng: random.Random) -> str:
    """JSON text of `value` (a list of pairs is an object, repeated keys kept), with random
    whitespace around the colons and commas."""

    def ws() -> str:
        return rng.choice(["", "", " ", "\t", " \r\n "])

    if isinstance(value, list) and value and isinstance(value[0], tuple):
        inner = ",".join(
            f"{ws()}{json.dumps(k)}{ws()}:{ws()}{_dump(v, rng)}{ws()}" for k, v in value
        )
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v, rng) for v in value) + "]"
    if value == [] or value is None or isinstance(value, (int, str)):
        return json.dumps(value, ensure_ascii=rng.random() < 0.5)
    raise AssertionError(value)  # pragma: no cover


def test_duplicate_key_matches_the_full_parse_on_random_lines() -> None:
    rng = random.Random(28)
    duplicates = 0
    for _ in range(3000):
        body = _object(rng, 1) or [("x", 1)]
        line = [("custom_id", "r"), ("body", body), *_object(rng, 2)]
        raw = (_dump(line, rng) + "\n").encode()
        duplicates += check(raw) is not None
    assert duplicates > 300  # the random lines do exercise both answers
