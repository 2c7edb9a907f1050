"""The lone-surrogate scan: a parsed JSON string that is not Unicode text.

A JSON \\uD83D escape with no pair (an emoji cut in half) parses into a string the tokenizer and
every UTF-8 writer refuse. The reader searches a line's raw bytes for such an escape first; only a
line that may hold one has its body walked, and the first bad field is named.
"""

from __future__ import annotations

import json
import re
from typing import Any

from batchrun.openai.invalid import SHOW_LIMIT, bad

# A UTF-16 surrogate code point. Strict UTF-8 decoding never yields one, but a JSON \uD83D escape
# does, and the decoder only pairs it with a following low-surrogate escape: any surrogate left in
# a parsed string is a lone one, which is not Unicode text. The tokenizer and every UTF-8 writer
# (journal, outputs) refuse it, so such a line must be refused here, naming the field.
SURROGATE = re.compile("[\ud800-\udfff]")
# The JSON escape of a surrogate (\uD800 to \uDFFF, in either case) in a line's raw bytes: only a
# line holding one can parse into a string with a surrogate in it.
# (A regex: its literal-prefix scan is faster here than `bytes.__contains__`.)
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# A surrogate escape the JSON decoder leaves alone (a high one not followed at once by a low one,
# or a low one not right after a high one: the decoder pairs exactly those), or an escaped
# backslash, after which "\\ud83d" is text that only looks like an escape (then the walk decides).
# Every branch starts with a backslash, which keeps the search a fast scan (a leading lookbehind
# would be tried at every position, ten times slower).
_LONE_SURROGATE_ESCAPE = re.compile(
    rb"\\(?:\\|u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|[c-fC-F][0-9a-fA-F]{2}(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})))"
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def surrogate_problem(text: str) -> str | None:
    """Why `text` is not Unicode text (it holds a lone surrogate), or None when it is."""
    # isascii() is O(1) in CPython: the common string costs no regex search.
    if text.isascii():
        return None
    found = SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"contains a lone surrogate (\\u{ord(found.group()):04x}) at character "
        f"{found.start() + 1}; it is not valid Unicode text (a \\uD800-\\uDFFF escape must be "
        "half of a pair: was the text cut in the middle of an emoji?)"
    )


def _path_key(where: str, key: str) -> str:
    """The field path of `key` inside the object at `where`: a.b, or a["odd key"]."""
    if _IDENTIFIER.match(key):
        return f"{where}.{key}"
    # The walk checks a key before it descends under it: a key on a path is valid text.
    return f"{where}[{json.dumps(key, ensure_ascii=False)}]"


def find_lone_surrogate(value: object, where: str) -> str | None:
    """A message naming the first string (or object key) under `value` with a lone surrogate."""
    # Iterative, with each path built only when it is reported: the parser accepts nesting
    # about as deep as the recursion limit, and most walked lines hold only well-formed pairs.
    stack: list[tuple[object, object]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = surrogate_problem(item)
            if problem is not None:
                return f"{_render_path(path)} {problem}"
        elif isinstance(item, dict):
            for key in item:
                problem = surrogate_problem(key)
                if problem is not None:
                    # ensure_ascii: the key is shown with its surrogate escaped, never raw.
                    shown = json.dumps(key[:SHOW_LIMIT])
                    return f"the key {shown} of {_render_path(path)} {problem}"
            # Reversed, so that the stack pops the first field first: the first bad one is named.
            stack.extend((child, (path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((item[i], (path, i)) for i in range(len(item) - 1, -1, -1))
    return None


def _render_path(path: object) -> str:
    """The dotted field path from the walk's (parent, key) links."""
    keys: list[str | int] = []
    while isinstance(path, tuple):
        path, key = path
        keys.append(key)
    where = str(path)
    for key in reversed(keys):
        where = f"{where}[{key}]" if isinstance(key, int) else _path_key(where, key)
    return where


def may_hold_lone_surrogate(raw: bytes) -> bool:
    """Whether a JSON line's raw bytes may parse into a string holding a lone surrogate."""
    # Most lines with surrogate escapes hold only well-formed pairs (an emoji written by a JSON
    # encoder with ensure_ascii): one regex search clears them without walking the body. (The
    # reader calls this only for a line that SURROGATE_ESCAPE found something in.)
    return _LONE_SURROGATE_ESCAPE.search(raw) is not None


def check_text(body: dict[str, Any]) -> None:
    """Raise if any string of the body (or key) holds a lone surrogate, naming the field."""
    message = find_lone_surrogate(body, "body")
    if message is not None:
        bad(message)
