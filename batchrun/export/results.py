"""Export a job's journal: output.jsonl + errors.jsonl (OpenAI batch format) and results.parquet.

The journal holds one record per attempt; export reports each request's last attempt. To keep
memory bounded for millions of records, the first pass keeps only a few integers per request
(the byte offset of its last record, its line, attempts, outcome), never a body; the writers
then read the chosen records back by offset, in input-line order.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import secrets
import shlex
import sys
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from batchrun.errors import BatchrunError
from batchrun.job.inputmap import InputMap, load_input_map
from batchrun.job.journal import encode_record
from batchrun.job.manifest import load_manifest, recorded_runner
from batchrun.job.paths import JobPaths

OUTPUT_NAME = "output.jsonl"
ERRORS_NAME = "errors.jsonl"
PARQUET_NAME = "results.parquet"

# Outcome of a request's last record, as stored in the index; PENDING: a request of the input
# map (a forced resume's) with no finished attempt, never written out.
FAILED, SUCCEEDED, INVALID, PENDING = 0, 1, 2, 3
_STATUS_NAMES = {FAILED: "failed", SUCCEEDED: "succeeded", INVALID: "invalid"}


class Entry(NamedTuple):
    """One request (or invalid input line): where its last journal record is, and how it ended."""

    offset: int
    line: int
    attempts: int
    status: int  # FAILED, SUCCEEDED or INVALID


@dataclass
class JournalIndex:
    """Per request, the last journal record's offset; iterates in input-line order."""

    path: Path
    # Parallel arrays, not one object per request: a few bytes each instead of ~100.
    offsets: array[int]
    lines: array[int]
    attempts: array[int]
    statuses: array[int]
    # Hash of the journal's first line: the same for every export of one job, different between
    # jobs, so derived ids are stable on re-export yet unlikely to collide across jobs.
    job_salt: bytes
    # What the succeeded bodies hold beyond text, so the Parquet schema gains only the columns
    # that have data: any first choice with logprobs, and the sizes of the embeddings seen.
    has_logprobs: bool = False
    embedding_dims: set[int] = field(default_factory=set)
    _order: array[int] | None = field(default=None, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.offsets)

    def __iter__(self) -> Iterator[Entry]:
        if self._order is None or len(self._order) != len(self.lines):
            self._order = array("q", sorted(range(len(self.lines)), key=self.lines.__getitem__))
        for i in self._order:
            yield Entry(self.offsets[i], self.lines[i], self.attempts[i], self.statuses[i])

    def count(self, status: int) -> int:
        """How many requests ended with `status`."""
        return self.statuses.count(status)


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: the files, and how many requests succeeded, failed, or were invalid."""

    paths: tuple[Path, ...]
    succeeded: int
    failed: int
    invalid: int
    # Valid requests with no finished attempt, not in the files; None when no manifest says how
    # many requests the job has.
    pending: int | None = None
    running_pid: int | None = None  # the process running the job while it was exported

    @property
    def total(self) -> int:
        """All rows reported: requests plus invalid input lines."""
        return self.succeeded + self.failed + self.invalid

    def describe(self) -> str:
        """One line for people: the counts, and what the files lack when the export is partial."""
        text = (
            f"{self.succeeded:,} succeeded, {self.failed:,} failed, {self.invalid:,} invalid lines"
        )
        if self.pending:
            text += f", {self.pending:,} pending (not in the output: partial export)"
        if self.running_pid is not None:
            text += f"; the job is running (process {self.running_pid}), export again when it ends"
        return text


def latest_by_request(journal_path: Path, input_map: InputMap | None = None) -> JournalIndex:
    """Index the journal in one pass: each request's last record (by offset) and attempt count.

    Result records are keyed by custom_id (unique among valid lines); invalid-line records by
    line number, since their custom_id may be null or duplicate a valid one. A torn last line is
    ignored; any other unreadable line raises BatchrunError, as `journal.read_records` does.

    With the input map of a forced resume, the index holds the requests of the input as it is
    now, each at its current line (PENDING until it has a record): records of custom_ids that
    left the file are skipped, and only that map's invalid-line records count.
    """
    index = JournalIndex(journal_path, array("q"), array("q"), array("i"), array("b"), b"")
    by_id: dict[str, int] = {}
    by_line: dict[int, int] = {}
    generation = None
    if input_map is not None:
        generation = input_map.generation
        for custom_id, line in input_map.lines.items():
            by_id[custom_id] = len(index.offsets)
            index.offsets.append(-1)
            index.lines.append(line)
            index.attempts.append(0)
            index.statuses.append(PENDING)
    if not journal_path.exists():
        return index
    try:
        f = journal_path.open("rb")
    except OSError as e:
        raise BatchrunError(f"cannot read the journal {journal_path}: {e.strerror or e}") from e
    with f:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.endswith(b"\n"):
                break  # torn by a crash mid-write: never a finished attempt
            try:
                rec = _parse(raw)
                kind, line = rec["kind"], int(rec["line"])
                if kind == "result":
                    status = SUCCEEDED if rec["ok"] else FAILED
                    key: dict[Any, int] = by_id
                    k: Any = str(rec["custom_id"])
                elif kind == "invalid":
                    status, key, k = INVALID, by_line, line
                else:
                    continue  # a record kind from a newer batchrun: not a request outcome
            except (KeyError, TypeError, ValueError):
                raise BatchrunError(
                    f"the journal {journal_path} is corrupt at line {lineno}; "
                    "move that line out of the file (or restore a backup) and run again"
                ) from None
            if not index.job_salt:
                index.job_salt = hashlib.sha256(raw).digest()
            idx = key.get(k)
            if status == INVALID:
                # Untagged: submit's reading of the file; tagged: a forced resume's (see InputMap).
                if rec.get("generation") != generation:
                    continue
            elif input_map is not None:
                if idx is None:
                    continue  # its line left the input file: no longer part of the job
                line = index.lines[idx]  # where the request is now, not where it was when it ran
            if status == SUCCEEDED:
                _note_body(index, rec.get("body"))
            if idx is None:
                key[k] = len(index.offsets)
                index.offsets.append(start)
                index.lines.append(line)
                index.attempts.append(0 if status == INVALID else 1)
                index.statuses.append(status)
            else:
                index.offsets[idx] = start
                index.lines[idx] = line
                index.statuses[idx] = status
                if status != INVALID:
                    index.attempts[idx] += 1
    return index


def export_job(
    job_dir: Path, out_dir: Path, *, parquet: bool = False, partial: bool = False
) -> ExportSummary:
    """Export a job; refuse while requests are pending, unless `partial` (then count them).

    Only reads the job directory and takes no lock, so it can run beside the job's own run.
    The requests are those of the input as it is now (after a forced resume, its input map).
    """
    paths = JobPaths(job_dir)
    manifest: dict[str, Any] | None = None
    try:
        manifest = load_manifest(paths)
    except BatchrunError as e:
        if not paths.journal.exists():
            raise  # not a job at all
        if paths.manifest.exists() and not partial:
            raise BatchrunError(
                f"{e}; pass --partial to export the journal's results without it"
            ) from None
        # No manifest (a submit killed as it began): the journal's results, count of pending unknown.
    input_map = load_input_map(paths, manifest) if manifest is not None else None
    _prepare(out_dir)  # before the journal pass: a bad --output-dir fails at once
    index = latest_by_request(paths.journal, input_map)
    pending: int | None = None
    running: int | None = None
    if manifest is not None:
        if input_map is not None:
            pending = index.count(PENDING)
        else:
            finished = index.count(SUCCEEDED) + index.count(FAILED)
            pending = max(0, int(manifest["requests"]) - finished)
        running = recorded_runner(manifest)
    if pending and not partial:
        are = "request is" if pending == 1 else "requests are"
        if running is not None:
            raise BatchrunError(
                f"{pending:,} {are} still pending: the job is running (process {running}); "
                "wait for it to finish, or pass --partial to export only what is finished so far"
            )
        raise BatchrunError(
            f"{pending:,} {are} still pending; continue the job with: batchrun resume "
            f"--job-dir {shlex.quote(str(job_dir))}, or pass --partial to export only what is "
            "finished"
        )
    summary = _write_parquet(index, out_dir) if parquet else _write_jsonl(index, out_dir)
    return dataclasses.replace(summary, pending=pending, running_pid=running)


def export_jsonl(job_dir: Path, journal_path: Path, out_dir: Path) -> ExportSummary:
    """Write output.jsonl and errors.jsonl (OpenAI batch output format) into `out_dir`.

    Line ids derive from the journal, not from `job_dir`'s path, so moving or renaming the job
    directory does not change them.
    """
    if not job_dir.is_dir():
        raise BatchrunError(f"no job directory at {job_dir}; check --job-dir")
    _prepare(out_dir)  # before the journal pass: a bad --output-dir fails at once
    return _write_jsonl(latest_by_request(journal_path), out_dir)


def _write_jsonl(index: JournalIndex, out_dir: Path) -> ExportSummary:
    """Write output.jsonl and errors.jsonl from an index of the journal."""
    out_path, err_path = out_dir / OUTPUT_NAME, out_dir / ERRORS_NAME

    def write_output(f: IO[bytes]) -> None:
        for _, rec in _records(index, {SUCCEEDED}):
            f.write(_dumps(_output_line(index.job_salt, rec)))

    def write_errors(f: IO[bytes]) -> None:
        for entry, rec in _records(index, {FAILED, INVALID}):
            f.write(_dumps(_error_line(index.job_salt, rec, entry)))

    # Each file makes its own pass over the index, so neither holds the other's lines.
    _atomic_write(out_path, write_output)
    _atomic_write(err_path, write_errors)
    return ExportSummary(
        paths=(out_path, err_path),
        succeeded=index.count(SUCCEEDED),
        failed=index.count(FAILED),
        invalid=index.count(INVALID),
    )


def export_parquet(
    journal_path: Path, out_dir: Path, row_group_size: int = 10_000
) -> ExportSummary:
    """Write results.parquet: one flat row per request and per invalid line, in row groups.

    Beyond the flat columns, a job whose answers carry logprobs gets a `logprobs` column (the first
    choice's tokens, as nested lists) and an embeddings job an `embeddings` column (per request,
    its vectors as fixed-size lists of float32).
    """
    if row_group_size < 1:
        raise ValueError("row_group_size must be at least 1")
    _prepare(out_dir)
    return _write_parquet(latest_by_request(journal_path), out_dir, row_group_size)


def _write_parquet(
    index: JournalIndex, out_dir: Path, row_group_size: int = 10_000
) -> ExportSummary:
    """Write results.parquet from an index of the journal."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = out_dir / PARQUET_NAME
    schema = _parquet_schema(index)
    names = schema.names
    extras = names[len(_BASE_COLUMNS) :]

    def write(f: IO[bytes]) -> None:
        writer = pq.ParquetWriter(f, schema)
        try:
            columns: dict[str, list[Any]] = {n: [] for n in names}
            for entry, rec in _records(index, {SUCCEEDED, FAILED, INVALID}):
                row = _parquet_row(entry, rec) + _extra_values(extras, entry, rec)
                for name, value in zip(names, row, strict=True):
                    columns[name].append(value)
                if len(columns["line"]) >= row_group_size:
                    writer.write_table(_table(pa, columns, schema))
                    columns = {n: [] for n in names}
            if columns["line"]:
                writer.write_table(_table(pa, columns, schema))
        finally:
            writer.close()  # writes the footer; the file object stays open for the fsync

    _atomic_write(path, write)
    return ExportSummary(
        paths=(path,),
        succeeded=index.count(SUCCEEDED),
        failed=index.count(FAILED),
        invalid=index.count(INVALID),
    )


