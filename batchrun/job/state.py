"""A job's state, derived from its journal (the one source of truth)."""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from batchrun.job.inputmap import load_input_map
from batchrun.job.journal import read_records
from batchrun.job.manifest import Manifest
from batchrun.job.paths import JobPaths
from batchrun.job.tally import CACHED, COPY, ENGINE, Tally, TallyTotals
from batchrun.openai.records import Outcome, Request


class RequestStatus(IntEnum):
    """Where a request (or an input line) stands: the one status scale run, status and export share.

    Derived from its last journal record; ints underneath, so that the per-request tables of a
    million-line job stay plain byte arrays.
    """

    OK = 0
    FAILED_RETRYABLE = 1  # a failed attempt another may fix (engine error, OOM), attempts left
    FAILED_FINAL = 2  # a failed attempt that would fail the same way (a 400), or attempts spent
    INVALID = 3  # an input line that failed validation: it never runs
    PENDING = 4  # a request with no finished attempt yet


OK, FAILED_RETRYABLE, FAILED_FINAL, INVALID, PENDING = RequestStatus


def attempt_status(ok: object, retryable: object) -> int:
    """The status an attempt leaves its request in, from its record's (or outcome's) `ok` and
    `retryable`: the one rule every reader of the journal applies (the run's state, the summary,
    export's index)."""
    if ok:
        return OK
    return FAILED_RETRYABLE if retryable else FAILED_FINAL


# A request's key in the state: its input line (a state with a journal to name lines from), or
# its custom_id (a state built in memory, or a record that names no line).
Key = int | str


@dataclass
class _ByLine:
    """The requests' last statuses: by line in a byte array (status + 1; 0: none yet), by
    custom_id in a dict; attempts only of requests with more than one; the failed ones' custom_ids
    (what a retry pass selects). About one byte a request where lines are known."""

    codes: bytearray = field(default_factory=bytearray)
    by_id: dict[str, int] = field(default_factory=dict)
    more: dict[Key, int] = field(default_factory=dict)
    failed: dict[str, Key] = field(default_factory=dict)
    done: int = 0

    def get(self, key: Key) -> int | None:
        """The last status of `key`, or None when it has no finished attempt."""
        if type(key) is int:
            codes = self.codes
            code = codes[key] if key < len(codes) else 0
            return code - 1 if code else None
        return self.by_id.get(key)  # type: ignore[arg-type]

    def attempts(self, key: Key) -> int:
        """Finished attempts of `key`."""
        n = self.more.get(key)
        if n is not None:
            return n
        return 0 if self.get(key) is None else 1

    def grow(self, line: int) -> None:
        """Make room in the byte array for `line` (doubling: amortized O(1))."""
        codes = self.codes
        if line >= len(codes):
            codes.extend(bytes(max(line + 1, 2 * len(codes), 1024) - len(codes)))

    def set(self, key: Key, cid: str, status: int) -> int:
        """Record `key`'s new last status; return its attempts (this one included)."""
        if type(key) is int:
            self.grow(key)
            old_code = self.codes[key]
            old = old_code - 1 if old_code else None
            self.codes[key] = status + 1
        else:
            old = self.by_id.get(key)  # type: ignore[arg-type]
            self.by_id[key] = status  # type: ignore[index]
        if status != OK:
            self.failed[cid] = key
        elif old is not None and old != OK:
            del self.failed[cid]
        if old is None:
            self.done += 1
            return 1
        attempt = self.more.get(key, 1) + 1
        self.more[key] = attempt
        return attempt

    def finished(self) -> Iterator[Key]:
        """Every key with a finished attempt."""
        codes = self.codes
        for line in range(len(codes)):
            if codes[line]:
                yield line
        yield from self.by_id


class _View(Mapping[str, int]):
    """A request-by-custom_id view of a state's table (for tests and reports; the run itself
    never names every request): line keys are named from the journal, read back when asked."""

    __slots__ = ("_state",)

    def __init__(self, state: JobState) -> None:
        self._state = state

    def _value(self, key: Key) -> int | None:
        raise NotImplementedError

    def __getitem__(self, cid: str) -> int:
        key = self._state.key_of(cid)
        value = None if key is None else self._value(key)
        if value is None:
            raise KeyError(cid)
        return value

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, str) and self.get(cid) is not None

    def __iter__(self) -> Iterator[str]:
        return (cid for cid, _ in self._state.named())

    def __len__(self) -> int:
        return self._state.done

    def items(self) -> Iterator[tuple[str, int]]:  # type: ignore[override]
        """(custom_id, value) of every request with a finished attempt, in one pass."""
        for cid, key in self._state.named():
            value = self._value(key)
            assert value is not None
            yield cid, value

    def values(self) -> Iterator[int]:  # type: ignore[override]
        """The value of every request with a finished attempt."""
        return (value for _, value in self.items())


class LastStatuses(_View):
    """Each request's last status (RequestStatus), by custom_id."""

    __slots__ = ()

    def _value(self, key: Key) -> int | None:
        return self._state.table.get(key)


