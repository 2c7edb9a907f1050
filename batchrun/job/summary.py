"""The job's summary: its counts as of one point of its journal, so that `status` costs O(1).

The journal stays the one source of truth. The process that runs a job keeps `summary.json`
beside it (`SummaryKeeper`): the counts status shows (requests done and succeeded, invalid lines,
attempts, tokens, timing, per-worker figures, latency and queue-wait histograms, errors by code)
and the journal offset they cover, with a digest of the journal's bytes just before that offset.
The keeper folds the journal's own bytes (so the summary is the fold of the journal up to its
offset by construction, whatever order a writer journals and counts in), and rewrites the file
atomically (a temp file renamed over it) at a bounded rate, never on every record, and when the
journal closes.

`status` reads the summary, checks it against the journal and folds in the journal's tail past
its offset (`current_summary`). A summary that is missing, torn, of another version or input
generation, that points past the journal's end or at bytes other than the digest says, or whose
tail does not fold consistently, is rebuilt from the whole journal, never trusted.

Folding a record needs the request's previous state, which neither the summary nor the tail
holds (that would be O(requests)). The journal's rules give it: a record's `attempt` is one more
than the request's records before it, and a request runs again only after a failed attempt (the
retry passes take retryable failures, retry-failed any failure; resume and serve take requests
with no record). So attempt 1 is a request newly done, and a later attempt replaces a failure:
only `ok` moves the succeeded count. Deduplicated copies and cache hits follow the same rules (a
copy is journaled for a request with no record, or a failed one in a retry pass); invalid-line
records count only when they are of the summary's input generation, as in `JobState.record`. A
record that breaks these rules makes the fold fail, and the counts come from `state.replay`.
The counts and their fold (`Summary`, `SummaryRecord`) are job/summary_counts.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Container
from pathlib import Path

import msgspec

from batchrun.errors import BatchrunError
from batchrun.job.inputmap import load_input_map
from batchrun.job.journal import JournalWriter
from batchrun.job.manifest import Manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import replay
from batchrun.job.summary_counts import Summary, SummaryRecord
from batchrun.job.timing import Timing

SUMMARY_NAME = "summary.json"
# The journal bytes before the summary's offset that its digest covers: enough to tell another
# journal (a restored backup, a copy of another job) from this one.
CHECK_BYTES = 64
# How often a running job rewrites its summary: at most once a second, or once `BURST_BYTES`
# of journal wait, then at most ten times a second (status reads the tail meanwhile).
INTERVAL_S = 1.0
BURST_BYTES = 4 << 20
_BURST_INTERVAL_S = 0.1

_DECODER = msgspec.json.Decoder(SummaryRecord)


def summary_path(paths: JobPaths) -> Path:
    """Where the job keeps its summary."""
    return paths.root / SUMMARY_NAME


def digest(tail: bytes) -> str:
    """The check of a summary whose offset `tail` (the journal's last bytes before it) ends."""
    return hashlib.blake2b(tail[-CHECK_BYTES:], digest_size=12).hexdigest()


def write_summary(paths: JobPaths, summary: Summary) -> None:
    """Replace the job's summary atomically (temp file renamed over it); errors are ignored.

    Not fsync'd: after a power cut a stale or empty summary is rebuilt from the journal, so
    durability would buy nothing but a disk flush a second.
    """
    path = summary_path(paths)
    tmp = path.with_name(f".{SUMMARY_NAME}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(summary.to_json())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class _Inconsistent(Exception):
    """A record the summary's rules cannot fold (see `Summary.fold`)."""


_BLOCK = 1 << 20  # journal bytes decoded at once (a few MiB of records in memory at most)


def fold_journal(
    summary: Summary,
    timing: Timing,
    path: Path,
    end: int | None = None,
    current: Container[str] | None = None,
) -> None:
    """Fold the journal's whole lines from `summary.offset` (to `end`, else to its last whole
    line) into `summary` and `timing`, moving the offset and check along.

    As `journal.read_records` (strict): a line that is not a record is a BatchrunError naming
    its place. Raises _Inconsistent when a record breaks the fold's rules.
    """
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        offset = summary.offset
        f.seek(offset)
        carry = b""
        while True:
            want = _BLOCK if end is None else min(_BLOCK, end - offset - len(carry))
            chunk = f.read(want) if want > 0 else b""
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if not chunk:
                    break  # no whole line left (a torn last line is not one)
                carry = data  # a line longer than a block: read on
                continue
            block, carry = data[:cut], data[cut:]
            _fold_block(summary, timing, block, path, offset, current)
            offset += len(block)
            tail = block[-CHECK_BYTES:]
            if len(tail) < CHECK_BYTES and offset > len(tail):
                f.seek(offset - CHECK_BYTES)
                tail = f.read(CHECK_BYTES)
                f.seek(offset + len(carry))
            summary.offset, summary.check = offset, digest(tail)
            if not chunk:
                break
    summary.keep_timing(timing)


def fold_written(summary: Summary, timing: Timing, chunks: list[bytes], path: Path) -> None:
    """Fold journal bytes as they were written (`chunks`: whole lines, one after another from
    `summary.offset`) into `summary` and `timing`, as `fold_journal` would fold them from the
    file, without reading them back."""
    offset = summary.offset
    for block in chunks:
        _fold_block(summary, timing, block, path, offset, None)
        offset += len(block)
        summary.offset = offset
    tail = b""
    for block in reversed(chunks):
        tail = block[-CHECK_BYTES:] + tail
        if len(tail) >= CHECK_BYTES:
            break
    if len(tail) < CHECK_BYTES and offset > len(tail):
        # (Short writes after a summary's offset: the bytes before them are in the file.)
        with path.open("rb") as f:
            f.seek(max(0, offset - CHECK_BYTES))
            tail = f.read(min(CHECK_BYTES, offset))
    summary.check = digest(tail)
    summary.keep_timing(timing)


def _fold_block(
    summary: Summary,
    timing: Timing,
    block: bytes,
    path: Path,
    offset: int,
    current: Container[str] | None,
) -> None:
    """Fold whole journal lines (`block`, at `offset`): decoded in one call, or line by line
    when one of them does not decode as the summary reads records."""
    try:
        records = _DECODER.decode_lines(block)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pos = offset
        for raw in block.splitlines(keepends=True):
            try:
                rec = _DECODER.decode(raw)
                timed = True
            except (msgspec.DecodeError, msgspec.ValidationError):
                rec, timed = _lenient(raw, path, pos), False
            pos += len(raw)
            one = summary.fold(rec, current)
            if one is False:
                summary.offset = pos
                raise _Inconsistent from None
            if timed and one:
                timing.add(rec)  # a record of odd types is counted, not timed
        return
    counted = summary.fold_many(records, current)
    if counted is None:
        raise _Inconsistent
    timing.add_many(counted)  # the same records as the counts: one definition of an attempt


def _lenient(raw: bytes, path: Path, offset: int) -> SummaryRecord:
    """A record whose fields are not of the usual types, as `JobState.record` reads it."""
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or "kind" not in obj:
        raise BatchrunError(
            f"the journal {path} is corrupt at byte {offset}; "
            "move that line out of the file (or restore a backup) and run again"
        )
    t = obj.get("time")
    cid = obj.get("custom_id")
    attempt = obj.get("attempt")
    worker = obj.get("worker")
    latency = obj.get("latency_s")
    model = obj.get("model")
    try:
        return SummaryRecord(
            kind=str(obj["kind"]),
            time=float(t) if isinstance(t, (int, float)) else 0.0,
            custom_id=cid if isinstance(cid, str) else None,
            ok=bool(obj.get("ok")),
            attempt=attempt if type(attempt) is int else 0,
            prompt_tokens=int(obj.get("prompt_tokens") or 0),
            completion_tokens=int(obj.get("completion_tokens") or 0),
            worker=worker if type(worker) is int else None,
            copy_of=str(obj["copy_of"]) if "copy_of" in obj else None,
            generation=obj.get("generation") if isinstance(obj.get("generation"), str) else None,
            cached=bool(obj.get("cached")),
            latency_s=float(latency) if isinstance(latency, (int, float)) else None,
            model=model if isinstance(model, str) else None,
        )
    except (TypeError, ValueError):
        return SummaryRecord(kind="result", attempt=0)  # cannot be folded: rebuilt by replay


def _tail_check(path: Path, offset: int) -> str:
    """The digest of the journal's bytes before `offset`."""
    if offset == 0:
        return digest(b"")
    with path.open("rb") as f:
        start = max(0, offset - CHECK_BYTES)
        f.seek(start)
        return digest(f.read(offset - start))


def _generation(manifest: Manifest) -> str | None:
    info = manifest.input_map
    return info.generation if info is not None else None


def _run_starts(manifest: Manifest) -> list[float]:
    return [r.started_at for r in manifest.runs]


def rebuild(paths: JobPaths, manifest: Manifest) -> Summary:
    """The summary of the whole journal (of the input as it is now: see InputMap)."""
    input_map = load_input_map(paths, manifest)
    summary = Summary(generation=_generation(manifest), check=digest(b""))
    timing = Timing(_run_starts(manifest))
    try:
        fold_journal(summary, timing, paths.journal, None, input_map.lines if input_map else None)
    except _Inconsistent:
        # A journal the fold's rules do not hold for (not one batchrun wrote): count it
        # exactly, a request at a time.
        return _replayed(paths, manifest)
    return summary


def _replayed(paths: JobPaths, manifest: Manifest) -> Summary:
    """The summary of the journal's whole lines, counted by `state.replay` (O(requests))."""
    end = whole_end(paths.journal)
    state = replay(paths, manifest, end=end)
    # The replay counts with the same per-record step as the summary's fold (job/tally.py).
    summary = Summary(
        offset=end,
        check=_tail_check(paths.journal, end),
        generation=state.generation,
        tally=state.tally,
    )
    # Timing of the same records the replay counted: a scratch fold says which those are (its
    # own counts cannot follow this journal, and are dropped).
    scratch = Summary(generation=state.generation)
    current = state.current
    timing = Timing(_run_starts(manifest))
    with paths.journal.open("rb") as f:
        pos = 0
        for raw in f:
            pos += len(raw)
            if pos > end:
                break
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                rec = _DECODER.decode(raw)
                if scratch.fold(rec, current) is not None:
                    timing.add(rec)
    summary.keep_timing(timing)
    return summary


def whole_end(path: Path) -> int:
    """Where the journal's last whole line ends (a torn last line is not counted)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return 0
    with f:
        pos = f.seek(0, os.SEEK_END)
        while pos > 0:
            start = max(0, pos - (1 << 16))
            f.seek(start)
            found = f.read(pos - start).rfind(b"\n")
            if found >= 0:
                return start + found + 1
            pos = start
        return 0


def current_summary(paths: JobPaths, manifest: Manifest, *, save: bool = True) -> Summary:
    """The job's counts now: its summary checked against the journal plus the journal's tail,
    or, when the summary cannot be trusted, a rebuild from the whole journal (saved for the
    next reader when `save`)."""
    summary = saved_summary(paths, manifest)
    if summary is not None:
        return summary
    summary = rebuild(paths, manifest)
    if save:
        write_summary(paths, summary)
    return summary


def saved_summary(paths: JobPaths, manifest: Manifest) -> Summary | None:
    """The job's counts from its saved summary and the journal's tail, without a rebuild: None
    when the summary cannot be trusted (then only a replay of the whole journal knows them)."""
    try:
        summary = Summary.from_json(summary_path(paths).read_bytes())
        if summary is None or summary.generation != _generation(manifest):
            return None
        journal = paths.journal
        size = journal.stat().st_size if summary.offset else 0
        if summary.offset > size or _tail_check(journal, summary.offset) != summary.check:
            return None
        fold_journal(summary, summary.timing_of(_run_starts(manifest)), journal)
    except (OSError, KeyError, TypeError, ValueError, AttributeError, _Inconsistent):
        return None  # a summary that cannot be read, or that this journal cannot follow
    return summary


class SummaryKeeper:
    """Keeps a running job's summary (a JournalWatcher): the journal's bytes folded and saved at
    a bounded rate as they are written, and when the journal closes."""

    def __init__(self, paths: JobPaths, manifest: Manifest) -> None:
        """Start from the journal as it is now (its summary, or a recount: a forced resume's)."""
        self.paths = paths
        self.summary = current_summary(paths, manifest)
        self.timing = self.summary.timing_of(_run_starts(manifest))
        self._due = time.monotonic() + INTERVAL_S
        self._burst_due = self._due - INTERVAL_S + _BURST_INTERVAL_S
        self._broken = False
        # The writes since the last save, held to be folded as they were written: reading them
        # back from the file cost a running job a third of the fold (a 100 MB journal at 200,000
        # echo results, read and copied in blocks). Held only while they follow one another from
        # the summary's offset (`_held_from`, to `_held_to`; -1: a gap, fold from the file).
        self._held: list[bytes] = []
        self._held_from = self._held_to = self.summary.offset

    def written(self, offset: int, data: bytes) -> None:
        """A write to the journal: fold and save the summary when one is due."""
        if offset - len(data) == self._held_to and data.endswith(b"\n"):
            self._held.append(data)
            self._held_to = offset
        else:
            self._held.clear()
            self._held_to = -1
        now = time.monotonic()
        if now >= self._due or (
            offset - self.summary.offset >= BURST_BYTES and now >= self._burst_due
        ):
            self._save(offset)

    def closed(self, offset: int) -> None:
        """The journal closes: fold and save the final counts."""
        if offset != self.summary.offset:
            self._save(offset)

    def _save(self, offset: int) -> None:
        if self._broken:
            return
        held = self._held
        whole = self._held_from == self.summary.offset and self._held_to == offset
        self._held = []
        try:
            if whole:
                fold_written(self.summary, self.timing, held, self.paths.journal)
            else:
                fold_journal(self.summary, self.timing, self.paths.journal, offset)
        except (_Inconsistent, BatchrunError, OSError):
            # Status rebuilds from the journal; the run itself must never stop for its summary.
            self._broken = True
            with contextlib.suppress(OSError):
                summary_path(self.paths).unlink()
            return
        # (Short of `offset` only where the file ends in a torn line: then the next writes do
        # not follow on, and the next save reads the file.)
        self._held_from = self._held_to = self.summary.offset
        write_summary(self.paths, self.summary)
        now = time.monotonic()
        self._due, self._burst_due = now + INTERVAL_S, now + _BURST_INTERVAL_S


def keep_summary(paths: JobPaths, manifest: Manifest, journal: JournalWriter) -> None:
    """Have `journal` (open) keep the job's summary from now on."""
    journal.watcher = SummaryKeeper(paths, manifest)
