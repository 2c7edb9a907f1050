"""Per-line rules for OpenAI batch input: the envelope fields and the request body.

Every check here is pure (no file, no state); the reader owns the stateful rules (duplicate
custom_ids, one url per file). A broken rule raises `InvalidLine` with the error code and a
message that names the field and what was expected. Exceptions keep the fast path (a valid line)
free of result-tuple plumbing; they are only raised for bad lines.

An explicit JSON ``null`` on an optional body field means "not set", as in the OpenAI API, so code
that turns a body into engine parameters must treat ``None`` like an absent key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

from batchrun.openai.records import CHAT, COMPLETIONS, EMBEDDINGS, SUPPORTED_ENDPOINTS

MAX_CUSTOM_ID_LEN = 512
MAX_TOKENS_LIMIT = 1_000_000
MAX_N = 128
MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI limits it
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs, as OpenAI limits it
LOGIT_BIAS_LIMIT = 100
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_LEN = 64
MAX_METADATA_VALUE_LEN = 512
MAX_EMBEDDING_INPUTS = 2048
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
ENCODING_FORMATS = ("float", "base64")
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLE_SET = frozenset(CHAT_ROLES)
# Echoed values are cut to this many characters so a message never carries a huge payload.
SHOW_LIMIT = 80
# The seeds vLLM takes: a signed 64-bit integer, the range its own OpenAI server enforces
# (entrypoints/openai/*/protocol.py: _INT64_MIN/_INT64_MAX) and OpenAI documents. A larger seed
# passes SamplingParams and then kills the engine: torch's Generator.manual_seed stops at 2**64-1
# ("Overflow when unpacking long long"), the V2 model runner's int64 seed buffer at 2**63-1.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
# A UTF-16 surrogate code point. Strict UTF-8 decoding never yields one, but a JSON \uD83D escape
# does, and the decoder only pairs it with a following low-surrogate escape: any surrogate left in
# a parsed string is a lone one, which is not Unicode text. The tokenizer and every UTF-8 writer
# (journal, outputs) refuse it, so such a line must be refused here, naming the field.
_SURROGATE = re.compile("[\ud800-\udfff]")
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


class InvalidLine(Exception):
    """A line broke a rule: `code` is the error code, `message` says why in plain words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


def _endpoints() -> str:
    return ", ".join(repr(u) for u in SUPPORTED_ENDPOINTS)


def _surrogate_problem(text: str) -> str | None:
    """Why `text` is not Unicode text (it holds a lone surrogate), or None when it is."""
    # isascii() is O(1) in CPython: the common string costs no regex search.
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
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
            problem = _surrogate_problem(item)
            if problem is not None:
                return f"{_render_path(path)} {problem}"
        elif isinstance(item, dict):
            for key in item:
                problem = _surrogate_problem(key)
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
        _bad(message)


def check_custom_id(obj: dict[str, Any]) -> str:
    """Return the line's custom_id, or raise if it is missing, not a string, empty or too long."""
    if "custom_id" not in obj:
        raise InvalidLine("missing_custom_id", "custom_id is missing; every line needs one")
    cid = obj["custom_id"]
    if not isinstance(cid, str):
        raise InvalidLine("invalid_custom_id", f"custom_id must be a string, got {describe(cid)}")
    if not cid:
        raise InvalidLine("invalid_custom_id", "custom_id must not be empty")
    if len(cid) > MAX_CUSTOM_ID_LEN:
        raise InvalidLine(
            "invalid_custom_id",
            f"custom_id is {len(cid)} characters long, the limit is {MAX_CUSTOM_ID_LEN}: "
            f"{show(cid)}",
        )
    # The custom_id is written to the journal and the outputs, as UTF-8. (isascii() first, as in
    # _surrogate_problem, inlined: this runs for every line.)
    if not cid.isascii() and _SURROGATE.search(cid) is not None:
        problem = _surrogate_problem(cid)
        raise InvalidLine("invalid_custom_id", f"custom_id {show(cid)} {problem}")
    return cid


