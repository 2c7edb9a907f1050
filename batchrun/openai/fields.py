"""Field checkers the endpoints share: numbers in a range, seed, stop, logit_bias, metadata, ...

Each checker takes the field's key and its (non-null) value and raises `InvalidLine` naming
body.<key> when the value breaks the rule; an endpoint's table maps its field names to these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from batchrun.openai.invalid import bad, describe, show

MAX_TOKENS_LIMIT = 1_000_000
MAX_N = 128
MAX_STOP_SEQUENCES = 4
LOGIT_BIAS_LIMIT = 100
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_LEN = 64
MAX_METADATA_VALUE_LEN = 512
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# The seeds vLLM takes: a signed 64-bit integer, the range its own OpenAI server enforces
# (entrypoints/openai/*/protocol.py: _INT64_MIN/_INT64_MAX) and OpenAI documents. A larger seed
# passes SamplingParams and then kills the engine: torch's Generator.manual_seed stops at 2**64-1
# ("Overflow when unpacking long long"), the V2 model runner's int64 seed buffer at 2**63-1.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1

# A field's checker: called with the field's key and its value (never None: null means "not set").
FieldCheck = Callable[[str, object], None]


def int_in(low: int, high: int | None) -> FieldCheck:
    def check(key: str, value: object) -> None:
        # Python's bool is an int subclass; JSON true/false must not pass as a number.
        if isinstance(value, bool) or not isinstance(value, int):
            bad(f"body.{key} must be a whole number, got {describe(value)}")
        if value < low or (high is not None and value > high):
            limit = f"at least {low}" if high is None else f"between {low} and {high}"
            bad(f"body.{key} must be {limit}, got {show(value)}")

    return check


def number_in(low: float, high: float, low_open: bool = False) -> FieldCheck:
    def check(key: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad(f"body.{key} must be a number, got {describe(value)}")
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            lo = f"greater than {low:g}" if low_open else f"at least {low:g}"
            bad(f"body.{key} must be {lo} and at most {high:g}, got {show(value)}")

    return check


def check_seed(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        bad(f"body.{key} must be a whole number, got {describe(value)}")
    if not SEED_MIN <= value <= SEED_MAX:
        bad(
            f"body.{key} must be between {SEED_MIN} and {SEED_MAX} (a signed 64-bit integer), "
            f"got {show(value)}"
        )


def check_stop(key: str, value: object) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        bad(
            f"body.{key} must be a string or an array of up to {MAX_STOP_SEQUENCES} strings, "
            f"got {describe(value)}"
        )
    if len(value) > MAX_STOP_SEQUENCES:
        bad(f"body.{key} may hold at most {MAX_STOP_SEQUENCES} strings, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            bad(f"body.{key}[{i}] must be a string, got {describe(item)}")


def check_stream(key: str, value: object) -> None:
    if value is True:
        bad("stream is not supported in a batch; remove body.stream or set it to false")
    if value is not False:
        bad(f"body.{key} must be true or false, got {show(value)}")


def check_bool(key: str, value: object) -> None:
    if not isinstance(value, bool):
        bad(f"body.{key} must be true or false, got {describe(value)}")


def check_string(key: str, value: object) -> None:
    if not isinstance(value, str):
        bad(f"body.{key} must be a string, got {describe(value)}")


def check_logit_bias(key: str, value: object) -> None:
    if not isinstance(value, dict):
        bad(
            f"body.{key} must be an object that maps token ids (as strings) to a bias between "
            f"-100 and 100, got {describe(value)}"
        )
    for token, bias in value.items():
        # JSON object keys are strings: the token id is written as a decimal string.
        if not (token.isascii() and token.isdigit()):
            bad(
                f'body.{key} keys must be token ids written as strings such as "50256", got {show(token)}'
            )
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            bad(f"body.{key}[{token!r}] must be a number, got {describe(bias)}")
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            bad(
                f"body.{key}[{token!r}] must be between -{LOGIT_BIAS_LIMIT} and "
                f"{LOGIT_BIAS_LIMIT}, got {show(bias)}"
            )


def check_metadata(key: str, value: object) -> None:
    if not isinstance(value, dict):
        bad(f"body.{key} must be an object of string values, got {describe(value)}")
    if len(value) > MAX_METADATA_KEYS:
        bad(f"body.{key} may hold at most {MAX_METADATA_KEYS} keys, got {len(value)}")
    for k, v in value.items():
        if len(k) > MAX_METADATA_KEY_LEN:
            bad(
                f"body.{key} keys may be at most {MAX_METADATA_KEY_LEN} characters long, got "
                f"{show(k)}"
            )
        if not isinstance(v, str):
            bad(f"body.{key}[{k!r}] must be a string, got {describe(v)}")
        if len(v) > MAX_METADATA_VALUE_LEN:
            bad(
                f"body.{key}[{k!r}] may be at most {MAX_METADATA_VALUE_LEN} characters long, "
                f"got {len(v)}"
            )


def input_items(body: Mapping[str, Any], needs: str, kinds: str) -> list[Any] | None:
    """body.input of an endpoint that takes a string or an array: None for a non-empty string
    (all there is to check), else the non-empty array, for the endpoint's checks of its items.
    Missing or null (`needs`: what a request needs), empty, or neither (`kinds`: what it may
    be): an invalid line."""
    value = body.get("input")
    if value is None:
        bad(f"body.input is missing; {needs}")
    if isinstance(value, str):
        if not value:
            bad("body.input must not be empty")
        return None
    if not isinstance(value, list):
        bad(f"body.input must be {kinds}, got {describe(value)}")
    if not value:
        bad("body.input must not be an empty array")
    return value


def format_object(where: str, value: object, formats: Sequence[str]) -> dict[str, Any]:
    """The response format object at `where` (chat's body.response_format, the Responses API's
    body.text.format); raises unless it is an object whose type is one of `formats`."""
    if not isinstance(value, dict):
        bad(f'{where} must be an object such as {{"type": "json_object"}}, got {describe(value)}')
    kind = value.get("type")
    if kind not in formats:
        got = "it is missing" if "type" not in value else f"got {show(kind)}"
        bad(f"{where}.type must be one of {', '.join(formats)}; {got}")
    return value


def check_strict(where: str, spec: Mapping[str, Any]) -> None:
    """A JSON schema format's `strict` at `where`: true, false or left out."""
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        bad(f"{where}.strict must be true or false, got {describe(strict)}")


