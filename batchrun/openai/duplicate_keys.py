"""Find a key given twice in a batch line's object or in its body.

JSON parsers keep the last of two equal keys silently, so the reader refuses such a line. Also
here: the refusal of NaN and Infinity that the reader's JSON decoders and this module's second
parse share.
"""

from __future__ import annotations

import json
import re
from typing import Any


class NonStandardNumber(ValueError):
    """NaN / Infinity: Python's json accepts them, JSON (and the OpenAI API) does not."""


def reject_constant(name: str) -> Any:
    raise NonStandardNumber(f"{name} is not a valid JSON number")


# _key_ends: JSON's whitespace, one byte each (b"" is not in it: the end of the line stops the
# walk), and the most quotes walked before parsing the line again costs less.
_WHITESPACE = frozenset((b" ", b"\t", b"\r", b"\n"))
_MAX_QUOTES = 512
_SEARCHED_LINE = 16384  # bytes: past it, hopping from quote to quote is the cheaper
_KEY_END = re.compile(rb'"[ \t\r\n]*:')
_QUOTE_SPACE = re.compile(rb'"[ \t\r\n]').search
_CONTAINERS = (dict, list)


def duplicate_key(raw: bytes, obj: dict[str, Any]) -> tuple[str, str] | None:
    """The first key given twice in the line's object or in its body, as (where, key): where is
    "" for the line, "body." for the body. None when every key there is given once.

    JSON parsers keep the last of two equal keys silently; which one the user meant is unknown,
    so the line is refused. The quick test (nearly every line): the quotes followed by a colon,
    which are at least the keys written in the line, number no more than the keys the parsed
    line holds; otherwise the line is parsed again, keeping every pair.
    """
    # Inlined (this runs for every line). Nearly every line has no whitespace right after a
    # quote: then each quote followed by a colon is a `":` pair, counted without a match list.
    if _QUOTE_SPACE(raw) is None:
        ends: int | None = raw.count(b'":')
    else:
        ends = len(_KEY_END.findall(raw)) if len(raw) <= _SEARCHED_LINE else _key_ends(raw)
    held = len(obj)
    for item in obj.values():
        kind = type(item)
        if kind is dict or (kind is list and item):
            held += _keys_held(item)
    if ends == held:
        return None
    twice: dict[int, str] = {}  # id() of an object -> its first key given twice

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        made = dict(items)
        if len(made) != len(items):  # rare: name the first key given twice
            seen: set[str] = set()
            twice[id(made)] = next(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return made

    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
        again = json.loads(text, object_pairs_hook=pairs, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return None  # (not reached: the line parsed once already)
    if id(again) in twice:
        return "", twice[id(again)]
    inner = again.get("body") if isinstance(again, dict) else None
    if isinstance(inner, dict) and id(inner) in twice:
        return "body.", twice[id(inner)]
    return None


def _key_ends(raw: bytes) -> int | None:
    """How many quotes in the line are followed (after any whitespace) by a colon: each key's
    closing quote is, so at least the number of keys written (an escaped quote before a colon
    inside a string counts too). A short line is searched in C at once; a long one hops from
    quote to quote (memchr), so a long text without quotes costs nothing there. None past
    _MAX_QUOTES quotes (parsing the line again then costs less)."""
    if len(raw) <= _SEARCHED_LINE:
        return len(_KEY_END.findall(raw))
    find = raw.find
    ends = 0
    hops = 0
    i = find(b'"')
    while i >= 0:
        hops += 1
        if hops > _MAX_QUOTES:
            return None
        j = i + 1
        c = raw[j : j + 1]
        while c in _WHITESPACE:
            j += 1
            c = raw[j : j + 1]
        if c == b":":
            ends += 1
        i = find(b'"', j)
    return ends


def _keys_held(value: Any) -> int:
    """The keys of every object in a parsed JSON value (a list whose first item is no object or
    list is taken to hold none: an undercount only sends the line to the exact test)."""
    kind = type(value)
    if kind is dict:
        held = len(value)
        for item in value.values():
            if type(item) in _CONTAINERS:
                held += _keys_held(item)
        return held
    if kind is list and value and type(value[0]) in _CONTAINERS:
        held = 0
        for item in value:
            if type(item) in _CONTAINERS:
                held += _keys_held(item)
        return held
    return 0


def duplicate_message(where: str, key: str) -> str:
    """The message for a line that gives `key` twice ("" the line's own keys, "body." the body's)."""
    place = "in body" if where else "on this line"
    return (
        f"the key {key!r} is given twice {place}; JSON readers keep the last one silently, so "
        "which one was meant is unknown: give each key once"
    )
