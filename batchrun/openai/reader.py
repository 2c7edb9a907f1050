"""Stream an OpenAI batch input file line by line and validate each line.

The file is read in binary mode one line at a time, so memory stays bounded by the longest line
(plus about 17 bytes per custom_id, for the duplicate check: openai/seen_ids.py) however large
the file is.
A bad line never stops the read: it comes out as a `LineError` with its 1-based line number.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shlex
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from batchrun.errors import BatchrunError
from batchrun.openai.duplicate_keys import (
    NonStandardNumber,
    duplicate_key,
    duplicate_message,
    reject_constant,
)
from batchrun.openai.invalid import InvalidLine, json_type
from batchrun.openai.records import LineError, Request
from batchrun.openai.routing import MODEL_NOT_FOUND, KnownModels
from batchrun.openai.seen_ids import OFFSET_EVERY, SeenIds
from batchrun.openai.text import SURROGATE_ESCAPE, may_hold_lone_surrogate
from batchrun.openai.token_ids import Vocabularies
from batchrun.openai.validation import check_body, check_custom_id, check_method, check_url

BOM = b"\xef\xbb\xbf"
# A large read buffer: line splitting happens in C over fewer, bigger reads.
READ_BUFFER = 1 << 20
HASH_BLOCK = 1 << 20
# Bytes that make a line or a file "blank": the set bytes.isspace() and bytes.strip() use.
WHITESPACE = b" \t\r\n\x0b\x0c"


# Built once: json.loads with any keyword argument constructs a new decoder on every call,
# which costs about a third of the time a short line takes.
_DECODER = json.JSONDecoder(parse_constant=reject_constant)
# The decoder's own scanner (set in JSONDecoder.__init__ since Python 2.6; typeshed omits it).
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
JSON_WHITESPACE = " \t\r\n"
# The first try at every line: msgspec's JSON decoder, about three times as fast as the json
# module's scanner on a short line. What it accepts, the json module parses here too, to the same
# value (key order and duplicate keys included: the last value wins, in the first key's place). It
# refuses the rest, which then goes the json module's way below and gets today's value or message:
# NaN and Infinity, a lone surrogate escape (\ud83d with no pair: json parses it, the validation
# names the field), a float beyond the double range (1e400: json reads inf, a field check refuses
# it), an integer over the interpreter's digit limit, a BOM, invalid UTF-8, trailing data.
# Called through partial: a call from C is counted against the recursion limit as the call of the
# json scanner is (a direct call from Python code is specialised and skips that count), so both
# stop at the same nesting depth and a line nested right at the limit gets the same answer.
_FAST_DECODE: Callable[[bytes], Any] = functools.partial(msgspec.json.Decoder().decode)


def _refuses_lone_surrogates(decode: Callable[[bytes], Any]) -> bool:
    """Whether `decode` refuses every kind of lone surrogate escape (msgspec 0.22 does)."""
    for escapes in (
        rb"\ud83d",
        rb"\ud83dx",
        rb"\ud83d\ud83d",
        rb"\ud83d\u0041",
        rb"\ude00",
        rb"\ude00\ud83d",
    ):
        for raw in (b'["' + escapes + b'"]', b'{"' + escapes + b'": 1}'):
            try:
                decode(raw)
            except ValueError:
                continue
            return False
    return True


# Whether no value `_FAST_DECODE` returns can hold a lone surrogate, so the reader may skip its
# search for one; a msgspec that let one through would leave the search on.
_FAST_IS_UNICODE = _refuses_lone_surrogates(_FAST_DECODE)

# The magic bytes of the compressed formats an input file is most often shipped in, with the
# format's name, what a file in it is, and the command that undoes it ({} is the file). Every JSONL
# batch line starts with "{", so none of these can begin a valid input.
COMPRESSED_FORMATS = (
    (b"\x1f\x8b", "gzip", "gzip-compressed", "gunzip -k {}"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd-compressed", "zstd -d {}"),
    (b"\xfd7zXZ\x00", "xz", "xz-compressed", "unxz -k {}"),
    (b"PK\x03\x04", "zip", "a zip archive", "unzip {}"),
    (b"BZh", "bzip2", "bzip2-compressed", "bunzip2 -k {}"),
)
_BLOCK_SIZES = tuple(b"%d" % n for n in range(1, 10))  # the digit after bzip2's "BZh"


def read_input(
    path: Path, known: KnownModels | None = None, vocab: Vocabularies | None = None
) -> Iterator[Request | LineError]:
    """Yield a Request for each valid line of `path` and a LineError for each invalid one.

    `known`: a job with LoRA adapters or several base models: a line may name a base model or
    any adapter (with several base models it must name one), and a line naming another model
    is an error record `model_not_found` (openai/routing.py). `vocab`: the job's vocabulary
    sizes: a token id a line names outside its model's is an `invalid_request`
    (openai/token_ids.py).
    """
    refusal = vocab.refusal if vocab is not None else None
    seen = SeenIds(path, _custom_id_of)  # custom_id -> the line where it first appeared
    offsets = seen.offsets  # where every OFFSET_EVERY-th line starts, to read it again
    pos = 0
    estimate_at = 1025  # where the file's line count is estimated from its lines so far
    urls, models = _First("url"), _First("model")  # every line must agree with the first
    has_surrogate_escape = SURROGATE_ESCAPE.search  # bound once: this loop is hot
    with path.open("rb", buffering=READ_BUFFER) as f, contextlib.closing(seen):
        size = os.fstat(f.fileno()).st_size
        for lineno, raw in enumerate(f, start=1):
            if not (lineno - 1) % OFFSET_EVERY:
                offsets.append(pos)
                if lineno == estimate_at and pos:
                    # Size the table for the whole file once, not by doublings (each a spike of
                    # old and new table); a thousand lines' guess trusted up to 1024 times them,
                    # in case the file's first lines are shorter than the rest.
                    seen.expect(min(lineno * size // pos, lineno * 1024))
                    estimate_at = (estimate_at - 1) * 1024 + 1
            pos += len(raw)
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            # isspace() makes no copy (strip() would: 50 MB for a 50 MB line).
            if not raw or raw.isspace():
                continue
            obj, fast = _parse_line(raw)
            # Only a line holding a surrogate's escape (\uD800-\uDFFF) can hold a lone surrogate:
            # the others (nearly all) skip the walk over every string of the body. A line msgspec
            # parsed holds none (it refuses them), and skips even the search for an escape.
            escaped = (
                not fast and has_surrogate_escape(raw) is not None and may_hold_lone_surrogate(raw)
            )
            # Before `raw` goes: a key given twice is found in the line's text (parsers keep the last).
            duplicate = duplicate_key(raw, obj) if isinstance(obj, dict) else None
            del raw  # not held (a 50 MB line: 50 MB) while the consumer works on this line
            if not isinstance(obj, dict):
                yield _not_an_object(lineno, obj)
                continue
            custom_id: str | None = None
            if duplicate == ("", "custom_id"):  # which of the two is the line's? Neither is named.
                yield LineError(lineno, None, "duplicate_key", duplicate_message(*duplicate))
                continue
            try:
                custom_id = check_custom_id(obj)
                first = seen.first(custom_id, lineno)
                if first is not None:
                    yield LineError(
                        lineno,
                        custom_id,
                        "duplicate_custom_id",
                        f"custom_id {custom_id!r} already appeared on line {first}; "
                        "custom_id must be unique within the file",
                    )
                    continue
                # (Registered by seen.first even if the rest of the line is bad: a custom_id names
                # at most one line, so its error record and a later line's result can never be
                # confused.)
                if duplicate is not None:
                    yield LineError(
                        lineno, custom_id, "duplicate_key", duplicate_message(*duplicate)
                    )
                    continue
                check_method(obj)
                url = check_url(obj)
                if url != urls.value and (mixed := urls.differs(url, lineno)):
                    yield LineError(lineno, custom_id, "mixed_urls", mixed)
                    continue
                body = check_body(url, obj, scan_text=escaped)
            except InvalidLine as e:
                yield LineError(lineno, custom_id, e.code, e.message)
                continue
            model = body.get("model")  # a string or null: check_body saw to it
            if known is not None:
                if (model and model not in known) or (not model and known.needs_name):
                    yield LineError(
                        lineno, custom_id, MODEL_NOT_FOUND, known.unknown(model or None)
                    )
                    continue
            elif model and model != models.value and (mixed := models.differs(model, lineno)):
                yield LineError(lineno, custom_id, "mixed_models", mixed)
                continue
            if refusal is not None and (why := refusal(body)) is not None:
                yield LineError(lineno, custom_id, "invalid_request", why)
                continue
            yield Request(custom_id, lineno, url, body)


def _not_an_object(lineno: int, obj: object) -> LineError:
    """The error record of a line that is not a JSON object (or not JSON at all)."""
    if isinstance(obj, _Unparsable):
        return LineError(lineno, obj.custom_id, "invalid_json", obj.message)
    return LineError(
        lineno,
        None,
        "invalid_request",
        f"line is a JSON {json_type(obj)}, expected an object "
        '{"custom_id", "method", "url", "body"}',
    )


class _First:
    """The value a field took on the file's first line that set it, and that line: every later
    line must give the same."""

    __slots__ = ("field", "line", "value")

    def __init__(self, field: str) -> None:
        self.field = field
        self.value: str | None = None
        self.line = 0

    def differs(self, value: str, lineno: int) -> str | None:
        """None when `value` agrees (or is the first); else the message of a mixed file."""
        if self.value is None:
            self.value, self.line = value, lineno
            return None
        return None if value == self.value else _mixed(self.field, value, self.value, self.line)


def _mixed(field: str, value: str, first: str, first_line: int) -> str:
    """The message for a line whose `field` differs from the one the file's first line set."""
    return (
        f"{field} {value!r} differs from this file's {field} {first!r} (set by line "
        f"{first_line}); every line of a batch must use the same {field}"
    )