def _table(pa: Any, columns: dict[str, list[Any]], schema: Any) -> Any:
    """A row group as an Arrow table; text that is not valid Unicode (a lone surrogate in an old
    journal) has its bad characters replaced (U+FFFD), as Parquet strings must be UTF-8."""
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


def _note_body(index: JournalIndex, body: object) -> None:
    """Record in `index` whether a succeeded body has logprobs or embeddings (and their size)."""
    if not isinstance(body, dict):
        return
    data = body.get("data")
    if isinstance(data, list):
        for item in data:
            vector = _embedding(item)
            if vector is not None:
                index.embedding_dims.add(len(vector))
        return
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        index.has_logprobs = index.has_logprobs or choices[0].get("logprobs") is not None


# --- reading the journal -------------------------------------------------------------------


def _parse(raw: bytes) -> dict[str, Any]:
    """A journal record; ValueError when the line is not one."""
    # Decoding first skips json's per-call encoding sniffing; a bad byte is a ValueError too.
    rec = json.loads(raw.decode("utf-8"))
    if not isinstance(rec, dict) or "kind" not in rec:
        raise ValueError("not a journal record")
    return rec


def _records(index: JournalIndex, statuses: set[int]) -> Iterator[tuple[Entry, dict[str, Any]]]:
    """Entries with one of `statuses`, each with its last record read back by offset, by line."""
    if len(index) == 0:
        return
    try:
        f = index.path.open("rb")
    except OSError as e:
        raise BatchrunError(f"cannot read the journal {index.path}: {e.strerror or e}") from e
    with f:
        for entry in index:
            if entry.status not in statuses:
                continue  # skipped before the read: no I/O or parsing for the other file's lines
            f.seek(entry.offset)
            try:
                rec = _parse(f.readline())
            except ValueError:
                # The index was built from this file a moment ago; only a rewrite can cause this.
                raise BatchrunError(
                    f"the journal {index.path} changed during export; run the export again"
                ) from None
            yield entry, rec