def check_method(obj: dict[str, Any]) -> None:
    """Raise unless the line's method is "POST"."""
    if "method" not in obj:
        raise InvalidLine("invalid_method", 'method is missing; expected "POST"')
    method = obj["method"]
    if method != "POST":
        raise InvalidLine("invalid_method", f'method must be "POST", got {show(method)}')


def check_url(obj: dict[str, Any]) -> str:
    """Return the line's url, or raise unless it is one of the supported endpoints."""
    if "url" not in obj:
        raise InvalidLine("invalid_url", f"url is missing; expected one of {_endpoints()}")
    url = obj["url"]
    if not isinstance(url, str) or url not in SUPPORTED_ENDPOINTS:
        raise InvalidLine("invalid_url", f"url must be one of {_endpoints()}, got {show(url)}")
    return url


def check_body(url: str, obj: dict[str, Any], *, scan_text: bool = True) -> dict[str, Any]:
    """Return the line's body, or raise if it breaks a rule of the endpoint `url`.

    `scan_text` False skips the search for lone surrogates: for a caller (the reader) that saw
    the line's raw text hold no surrogate escape, so none of its strings can hold one.
    """
    if "body" not in obj:
        raise InvalidLine("invalid_body", "body is missing; expected a JSON object")
    body = obj["body"]
    if not isinstance(body, dict):
        raise InvalidLine("invalid_body", f"body must be a JSON object, got {describe(body)}")
    if url == CHAT:
        _check_messages(body)
    elif url == COMPLETIONS:
        _check_prompt(body)
    elif url == EMBEDDINGS:
        _check_input(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        _bad(f"body.model must be a string, got {describe(model)}")
    checks = _FIELD_CHECKS[url]
    # Only the keys present are looked at: a body usually has a few of the known fields.
    for key, value in body.items():
        check = checks.get(key)
        if check is not None and value is not None:
            check(key, value)
    if url == CHAT:
        _check_chat_combinations(body)
    elif url == COMPLETIONS:
        _check_completion_combinations(body)
    if scan_text:
        # Last: a line with a structural mistake gets that field's own message first.
        check_text(body)
    return body


def _bad(message: str) -> NoReturn:
    raise InvalidLine("invalid_request", message)


def _check_messages(body: dict[str, Any]) -> None:
    if "messages" not in body:
        _bad("body.messages is missing; a chat request needs a list of messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        _bad(f"body.messages must be an array of messages, got {json_kind(messages)}")
    if not messages:
        _bad("body.messages must not be empty")
    # This loop is hot (every message of every line): the common case, a known role and a
    # plain string content, passes without building a field path or calling a helper.
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            _bad(
                f"body.messages[{i}] must be an object with role and content, got {json_kind(msg)}"
            )
        role = msg.get("role")
        # The type test first: an unhashable role (an array) would make `in` raise.
        if type(role) is not str or role not in _ROLE_SET:
            got = "it is missing" if "role" not in msg else f"got {show(role)}"
            _bad(f"body.messages[{i}].role must be one of {', '.join(CHAT_ROLES)}; {got}")
        if type(msg.get("content")) is not str:
            _check_content(f"body.messages[{i}]", role, msg)


def _check_content(where: str, role: object, msg: dict[str, Any]) -> None:
    content = msg.get("content")
    if isinstance(content, str):
        return
    if content is None:
        # An assistant turn that only calls tools has no content, as in the OpenAI API.
        if role == "assistant" and (msg.get("tool_calls") or msg.get("function_call")):
            return
        got = "it is missing" if "content" not in msg else "got null"
        _bad(f"{where}.content must be a string or an array of content parts; {got}")
    if not isinstance(content, list):
        _bad(
            f"{where}.content must be a string or an array of content parts, "
            f"got {describe(content)}"
        )
    if not content:
        _bad(f"{where}.content must not be an empty array")
    for j, part in enumerate(content):
        pwhere = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            _bad(f"{pwhere} must be an object with a type, got {describe(part)}")
        ptype = part.get("type")
        if not isinstance(ptype, str):
            got = "it is missing" if "type" not in part else f"got {show(ptype)}"
            _bad(f"{pwhere}.type must be a string such as 'text'; {got}")
        if ptype == "text" and not isinstance(part.get("text"), str):
            _bad(f"{pwhere}.text must be a string for a part of type 'text'")


def _check_prompt(body: dict[str, Any]) -> None:
    if "prompt" not in body:
        _bad("body.prompt is missing; a completions request needs a prompt string")
    prompt = body["prompt"]
    if isinstance(prompt, list):
        if len(prompt) != 1:
            _bad(
                f"body.prompt must be a string or an array of exactly one string, got an array "
                f"of {len(prompt)} items (batchrun runs one prompt per request)"
            )
        prompt = prompt[0]
        where = "body.prompt[0]"
    else:
        where = "body.prompt"
    if not isinstance(prompt, str):
        _bad(f"{where} must be a string, got {describe(prompt)}")
    if not prompt:
        _bad(f"{where} must not be empty")


def _int_in(low: int, high: int | None) -> Callable[[str, object], None]:
    def check(key: str, value: object) -> None:
        # Python's bool is an int subclass; JSON true/false must not pass as a number.
        if isinstance(value, bool) or not isinstance(value, int):
            _bad(f"body.{key} must be a whole number, got {describe(value)}")
        if value < low or (high is not None and value > high):
            limit = f"at least {low}" if high is None else f"between {low} and {high}"
            _bad(f"body.{key} must be {limit}, got {show(value)}")

    return check


def _number_in(low: float, high: float, low_open: bool = False) -> Callable[[str, object], None]:
    def check(key: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _bad(f"body.{key} must be a number, got {describe(value)}")
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            lo = f"greater than {low:g}" if low_open else f"at least {low:g}"
            _bad(f"body.{key} must be {lo} and at most {high:g}, got {show(value)}")

    return check


def _check_seed(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(f"body.{key} must be a whole number, got {describe(value)}")
    if not SEED_MIN <= value <= SEED_MAX:
        _bad(
            f"body.{key} must be between {SEED_MIN} and {SEED_MAX} (a signed 64-bit integer), "
            f"got {show(value)}"
        )


def _check_stop(key: str, value: object) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        _bad(
            f"body.{key} must be a string or an array of up to {MAX_STOP_SEQUENCES} strings, "
            f"got {describe(value)}"
        )
    if len(value) > MAX_STOP_SEQUENCES:
        _bad(f"body.{key} may hold at most {MAX_STOP_SEQUENCES} strings, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            _bad(f"body.{key}[{i}] must be a string, got {describe(item)}")


def _check_stream(key: str, value: object) -> None:
    if value is True:
        _bad("stream is not supported in a batch; remove body.stream or set it to false")
    if value is not False:
        _bad(f"body.{key} must be true or false, got {show(value)}")


def _check_bool(key: str, value: object) -> None:
    if not isinstance(value, bool):
        _bad(f"body.{key} must be true or false, got {describe(value)}")


def _check_string(key: str, value: object) -> None:
    if not isinstance(value, str):
        _bad(f"body.{key} must be a string, got {describe(value)}")


def _check_logit_bias(key: str, value: object) -> None:
    if not isinstance(value, dict):
        _bad(
            f"body.{key} must be an object that maps token ids (as strings) to a bias between "
            f"-100 and 100, got {describe(value)}"
        )
    for token, bias in value.items():
        # JSON object keys are strings: the token id is written as a decimal string.
        if not (token.isascii() and token.isdigit()):
            _bad(
                f'body.{key} keys must be token ids written as strings such as "50256", got {show(token)}'
            )
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            _bad(f"body.{key}[{token!r}] must be a number, got {describe(bias)}")
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            _bad(
                f"body.{key}[{token!r}] must be between -{LOGIT_BIAS_LIMIT} and "
                f"{LOGIT_BIAS_LIMIT}, got {show(bias)}"
            )


def _check_metadata(key: str, value: object) -> None:
    if not isinstance(value, dict):
        _bad(f"body.{key} must be an object of string values, got {describe(value)}")
    if len(value) > MAX_METADATA_KEYS:
        _bad(f"body.{key} may hold at most {MAX_METADATA_KEYS} keys, got {len(value)}")
    for k, v in value.items():
        if len(k) > MAX_METADATA_KEY_LEN:
            _bad(
                f"body.{key} keys may be at most {MAX_METADATA_KEY_LEN} characters long, got "
                f"{show(k)}"
            )
        if not isinstance(v, str):
            _bad(f"body.{key}[{k!r}] must be a string, got {describe(v)}")
        if len(v) > MAX_METADATA_VALUE_LEN:
            _bad(
                f"body.{key}[{k!r}] may be at most {MAX_METADATA_VALUE_LEN} characters long, "
                f"got {len(v)}"
            )


def _check_response_format(key: str, value: object) -> None:
    if not isinstance(value, dict):
        _bad(
            f'body.{key} must be an object such as {{"type": "json_object"}}, got {describe(value)}'
        )
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        got = "it is missing" if "type" not in value else f"got {show(kind)}"
        _bad(f"body.{key}.type must be one of {', '.join(RESPONSE_FORMATS)}; {got}")
    if kind != "json_schema":
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        got = "it is missing" if "json_schema" not in value else f"got {describe(spec)}"
        _bad(
            f"body.{key}.json_schema must be an object with a name and a schema for a "
            f"response_format of type 'json_schema'; {got}"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        got = "it is missing" if "name" not in spec else f"got {describe(name)}"
        _bad(f"body.{key}.json_schema.name must be a non-empty string; {got}")
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        _bad(f"body.{key}.json_schema.schema must be a JSON Schema object, got {describe(schema)}")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        _bad(f"body.{key}.json_schema.strict must be true or false, got {describe(strict)}")


def _check_modalities(key: str, value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        _bad(f'body.{key} must be an array of strings such as ["text"], got {describe(value)}')
    for m in value:
        if m == "audio":
            _bad(
                f"body.{key} asks for audio output, which batchrun cannot produce (it runs text "
                'models); use ["text"] or remove the field'
            )
        if m != "text":
            _bad(
                f'body.{key} may only hold "text" (and "audio" for OpenAI\'s audio models), got {show(m)}'
            )


def _check_tools(key: str, value: object) -> None:
    if not isinstance(value, list):
        _bad(f"body.{key} must be an array of tools, got {describe(value)}")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            _bad(f"body.{key}[{i}] must be an object, got {describe(tool)}")
        if tool.get("type") != "function":
            _bad(
                f"body.{key}[{i}].type must be 'function' (the only kind of tool a local model "
                f"can be given), got {show(tool.get('type'))}"
            )
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            _bad(f"body.{key}[{i}].function must be an object with a non-empty string name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            _bad(
                f"body.{key}[{i}].function.parameters must be a JSON Schema object, "
                f"got {describe(params)}"
            )


def _check_tool_choice(key: str, value: object) -> None:
    if value in ("none", "auto"):
        return
    if value == "required" or isinstance(value, dict):
        _bad(
            f"body.{key} {show(value) if isinstance(value, str) else 'naming a function'} is not "
            "supported: batchrun cannot force a tool call; use 'auto' or 'none'"
        )
    _bad(f"body.{key} must be 'none', 'auto', 'required' or an object, got {describe(value)}")


def _refuse(why: str) -> Callable[[str, object], None]:
    """A check that refuses any non-null value of a field batchrun cannot honour, saying why."""

    def check(key: str, value: object) -> None:
        _bad(f"body.{key} is not supported: {why}; remove it")

    return check


def _check_encoding_format(key: str, value: object) -> None:
    if value not in ENCODING_FORMATS:
        _bad(
            f"body.{key} must be one of {', '.join(map(repr, ENCODING_FORMATS))}, got {show(value)}"
        )


def _check_chat_combinations(body: dict[str, Any]) -> None:
    if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
        _bad("body.top_logprobs needs body.logprobs set to true")


def _check_completion_combinations(body: dict[str, Any]) -> None:
    best_of, n = body.get("best_of"), body.get("n")
    n = 1 if n is None else n
    if best_of is not None and best_of != n:
        # vLLM 0.32 has no best_of: it can only return the n sequences it samples.
        _bad(
            f"body.best_of {best_of} is not supported: only best_of equal to n ({n}) can be "
            "honoured (vLLM returns every sequence it samples); remove it"
        )
    if body.get("echo") is True and body.get("logprobs") is not None:
        _bad(
            "body.echo together with body.logprobs is not supported: the prompt's first token "
            "has no logprob, which the Completion type cannot hold; drop one of them"
        )


def _check_input(body: dict[str, Any]) -> None:
    if "input" not in body:
        _bad("body.input is missing; an embeddings request needs a string or an array of them")
    value = body["input"]
    if isinstance(value, str):
        if not value:
            _bad("body.input must not be empty")
        return
    if not isinstance(value, list):
        _bad(
            "body.input must be a string, an array of strings, an array of token ids or an "
            f"array of token id arrays, got {describe(value)}"
        )
    if not value:
        _bad("body.input must not be an empty array")
    if len(value) > MAX_EMBEDDING_INPUTS:
        _bad(f"body.input may hold at most {MAX_EMBEDDING_INPUTS} items, got {len(value)}")
    first = value[0]
    if isinstance(first, int) and not isinstance(first, bool):
        _check_token_ids("body.input", value)
        return
    for i, item in enumerate(value):
        where = f"body.input[{i}]"
        if isinstance(first, str):
            if not isinstance(item, str):
                _bad(f"{where} must be a string like the items before it, got {describe(item)}")
            if not item:
                _bad(f"{where} must not be empty")
        elif isinstance(first, list):
            if not isinstance(item, list):
                _bad(
                    f"{where} must be an array of token ids like the items before it, got {describe(item)}"
                )
            _check_token_ids(where, item)
        else:
            _bad(
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
        _bad(f"{where} must not be an empty array")
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            _bad(
                f"{where}[{i}] must be a token id (a whole number, 0 or more), got {describe(token)}"
            )


_SAMPLING_CHECKS: dict[str, Callable[[str, object], None]] = {
    "max_tokens": _int_in(1, MAX_TOKENS_LIMIT),
    "temperature": _number_in(0, 2),
    "top_p": _number_in(0, 1, low_open=True),
    "n": _int_in(1, MAX_N),
    "seed": _check_seed,
    "stop": _check_stop,
    "presence_penalty": _number_in(-2, 2),
    "frequency_penalty": _number_in(-2, 2),
    "logit_bias": _check_logit_bias,
    # A vLLM extension on /v1/completions, honoured there the same way as on chat.
    "response_format": _check_response_format,
    "stream": _check_stream,
    "stream_options": _refuse("it only applies to stream, which a batch does not support"),
    "user": _check_string,
}

_NO_AUDIO = "batchrun runs text models, which produce no audio"

_FIELD_CHECKS: dict[str, dict[str, Callable[[str, object], None]]] = {
    CHAT: {
        **_SAMPLING_CHECKS,
        "max_completion_tokens": _int_in(1, MAX_TOKENS_LIMIT),
        "logprobs": _check_bool,
        "top_logprobs": _int_in(0, MAX_TOP_LOGPROBS),
        "metadata": _check_metadata,
        "tools": _check_tools,
        "tool_choice": _check_tool_choice,
        "parallel_tool_calls": _check_bool,
        "modalities": _check_modalities,
        "store": _check_bool,
        "service_tier": _check_string,
        "prompt_cache_key": _check_string,
        "safety_identifier": _check_string,
        "audio": _refuse(_NO_AUDIO),
        "functions": _refuse("the deprecated functions API is not run; pass body.tools instead"),
        "function_call": _refuse(
            "the deprecated functions API is not run; pass body.tool_choice instead"
        ),
        "prediction": _refuse("predicted outputs are an OpenAI service feature vLLM does not have"),
        "web_search_options": _refuse("a local model has no web search"),
        "verbosity": _refuse("only OpenAI's own models take it"),
        "moderation": _refuse("batchrun runs no moderation model"),
    },
    COMPLETIONS: {
        **_SAMPLING_CHECKS,
        "logprobs": _int_in(0, MAX_COMPLETION_LOGPROBS),
        "echo": _check_bool,
        "best_of": _int_in(1, MAX_N),
        "suffix": _refuse("vLLM cannot insert text between a prompt and a suffix"),
    },
    EMBEDDINGS: {
        "encoding_format": _check_encoding_format,
        "dimensions": _int_in(1, None),
        "user": _check_string,
    },
}