def _custom_id_of(raw: bytes) -> str | None:
    """The custom_id of a raw line as the reader takes it (for SeenIds' check of a match)."""
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    obj, _ = _parse_line(raw)
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    return cid if isinstance(cid, str) else None


def _parse_line(raw: bytes) -> tuple[object, bool]:
    """The JSON value of one line (or an `_Unparsable`), and whether it holds no lone surrogate.

    The flag is True only for a line msgspec parsed; False means "not known", not "holds one".
    """
    # A function of its own so the decoded text is freed on return, not held while the
    # consumer works on the request.
    try:
        return _FAST_DECODE(raw), _FAST_IS_UNICODE
    except (ValueError, RecursionError):
        # msgspec's DecodeError (and ValidationError, for a number out of range) is a
        # ValueError, as is UnicodeDecodeError.
        pass
    try:
        # Strict decode: json.loads(bytes) would guess UTF-16/32 from the first bytes and let
        # UTF-8-encoded surrogates through.
        text = raw.decode("utf-8")
        # The scanner alone, not JSONDecoder.decode: its two Python-level wrappers and regex
        # calls cost over a tenth of a short line's time. It takes no leading whitespace; such a
        # line goes the full way below.
        obj, end = _SCAN(text, 0)
        if end != len(text) and text[end:].strip(JSON_WHITESPACE):
            raise ValueError("extra data")
        return obj, False
    except (ValueError, StopIteration, RecursionError):
        # ValueError covers UnicodeDecodeError and JSONDecodeError. Only lines both msgspec and
        # the scanner refused (bad lines, nearly all, and ones with leading whitespace that
        # msgspec did not take) get here, so parsing again for the reason costs nothing.
        return _parse_slow(raw), False