class Attempts(_View):
    """Attempts per request, by custom_id: a request with a finished attempt has one unless the
    state's `more` says how many (most have one: no second table of a million entries)."""

    __slots__ = ()

    def _value(self, key: Key) -> int | None:
        n = self._state.table.attempts(key)
        return n or None

    def total(self) -> int:
        """Attempts of every request together."""
        return self._state.tried


@dataclass
class JobState(TallyTotals):
    """What the journal says: per request, attempts and how the last one ended; totals.

    With `journal` (replay gives it), requests are kept by their input line (a byte each) and
    named, where a view asks for custom_ids, from the journal's records; without one (a state
    built in memory), by custom_id.
    """

    journal: Path | None = None
    table: _ByLine = field(default_factory=_ByLine, init=False)
    # The counts every fold of the journal keeps alike: totals, per worker, per model
    # (job/tally.py: the one per-record step).
    tally: Tally = field(default_factory=Tally, init=False)
    # After a forced resume (see InputMap): only these custom_ids are part of the job, and only
    # invalid-line records tagged with this generation are the current file's. A state with a
    # journal is given the input map's custom_id -> line (its lines were renumbered).
    current: Container[str] | None = None
    generation: str | None = None
    # Kept as records are folded, so that these counts cost O(1) to read: requests whose last
    # attempt succeeded, and attempts.
    ok: int = 0
    tried: int = 0

    @property
    def last(self) -> LastStatuses:
        """Each request's last status by custom_id (a view: iterating it names every request)."""
        return LastStatuses(self)

    @property
    def attempts(self) -> Attempts:
        """Each request's attempts by custom_id (a view, as `last`)."""
        return Attempts(self)

    @property
    def done(self) -> int:
        """Requests with a finished attempt."""
        return self.table.done

    @property
    def succeeded(self) -> int:
        """Requests whose last attempt succeeded."""
        return self.ok

    @property
    def failed(self) -> int:
        """Requests whose last attempt failed."""
        return self.table.done - self.ok

    def pending(self, requests: int) -> int:
        """Of a job's `requests` valid requests, those with no finished attempt yet."""
        return max(0, requests - self.table.done)

    def _key(self, cid: str, line: object) -> Key | None:
        """Where request `cid` (journaled at `line`) is kept; None: not part of the job."""
        current = self.current
        if current is not None:
            if cid not in current:
                return None  # its line left the input file
            if self.journal is not None:
                return current[cid]  # type: ignore[index,no-any-return]  # the line now
            return cid
        if self.journal is not None and type(line) is int and line > 0:
            by_id = self.table.by_id
            # A request an old record kept by custom_id stays there.
            return cid if by_id and cid in by_id else line
        return cid

    def key_of(self, cid: str) -> Key | None:
        """Where request `cid` is kept, found by its custom_id (slow for a request neither
        failed nor renumbered: its line is read back from the journal); None: no record."""
        if cid in self.table.failed:
            return self.table.failed[cid]
        if self.journal is None or cid in self.table.by_id:
            return cid
        if self.current is not None:
            return self._key(cid, None)
        for line, name in self._names().items():
            if name == cid:
                return line
        return None

    def _names(self) -> dict[int, str]:
        """Each line's custom_id, as the journal (or the forced resume's input map) names it."""
        if self.current is not None:
            return {line: cid for cid, line in self.current.items()}  # type: ignore[attr-defined]
        names: dict[int, str] = {}
        if self.journal is not None:
            for rec in read_records(self.journal, strict=False):
                line = rec.get("line")
                if rec.get("kind") == "result" and type(line) is int:
                    names[line] = rec["custom_id"]
        return names

    def named(self) -> Iterator[tuple[str, Key]]:
        """(custom_id, key) of every request with a finished attempt (names read back)."""
        names = self._names() if self.table.codes else {}
        for key in self.table.finished():
            yield (names[key] if type(key) is int else key), key  # type: ignore[misc]

    def is_not_done(self, request: Request) -> bool:
        """Whether the request still waits for its first finished attempt."""
        key = self._key(request.custom_id, request.line)
        table = self.table
        if type(key) is int:
            codes = table.codes
            if key < len(codes) and codes[key]:
                return False
            return not (table.by_id and request.custom_id in table.by_id)
        return key is None or key not in table.by_id

    def failed_ids(self) -> set[str]:
        """The custom_ids of the requests whose last attempt failed."""
        return set(self.table.failed)

    def retryable(self, max_attempts: int) -> dict[str, int]:
        """Requests whose last attempt failed retryably with attempts left: custom_id ->
        attempts so far."""
        table = self.table
        found: dict[str, int] = {}
        for cid, key in table.failed.items():
            if table.get(key) == FAILED_RETRYABLE:
                n = table.attempts(key)
                if n < max_attempts:
                    found[cid] = n
        return found

    def record(self, rec: dict[str, Any]) -> None:
        """Fold one journal record into the state."""
        invalid = rec.get("kind") == "invalid"
        if invalid:
            # Untagged records are submit's; tagged ones a forced resume's (of `generation` only).
            if rec.get("generation") != self.generation:
                return
            key: Key | None = None
        else:
            cid = rec["custom_id"]
            key = self._key(cid, rec.get("line"))
            if key is None:
                return  # its line left the input file: no longer part of the job
        t = rec.get("time")
        when = float(t) if isinstance(t, (int, float)) else 0.0
        if key is None:
            self.tally.add_invalid(when)
            return
        table = self.table
        self.tried += 1
        old = table.get(key)
        status = attempt_status(rec.get("ok"), rec.get("retryable"))
        table.set(key, cid, status)
        change = (status == OK) - (old == OK)
        self.ok += change
        latency = rec.get("latency_s")
        worker = rec.get("worker")
        model = rec.get("model")
        self.tally.add(
            when,
            float(latency) if isinstance(latency, (int, float)) else 0.0,
            int(rec.get("prompt_tokens") or 0),
            int(rec.get("completion_tokens") or 0),
            old is None,
            change,
            COPY if "copy_of" in rec else CACHED if rec.get("cached") else ENGINE,
            worker if type(worker) is int else None,
            model if isinstance(model, str) else None,
        )

    def record_results(
        self,
        outcomes: Sequence[Outcome],
        worker: int | None,
        t: float,
        lines: Sequence[int] | None = None,
        models: Sequence[str] | None = None,
    ) -> list[int]:
        """Fold in the results of attempts as `record` folds their journal records (all from
        worker `worker`, at time `t`; None: answered without one, from the answer cache; `lines`:
        their requests' input lines; `models`: the model each record names), without building
        the records; return their attempt numbers."""
        table, current = self.table, self.current
        keys: Sequence[Key | None]
        if self.journal is not None and current is None and lines is not None and not table.by_id:
            keys = lines  # the common case: each request at its line
            top = max(lines, default=0)
        else:
            at = lines if lines is not None else [None] * len(outcomes)
            keys = [self._key(o.custom_id, line) for o, line in zip(outcomes, at, strict=True)]
            top = max((k for k in keys if type(k) is int), default=0)  # type: ignore[type-var]
        if top:
            table.grow(top)
        codes, by_id, more, failed = table.codes, table.by_id, table.more, table.failed
        tally = self.tally
        numbers: list[int] = []
        ok = done = counted = prompt = completion = engine = engine_tokens = copies = 0
        first_copies = 0
        longest = 0.0
        for i, (outcome, key) in enumerate(zip(outcomes, keys, strict=True)):
            if key is None:
                # Its line left the input file: no longer part of the job (its attempt number
                # as if it were: this run's first).
                numbers.append(1)
                continue
            if type(key) is int:
                code = codes[key]
                old = code - 1 if code else None
            else:
                old = by_id.get(key)  # type: ignore[arg-type]
            if old is None:
                attempt = 1
                done += 1
            else:
                attempt = more.get(key, 1) + 1
                more[key] = attempt
            numbers.append(attempt)
            cid = outcome.custom_id
            status = attempt_status(outcome.ok, outcome.retryable)
            change = (status == OK) - (old == OK)
            ok += change
            if status == OK:
                if old is not None and old != OK:
                    del failed[cid]
            else:
                failed[cid] = key
            if type(key) is int:
                codes[key] = status + 1
            else:
                by_id[key] = status  # type: ignore[index]
            counted += 1
            generated = int(outcome.completion_tokens or 0)
            extra = outcome.extra
            source = (
                ENGINE
                if not extra
                else COPY
                if "copy_of" in extra
                else CACHED
                if extra.get("cached")
                else ENGINE
            )
            latency = outcome.latency_s
            if models is not None:
                tally.add(
                    t, round(latency, 6), int(outcome.prompt_tokens or 0), generated,
                    old is None, change, source, worker, models[i],
                )  # fmt: skip
                continue
            # Summed, then counted as one group: the same step as `record`'s, once a call.
            prompt += int(outcome.prompt_tokens or 0)
            completion += generated
            if source == ENGINE:
                engine += 1
                engine_tokens += generated
                if latency > longest:
                    longest = latency
            elif source == COPY:
                copies += 1
                first_copies += old is None
        table.done += done
        self.ok += ok
        self.tried += counted
        if models is None and counted:
            # (The longest latency as journaled: rounding keeps order, so once is enough.)
            tally.add_group(
                t, worker, counted, done, ok, prompt, completion, engine, engine_tokens, copies,
                first_copies, round(longest, 6),
            )  # fmt: skip
        return numbers


def replay(paths: JobPaths, manifest: Manifest | None = None, end: int | None = None) -> JobState:
    """Derive the job's state from its journal (the one source of truth), up to byte `end`.

    With the manifest, of the input file as it is now: after a forced resume, requests that left
    the file and the old file's invalid lines are not counted (see InputMap).
    """
    input_map = load_input_map(paths, manifest) if manifest is not None else None
    state = JobState(journal=paths.journal)
    if input_map is not None:
        state.current, state.generation = input_map.lines, input_map.generation
    for rec in read_records(paths.journal, end=end):
        state.record(rec)
    return state
