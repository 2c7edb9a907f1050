"""Where a run pass's requests come from: the input file read again, cheaply when this process
has already validated it.

Every pass over a job's requests (the run, each retry pass) reads the input file again, so that
memory stays bounded however many requests a job has. The full reader (`read_input`) validates
every line again: the body rules, the duplicate custom_ids, the url and model shared by the file.
A pass that follows a whole validating pass in this same process need not. That pass leaves an
`InputIndex`: the file's identity and stats, the numbers of its invalid lines (few, in an array),
and a 16-bit fingerprint of each valid line's custom_id (2 bytes a request). While the file's
stats are the same, the fast pass skips the invalid and blank lines and makes each valid line's
Request from its decoded JSON alone (msgspec: several times faster than the standard decoder),
without the rules; the Requests are the same ones the full reader makes. Anything unexpected (the
stats differ, a line no longer decodes into a request, a custom_id's fingerprint differs, the
lines run out early) hands the rest of the pass to the full reader.

The index lives in memory only: a later process (resume) validates the file in its first pass,
which records a new index as it goes, for that process's retry passes.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from batchrun.openai.reader import BOM, READ_BUFFER, read_input
from batchrun.openai.records import LineError, Request
from batchrun.openai.routing import KnownModels
from batchrun.openai.token_ids import Vocabularies

# What identifies a file as it is: device, inode, size, modification and change times. Writing
# to the file or replacing it changes at least one of them.
Stats = tuple[int, int, int, int, int]


def _stats(st: os.stat_result) -> Stats:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# A custom_id's fingerprint: 16 bits of its hash (salted per process: the index lives in one).
# Written out where it is taken (`hash(custom_id) & FINGERPRINT`): a call per line costs more.
FINGERPRINT = 0xFFFF


class InputIndex:
    """What one whole validating pass over an input file found, for later passes over it."""

    def __init__(self, known: KnownModels | None = None, vocab: Vocabularies | None = None) -> None:
        # The names lines may give in body.model when the job has adapters, and the job's
        # vocabulary sizes (read_input's).
        self.known = known
        self.vocab = vocab
        # The file's stats when the pass began; None until a pass ran to the end with the file
        # unchanged throughout.
        self.stats: Stats | None = None
        self.invalid = array("Q")  # the invalid lines' numbers, ascending
        self.ids = array("H")  # each valid line's custom_id fingerprint, in the file's order

    @property
    def ready(self) -> bool:
        """Whether a whole validating pass recorded this index (the fast pass may use it)."""
        return self.stats is not None

    def read(self, path: Path) -> Iterator[Request | LineError]:
        """`read_input(path)`, recording what it yields; the index is ready once the read ran
        to its end and the file's stats are the same as when it began."""
        self.stats = None
        self.invalid = array("Q")
        self.ids = array("H")
        before = _stats(path.stat())
        for item in read_input(path, self.known, self.vocab):
            if isinstance(item, Request):
                self.ids.append(hash(item.custom_id) & FINGERPRINT)
            else:
                self.invalid.append(item.line)
            yield item
        try:
            after = _stats(path.stat())
        except OSError:  # gone since: there is nothing to index
            return
        if after == before:
            self.stats = before


def requests(
    path: Path, want: Callable[[Request], bool], index: InputIndex | None = None
) -> Iterator[Request]:
    """The valid requests of the input file at `path` that `want`, in the file's order.

    With a ready `index`, the fast pass; with one not ready, the full reader recording it (for
    the next pass); without one, the full reader.
    """
    if index is None:
        items: Iterator[Request | LineError] = read_input(path)
    elif index.ready:
        items = fast_requests(path, index)
    else:
        items = index.read(path)
    for item in items:
        if isinstance(item, Request) and want(item):
            yield item


def fast_requests(path: Path, index: InputIndex) -> Iterator[Request]:
    """The valid requests of `path` as `index` recorded them, or the full reader's on a surprise.

    Exactly the Requests `read_input(path)` yields, while the file is the one indexed: the same
    lines skipped (blank, invalid; the invalid ones include every later duplicate of a
    custom_id), the same custom_id, line, url and body for the others.
    """
    decode = msgspec.json.Decoder().decode
    invalid, ids = index.invalid, index.ids
    n_invalid, n_ids = len(invalid), len(ids)
    k = 0  # the next invalid line's place in `invalid`
    next_invalid = invalid[0] if n_invalid else 0  # 0: none left (lines count from 1)
    v = 0  # the next valid line's place in `ids`
    last = 0  # the line of the last request yielded
    with path.open("rb", buffering=READ_BUFFER) as f:
        # The open file's own stats: a file put in the path's place since is not the one indexed.
        unchanged = _stats(os.fstat(f.fileno())) == index.stats
        for lineno, raw in enumerate(f if unchanged else (), start=1):
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            if not raw or raw.isspace():
                continue
            if lineno == next_invalid:
                k += 1
                next_invalid = invalid[k] if k < n_invalid else 0
                continue
            try:
                obj = decode(raw)
            except (msgspec.DecodeError, RecursionError):
                # Valid JSON the reader took that msgspec does not (a number beyond a float's
                # range, a lone surrogate's escape outside the body): the full reader goes on.
                break
            del raw  # not held while the consumer works on this line
            if not isinstance(obj, dict) or v >= n_ids:
                break
            custom_id, url, body = obj.get("custom_id"), obj.get("url"), obj.get("body")
            if not (
                isinstance(custom_id, str)
                and isinstance(url, str)
                and isinstance(body, dict)
                and (hash(custom_id) & FINGERPRINT) == ids[v]
            ):
                break
            v += 1
            last = lineno
            yield Request(custom_id, lineno, url, body)
        else:
            if unchanged and v == n_ids and k == n_invalid:
                return
    # The rest of the pass, from the line after the last one yielded.
    for item in read_input(path, index.known, index.vocab):
        if isinstance(item, Request) and item.line > last:
            yield item