class _Unparsable:
    """Why a line is not valid JSON (a class of its own: a JSON string is a str too), and its
    custom_id where one can still be read (a line refused only for a NaN or an Infinity)."""

    __slots__ = ("custom_id", "message")

    def __init__(self, message: str, custom_id: str | None = None) -> None:
        self.message = message
        self.custom_id = custom_id


def _parse_slow(raw: bytes) -> object:
    """Parse one line with the full decoder; an `_Unparsable` says why it is not valid JSON."""
    # Two causes the decoder would name only by a column: say what a person can act on.
    if raw.startswith(BOM):
        return _Unparsable(
            "line is not valid JSON: it starts with a byte order mark (BOM), as joining files "
            "with `cat` leaves; remove it"
        )
    packed = compression_of(raw)
    if packed is not None:
        return _Unparsable(
            f"line is not valid JSON: it starts like {packed[0]}-compressed data (is the file "
            "compressed? decompress it first)"
        )
    if b"\x00" in raw:
        return _Unparsable(
            "line is not valid JSON: it holds NUL bytes (is the file UTF-16? save it as UTF-8)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return _Unparsable(
            f"line is not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the "
            "line); save the file as UTF-8"
        )
    # Without its line ending: a line cut off inside a string would otherwise read as a string
    # holding a raw newline ("Invalid control character").
    text = text.rstrip("\r\n")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as e:
        if e.msg.startswith("Unterminated string"):
            return _Unparsable(
                f"line is not valid JSON: the string that starts at column {e.pos + 1} never "
                "ends (is the line cut off?)"
            )
        # Some of the decoder's messages end in "at" already ("Invalid control character at").
        reason = e.msg[:-3] if e.msg.endswith(" at") else e.msg
        if e.pos >= len(text.rstrip()):
            return _Unparsable(
                f"line is not valid JSON: {reason} at the end of the line (is it cut off?)"
            )
        return _Unparsable(f"line is not valid JSON: {reason} at column {e.pos + 1}")
    except NonStandardNumber as e:
        # Refused all the same, but the error record can name its request.
        try:
            loose = json.loads(text)
        except (ValueError, RecursionError):
            loose = None
        custom_id = loose.get("custom_id") if isinstance(loose, dict) else None
        named = custom_id if isinstance(custom_id, str) and custom_id else None
        return _Unparsable(f"line is not valid JSON: {e}", named)
    except RecursionError:
        return _Unparsable("line is not valid JSON: it is nested too deeply to read")
    except ValueError:
        # An integer literal longer than Python's int/str conversion limit (4300 digits); the
        # interpreter's own message is advice for programmers, not for the file's author.
        return _Unparsable("line is not valid JSON: a number in it has more than 4300 digits")


