"""The custom_ids an input file's reader has seen, kept in about 17 bytes each (issue 28: a
10M-line file validated in bounded memory), exactly.

A dict of custom_id strings costs about 130 bytes a line. Here each custom_id is its 64-bit hash
in an open-addressing table (array('q')), beside the line it first appeared on (array('I')). Equal
hashes do not make equal custom_ids: a match is checked against the file itself (the earlier
line read again: a byte offset is kept every OFFSET_EVERY lines to find it), so a collision never
marks a line a duplicate; a true duplicate costs one short read, which only an invalid line pays.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# A byte offset is kept for one line in this many: reading a line again reads at most this many.
OFFSET_EVERY = 64
# Slots per expected custom_id: the table's load stays under 1 / SLACK until it is outgrown.
SLACK = 1.4
# The hash of an empty slot; a custom_id hashing to it is stored as EMPTY_STANDIN.
EMPTY = 0
EMPTY_STANDIN = 1
# Python's own string hash (64 bits, salted per process; cached in the string). A name of its
# own so that a test can make every custom_id collide.
_hash = hash


class SeenIds:
    """custom_id -> the line it first appeared on, for the lines of one file read in order."""

    def __init__(
        self, path: Path, custom_id_of: Callable[[bytes], str | None], expected: int = 1024
    ) -> None:
        """`custom_id_of`: the custom_id a raw line of the file gives (as the reader parses it)."""
        self.path = path
        self.custom_id_of = custom_id_of
        self.size = max(16, int(expected * SLACK))
        self.keys = array("q", bytes(8 * self.size))
        self.lines = array("I", bytes(4 * self.size))
        self.used = 0
        self.offsets = array("q")  # the byte offset of line 1, 1 + OFFSET_EVERY, ...
        self._file: BinaryIO | None = None

    def first(self, custom_id: str, lineno: int) -> int | None:
        """The line where `custom_id` first appeared, or None (and it is registered at `lineno`)."""
        h = _hash(custom_id) or EMPTY_STANDIN
        keys, size = self.keys, self.size
        i = h % size
        while True:
            k = keys[i]
            if k == EMPTY:
                break
            if k == h:
                line = self.lines[i]
                if self._custom_id_on(line) == custom_id:
                    return line
            i = i + 1 if i + 1 < size else 0
        keys[i] = h
        self.lines[i] = lineno
        self.used += 1
        if self.used * SLACK > size:
            self._grow(size * 2)
        return None

    def expect(self, count: int) -> None:
        """Make room for `count` custom_ids in all (an estimate: the table grows past it), so
        that a big file's table is made once at its size rather than doubled up to it."""
        if count * SLACK > self.size:
            self._grow(int(count * SLACK))

    def _grow(self, size: int) -> None:
        """`size` slots, every entry placed again."""
        old_keys, old_lines = self.keys, self.lines
        keys = array("q", bytes(8 * size))
        lines = array("I", bytes(4 * size))
        for k, line in zip(old_keys, old_lines, strict=True):
            if k != EMPTY:
                i = k % size
                while keys[i] != EMPTY:
                    i = i + 1 if i + 1 < size else 0
                keys[i] = k
                lines[i] = line
        self.keys, self.lines, self.size = keys, lines, size

    def _custom_id_on(self, lineno: int) -> str | None:
        """The custom_id line `lineno` of the file gives, read again."""
        if self._file is None:
            self._file = self.path.open("rb")
        f = self._file
        block = (lineno - 1) // OFFSET_EVERY
        f.seek(self.offsets[block])
        raw = b""
        for _ in range(lineno - block * OFFSET_EVERY):
            raw = f.readline()
        return self.custom_id_of(raw)

    def close(self) -> None:
        """Close the file handle a check opened, if any."""
        if self._file is not None:
            self._file.close()
            self._file = None
