"""The crash harness's checker: the invariants a job's journal and exports must keep, whatever
kills came in between (scripts/chaos.py drives the runs and calls it after each stop and at the end).

Kept apart from the harness so that tests import it and run it on small journals written by hand
(tests/test_chaos_checker.py): a checker that never fails proves nothing, so each violation it knows
is shown to be reported, with its exact message, and a clean journal to report none. Like the
harness, it imports nothing from batchrun: it reads the files as a user's program would.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- what the input holds -------------------------------------------------------------------


@dataclass
class Expected:
    """What the input holds: valid requests (id -> line, answer, n) and invalid lines (line -> code)."""

    valid: dict[str, dict[str, Any]] = field(default_factory=dict)
    invalid: dict[int, dict[str, Any]] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    poison: set[str] = field(default_factory=set)
    max_tokens: int = 16

    def kinds(self) -> int:
        return len({v["kind"] for v in self.invalid.values()})


# --- reading the job ------------------------------------------------------------------------


@dataclass
class JournalView:
    """The journal's whole lines parsed, and whether a torn (unterminated) last line follows."""

    records: list[dict[str, Any]]
    torn: bool
    bad_lines: list[int]


def read_journal(path: Path) -> JournalView:
    if not path.exists():
        return JournalView([], False, [])
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    for i, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or "kind" not in rec:
            bad.append(i)
            continue
        if "shard" in rec:  # its body is in its worker's shard: a record naming lost bytes is bad
            body = shard_body(path.parent, rec["shard"])
            if body is None:
                bad.append(i)
                continue
            rec["body"] = body
        records.append(rec)
    return JournalView(records, bool(tail), bad)


def shard_body(job: Path, ref: Any) -> Any:
    """The body a record's `"shard": [name, at, length, ...]` names, as a reader of the job
    directory finds it (shards/NAME.res, the body's JSON at `at`); None when it is not there."""
    try:
        name, at, length = ref[0], int(ref[1]), int(ref[2])
        with (job / "shards" / f"{name}.res").open("rb") as f:
            f.seek(at)
            data = f.read(length)
        return json.loads(data) if len(data) == length else None
    except (OSError, ValueError, TypeError, IndexError):
        return None


def answer_of(body: Any, i: int = 0) -> Any:
    try:
        return body["choices"][i]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None


