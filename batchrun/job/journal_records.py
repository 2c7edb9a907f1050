"""The journal's record shapes, typed: one attempt's result, one invalid input line.

TypedDicts, not classes: a record is built per finished request on the parent's hot path and
handed to msgspec as it is, so the type costs nothing at run time and mypy checks every key.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal, TypedDict

import msgspec
from typing_extensions import NotRequired

from batchrun.openai.records import LineError, Outcome


class ResultRecord(TypedDict):
    """One finished attempt at one request."""

    kind: Literal["result"]
    custom_id: str
    line: int  # the request's 1-based input line
    attempt: int  # 1 for the first attempt
    ok: bool
    status_code: int
    body: dict[str, Any] | msgspec.Raw | None  # the OpenAI response object when ok
    error: dict[str, str] | None  # {"code", "message"} when not ok
    retryable: bool
    prompt_tokens: int
    completion_tokens: int
    latency_s: float | msgspec.Raw  # Raw: a float written with all its digits
    time: float  # when it was journaled, seconds since the epoch, to the millisecond
    worker: NotRequired[int]  # the index of the worker that ran it
    # The custom_id of the identical request whose outcome this one copies (run/dedup.py):
    # the engine did not run it again.
    copy_of: NotRequired[str]
    # Answered from the cross-job answer cache (run/answer_cache.py): the engine did not run it.
    cached: NotRequired[bool]
    # The model its line named (a base model or an adapter; run/model_routes.py), in a job of
    # several models or with adapters: status counts per model.
    model: NotRequired[str]
    # The vectors of an embeddings body the worker split them out of (openai/vectors.py): their
    # float32 bytes until the journal writes them to its side file, then where they are there,
    # `[at, n1, n2, ...]`, the record's last field (job/vectors.py).
    vectors: NotRequired[list[bytes] | list[int]]
    # Where its worker wrote the body (then null here) and vectors: `[shard, at, body bytes,
    # vector bytes...]`, the record's last field (job/shards.py).
    shard: NotRequired[list[str | int]]


class InvalidRecord(TypedDict):
    """An input line that failed validation; it never runs."""

    kind: Literal["invalid"]
    custom_id: str | None  # null when none could be read from the line
    line: int
    error: dict[str, str]
    time: float
    # A forced resume's reading of a changed input: its input map's generation.
    generation: NotRequired[str]


def result_record(
    outcome: Outcome, line: int, attempt: int, now: float | None = None
) -> ResultRecord:
    """The journal record of one attempt, finished at `now` (as written: `time.time()` to the
    millisecond; by default, now); a deduplicated copy's names the request it was copied from."""
    latency = round(outcome.latency_s, 6)
    rec: ResultRecord = {
        "kind": "result",
        "custom_id": outcome.custom_id,
        "line": line,
        "attempt": attempt,
        "ok": outcome.ok,
        "status_code": outcome.status_code,
        "body": outcome.body,
        "error": outcome.error,
        "retryable": outcome.retryable,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        # msgspec writes a float below 1e-4 other than json does (`0.00005` for `5e-05`): the
        # journal's bytes are json's, so such a latency goes as json's text (journal.exact_float).
        "latency_s": latency if latency == 0 or 1e-4 <= latency < 1e16 else _json_float(latency),
        "time": round(time.time(), 3) if now is None else now,
    }
    extra = outcome.extra
    if extra:  # a copy answered for a duplicate names its representative (run/dedup.py)
        if "copy_of" in extra:
            rec["copy_of"] = extra["copy_of"]
        if extra.get("cached"):  # answered from the cross-job cache (run/answer_cache.py)
            rec["cached"] = True
    if outcome.vectors is not None:
        rec["vectors"] = outcome.vectors
    return rec


def _json_float(value: float) -> msgspec.Raw:
    """`value` as json writes it (a latency: finite)."""
    return msgspec.Raw(repr(value) if math.isfinite(value) else "null")


def invalid_record(err: LineError) -> InvalidRecord:
    """The journal record of an input line that failed validation."""
    return {
        "kind": "invalid",
        "custom_id": err.custom_id,
        "line": err.line,
        "error": {"code": err.code, "message": err.message},
        "time": round(time.time(), 3),
    }