# --- building lines and rows ---------------------------------------------------------------


def _ids(salt: bytes, rec: dict[str, Any]) -> tuple[str, str]:
    """The batch line's `id` and `request_id`: stable per job and request, distinct otherwise."""
    if rec["kind"] == "result":
        # surrogatepass: a lone surrogate in an old journal's custom_id still gets an id; other
        # text encodes as plain UTF-8 does, so ids stay what they always were.
        key = b"r\0" + str(rec["custom_id"]).encode("utf-8", "surrogatepass")
    else:
        key = b"i\0" + str(rec["line"]).encode("ascii")
    digest = hashlib.sha256(salt + b"\0" + key).hexdigest()
    return f"batch_req_{digest[:32]}", digest[32:]


def _output_line(salt: bytes, rec: dict[str, Any]) -> dict[str, Any]:
    line_id, request_id = _ids(salt, rec)
    return {
        "id": line_id,
        "custom_id": rec["custom_id"],
        "response": {"status_code": 200, "request_id": request_id, "body": rec["body"]},
        "error": None,
    }


def _error_line(salt: bytes, rec: dict[str, Any], entry: Entry) -> dict[str, Any]:
    line_id, request_id = _ids(salt, rec)
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


def _dumps(obj: dict[str, Any]) -> bytes:
    # As the journal writes: nothing a record holds (a lone surrogate) can stop an export.
    return encode_record(obj)


