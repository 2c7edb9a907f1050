"""The journal's vectors, stored once as binary: a side file of float32 bytes beside it.

An embeddings result whose worker took its vectors out of the body (openai/vectors.py
`split_vectors`) is journaled with each embedding an empty text, and its vectors appended to
the side file (`journal.f32` beside `journal.jsonl`): 4 bytes a value, where the journal's
base64 took 5.33 and its JSON text more. The record's last field says where they are:
``"vectors": [at, n1, n2, ...]``, the side file's offset of the first vector and each one's
length in bytes. `inline` puts them back: the line it gives is, byte for byte, the one an
earlier version journaled (the same base64, at the same places), so every reader of bodies
(export, serve, the index's salt) reads what it always did, and a journal without a side file
(an earlier version's, a chat job's) is read as it is.

Order, so a crash never leaves a record whose vectors are missing: a record's vectors reach the
kernel before its line does (a killed process loses neither, or only the line: bytes in the
side file that no record names are never read), and each fsync covers the side file before the
journal. A power cut may still keep journal pages the kernel wrote back on its own; on open,
`drop_unbacked` cuts the journal before the first record whose vectors the side file lacks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from batchrun.errors import BatchrunError
from batchrun.job.files import fsync_dir, write_all
from batchrun.openai.vectors import fill_vectors

VECTORS_SUFFIX = ".f32"
# How a record that names its vectors ends: the field is always written last.
_FIELD = b',"vectors":['
_END = b"]}\n"
_DIGITS = frozenset(b"0123456789,")


def vectors_path(journal: Path) -> Path:
    """The side file of `journal` (journal.jsonl: journal.f32)."""
    return journal.with_suffix(VECTORS_SUFFIX)


def vector_ref(line: bytes) -> tuple[int, list[int]] | None:
    """Where the vectors of a journal line are: (offset, each one's length); None when the
    line names none (a body journaled whole, or no embeddings at all)."""
    if not line.endswith(_END):
        return None
    start = line.rfind(_FIELD)
    if start < 0:
        return None
    inner = line[start + len(_FIELD) : -len(_END)]
    if not inner or not _DIGITS.issuperset(inner):
        return None
    at, *sizes = map(int, inner.split(b","))
    return at, sizes


@dataclass
class VectorWriter:
    """Appends vectors to a journal's side file (opened on the first write)."""

    path: Path
    _f: BinaryIO | None = field(default=None, init=False)
    offset: int = field(default=0, init=False)

    def write(self, chunks: Sequence[bytes]) -> int:
        """Append `chunks`, in one system call for each 1,024 of them; return the offset of
        the first."""
        if self._f is None:
            try:
                created = not self.path.exists()
                self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115
                if created:  # its name durable before a synced record names it (as the journal's)
                    fsync_dir(self.path.parent)
                self.offset = os.fstat(self._f.fileno()).st_size
            except OSError as e:
                raise BatchrunError(f"cannot open {self.path}: {e.strerror or e}") from e
        at = self.offset
        try:
            self.offset += write_all(self._f.fileno(), chunks)
        except OSError as e:
            raise BatchrunError(f"cannot write {self.path}: {e.strerror or e}") from e
        return at

    def fsync(self) -> None:
        """Flush what was written to stable storage (OSError as it comes)."""
        if self._f is not None:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        """Close (callers fsync first)."""
        if self._f is not None:
            self._f.close()
            self._f = None


class VectorReader:
    """Reads vectors back from a journal's side file, for `inline`."""

    def __init__(self, journal: Path) -> None:
        self.path = vectors_path(journal)
        self._fd: int | None = None

    def read(self, at: int, size: int) -> bytes:
        """`size` bytes at `at`; BatchrunError when the side file lacks them."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as e:
                raise BatchrunError(
                    f"cannot read {self.path}, which holds the job's vectors: {e.strerror or e}"
                ) from e
        data = os.pread(self._fd, size, at)
        if len(data) != size:
            raise BatchrunError(
                f"{self.path} ends before the vectors the journal names (byte {at + size}); "
                "it was truncated or replaced: restore it from a backup"
            )
        return data

    def close(self) -> None:
        """Close the side file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> VectorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def inline(line: bytes, reader: VectorReader) -> bytes:
    """A journal line with its vectors put back as base64 and its `vectors` field dropped: the
    line as an earlier version wrote it. A line that names no vectors is returned as it is."""
    ref = vector_ref(line)
    if ref is None:
        return line
    at, sizes = ref
    data = reader.read(at, sum(sizes))
    vectors, pos = [], 0
    for size in sizes:
        vectors.append(data[pos : pos + size])
        pos += size
    head = line[: line.rfind(_FIELD)]
    try:
        return fill_vectors(head, vectors) + b"}\n"
    except ValueError as e:
        raise BatchrunError(f"a journal record does not match its vectors: {e}") from None


def drop_unbacked(journal: Path) -> int:
    """Cut the journal before the first record whose vectors its side file lacks (what a power
    cut can leave: see the module's docstring); return the bytes dropped."""
    side = vectors_path(journal)
    if not side.exists() or not journal.exists():
        return 0
    have = side.stat().st_size
    cut: int | None = None
    # Records name the side file in the order they were written: walk back from the end while
    # the last ones reach past it.
    for start, line in _lines_backwards(journal):
        ref = vector_ref(line)
        if ref is None:
            continue
        at, sizes = ref
        if at + sum(sizes) <= have:
            break
        cut = start
    if cut is None:
        return 0
    with journal.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.truncate(cut)
        os.fsync(f.fileno())
    return size - cut


def _lines_backwards(path: Path, block: int = 1 << 16) -> Iterator[tuple[int, bytes]]:
    """The file's lines, last first, each with its offset, read a block at a time and only as
    far back as the caller goes."""
    with path.open("rb") as f:
        pos = f.seek(0, os.SEEK_END)
        rest = b""  # from `pos` to the end of the line it begins in, not yet given
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            buf = f.read(pos - start) + rest
            pos = start
            first = 0
            if start > 0:  # the block's first line may begin in an earlier block
                first = buf.find(b"\n") + 1
                if first == 0:
                    rest = buf
                    continue
            rest = buf[:first]
            pieces = buf[first:].split(b"\n")
            lines = [p + b"\n" for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
            offsets, offset = [], start + first
            for line in lines:
                offsets.append(offset)
                offset += len(line)
            yield from reversed(list(zip(offsets, lines, strict=True)))
