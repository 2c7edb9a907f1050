"""results.parquet: one flat row per request and per invalid line, written in row groups.

The token columns are the body's usage (what output.jsonl says): `cached_tokens` from its
prompt (or a Response's input) token details, `reasoning_tokens` from its completion (output)
token details, 0 where the body reports none.

Beyond the flat columns, a job whose answers carry logprobs gets a `logprobs` column (the first
choice's tokens, as nested lists), one whose answers carry reasoning (--reasoning-parser) a
`reasoning` column, one whose chat answers have tool calls a `tool_calls` column (the first
choice's calls, each {id, type, name, arguments}, the arguments as the JSON text the body holds;
null for a row without: a forced call's `content` is null, so its call is only there), and an
embeddings job an `embeddings` column (per request, its vectors as
fixed-size lists of float32), and a score or rerank job `scores` and `score_indices` (per request,
its scores in the body's order, and what each scores: the pair's index for /v1/score, the
document's for /v1/rerank, whose results are best first and cut to top_n). A /v1/responses
answer's row holds its message's text as `content`
and its status as `finish_reason` (stop, or length when incomplete); its `tool_calls` are null, as
batchrun's Responses hold no function_call items (responses_api.py refuses tools there). A
transcription's or translation's row holds its text as `content`, and a job whose answers report
their audio's duration a `duration_s` column (a verbose_json answer's `duration`, else the usage's
whole seconds, rounded up as OpenAI counts them; null for a translation in json or text).

Each record read back is decoded by msgspec into just the fields a row needs, and a row group's
columns are built from its rows at once. A record msgspec refuses (NaN, a lone surrogate escape:
old journals) or of an unusual shape is read with json and turned into a row as it always was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import IO, Any

import msgspec

from batchrun.export.embeddings import embedding_value
from batchrun.export.index import (
    REPORTED,
    STATUS_NAMES,
    Entry,
    JournalIndex,
    changed,
    parse_record,
    read_back,
)
from batchrun.export.json_rows import json_row, logprob_rows
from batchrun.export.parquet_meta import pandas_metadata
from batchrun.job.paths import PARQUET_NAME as PARQUET_NAME
from batchrun.job.state import INVALID, OK
from batchrun.openai.usage import DetailedUsage

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
    ("cached_tokens", "int64"),
    ("reasoning_tokens", "int64"),
    ("error_code", "string"),
    ("error_message", "string"),
    ("attempts", "int32"),
    ("latency_s", "float64"),
    ("response_id", "string"),
)


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

    The flat columns always; `logprobs`, `reasoning`, `tool_calls`, `embeddings`, and `scores`
    with `score_indices`, when `index` saw answers that have them.
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
    if index is not None and index.has_reasoning:
        fields.append(("reasoning", pa.string()))
    if index is not None and index.has_tool_calls:
        call = pa.struct(
            [
                ("id", pa.string()),
                ("type", pa.string()),
                ("name", pa.string()),
                ("arguments", pa.string()),
            ]
        )
        fields.append(("tool_calls", pa.list_(call)))
    if index is not None and index.embedding_dims:
        dims = index.embedding_dims
        vector = pa.list_(pa.float32(), next(iter(dims)) if len(dims) == 1 else -1)
        fields.append(("embeddings", pa.list_(vector)))
    if index is not None and index.has_scores:
        fields.append(("scores", pa.list_(pa.float64())))
        fields.append(("score_indices", pa.list_(pa.int64())))
    if index is not None and index.has_duration:
        fields.append(("duration_s", pa.float64()))
    schema = pa.schema(fields)
    metadata = pandas_metadata(pa, schema)
    return schema if metadata is None else schema.with_metadata(metadata)


# --- rows ----------------------------------------------------------------------------------


class _Function(msgspec.Struct):
    name: Any = None
    arguments: Any = None  # the JSON text, kept as it is


class _ToolCall(msgspec.Struct):
    id: Any = None
    type: Any = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: Any = None
    reasoning: Any = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    message: _Message | msgspec.UnsetType | None = msgspec.UNSET
    text: Any = None
    finish_reason: Any = None
    logprobs: Any = None


class _Item(msgspec.Struct):
    embedding: Any = None
    index: Any = None  # a score body's
    score: Any = None


class _Result(msgspec.Struct):
    """An item of a RerankResponse's results (its document's text is not read)."""

    index: Any = None
    relevance_score: Any = None


class _Usage(DetailedUsage):
    prompt_tokens: Any = None
    completion_tokens: Any = None
    total_tokens: Any = None
    input_tokens: Any = None  # a Response's names for the first two
    output_tokens: Any = None
    type: Any = None  # a transcription's: "duration", with the audio's whole seconds
    seconds: Any = None


class _Part(msgspec.Struct):
    text: Any = None


class _OutputItem(msgspec.Struct):
    type: Any = None
    content: list[_Part] | None = None


class _Body(msgspec.Struct):
    id: Any = None
    model: Any = None
    choices: list[_Choice] | None = None
    data: list[_Item] | None = None  # an embeddings body's, one item per input; a score body's
    results: list[_Result] | None = None  # a RerankResponse's
    output: list[_OutputItem] | None = None  # a Response's (/v1/responses)
    status: Any = None  # a Response's: "completed" or "incomplete"
    usage: _Usage | None = None
    text: Any = None  # a transcription's or translation's (/v1/audio/...)
    duration: Any = None  # a verbose one's (response_format verbose_json), in seconds


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
            return json_row(entry, parse_record(raw), extras)
        except ValueError:
            raise changed(index) from None
    body = rec.body if entry.status == OK else None
    content = finish_reason = model = response_id = reasoning = None
    n_choices = 0
    usage = None
    first = None
    if body is not None and body.output is not None:
        # A Response: its message's text and reasoning item's; one answer, cut or not.
        content, reasoning = (
            _item_text(body.output, "message"),
            _item_text(body.output, "reasoning"),
        )
        finish_reason = "length" if body.status == "incomplete" else "stop"
        n_choices = 1
        model, response_id, usage = body.model, body.id, body.usage
    elif body is not None and isinstance(body.text, str):
        # A transcription or translation: its text is the answer.
        content, n_choices, model = body.text, 1, body.model
    elif body is not None:
        # An embeddings or score body has `data` (one item per input or pair), a rerank body
        # `results`, where the others have `choices`.
        items: Sequence[Any] | None = body.choices if body.choices is not None else body.data
        items = items if items is not None else body.results
        n_choices = len(items) if items is not None else 0
        first = body.choices[0] if body.choices else None
        if first is not None:
            if first.message is msgspec.UNSET:
                content = first.text
            elif first.message is not None:
                content, reasoning = first.message.content, first.message.reasoning
            finish_reason = first.finish_reason
        model, response_id, usage = body.model, body.id, body.usage
    # The body's usage is what the user sees in output.jsonl; the record's counts back it up.
    if usage is not None and usage.input_tokens is not None:
        usage.prompt_tokens, usage.completion_tokens = usage.input_tokens, usage.output_tokens
    prompt = int((usage and usage.prompt_tokens) or rec.prompt_tokens or 0)
    completion = int((usage and usage.completion_tokens) or rec.completion_tokens or 0)
    total = int((usage and usage.total_tokens) or prompt + completion)
    cached = usage.cached_tokens() if usage is not None else 0
    reasoning_tokens = usage.reasoning_tokens() if usage is not None else 0
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
        cached,
        reasoning_tokens,
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
            values.append(logprob_rows(first.logprobs if first is not None else None))
        elif name == "reasoning":
            values.append(reasoning)
        elif name == "tool_calls":
            message = first.message if first is not None else None
            values.append(_tool_calls(message) if isinstance(message, _Message) else None)
        elif name == "embeddings":
            data = body.data
            values.append(
                None if data is None else [embedding_value(item.embedding) for item in data]
            )
        elif name == "duration_s":
            values.append(_duration(body))
        else:  # scores, score_indices
            values.append(_scores(body, name))
    return tuple(values)


def _duration(body: _Body) -> float | None:
    """A transcription's audio duration: a verbose answer's own, else its usage's seconds
    (rounded up, as OpenAI counts them); None for an answer that reports none."""
    if isinstance(body.duration, (int, float)):
        return float(body.duration)
    usage = body.usage
    if usage is not None and usage.type == "duration" and isinstance(usage.seconds, (int, float)):
        return float(usage.seconds)
    return None


def _tool_calls(message: _Message) -> list[dict[str, Any]] | None:
    """A message's tool calls as `tool_calls` column values; None when it has none."""
    if not message.tool_calls:
        return None  # an empty list (vLLM's server writes one for no calls) is no calls
    return [
        {
            "id": call.id,
            "type": call.type,
            "name": (call.function or _Function()).name,
            "arguments": (call.function or _Function()).arguments,
        }
        for call in message.tool_calls
    ]