def hash_file(path: Path) -> str:
    """The sha256 hex digest of the file at `path`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def check_input_file(path: Path) -> None:
    """Raise BatchrunError if `path` is missing, not a regular file, unreadable or blank."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise BatchrunError(f"input file not found: {path}") from None
    except PermissionError:
        # A directory on the way that we may not enter: Path.exists() would raise here too.
        raise BatchrunError(f"cannot read input file (permission denied): {path}") from None
    except OSError as e:
        raise BatchrunError(f"cannot read input file {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise BatchrunError(f"input path is a directory, not a file: {path}")
    # The job hashes the input and re-reads it on resume, which a pipe or device cannot give.
    if not stat.S_ISREG(st.st_mode):
        raise BatchrunError(f"input must be a regular file (not a pipe or device): {path}")
    try:
        # Opening is the only reliable readability test (os.access is wrong for root, ACLs).
        with path.open("rb") as f:
            packed = compression_of(f.read(8))
            if packed is not None:
                # Read as text, it would only give a screenful of "not valid JSON" lines.
                _, what, command = packed
                raise BatchrunError(
                    f"input file {path} is {what}; decompress it first "
                    f"({command.format(shlex.quote(str(path)))})"
                )
            f.seek(0)
            if not _has_content(f.read, READ_BUFFER):
                raise BatchrunError(f"input file is empty: {path}")
            if _is_json_array(f):
                # Read as JSONL, one array line would be a job of one invalid line (and a
                # pretty-printed one a job of its last element, or of none).
                quoted = shlex.quote(str(path))
                raise BatchrunError(
                    f"input file {path} holds a JSON array, not JSONL (one request object a "
                    f"line); convert it first (jq -c '.[]' {quoted} > requests.jsonl)"
                )
    except PermissionError:
        raise BatchrunError(f"cannot read input file (permission denied): {path}") from None
    except OSError as e:
        raise BatchrunError(f"cannot read input file {path}: {e.strerror or e}") from None


def holds_json_array(path: Path) -> bool:
    """Whether the file at `path` is one JSON array rather than JSONL (see `_is_json_array`)."""
    with path.open("rb") as f:
        return _is_json_array(f)


def _is_json_array(f: BinaryIO) -> bool:
    """Whether the open file is one JSON array: its first byte past a BOM and whitespace is "["
    and its last before the trailing whitespace is "]" (every JSONL batch line is an object)."""
    f.seek(0)
    head = f.read(4096)
    head = head[len(BOM) :] if head.startswith(BOM) else head
    if not head.lstrip(WHITESPACE).startswith(b"["):
        return False
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - 4096))
    return f.read().rstrip(WHITESPACE).endswith(b"]")


def _has_content(read: Callable[[int], bytes], block: int) -> bool:
    """Whether the stream holds anything besides a leading BOM and whitespace."""
    first = True
    while chunk := read(block):
        if first and chunk.startswith(BOM):
            chunk = chunk[len(BOM) :]
        first = False
        if chunk.strip(WHITESPACE):
            return True
    return False


def compression_of(head: bytes) -> tuple[str, str, str] | None:
    """The compressed format `head` (a file's first bytes) starts: name, description, command."""
    for magic, name, what, command in COMPRESSED_FORMATS:
        # bzip2's "BZh" is followed by its block size, a digit 1-9: plain text rarely is.
        if head.startswith(magic) and (magic != b"BZh" or head[3:4] in _BLOCK_SIZES):
            return name, what, command
    return None


def is_probably_not_jsonl(first_bytes: bytes) -> bool:
    """Whether a file's first bytes look like something other than JSONL (binary, CSV, array)."""
    if b"\x00" in first_bytes:
        return True
    head = first_bytes[len(BOM) :] if first_bytes.startswith(BOM) else first_bytes
    head = head.lstrip(WHITESPACE)
    # Every JSONL batch line is an object, so the first non-blank byte must open one.
    return bool(head) and not head.startswith(b"{")
