"""results.parquet: one flat row per request and per invalid line, written in row groups.

Beyond the flat columns, a job whose answers carry logprobs gets a `logprobs` column (the first
choice's tokens, as nested lists) and an embeddings job an `embeddings` column (per request, its
vectors as fixed-size lists of float32).

Each record read back is decoded by msgspec into just the fields a row needs, and a row group's
columns are built from its rows at once. A record msgspec refuses (NaN, a lone surrogate escape:
old journals) or of an unusual shape is read with json and turned into a row as it always was.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Sequence
from typing import IO, Any

import msgspec

from batchrun.export.index import (
    REPORTED,
    STATUS_NAMES,
    Entry,
    JournalIndex,
    changed,
    embedding,
    parse_record,
    read_back,
)
from batchrun.job.state import INVALID, OK

PARQUET_NAME = "results.parquet"

_BASE_COLUMNS = (
    ("custom_id", "string"),
    ("line", "int64"),
    ("status", "string"),
    ("status_code", "int32"),
    ("content", "string"),
    ("finish_reason", "string"),
    ("n_choices", "int32"),
    ("model", "string"),
    ("prompt_tokens", "int64"),
    ("completion_tokens", "int64"),
    ("total_tokens", "int64"),
    ("error_code", "string"),
    ("error_message", "string"),
    ("attempts", "int32"),
    ("latency_s", "float64"),
    ("response_id", "string"),
)
# Read back by pandas as Int32, not as float64 when any row is null (an invalid line) and as
# int32 otherwise: the same dtype in every file.
_NULLABLE_INTS = {"status_code"}


def write_parquet(index: JournalIndex, f: IO[bytes], row_group_size: int = 10_000) -> None:
    """Write results.parquet from an index of the journal, `row_group_size` rows a group."""
    import pyarrow.parquet as pq

    schema = parquet_schema(index)
    extras = tuple(schema.names[len(_BASE_COLUMNS) :])
    writer = pq.ParquetWriter(f, schema)
    try:
        rows: list[tuple[Any, ...]] = []
        for entry, raw in read_back(index, REPORTED):
            rows.append(_row(index, entry, raw, extras))
            if len(rows) >= row_group_size:
                writer.write_table(_table(rows, schema))
                rows = []
        if rows:
            writer.write_table(_table(rows, schema))
    finally:
        writer.close()  # writes the footer; the file object stays open for the fsync


# --- the schema ----------------------------------------------------------------------------


def parquet_schema(index: JournalIndex | None = None) -> Any:
    """The results.parquet schema, with pandas metadata so nullable ints read back as Int32.

    The flat columns always; `logprobs` and `embeddings` when `index` saw answers that have them.
    An embeddings column is a list of fixed-size lists when every vector has one size (the usual
    case), else a list of lists.
    """
    import pyarrow as pa

    fields = [(name, getattr(pa, kind)()) for name, kind in _BASE_COLUMNS]
    if index is not None and index.has_logprobs:
        candidate = pa.struct([("token", pa.string()), ("logprob", pa.float64())])
        token = pa.struct(
            [
                ("token", pa.string()),
                ("logprob", pa.float64()),
                ("top_logprobs", pa.list_(candidate)),
            ]
        )
        fields.append(("logprobs", pa.list_(token)))
    if index is not None and index.embedding_dims:
        dims = index.embedding_dims
        vector = pa.list_(pa.float32(), next(iter(dims)) if len(dims) == 1 else -1)
        fields.append(("embeddings", pa.list_(vector)))
    schema = pa.schema(fields)
    metadata = _pandas_metadata(pa, schema)
    return schema if metadata is None else schema.with_metadata(metadata)


def _pandas_metadata(pa: Any, schema: Any) -> dict[bytes, bytes] | None:
    """The metadata pyarrow writes for a pandas frame of `schema`'s columns (object columns for
    text and nested values), built without pandas (its import alone takes a fifth of a second);
    None where pandas is not installed."""
    try:
        pandas_version = importlib.metadata.version("pandas")
    except importlib.metadata.PackageNotFoundError:
        return None

    def numpy_name(t: Any) -> str:
        return {"double": "float64", "float": "float32"}.get(str(t), str(t))  # ints: their own

    def pandas_type(t: Any) -> str:
        if pa.types.is_string(t):
            return "unicode"
        if pa.types.is_list(t):
            return f"list[{pandas_type(t.value_type)}]"
        if pa.types.is_nested(t):
            return "object"
        return numpy_name(t)

    columns = [
        {
            "name": col.name,
            "field_name": col.name,
            "pandas_type": pandas_type(col.type),
            "numpy_type": (
                "Int32"
                if col.name in _NULLABLE_INTS
                else "object"
                if pa.types.is_string(col.type) or pa.types.is_nested(col.type)
                else numpy_name(col.type)
            ),
            "metadata": None,
        }
        for col in schema
    ]
    pandas = {
        "index_columns": [],
        "column_indexes": [],
        "columns": columns,
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": pandas_version,
    }
    return {b"pandas": json.dumps(pandas).encode("utf8")}


# --- rows ----------------------------------------------------------------------------------


class _Message(msgspec.Struct):
    content: Any = None


class _Choice(msgspec.Struct):
    message: _Message | msgspec.UnsetType | None = msgspec.UNSET
    text: Any = None
    finish_reason: Any = None
    logprobs: Any = None


class _Item(msgspec.Struct):
    embedding: Any = None


class _Usage(msgspec.Struct):
    prompt_tokens: Any = None
    completion_tokens: Any = None
    total_tokens: Any = None


class _Body(msgspec.Struct):
    id: Any = None
    model: Any = None
    choices: list[_Choice] | None = None
    data: list[_Item] | None = None  # an embeddings body's, one item per input
    usage: _Usage | None = None


class _Error(msgspec.Struct):
    code: Any = None
    message: Any = None


class _Record(msgspec.Struct):
    """What a row takes of a journal record. Untyped values (Any) are json's; a record whose
    objects are not where a row expects them is read by `_json_row` instead."""

    kind: Any
    custom_id: Any = None
    status_code: Any = None
    body: _Body | None = None
    error: _Error | None = None
    prompt_tokens: Any = None
    completion_tokens: Any = None
    latency_s: Any = None


_DECODER = msgspec.json.Decoder(_Record)


def _row(index: JournalIndex, entry: Entry, raw: bytes, extras: Sequence[str]) -> tuple[Any, ...]:
    """One row, in schema column order."""
    try:
        rec = _DECODER.decode(raw)
    except ValueError:  # msgspec.DecodeError, or bytes that are not UTF-8
        try:
            return _json_row(entry, parse_record(raw), extras)
        except ValueError:
            raise changed(index) from None
    body = rec.body if entry.status == OK else None
    content = finish_reason = model = response_id = None
    n_choices = 0
    usage = None
    first = None
    if body is not None:
        # An embeddings body has `data` (one item per input) where the others have `choices`.
        items = body.choices if body.choices is not None else body.data
        n_choices = len(items) if items is not None else 0
        first = body.choices[0] if body.choices else None
        if first is not None:
            if first.message is msgspec.UNSET:
                content = first.text
            else:
                content = first.message.content if first.message is not None else None
            finish_reason = first.finish_reason
        model, response_id, usage = body.model, body.id, body.usage
    # The body's usage is what the user sees in output.jsonl; the record's counts back it up.
    prompt = int((usage and usage.prompt_tokens) or rec.prompt_tokens or 0)
    completion = int((usage and usage.completion_tokens) or rec.completion_tokens or 0)
    total = int((usage and usage.total_tokens) or prompt + completion)
    err = rec.error or _Error()
    invalid = entry.status == INVALID
    values = [
        rec.custom_id,
        entry.line,
        STATUS_NAMES[entry.status],
        None if invalid else rec.status_code,
        content,
        finish_reason,
        n_choices,
        model,
        prompt,
        completion,
        total,
        err.code,
        err.message,
        entry.attempts,
        None if invalid else rec.latency_s,
        response_id,
    ]
    for name in extras:
        if body is None:
            values.append(None)
        elif name == "logprobs":
            values.append(_logprobs(first.logprobs if first is not None else None))
        else:  # embeddings
            data = body.data
            values.append(None if data is None else [embedding(item.embedding) for item in data])
    return tuple(values)


def _json_row(entry: Entry, rec: dict[str, Any], extras: Sequence[str]) -> tuple[Any, ...]:
    """`_row` for a record as json reads it."""
    body = rec.get("body") if entry.status == OK else None
    choices = body.get("choices") if isinstance(body, dict) else None
    items = choices if choices is not None else body.get("data") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else {}
    if "message" in first:
        content = (first.get("message") or {}).get("content")
    else:
        content = first.get("text")
    usage = (body.get("usage") if isinstance(body, dict) else None) or {}
    prompt = int(usage.get("prompt_tokens") or rec.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or rec.get("completion_tokens") or 0)
    err = rec.get("error") or {}
    invalid = entry.status == INVALID
    values = [
        rec.get("custom_id"),
        entry.line,
        STATUS_NAMES[entry.status],
        None if invalid else rec.get("status_code"),
        content,
        first.get("finish_reason"),
        len(items) if isinstance(items, list) else 0,
        body.get("model") if isinstance(body, dict) else None,
        prompt,
        completion,
        int(usage.get("total_tokens") or prompt + completion),
        err.get("code"),
        err.get("message"),
        entry.attempts,
        None if invalid else rec.get("latency_s"),
        body.get("id") if isinstance(body, dict) else None,
    ]
    for name in extras:
        if not isinstance(body, dict):
            values.append(None)
        elif name == "logprobs":
            values.append(_logprobs(first.get("logprobs") if isinstance(first, dict) else None))
        else:  # embeddings
            data = body.get("data")
            values.append(
                [embedding(x.get("embedding")) if isinstance(x, dict) else None for x in data]
                if isinstance(data, list)
                else None
            )
    return tuple(values)


def _logprobs(logprobs: object) -> list[dict[str, Any]] | None:
    """A choice's logprobs as [{token, logprob, top_logprobs: [{token, logprob}]}]."""
    if not isinstance(logprobs, dict):
        return None
    if "content" in logprobs:  # chat: ChoiceLogprobs
        return [
            {
                "token": t.get("token"),
                "logprob": t.get("logprob"),
                "top_logprobs": [
                    {"token": c.get("token"), "logprob": c.get("logprob")}
                    for c in t.get("top_logprobs") or []
                ],
            }
            for t in logprobs.get("content") or []
        ]
    # completions: parallel lists, each position's alternatives as a {token: logprob} object
    tokens = logprobs.get("tokens") or []
    token_logprobs = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    return [
        {
            "token": token,
            "logprob": lp,
            "top_logprobs": [
                {"token": t, "logprob": v}
                for t, v in sorted((top or {}).items(), key=lambda kv: -kv[1])
            ],
        }
        for token, lp, top in zip(tokens, token_logprobs, tops, strict=False)
    ]


# --- row groups ----------------------------------------------------------------------------


def _table(rows: list[tuple[Any, ...]], schema: Any) -> Any:
    """A row group as an Arrow table, built a column at a time; text that is not valid Unicode
    (a lone surrogate in an old journal) has its bad characters replaced (U+FFFD), as Parquet
    strings must be UTF-8."""
    import pyarrow as pa

    columns = dict(zip(schema.names, zip(*rows, strict=True), strict=True))
    try:
        return pa.table(columns, schema=schema)
    except (UnicodeEncodeError, pa.ArrowException):
        return pa.table({n: [_valid_text(v) for v in c] for n, c in columns.items()}, schema=schema)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(value: Any) -> Any:
    """`value` with every string in it made valid UTF-8 (lone surrogates replaced)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    if isinstance(value, dict):
        return {k: _valid_text(v) for k, v in value.items()}
    return value