def _scores(body: _Body, name: str) -> list[Any] | None:
    """A score body's scores (or their pairs' indices), or a rerank body's relevance scores (or
    their documents' indices), in the body's order; None for other bodies."""
    index = name == "score_indices"
    if body.results is not None:
        return [r.index if index else r.relevance_score for r in body.results]
    if body.data and body.data[0].score is not None:
        return [item.index if index else item.score for item in body.data]
    return None


def _item_text(output: list[_OutputItem], kind: str) -> str | None:
    """The text of a Response's first output item of type `kind` (None when it has none)."""
    for item in output:
        if item.type == kind:
            return "".join(p.text for p in item.content or () if isinstance(p.text, str))
    return None


# --- row groups ----------------------------------------------------------------------------


def _table(rows: list[tuple[Any, ...]], schema: Any) -> Any:
    """A row group as an Arrow table, built a column at a time; text that is not valid Unicode
    (a lone surrogate in an old journal) has its bad characters replaced (U+FFFD), as Parquet
    strings must be UTF-8."""
    import pyarrow as pa

    columns: dict[str, Any] = dict(zip(schema.names, zip(*rows, strict=True), strict=True))
    if "embeddings" in columns:
        columns["embeddings"] = _embeddings(columns["embeddings"], schema.field("embeddings").type)
    try:
        return pa.table(columns, schema=schema)
    except (UnicodeEncodeError, pa.ArrowException):
        return pa.table(
            {
                n: c if n == "embeddings" else [_valid_text(v) for v in c]
                for n, c in columns.items()
            },
            schema=schema,
        )


