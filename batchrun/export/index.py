"""The journal index: per request (and invalid input line), where its last record is and how it
ended, in input-line order; and reading those records back.

The journal holds one record per attempt; export reports each request's last attempt. To keep
memory bounded for millions of records, the index keeps only a few integers per input line (the
byte offset of its last record, its length, attempts, status: 17 bytes), never a body or a
custom_id; the writers then read the chosen records back by offset, in input-line order.

Records are read with msgspec, which decodes only the fields asked for (the body stays raw
bytes); a record it refuses (NaN, a lone surrogate escape: old journals) is read with json, as
it always was.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from batchrun.errors import BatchrunError
from batchrun.export.embeddings import embedding, raw_embedding_size
from batchrun.job.inputmap import InputMap
from batchrun.job.shards import ShardReader, restore, shard_path, shards_dir, stored_ref
from batchrun.job.state import (
    FAILED_FINAL,
    FAILED_RETRYABLE,
    INVALID,
    OK,
    PENDING,
    attempt_status,
)
from batchrun.job.vectors import VectorReader

# A request's status in the index is job/state.py's RequestStatus: PENDING is a request of a
# forced resume's input map with no finished attempt, never written out.
FAILED = (FAILED_RETRYABLE, FAILED_FINAL)
REPORTED = (OK, *FAILED, INVALID)  # every status but PENDING: the rows of the results
STATUS_NAMES: dict[int, str] = {
    OK: "succeeded",
    FAILED_RETRYABLE: "failed",
    FAILED_FINAL: "failed",
    INVALID: "invalid",
}


class Entry(NamedTuple):
    """One request (or invalid input line): where its last journal record is, and how it ended."""

    offset: int
    line: int
    attempts: int
    status: int  # OK, FAILED_RETRYABLE, FAILED_FINAL, INVALID or PENDING


# A line's status when the index has no entry there (a line of another kind, or not finished).
NONE = -1
# Lines past this are no line of an input file: a corrupt record (the tables are by line).
MAX_LINE = 2**31 - 1


@dataclass
class JournalIndex:
    """Per input line, the last journal record's offset; iterates in input-line order."""

    path: Path
    # Parallel arrays indexed by input line (a line is where it is kept: no key, order or dict
    # of custom_ids to keep): 17 bytes a line, against ~100 for an object per request.
    offsets: array[int] = field(default_factory=lambda: array("q"))
    # Each last record's length in bytes, newline included: read back with one pread each.
    lengths: array[int] = field(default_factory=lambda: array("I"))
    attempts: array[int] = field(default_factory=lambda: array("I"))
    statuses: array[int] = field(default_factory=lambda: array("b"))  # NONE: no entry
    # Hash of the journal's first request record: the same for every export of one job,
    # different between jobs, so derived ids are stable on re-export yet unlikely to collide.
    job_salt: bytes = b""
    # What the succeeded bodies hold beyond text, so the Parquet schema gains only the columns
    # that have data: any first choice with logprobs, and the sizes of the embeddings seen.
    has_logprobs: bool = False
    embedding_dims: set[int] = field(default_factory=set)
    # Any answer split by a reasoning parser (a chat message's `reasoning`, a reasoning item).
    has_reasoning: bool = False
    # Any score or rerank answer (vLLM's ScoreResponse `data` of scores, RerankResponse `results`).
    has_scores: bool = False
    # Any first choice whose message has tool calls (a forced or parsed call); an empty list
    # (as vLLM's server writes for none) is none.
    has_tool_calls: bool = False
    # Any transcription or translation that reports its audio's duration.
    has_duration: bool = False
    entries: int = 0  # lines with an entry

    def __len__(self) -> int:
        return self.entries

    def __iter__(self) -> Iterator[Entry]:
        offsets, attempts = self.offsets, self.attempts
        for line, status in enumerate(self.statuses):
            if status != NONE:
                yield Entry(offsets[line], line, attempts[line], status)

    def count(self, *statuses: int) -> int:
        """How many requests ended with one of `statuses`."""
        return sum(self.statuses.count(s) for s in statuses)

    def grow(self, line: int) -> None:
        """Make room in the tables for `line`: by an eighth at least, so that appending stays
        O(1) amortized yet the slack stays small (a large array grows in place, by mremap)."""
        have = len(self.statuses)
        if line < have:
            return
        more = max(line + 1, have + (have >> 3), 1024) - have
        self.offsets.frombytes(bytes(8 * more))
        self.lengths.frombytes(bytes(4 * more))
        self.attempts.frombytes(bytes(4 * more))
        self.statuses.frombytes(b"\xff" * more)  # NONE


