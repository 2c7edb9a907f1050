"""What a broken per-line rule raises, and how a JSON value is described in its message.

The rules of batchrun.openai.validation and the body modules (chat, completions, embeddings,
fields, text) raise `InvalidLine`; `show` and `describe` keep the values they echo short.
"""

from __future__ import annotations

from typing import NoReturn

# Echoed values are cut to this many characters so a message never carries a huge payload.
SHOW_LIMIT = 80


class InvalidLine(Exception):
    """A line broke a rule: `code` is the error code, `message` says why in plain words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bad(message: str) -> NoReturn:
    """Raise the `invalid_request` error of a body field that broke a rule."""
    raise InvalidLine("invalid_request", message)


def show(value: object) -> str:
    """A short, human description of a JSON value for an error message."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        # Slice before repr so a 50 MB string is never copied whole into a message.
        if len(value) > SHOW_LIMIT:
            return repr(value[:SHOW_LIMIT]) + f"... ({len(value)} characters)"
        return repr(value)
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= SHOW_LIMIT else text[:SHOW_LIMIT] + "..."
    if isinstance(value, list):
        return f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def json_type(value: object) -> str:
    """The JSON type name of a parsed value ("array", "string", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def json_kind(value: object) -> str:
    """The JSON type name of a parsed value with its article ("an array", "a string", "null")."""
    name = json_type(value)
    if name == "null":
        return name
    return ("an " if name[0] in "aeiou" else "a ") + name


def describe(value: object) -> str:
    """A value's JSON type and a short rendering of it: "a string 'x'", "null", "an object"."""
    if value is None or isinstance(value, (list, dict)):
        return show(value)  # already says what it is: "null", "an array of 3 items"
    return f"{json_kind(value)} {show(value)}"
