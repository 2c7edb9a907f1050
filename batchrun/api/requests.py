"""The requests `batchrun.run` is given, streamed into the job's input file: one JSONL line per
request, in the order given, never all of them in memory at once.

A request is a dict in the OpenAI batch format (`custom_id`, `method`, `url`, `body`), or a
line of JSON as a string. A pandas DataFrame or a pyarrow Table gives one request per row, its
columns the fields. What a line holds is judged later, by the same validation as the CLI's
input file: a line that breaks a rule becomes an invalid line of the job (its line number is
the request's position, from 1), never an exception here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from batchrun.errors import BatchrunError
from batchrun.job.files import atomic_write

# The job's input file, in its directory (a URL input's copy is input.jsonl: storage/fetch.py).
INPUT_NAME = "requests.jsonl"
# Bytes gathered before a write: few system calls, little memory.
_CHUNK = 1 << 20


def write_requests(requests: Any, path: Path) -> int:
    """Write `requests` to `path` as JSONL (atomically: a crash leaves no half file under its
    name); returns how many were written. BatchrunError for a request no JSON can hold."""
    count = 0

    def write(f: IO[bytes]) -> None:
        nonlocal count
        chunk: list[bytes] = []
        size = 0
        for row in rows(requests):
            count += 1
            line = _line(row, count)
            chunk.append(line)
            size += len(line)
            if size >= _CHUNK:
                f.write(b"".join(chunk))
                chunk, size = [], 0
        f.write(b"".join(chunk))

    atomic_write(path, write)
    return count


def rows(requests: Any) -> Iterator[Any]:
    """Each request of an iterable, a pyarrow Table (batch by batch) or a pandas DataFrame (row
    by row), as a dict (or a string, given as one)."""
    if isinstance(requests, str | bytes | Mapping):
        raise TypeError(
            "requests must be an iterable of request dicts, a pandas DataFrame or a pyarrow "
            f"Table, not a {type(requests).__name__}"
        )
    if hasattr(requests, "to_batches"):  # a pyarrow Table (or RecordBatchReader)
        for batch in requests.to_batches():
            yield from batch.to_pylist()
        return
    if hasattr(requests, "itertuples") and hasattr(requests, "columns"):  # a pandas DataFrame
        columns = [str(c) for c in requests.columns]
        for values in requests.itertuples(index=False, name=None):
            yield dict(zip(columns, values, strict=True))
        return
    if not isinstance(requests, Iterable):
        raise TypeError(
            "requests must be an iterable of request dicts, a pandas DataFrame or a pyarrow "
            f"Table, not a {type(requests).__name__}"
        )
    yield from requests


def _line(row: Any, number: int) -> bytes:
    """One request as its line: a string as it is, anything else as JSON."""
    if isinstance(row, str):
        if "\n" in row or "\r" in row:
            raise BatchrunError(
                f"request {number} is a string with a line break: give one line of JSON, or a dict"
            )
        return row.encode("utf-8", "surrogatepass") + b"\n"
    try:
        text = json.dumps(row, default=_plain, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise BatchrunError(f"request {number} cannot be written as JSON: {e}") from None
    return text.encode("utf-8") + b"\n"


def _plain(value: Any) -> Any:
    """A numpy value (a DataFrame's cell) as the Python value JSON takes."""
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