class Checker:
    """The invariants; every broken one becomes a line in `violations`."""

    def __init__(self, exp: Expected, engine: str, max_attempts: int) -> None:
        self.exp = exp
        self.engine = engine
        self.max_attempts = max_attempts
        self.violations: list[str] = []
        self._seen: set[str] = set()

    def fail(self, message: str) -> None:
        """Record a violation once: the same fault seen again after a later stop is not new."""
        where, sep, what = message.partition(": ")
        key = what if sep and where.startswith(("after stop", "final journal")) else message
        if key not in self._seen:
            self._seen.add(key)
            self.violations.append(message)

    def fail_many(self, where: str, items: list[str], one: str, many: str) -> None:
        """One violation per item for a few, one summary line for many (`one` takes the item,
        `many` the count and the first items)."""
        if len(items) <= 5:
            for item in items:
                self.fail(f"{where}: {one.format(item)}")
        elif items:
            first = ", ".join(items[:3])
            self.fail(f"{where}: {many.format(n=len(items), first=first)}")

    def check_answer(self, where: str, cid: str, body: Any) -> None:
        want = self.exp.valid[cid]
        if not isinstance(body, dict) or body.get("object") != "chat.completion":
            self.fail(f"{where}: {cid}: the answer is not a chat.completion object")
            return
        choices = body.get("choices")
        if not isinstance(choices, list) or len(choices) != want["n"]:
            self.fail(f"{where}: {cid}: expected {want['n']} choice(s)")
            return
        for i in range(want["n"]):
            got = answer_of(body, i)
            if self.engine == "echo":
                if got != want["answer"]:
                    self.fail(f"{where}: {cid}: wrong answer {got!r}, expected {want['answer']!r}")
            elif not isinstance(got, str) or choices[i].get("finish_reason") not in (
                "stop",
                "length",
            ):
                self.fail(f"{where}: {cid}: choice {i} has no text or no finish_reason")
        usage = body.get("usage") or {}
        if self.engine == "vllm" and int(usage.get("completion_tokens") or 0) > self.exp.max_tokens:
            self.fail(f"{where}: {cid}: more completion tokens than max_tokens")
        if body.get("model") != "chaos":
            self.fail(f"{where}: {cid}: model {body.get('model')!r}, expected 'chaos'")

    def check_journal(self, view: JournalView, where: str, final: bool) -> dict[str, Any]:
        """Invariants of the journal at any moment (and, with `final`, at the end)."""
        for n in view.bad_lines:
            self.fail(f"{where}: journal line {n} is not a journal record (corrupt)")
        if final and view.torn:
            self.fail(f"{where}: the journal ends with a torn line after a clean run")
        attempts: dict[str, int] = {}
        ok: dict[str, dict[str, Any]] = {}
        invalid_seen: Counter[Any] = Counter()
        twice: list[str] = []
        twice_invalid: list[str] = []
        for rec in view.records:
            kind = rec.get("kind")
            if kind == "invalid":
                line = rec.get("line")
                invalid_seen[line] += 1
                if line not in self.exp.invalid:
                    self.fail(f"{where}: an invalid-line record for line {line}, which is valid")
                elif invalid_seen[line] == 2:
                    twice_invalid.append(str(line))
                continue
            if kind != "result":
                continue  # a record kind this harness does not know: not a request outcome
            cid = rec.get("custom_id")
            if cid not in self.exp.valid:
                self.fail(
                    f"{where}: a result for {cid!r}, which is not a valid request of the input"
                )
                continue
            n = attempts.get(cid, 0) + 1
            attempts[cid] = n
            if rec.get("attempt") != n:
                self.fail(
                    f"{where}: {cid}: journal attempt {rec.get('attempt')} where {n} was due "
                    "(an attempt counted twice or lost)"
                )
            if rec.get("line") != self.exp.valid[cid]["line"]:
                self.fail(f"{where}: {cid}: journal says line {rec.get('line')}")
            if cid in ok:
                twice.append(cid)
            if rec.get("ok"):
                ok[cid] = rec
                self.check_answer(where, cid, rec.get("body"))
                if cid in self.exp.failing:
                    self.fail(f"{where}: {cid} succeeded, but the engine fails it on purpose")
                if cid in self.exp.poison:
                    self.fail(f"{where}: {cid} succeeded, but it crashes the engine on purpose")
            else:
                code = (rec.get("error") or {}).get("code")
                if cid in self.exp.poison and code != "engine_crash":
                    self.fail(f"{where}: {cid} (poison) failed with {code!r}, not engine_crash")
                if cid not in self.exp.poison and code == "engine_crash":
                    self.fail(f"{where}: {cid} was blamed for crashing the engine, but it does not")
        self.fail_many(
            where,
            twice,
            "{} answered twice (a second result after a success)",
            "{n} requests ({first}, ...) answered twice (a second result after a success)",
        )
        self.fail_many(
            where,
            twice_invalid,
            "invalid line {} is recorded twice in the journal",
            "{n} invalid lines ({first}, ...) are recorded twice in the journal",
        )
        if final:
            lost = []
            for cid in self.exp.valid:
                if cid in self.exp.poison:
                    if attempts.get(cid) != 1:
                        self.fail(
                            f"{where}: {cid} (poison) has {attempts.get(cid, 0)} results, "
                            "expected exactly 1 (engine_crash)"
                        )
                elif cid in self.exp.failing:
                    # A success among them is reported with its record, above.
                    if attempts.get(cid) != self.max_attempts:
                        self.fail(
                            f"{where}: {cid} (always failing) has {attempts.get(cid, 0)} attempts, "
                            f"expected {self.max_attempts}"
                        )
                elif cid not in ok:
                    lost.append(cid)
            self.fail_many(
                where,
                lost,
                "{} has no successful result in the journal (lost)",
                "{n} requests ({first}, ...) have no successful result in the journal (lost)",
            )
            self.fail_many(
                where,
                [str(line) for line in self.exp.invalid if invalid_seen[line] == 0],
                "invalid line {} has no record in the journal (lost)",
                "{n} invalid lines ({first}, ...) have no record in the journal (lost)",
            )
        return {"attempts": attempts, "ok": ok}

    def check_exports(
        self, job: Path, journal: dict[str, Any], status: dict[str, Any] | None
    ) -> int:
        """output.jsonl, errors.jsonl and status against the input and the journal; rows checked."""
        try:
            output = [json.loads(x) for x in (job / "output.jsonl").read_bytes().splitlines()]
            errors = [json.loads(x) for x in (job / "errors.jsonl").read_bytes().splitlines()]
        except (OSError, ValueError) as e:
            self.fail(f"export: cannot read output.jsonl / errors.jsonl: {e}")
            return 0
        seen: Counter[str] = Counter()
        line_ids: Counter[str] = Counter()
        lines_in_order: list[int] = []
        for o in output:
            cid = o.get("custom_id")
            line_ids[o.get("id")] += 1
            seen[cid] += 1
            if cid not in self.exp.valid:
                self.fail(f"output.jsonl: {cid!r} is not a valid request of the input")
                continue
            lines_in_order.append(self.exp.valid[cid]["line"])
            if seen[cid] == 2:
                self.fail(f"output.jsonl: {cid} appears twice")
            if cid in self.exp.failing or cid in self.exp.poison:
                self.fail(f"output.jsonl: {cid} should have failed")
            resp = o.get("response") or {}
            if resp.get("status_code") != 200 or o.get("error") is not None:
                self.fail(f"output.jsonl: {cid}: not a 200 line")
            body = resp.get("body")
            self.check_answer("output.jsonl", cid, body)
            rec = journal["ok"].get(cid)
            if rec is not None and rec.get("body") != body:
                self.fail(f"output.jsonl: {cid}: the answer differs from the journal's")
        if lines_in_order != sorted(lines_in_order):
            self.fail("output.jsonl: lines are not in input order")
        err_seen: Counter[str] = Counter()
        inv_seen: Counter[Any] = Counter()
        failed_rows = invalid_rows = 0
        err_lines: list[int] = []
        for row in errors:
            line_ids[row.get("id")] += 1
            err = row.get("error") or {}
            line = err.get("line")
            err_lines.append(line if isinstance(line, int) else -1)
            if row.get("response") is None:
                invalid_rows += 1
                inv_seen[line] += 1
                want = self.exp.invalid.get(line) if isinstance(line, int) else None
                if want is None:
                    self.fail(
                        f"errors.jsonl: an invalid-line error for line {line}, which is valid"
                    )
                    continue
                if inv_seen[line] == 2:
                    self.fail(f"errors.jsonl: invalid line {line} appears twice")
                if err.get("code") != want["code"]:
                    self.fail(
                        f"errors.jsonl: line {line} ({want['kind']}): code {err.get('code')!r}, "
                        f"expected {want['code']!r}"
                    )
                if not isinstance(err.get("message"), str) or not err["message"]:
                    self.fail(f"errors.jsonl: line {line} has no message")
                continue
            failed_rows += 1
            cid = row.get("custom_id")
            err_seen[cid] += 1
            if cid not in self.exp.failing and cid not in self.exp.poison:
                self.fail(f"errors.jsonl: {cid!r} failed ({err.get('code')}), expected success")
                continue
            if err_seen[cid] == 2:
                self.fail(f"errors.jsonl: {cid} appears twice")
            want_code = "engine_crash" if cid in self.exp.poison else "engine_error"
            if err.get("code") != want_code or line != self.exp.valid[cid]["line"]:
                self.fail(f"errors.jsonl: {cid}: code {err.get('code')!r}, line {line}")
        if err_lines != sorted(err_lines):
            self.fail("errors.jsonl: lines are not in input order")
        missing = []
        for cid in self.exp.valid:
            if cid in self.exp.failing or cid in self.exp.poison:
                if err_seen[cid] == 0:
                    self.fail(f"errors.jsonl: {cid} (failing on purpose) is missing")
                if seen[cid]:
                    self.fail(f"export: {cid} is both in output.jsonl and errors.jsonl")
            elif seen[cid] == 0:
                missing.append(cid)
        self.fail_many(
            "output.jsonl",
            missing,
            "{} is missing (lost)",
            "{n} requests ({first}, ...) are missing (lost)",
        )
        self.fail_many(
            "errors.jsonl",
            [str(line) for line in self.exp.invalid if inv_seen[line] == 0],
            "invalid line {} is missing (lost)",
            "{n} invalid lines ({first}, ...) are missing (lost)",
        )
        dup_ids = [i for i, c in line_ids.items() if c > 1]
        if dup_ids:
            self.fail(f"export: {len(dup_ids)} line ids are used twice")
        if status is not None:
            req = status.get("requests") or {}
            want = {
                "valid": len(self.exp.valid),
                "invalid": len(self.exp.invalid),
                "total": len(self.exp.valid) + len(self.exp.invalid),
                "succeeded": len(output),
                "failed": failed_rows,
                "pending": 0,
            }
            for key, value in want.items():
                if req.get(key) != value:
                    self.fail(f"status: requests.{key} is {req.get(key)}, the files say {value}")
            if invalid_rows != len(self.exp.invalid):
                self.fail(
                    f"errors.jsonl: {invalid_rows} invalid lines, the input has {len(self.exp.invalid)}"
                )
            results = sum(journal["attempts"].values())
            if status.get("attempts") != results:
                self.fail(
                    f"status: attempts is {status.get('attempts')}, the journal has {results}"
                )
            if status.get("status") != "completed":
                self.fail(f"status: the job is {status.get('status')!r}, expected 'completed'")
        return len(output) + len(errors)