def check_response_format(key: str, value: object) -> None:
    value = format_object(f"body.{key}", value, RESPONSE_FORMATS)
    if value["type"] != "json_schema":
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        got = "it is missing" if "json_schema" not in value else f"got {describe(spec)}"
        bad(
            f"body.{key}.json_schema must be an object with a name and a schema for a "
            f"response_format of type 'json_schema'; {got}"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        got = "it is missing" if "name" not in spec else f"got {describe(name)}"
        bad(f"body.{key}.json_schema.name must be a non-empty string; {got}")
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        bad(f"body.{key}.json_schema.schema must be a JSON Schema object, got {describe(schema)}")
    check_strict(f"body.{key}.json_schema", spec)


def refuse(why: str) -> FieldCheck:
    """A check that refuses any non-null value of a field batchrun cannot honour, saying why."""

    def check(key: str, value: object) -> None:
        bad(f"body.{key} is not supported: {why}; remove it")

    return check


def refuse_unless(default: object, why: str) -> FieldCheck:
    """Refuse a value other than the field's default (which changes nothing), saying why."""

    def check(key: str, value: object) -> None:
        if value != default or isinstance(value, bool) != isinstance(default, bool):
            bad(f"body.{key} is not supported: {why}; remove it")

    return check


SAMPLING_CHECKS: dict[str, FieldCheck] = {
    "max_tokens": int_in(1, MAX_TOKENS_LIMIT),
    "temperature": number_in(0, 2),
    "top_p": number_in(0, 1, low_open=True),
    "n": int_in(1, MAX_N),
    "seed": check_seed,
    "stop": check_stop,
    "presence_penalty": number_in(-2, 2),
    "frequency_penalty": number_in(-2, 2),
    "logit_bias": check_logit_bias,
    # A vLLM extension on /v1/completions, honoured there the same way as on chat.
    "response_format": check_response_format,
    "stream": check_stream,
    "stream_options": refuse("it only applies to stream, which a batch does not support"),
    "user": check_string,
}