def _parquet_row(entry: Entry, rec: dict[str, Any]) -> tuple[Any, ...]:
    """One row, in `_parquet_schema` column order."""
    body = rec.get("body") if entry.status == SUCCEEDED else None
    choices = body.get("choices") if isinstance(body, dict) else None
    # An embeddings body has `data` (one item per input) where the others have `choices`.
    items = choices if choices is not None else body.get("data") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else {}
    if "message" in first:
        content = (first.get("message") or {}).get("content")
    else:
        content = first.get("text")
    usage = (body.get("usage") if isinstance(body, dict) else None) or {}
    # The body's usage is what the user sees in output.jsonl; the record's counts back it up.
    prompt = int(usage.get("prompt_tokens") or rec.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or rec.get("completion_tokens") or 0)
    err = rec.get("error") or {}
    invalid = entry.status == INVALID
    return (
        rec.get("custom_id"),
        entry.line,
        _STATUS_NAMES[entry.status],
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
    )


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


def _parquet_schema(index: JournalIndex | None = None) -> Any:
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
    try:
        import pandas as pd
    except ImportError:
        return schema
    # Without this, pandas reads status_code as float64 when any row is invalid (null) and as
    # int32 otherwise; the metadata makes it Int32 in every file.
    nullable_ints = {"status_code"}

    def dtype(col: Any) -> Any:
        if col.name in nullable_ints:
            return "Int32"
        if pa.types.is_string(col.type) or pa.types.is_nested(col.type):
            return object
        return col.type.to_pandas_dtype()

    empty = pd.DataFrame({col.name: pd.Series([], dtype=dtype(col)) for col in schema})
    meta = pa.Table.from_pandas(empty, schema=schema, preserve_index=False).schema.metadata
    return schema.with_metadata(meta)


def _extra_values(names: list[str], entry: Entry, rec: dict[str, Any]) -> tuple[Any, ...]:
    """The values of the optional columns `names` for one row."""
    body = rec.get("body") if entry.status == SUCCEEDED else None
    if not isinstance(body, dict):
        return (None,) * len(names)
    values: list[Any] = []
    for name in names:
        if name == "logprobs":
            values.append(_first_choice_logprobs(body))
        else:  # embeddings
            data = body.get("data")
            values.append([_embedding(item) for item in data] if isinstance(data, list) else None)
    return tuple(values)


def _first_choice_logprobs(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The first choice's logprobs as [{token, logprob, top_logprobs: [{token, logprob}]}]."""
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    logprobs = first.get("logprobs") if isinstance(first, dict) else None
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


def _embedding(item: object) -> list[float] | None:
    """One embedding's floats, from a float list or OpenAI's base64 (little-endian float32)."""
    if not isinstance(item, dict):
        return None
    vector = item.get("embedding")
    if isinstance(vector, list):
        return vector
    if isinstance(vector, str):
        try:
            raw = base64.b64decode(vector, validate=True)
        except (binascii.Error, ValueError):
            return None
        values = array("f", raw[: len(raw) // 4 * 4])
        if sys.byteorder == "big":
            values.byteswap()
        return values.tolist()
    return None


# --- writing files -------------------------------------------------------------------------


def _prepare(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BatchrunError(
            f"cannot create the output directory {out_dir}: {e.strerror or e}; "
            "choose another with --output-dir"
        ) from e
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise BatchrunError(
            f"cannot write to the output directory {out_dir}: permission denied; "
            "choose another with --output-dir"
        )


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write `path` through a temp file in its directory: readers see the old file or the new."""
    tmp: str | None = None
    try:
        tmp = str(path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"))
        # Not mkstemp: its 0600 mode would make the results unreadable to the user's group;
        # 0666 here is narrowed by the umask, like any file the user creates.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
    except OSError as e:
        raise BatchrunError(
            f"cannot write {path}: {e.strerror or e}; "
            "check free space and permissions, or choose another --output-dir"
        ) from e
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; some platforms cannot open a directory, which is harmless.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