class _IndexRecord(msgspec.Struct):
    """What the index reads of a journal record; the rest (the body) is skipped.

    Untyped fields (Any) hold what json would read: the index checks them as it always did."""

    kind: Any
    line: Any = msgspec.UNSET
    custom_id: Any = msgspec.UNSET
    ok: Any = msgspec.UNSET
    retryable: Any = None
    generation: Any = None
    # Where a record's vectors are in the side file (job/vectors.py); None: its body is whole.
    vectors: Any = None
    # Where a record's body is in a result shard (job/shards.py); None: in the record.
    shard: Any = None


class _Message(msgspec.Struct):
    # Present (even null) when the job ran a reasoning parser (--reasoning-parser).
    reasoning: Any = msgspec.UNSET
    tool_calls: list[msgspec.Raw] | None = None  # counted, not read


class _Choice(msgspec.Struct):
    logprobs: msgspec.Raw = msgspec.Raw(b"null")
    message: _Message | None = None


class _OutputItem(msgspec.Struct):
    """An item of a Response's output (a /v1/responses body): its type only."""

    type: Any = None


class _Item(msgspec.Struct):
    embedding: msgspec.Raw = msgspec.Raw(b"null")
    score: msgspec.Raw = msgspec.Raw(b"null")  # a ScoreResponse's item


class _AudioUsage(msgspec.Struct):
    """A usage's type: "duration" in a transcription's (its other fields unread)."""

    type: Any = None


class _Body(msgspec.Struct):
    """What the Parquet schema needs to know of a succeeded body: its shape, values unread."""

    choices: list[_Choice] | None = None
    usage: _AudioUsage | None = None
    duration: Any = None  # a verbose transcription's or translation's
    data: list[_Item] | None = None  # an embeddings body's, or a score body's
    output: list[_OutputItem] | None = None  # a Response's
    results: msgspec.Raw | None = None  # a RerankResponse's


class _ShapedRecord(_IndexRecord):
    """`_IndexRecord`, and the shape of the body. (A body of another shape: read by json.)"""

    body: _Body | None = None


_INDEX_DECODER = msgspec.json.Decoder(_IndexRecord)
_SHAPED_DECODER = msgspec.json.Decoder(_ShapedRecord)
_BODY_DECODER = msgspec.json.Decoder(_Body)


def latest_by_request(
    journal_path: Path, input_map: InputMap | None = None, *, shapes: bool = True
) -> JournalIndex:
    """Index the journal in one pass: each request's last record (by offset) and attempt count;
    with `shapes`, what the succeeded bodies hold (logprobs, embeddings: the Parquet schema's).

    Records are kept by their input line (a valid line's custom_id is unique, an invalid line's
    may be null or another's: the line names both). A torn last line is ignored; any other
    unreadable line raises BatchrunError, as `journal.read_records` does.

    With the input map of a forced resume, the index holds the requests of the input as it is
    now, each at its current line (PENDING until it has a record): records of custom_ids that
    left the file are skipped, and only that map's invalid-line records count.
    """
    index = JournalIndex(journal_path)
    generation = None
    current: dict[str, int] | None = None
    if input_map is not None:
        generation, current = input_map.generation, input_map.lines
        _hold_pending(index, current)
    if not journal_path.exists():
        return index
    try:
        f = journal_path.open("rb", buffering=1 << 20)
    except OSError as e:
        raise BatchrunError(f"cannot read the journal {journal_path}: {e.strerror or e}") from e
    decoder = _SHAPED_DECODER if shapes else _INDEX_DECODER
    # The bodies workers wrote to their shards (job/shards.py): read for their shapes, and for
    # the salt's line.
    shards = ShardReader(shards_dir(journal_path.parent))
    with f, shards:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.endswith(b"\n"):
                break  # torn by a crash mid-write: never a finished attempt
            read = _read_record(raw, decoder, journal_path, lineno)
            if read is None:
                continue  # a record kind from a newer batchrun: not a request outcome
            rec, line, status = read
            if not index.job_salt:
                # Of the line as an earlier version wrote it: ids stay what they were.
                with VectorReader(journal_path) as vectors:
                    index.job_salt = hashlib.sha256(restore(raw, vectors, shards)).digest()
            if status == INVALID:
                # Untagged: submit's reading of the file; tagged: a forced resume's (see InputMap).
                if rec.generation != generation:
                    continue
            elif current is not None:
                # Where the request is now, not where it was when it ran (a valid line's
                # custom_id is unique: the map names it).
                now = current.get(str(rec.custom_id))
                if now is None:
                    continue  # its line left the input file: no longer part of the job
                line = now
            if not 0 <= line <= MAX_LINE:
                raise _corrupt(journal_path, lineno)
            if status == OK and shapes and isinstance(rec, _ShapedRecord | _JsonRecord):
                _note_shapes(index, rec, shards, journal_path, lineno)
            _keep(index, line, status, start, len(raw))
    return index


