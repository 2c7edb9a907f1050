"""output.jsonl and errors.jsonl: the OpenAI batch output format, one line per request.

A succeeded request's body is copied from the journal as it is, bytes for bytes: the journal
wrote it with the encoder export would use (`journal.encode_record`: compact, floats as json
writes them), so decoding and encoding it again would give the same bytes, only slower. A record
not written that way (not compact), or one msgspec refuses (NaN; a lone surrogate, which the
journal writes as a \\u escape, all its non-ASCII text with it) is decoded and encoded again, as
it always was. An embeddings body journaled with its vectors as base64 for a request that asked
for floats is the exception: its vectors are written as floats (export/embeddings.py).
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

import msgspec

from batchrun.export.embeddings import as_requested, float_body
from batchrun.export.index import (
    FAILED,
    Entry,
    JournalIndex,
    changed,
    parse_record,
    read_back,
)
from batchrun.job.journal import encode_record
from batchrun.job.paths import ERRORS_NAME as ERRORS_NAME
from batchrun.job.paths import OUTPUT_NAME as OUTPUT_NAME
from batchrun.job.state import INVALID, OK
from batchrun.openai.vectors import FLOAT_MARK_PREFIX

_CHUNK = 4096  # output lines encoded (and written) at a time
_MARK_LEN = len(FLOAT_MARK_PREFIX)


class _Result(msgspec.Struct):
    """What an output line takes of a succeeded result record; the body stays its bytes."""

    kind: Any
    custom_id: Any
    body: msgspec.Raw


class _Response(msgspec.Struct):
    status_code: int
    request_id: str
    body: msgspec.Raw


class _OutputLine(msgspec.Struct):
    """An output.jsonl line, its keys in the order `_output_line` writes them."""

    id: str
    custom_id: str
    response: _Response
    error: None = None


_RESULT_DECODER = msgspec.json.Decoder(_Result)
_RECORD_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


def write_output(index: JournalIndex, f: IO[bytes]) -> None:
    """Write output.jsonl: the succeeded requests, by line."""
    ids = _Ids(index.job_salt)
    lines: list[_OutputLine] = []
    for _, raw in read_back(index, (OK,)):
        line = _fast_output_line(ids, raw)
        if line is not None:
            lines.append(line)
            if len(lines) < _CHUNK:
                continue
        # A full chunk, or a record for the slow path: the lines before it go first.
        f.write(_ENCODER.encode_lines(lines))
        lines.clear()
        if line is None:
            f.write(encode_record(_output_line(ids, _record(index, raw))))
    f.write(_ENCODER.encode_lines(lines))


def write_errors(index: JournalIndex, f: IO[bytes]) -> None:
    """Write errors.jsonl: the failed requests and the invalid input lines, by line."""
    ids = _Ids(index.job_salt)
    for entry, raw in read_back(index, (*FAILED, INVALID)):
        f.write(encode_record(_error_line(ids, _record(index, raw), entry)))


class _Ids:
    """A batch line's `id` and `request_id`: stable per job and request, distinct otherwise."""

    def __init__(self, salt: bytes) -> None:
        self._salted = hashlib.sha256(salt + b"\0")

    def of_result(self, custom_id: object) -> tuple[str, str]:
        # surrogatepass: a lone surrogate in an old journal's custom_id still gets an id; other
        # text encodes as plain UTF-8 does, so ids stay what they always were.
        return self._of(b"r\0" + str(custom_id).encode("utf-8", "surrogatepass"))

    def of_record(self, rec: dict[str, Any]) -> tuple[str, str]:
        if rec["kind"] == "result":
            return self.of_result(rec["custom_id"])
        return self._of(b"i\0" + str(rec["line"]).encode("ascii"))

    def _of(self, key: bytes) -> tuple[str, str]:
        h = self._salted.copy()
        h.update(key)
        digest = h.hexdigest()
        return f"batch_req_{digest[:32]}", digest[32:]


def _fast_output_line(ids: _Ids, raw: bytes) -> _OutputLine | None:
    """The output line of a record, its body the record's bytes; None: decode it all instead."""
    if not raw.startswith(b'{"kind":"'):
        return None  # not written as the journal writes records (not compact)
    try:
        if not raw.isascii():
            raw.decode("utf-8")  # the body is copied unread: check its text is text
        rec = _RESULT_DECODER.decode(raw)
    except ValueError:  # msgspec.DecodeError, or bytes that are not UTF-8
        return None
    if type(rec.custom_id) is not str:
        return None
    line_id, request_id = ids.of_result(rec.custom_id)
    body = rec.body
    if memoryview(body)[:_MARK_LEN] == FLOAT_MARK_PREFIX:
        floats = float_body(bytes(body))
        if floats is not None:
            body = msgspec.Raw(floats)
    return _OutputLine(line_id, rec.custom_id, _Response(200, request_id, body))


def _record(index: JournalIndex, raw: bytes) -> dict[str, Any]:
    """A record read back, decoded: by msgspec, or where it refuses, by json."""
    try:
        rec: object = _RECORD_DECODER.decode(raw)
    except ValueError:
        rec = None
    if isinstance(rec, dict) and "kind" in rec:
        return rec
    try:
        return parse_record(raw)
    except ValueError:
        raise changed(index) from None


def _output_line(ids: _Ids, rec: dict[str, Any]) -> dict[str, Any]:
    line_id, request_id = ids.of_record(rec)
    return {
        "id": line_id,
        "custom_id": rec["custom_id"],
        "response": {"status_code": 200, "request_id": request_id, "body": _as_requested(rec)},
        "error": None,
    }


def _as_requested(rec: dict[str, Any]) -> Any:
    """A decoded record's body as its request asked for it (export/embeddings.py)."""
    body = rec["body"]
    return as_requested(body) if isinstance(body, dict) else body


def _error_line(ids: _Ids, rec: dict[str, Any], entry: Entry) -> dict[str, Any]:
    line_id, request_id = ids.of_record(rec)
    err = rec.get("error") or {}
    response = (
        None
        if entry.status == INVALID
        else {"status_code": rec.get("status_code"), "request_id": request_id, "body": None}
    )
    # The entry's line, not the record's: after a forced resume the request may have moved.
    return {
        "id": line_id,
        "custom_id": rec.get("custom_id"),
        "response": response,
        "error": {"code": err.get("code"), "message": err.get("message"), "line": entry.line},
    }
