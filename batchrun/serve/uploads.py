"""POST /v1/files: a multipart upload streamed to a temporary file, never past the size cap.

The body is parsed as it arrives (python-multipart), so an upload over `max_bytes` is refused
(413) having written at most `max_bytes`; a declared Content-Length over the cap is refused
before any of the body is read.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from batchrun.serve.errors import ApiError

# Room for the multipart framing and the other fields around the file's bytes.
FRAMING_SLACK = 64 * 1024
MAX_FIELD_BYTES = 4096
# A part's headers, and the number of parts: bounded, so that nothing but the file grows.
MAX_HEADER_BYTES = 8192
MAX_PARTS = 16


class _TooLarge(Exception):
    pass


@dataclass
class Upload:
    """What a finished upload holds: the file's bytes (in `path`, fsync'd) and its fields."""

    path: Path
    filename: str = "upload.jsonl"
    fields: dict[str, str] = field(default_factory=dict)
    size: int = 0
    has_file: bool = False


@dataclass
class _Parser:
    upload: Upload
    max_bytes: int
    out: IO[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    header_field: bytes = b""
    header_value: bytes = b""
    name: str | None = None
    is_file: bool = False
    value: bytes = b""

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": self.header_field_data,
            "on_header_value": self.header_value_data,
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
        }

    parts: int = 0
    header_bytes: int = 0

    def part_begin(self) -> None:
        self.headers, self.name, self.is_file, self.value = {}, None, False, b""
        self.parts += 1
        self.header_bytes = 0
        if self.parts > MAX_PARTS:
            raise ApiError(400, f"the upload has more than {MAX_PARTS} parts")

    def header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._header_room(end - start)
        self.header_field += data[start:end]

    def header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_room(end - start)
        self.header_value += data[start:end]

    def _header_room(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > MAX_HEADER_BYTES:
            raise ApiError(400, f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")

    def header_end(self) -> None:
        key = self.header_field.decode("latin-1").lower()
        self.headers[key] = self.header_value.decode("latin-1")
        self.header_field, self.header_value = b"", b""

    def headers_finished(self) -> None:
        _, params = parse_options_header(self.headers.get("content-disposition", ""))
        name = params.get(b"name")
        self.name = name.decode("utf-8", "replace") if name is not None else None
        filename = params.get(b"filename")
        if self.name == "file" and filename is not None:
            if self.upload.has_file:
                raise ApiError(400, "send one file per upload", param="file")
            self.is_file = True
            self.upload.has_file = True
            self.upload.filename = (
                os.path.basename(filename.decode("utf-8", "replace")) or "upload.jsonl"
            )
            self.out = open(self.upload.path, "wb")  # noqa: SIM115 (closed in receive_upload)

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self.is_file:
            assert self.out is not None
            self.upload.size += end - start
            if self.upload.size > self.max_bytes:
                raise _TooLarge
            self.out.write(data[start:end])
            return
        self.value += data[start:end]
        if len(self.value) > MAX_FIELD_BYTES:
            raise ApiError(400, f"the form field {self.name!r} is too long")

    def part_end(self) -> None:
        if not self.is_file and self.name is not None:
            self.upload.fields[self.name] = self.value.decode("utf-8", "replace")


async def receive_upload(request: Request, tmp: Path, max_bytes: int) -> Upload:
    """Stream the multipart body of `request` into `tmp`; ApiError (400, 413) when it cannot be."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise ApiError(400, "upload the file as multipart/form-data, with fields file and purpose")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes + FRAMING_SLACK:
        raise _too_large(max_bytes)
    state = _Parser(Upload(tmp), max_bytes)
    parser = MultipartParser(boundary, state.callbacks())  # type: ignore[arg-type]
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            parser.write(chunk)
        parser.finalize()
        # A body cut short (a client gone mid-upload) is refused, never stored as if whole.
        if parser.state != MultipartState.END:
            raise ApiError(
                400, "the upload was cut short: its closing multipart boundary is missing"
            )
        if declared is not None and declared.isdigit() and received < int(declared):
            raise ApiError(400, "the upload was cut short: shorter than its Content-Length")
        if state.out is not None:
            out = state.out
            await run_in_threadpool(_flush, out)
    except _TooLarge:
        _discard(state)
        raise _too_large(max_bytes) from None
    except ApiError:
        _discard(state)
        raise
    except Exception as e:  # a malformed body, or a client gone mid-upload
        _discard(state)
        raise ApiError(400, f"the upload could not be read: {e}") from None
    return state.upload


def _flush(out: IO[bytes]) -> None:
    out.flush()
    os.fsync(out.fileno())
    out.close()


def _discard(state: _Parser) -> None:
    if state.out is not None:
        with contextlib.suppress(OSError):
            state.out.close()
    with contextlib.suppress(OSError):
        state.upload.path.unlink()


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the file is larger than this server's limit of {max_bytes:,} bytes (--max-file-bytes)",
        param="file",
        code="file_too_large",
    )