def _hold_pending(index: JournalIndex, current: dict[str, int]) -> None:
    """Every request of a forced resume's input map in the index, PENDING at its line."""
    index.grow(max(current.values(), default=-1))
    for line in current.values():
        if index.statuses[line] == NONE:
            index.entries += 1
        index.offsets[line] = -1
        index.statuses[line] = PENDING


def _read_record(
    raw: bytes, decoder: msgspec.json.Decoder[Any], journal_path: Path, lineno: int
) -> tuple[_IndexRecord | _JsonRecord, int, int] | None:
    """A journal line's record, its input line and status; None for a record kind of a newer
    batchrun. A line that is no record raises the journal's corrupt-line error."""
    try:
        if not raw.isascii():
            raw.decode("utf-8")  # msgspec checks only the text it decodes, json all
        try:
            rec: _IndexRecord | _JsonRecord = decoder.decode(raw)
        except ValueError:  # msgspec.DecodeError, or bytes that are not UTF-8: ask json
            rec = _json_index_record(raw)
        kind = rec.kind
        if rec.line is msgspec.UNSET:
            raise KeyError("line")
        line = int(rec.line)
        if kind == "result":
            if rec.custom_id is msgspec.UNSET or rec.ok is msgspec.UNSET:
                raise KeyError("custom_id or ok")
            return rec, line, attempt_status(rec.ok, rec.retryable)
        if kind == "invalid":
            return rec, line, INVALID
        return None
    except (KeyError, TypeError, ValueError):
        raise _corrupt(journal_path, lineno) from None