def _embeddings(cells: Sequence[Any], kind: Any) -> Any:
    """A row group's embeddings column (each cell None or its request's vectors: float32 bytes
    or float lists) as an Arrow array of `kind`. When every vector is float32 bytes of the one
    size, the array is made from one buffer of them: pyarrow converts a fixed-size list from
    Python objects a value at a time (70 us a 1,024-value vector here)."""
    import numpy as np
    import pyarrow as pa

    vector = kind.value_type
    size = vector.list_size if pa.types.is_fixed_size_list(vector) else -1
    offsets, nulls, chunks = [0], [], []
    for cell in cells:
        nulls.append(cell is None)
        for v in cell or ():
            if type(v) is not bytes or len(v) != 4 * size:
                return pa.array([_as_arrays(c) for c in cells], type=kind)
            chunks.append(v)
        offsets.append(len(chunks))
    flat = np.frombuffer(b"".join(chunks), dtype="<f4").astype(np.float32, copy=False)
    return pa.ListArray.from_arrays(
        pa.array(offsets, type=pa.int32()),
        pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.float32()), size),
        type=kind,
        mask=pa.array(nulls, type=pa.bool_()),
    )


def _as_arrays(cell: list[Any] | None) -> list[Any] | None:
    """A cell's vectors as pyarrow converts them: float32 bytes as numpy arrays, floats as they
    are."""
    import numpy as np

    if cell is None:
        return None
    return [np.frombuffer(v, dtype="<f4") if type(v) is bytes else v for v in cell]


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