def _note_shapes(
    index: JournalIndex,
    rec: _ShapedRecord | _JsonRecord,
    shards: ShardReader,
    journal_path: Path,
    lineno: int,
) -> None:
    """What a succeeded record's body holds, wherever the body is, into the index."""
    if rec.shard is not None:
        _note_shard_body(index, rec.shard, shards, journal_path, lineno)
    else:
        _note_body(index, rec.body)
    if type(rec.vectors) is list:  # split out: the sizes are the record's
        index.embedding_dims.update(size // 4 for size in rec.vectors[1:])


def _keep(index: JournalIndex, line: int, status: int, start: int, length: int) -> None:
    """A record at byte `start` as the latest of its input line."""
    if line >= len(index.statuses):
        index.grow(line)
    if index.statuses[line] == NONE:
        index.entries += 1
    # Invalid lines count no attempts; a new line's count starts at the zero it grew with.
    index.offsets[line] = start
    index.lengths[line] = length
    index.statuses[line] = status
    if status != INVALID:
        index.attempts[line] += 1


def _corrupt(journal_path: Path, lineno: int) -> BatchrunError:
    return BatchrunError(
        f"the journal {journal_path} is corrupt at line {lineno}; "
        "move that line out of the file (or restore a backup) and run again"
    )


@dataclass
class _JsonRecord:
    """The index's fields of a record that msgspec refused, as json reads them."""

    kind: Any
    body: object  # the body json decoded, not its bytes
    line: Any
    custom_id: Any
    ok: Any
    retryable: Any
    generation: Any
    vectors: Any
    shard: Any


def _json_index_record(raw: bytes) -> _JsonRecord:
    """The index's fields of a journal record msgspec refused, as json reads them; ValueError
    when the line is not a record."""
    rec = parse_record(raw)
    return _JsonRecord(
        kind=rec["kind"],
        body=rec.get("body"),
        line=rec.get("line", msgspec.UNSET),
        custom_id=rec.get("custom_id", msgspec.UNSET),
        ok=rec.get("ok", msgspec.UNSET),
        retryable=rec.get("retryable"),
        generation=rec.get("generation"),
        vectors=rec.get("vectors"),
        shard=rec.get("shard"),
    )


# --- what the bodies hold ----------------------------------------------------------------

# An embedding split out to the side file, as the body holds it (openai/vectors.py PLACEHOLDER).
_SPLIT = msgspec.Raw(b'""')


def _note_body(index: JournalIndex, body: object) -> None:
    """Record in `index` whether a succeeded body (its shape, or as json read it) has logprobs,
    reasoning, tool calls, embeddings (and their size) or scores."""
    if not isinstance(body, _Body):
        _note_decoded_body(index, body)
        return
    if body.duration is not None or (body.usage is not None and body.usage.type == "duration"):
        index.has_duration = True
    if body.results is not None:
        index.has_scores = True
    elif body.data is not None:
        if body.data and bytes(body.data[0].score) != b"null":
            index.has_scores = True
        for item in body.data:
            if item.embedding == _SPLIT:
                continue  # its vector is in the side file: counted from the record's sizes
            size = raw_embedding_size(item.embedding)
            if size is not None:
                index.embedding_dims.add(size)
    elif body.choices:
        first = body.choices[0]
        if not index.has_logprobs:
            index.has_logprobs = bytes(first.logprobs) != b"null"
        if first.message is not None and first.message.reasoning is not msgspec.UNSET:
            index.has_reasoning = True
        if first.message is not None and first.message.tool_calls:
            index.has_tool_calls = True
    elif body.output:
        index.has_reasoning = index.has_reasoning or any(
            item.type == "reasoning" for item in body.output
        )


def _note_shard_body(
    index: JournalIndex, stored: object, shards: ShardReader, journal_path: Path, lineno: int
) -> None:
    """`_note_body` for a record whose body is in a result shard (its `shard` field, `stored`):
    its JSON read from there and decoded as the record's would be, and its vectors' sizes."""
    try:
        ref = stored_ref(stored)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not [name, at, length, ...]
        raise _corrupt(journal_path, lineno) from None
    data = shards.read(ref.name, ref.at, ref.body)
    try:
        if not data.isascii():
            data.decode("utf-8")
        body: object = _BODY_DECODER.decode(data)
    except ValueError:  # as for a whole record: json reads what msgspec refuses
        try:
            body = json.loads(data.decode("utf-8"))
        except ValueError:
            raise BatchrunError(
                f"the result shard {shard_path(shards.directory, ref.name)} holds no body "
                f"where line {lineno} of the journal {journal_path} says: it was written "
                "over; restore it from a backup"
            ) from None
    _note_body(index, body)
    index.embedding_dims.update(size // 4 for size in ref.vectors)


def _note_decoded_body(index: JournalIndex, body: object) -> None:
    """`_note_body` for a body json decoded."""
    if not isinstance(body, dict):
        return
    usage = body.get("usage")
    if body.get("duration") is not None or (
        isinstance(usage, dict) and usage.get("type") == "duration"
    ):
        index.has_duration = True
    data = body.get("data")
    if isinstance(body.get("results"), list) or (
        isinstance(data, list) and data and isinstance(data[0], dict) and "score" in data[0]
    ):
        index.has_scores = True
    if isinstance(data, list):
        for item in data:
            vector = embedding(item.get("embedding")) if isinstance(item, dict) else None
            if vector is not None and item.get("embedding") != "":  # "": split out
                index.embedding_dims.add(len(vector))
        return
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        index.has_logprobs = index.has_logprobs or choices[0].get("logprobs") is not None
        message = choices[0].get("message")
        index.has_reasoning = index.has_reasoning or (
            isinstance(message, dict) and "reasoning" in message
        )
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        index.has_tool_calls = index.has_tool_calls or (isinstance(calls, list) and bool(calls))
    output = body.get("output")
    if isinstance(output, list):
        index.has_reasoning = index.has_reasoning or any(
            isinstance(item, dict) and item.get("type") == "reasoning" for item in output
        )


# --- reading records back ------------------------------------------------------------------


def parse_record(raw: bytes) -> dict[str, Any]:
    """A journal record, as json reads it; ValueError when the line is not one."""
    # Decoding first skips json's per-call encoding sniffing; a bad byte is a ValueError too.
    rec = json.loads(raw.decode("utf-8"))
    if not isinstance(rec, dict) or "kind" not in rec:
        raise ValueError("not a journal record")
    return rec


def read_back(index: JournalIndex, statuses: Collection[int]) -> Iterator[tuple[Entry, bytes]]:
    """Entries with one of `statuses`, each with its last record's line (bytes), by line."""
    wanted = set(statuses)
    if not any(index.statuses.count(s) for s in wanted):
        return
    try:
        fd = os.open(index.path, os.O_RDONLY)
    except OSError as e:
        raise BatchrunError(f"cannot read the journal {index.path}: {e.strerror or e}") from e
    offsets, lengths, attempts = index.offsets, index.lengths, index.attempts
    pread = os.pread
    # Lines whose vectors are in the side file, or whose body is in a result shard, come back
    # whole: as an earlier version wrote them.
    vectors = VectorReader(index.path)
    shards = ShardReader(shards_dir(index.path.parent))
    try:
        for line, status in enumerate(index.statuses):
            if status not in wanted:
                continue  # skipped before the read: no I/O or parsing for the other file's lines
            # One read of exactly the record, wherever it is: the journal is in the order
            # requests finished (the plan's, not the file's), and a buffered reader would read
            # a whole buffer again for every jump back.
            offset = offsets[line]
            raw = pread(fd, lengths[line], offset)
            if raw.endswith(b"]}\n"):  # (the cheap test first: see job/vectors.py)
                raw = restore(raw, vectors, shards)
            yield Entry(offset, line, attempts[line], status), raw
    finally:
        os.close(fd)
        vectors.close()
        shards.close()


def changed(index: JournalIndex) -> BatchrunError:
    """The error for a record read back that is not one."""
    # The index was built from this file a moment ago; only a rewrite can cause this.
    return BatchrunError(f"the journal {index.path} changed during export; run the export again")
