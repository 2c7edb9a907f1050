"""The crash harness's checker (scripts/chaos_check.py) on small journals, without the harness.

tests/fixtures/chaos_clean/ is a real, clean echo job (input.jsonl; journal.jsonl as `submit` wrote
it; output.jsonl, errors.jsonl and status.json as `export` and `status --json` wrote them): request
`a`, an invalid line 2, `b` (n=2), `fail` (failing on purpose: two attempts, engine_error) and
`poison` (crashing the engine worker on purpose: one result, engine_crash). Each test copies it,
breaks one thing as a bug (or a kill) would, and asserts the checker's whole list of violations:
one kind each, with its exact message, and none for the clean job.

Journal lines of the fixture, in order: 1 invalid line 2, 2 a, 3 b, 4 fail (attempt 1),
5 poison, 6 fail (attempt 2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from chaos_check import Checker, Expected, read_journal

CLEAN = Path(__file__).resolve().parent / "fixtures" / "chaos_clean"
FINAL = "final journal"  # what the harness calls the check after its last, unkilled run
AFTER_KILL = "after stop 3 (kill, resume)"  # and after a stop, as it names them
MAX_ATTEMPTS = 2
# The fixture's journal records, by position (0-based).
INVALID, A, B, FAIL_1, POISON, FAIL_2 = range(6)


def expected(**extra_valid: int) -> Expected:
    """What input.jsonl holds, as the harness's input writer records it; `extra_valid` adds valid
    requests (id=line) that the journal never ran."""
    valid: dict[str, dict[str, Any]] = {
        "a": {"line": 1, "answer": "hi a", "n": 1},
        "b": {"line": 3, "answer": "hi b", "n": 2},
        "fail": {"line": 4, "answer": "f", "n": 1},
        "poison": {"line": 5, "answer": "p", "n": 1},
    }
    for cid, line in extra_valid.items():
        valid[cid] = {"line": line, "answer": cid, "n": 1}
    return Expected(
        valid=valid,
        invalid={2: {"kind": "not JSON", "code": "invalid_json"}},
        failing={"fail"},
        poison={"poison"},
    )


@pytest.fixture
def job(tmp_path: Path) -> Path:
    dest = tmp_path / "job"
    shutil.copytree(CLEAN, dest)
    return dest


def records(job: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (job / "journal.jsonl").read_text().splitlines()]


def write_journal(job: Path, recs: list[Any], tail: str = "") -> None:
    """Write records (or raw lines) as the journal; `tail` follows the last newline (torn)."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)
    (job / "journal.jsonl").write_text(text + tail)


def journal_violations(
    job: Path, where: str = FINAL, final: bool = True, exp: Expected | None = None
) -> list[str]:
    checker = Checker(exp or expected(), "echo", MAX_ATTEMPTS)
    checker.check_journal(read_journal(job / "journal.jsonl"), where, final=final)
    return checker.violations


def export_violations(job: Path) -> list[str]:
    """The final journal check, then the export check, as the harness runs them at the end."""
    checker = Checker(expected(), "echo", MAX_ATTEMPTS)
    journal = checker.check_journal(read_journal(job / "journal.jsonl"), FINAL, final=True)
    status = json.loads((job / "status.json").read_text())
    checker.check_exports(job, journal, status)
    return checker.violations


def failure(rec: dict[str, Any], code: str, attempt: int = 1) -> dict[str, Any]:
    """`rec` turned into a failed result with `code`."""
    return {
        **rec,
        "attempt": attempt,
        "ok": False,
        "status_code": 500,
        "body": None,
        "error": {"code": code, "message": f"simulated {code}"},
    }


def success(rec: dict[str, Any], like: dict[str, Any], answer: str) -> dict[str, Any]:
    """`rec` turned into a success whose body is `like`'s, answering `answer`."""
    body = json.loads(json.dumps(like["body"]))
    body["choices"][0]["message"]["content"] = answer
    return {**rec, "ok": True, "status_code": 200, "body": body, "error": None}


# --- a clean job ----------------------------------------------------------------------------


def test_a_clean_job_reports_nothing(job: Path) -> None:
    checker = Checker(expected(), "echo", MAX_ATTEMPTS)
    journal = checker.check_journal(read_journal(job / "journal.jsonl"), FINAL, final=True)
    assert journal["attempts"] == {"a": 1, "b": 1, "fail": 2, "poison": 1}
    assert set(journal["ok"]) == {"a", "b"}
    status = json.loads((job / "status.json").read_text())
    assert checker.check_exports(job, journal, status) == 5  # 2 output rows + 3 error rows
    assert checker.violations == []


def test_a_journal_cut_short_by_a_kill_is_not_a_violation(job: Path) -> None:
    """After a kill, what is not run yet is pending (resume runs it), and a torn last line is
    what a kill in the middle of a write leaves (replay drops it)."""
    recs = records(job)
    write_journal(job, recs[:A], tail=json.dumps(recs[A])[:40])
    assert read_journal(job / "journal.jsonl").torn
    assert journal_violations(job, AFTER_KILL, final=False) == []


# --- the journal: one violation kind each ----------------------------------------------------


def test_answered_twice_a_copied_success(job: Path) -> None:
    """The planted bug duplicate-result: a finished answer's journal line, copied."""
    recs = records(job)
    write_journal(job, [*recs, recs[A]])
    assert journal_violations(job) == [
        "final journal: a: journal attempt 1 where 2 was due (an attempt counted twice or lost)",
        "final journal: a answered twice (a second result after a success)",
    ]


def test_answered_twice_a_second_attempt_after_a_success(job: Path) -> None:
    recs = records(job)
    write_journal(job, [*recs, {**recs[A], "attempt": 2}])
    assert journal_violations(job) == [
        "final journal: a answered twice (a second result after a success)"
    ]


def test_attempt_gap(job: Path) -> None:
    recs = records(job)
    recs[FAIL_2]["attempt"] = 3
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: fail: journal attempt 3 where 2 was due (an attempt counted twice or lost)"
    ]


def test_attempt_counted_twice(job: Path) -> None:
    recs = records(job)
    recs[FAIL_2]["attempt"] = 1
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: fail: journal attempt 1 where 2 was due (an attempt counted twice or lost)"
    ]


def test_invalid_line_recorded_twice(job: Path) -> None:
    recs = records(job)
    write_journal(job, [*recs, recs[INVALID]])
    assert journal_violations(job) == [
        "final journal: invalid line 2 is recorded twice in the journal"
    ]


def test_lost_request(job: Path) -> None:
    """The planted bug drop-result: a finished answer deleted after the last run."""
    recs = records(job)
    del recs[A]
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: a has no successful result in the journal (lost)"
    ]
    # Between two kills it is no bug: resume runs the request again.
    assert journal_violations(job, AFTER_KILL, final=False) == []


def test_lost_invalid_line(job: Path) -> None:
    """The planted bug drop-invalid: resume never writes an invalid line's record again."""
    write_journal(job, records(job)[A:])
    assert journal_violations(job) == [
        "final journal: invalid line 2 has no record in the journal (lost)"
    ]


def test_many_lost_requests_make_one_line(job: Path) -> None:
    """More than five of a kind: one summary line naming the first three."""
    never_run = {f"r{i}": 5 + i for i in range(1, 7)}
    assert journal_violations(job, exp=expected(**never_run)) == [
        "final journal: 6 requests (r1, r2, r3, ...) have no successful result in the journal "
        "(lost)"
    ]


def test_poison_answered_ok(job: Path) -> None:
    recs = records(job)
    recs[POISON] = success(recs[POISON], recs[A], "p")
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: poison succeeded, but it crashes the engine on purpose"
    ]


def test_poison_failed_with_another_code(job: Path) -> None:
    recs = records(job)
    recs[POISON] = failure(recs[POISON], "engine_error")
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: poison (poison) failed with 'engine_error', not engine_crash"
    ]


def test_poison_run_again_after_its_engine_crash(job: Path) -> None:
    recs = records(job)
    write_journal(job, [*recs, {**recs[POISON], "attempt": 2}])
    assert journal_violations(job) == [
        "final journal: poison (poison) has 2 results, expected exactly 1 (engine_crash)"
    ]


def test_innocent_request_blamed_with_engine_crash(job: Path) -> None:
    """An innocent request failed as engine_crash is never retried: it is lost as well."""
    recs = records(job)
    recs[A] = failure(recs[A], "engine_crash")
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: a was blamed for crashing the engine, but it does not",
        "final journal: a has no successful result in the journal (lost)",
    ]


def test_failing_request_not_given_all_its_attempts(job: Path) -> None:
    recs = records(job)
    del recs[FAIL_2]
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: fail (always failing) has 1 attempts, expected 2"
    ]


def test_failing_request_that_succeeds(job: Path) -> None:
    recs = records(job)
    recs[FAIL_2] = success(recs[FAIL_2], recs[A], "f")
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: fail succeeded, but the engine fails it on purpose"
    ]


def test_corrupt_line(job: Path) -> None:
    """The planted bug garbage: a line of garbage in the middle of the journal."""
    recs: list[Any] = records(job)
    recs.insert(2, "garbage \x00 garbage")
    recs.insert(4, json.dumps({"custom_id": "a"}))  # JSON, but not a record: no kind
    write_journal(job, recs)
    violations = [
        "final journal: journal line 3 is not a journal record (corrupt)",
        "final journal: journal line 5 is not a journal record (corrupt)",
    ]
    assert journal_violations(job) == violations
    # Unlike a torn tail, a corrupt whole line is a violation after a kill too.
    assert journal_violations(job, AFTER_KILL, final=False) == [
        v.replace(FINAL, AFTER_KILL) for v in violations
    ]


def test_torn_tail_after_a_clean_run(job: Path) -> None:
    recs = records(job)
    write_journal(job, recs, tail='{"kind": "result", "custom_id": "a", "li')
    assert journal_violations(job) == [
        "final journal: the journal ends with a torn line after a clean run"
    ]


def test_records_the_input_does_not_explain(job: Path) -> None:
    recs = records(job)
    recs[A]["line"] = 7
    unknown = {**recs[B], "custom_id": "ghost"}
    invalid_valid = {**recs[INVALID], "line": 3}
    write_journal(job, [*recs, unknown, invalid_valid])
    assert journal_violations(job) == [
        "final journal: a: journal says line 7",
        "final journal: a result for 'ghost', which is not a valid request of the input",
        "final journal: an invalid-line record for line 3, which is valid",
    ]


def test_wrong_answers(job: Path) -> None:
    """The planted bug wrong-answer, and answers of the wrong shape or model."""
    recs = records(job)
    recs[A]["body"]["choices"][0]["message"]["content"] = "hi A"
    recs[A]["body"]["model"] = "other"
    recs[B]["body"]["choices"].pop()
    write_journal(job, recs)
    assert journal_violations(job) == [
        "final journal: a: wrong answer 'hi A', expected 'hi a'",
        "final journal: a: model 'other', expected 'chaos'",
        "final journal: b: expected 2 choice(s)",
    ]


def test_vllm_answers_are_checked_for_shape_and_length_not_text(job: Path) -> None:
    recs = records(job)
    recs[A]["body"]["choices"][0]["message"]["content"] = "anything"
    recs[A]["body"]["usage"]["completion_tokens"] = 17
    recs[B]["body"]["choices"][1]["finish_reason"] = None
    write_journal(job, recs)
    checker = Checker(expected(), "vllm", MAX_ATTEMPTS)
    checker.check_journal(read_journal(job / "journal.jsonl"), FINAL, final=True)
    assert checker.violations == [
        "final journal: a: more completion tokens than max_tokens",
        "final journal: b: choice 1 has no text or no finish_reason",
    ]


def test_the_same_fault_after_later_stops_is_reported_once(job: Path) -> None:
    recs = records(job)
    write_journal(job, [*recs, recs[INVALID]])
    checker = Checker(expected(), "echo", MAX_ATTEMPTS)
    for where in ("after stop 1 (kill, submit)", "after stop 2 (int, resume)", FINAL):
        checker.check_journal(read_journal(job / "journal.jsonl"), where, final=where == FINAL)
    assert checker.violations == [
        "after stop 1 (kill, submit): invalid line 2 is recorded twice in the journal"
    ]


# --- the exports ----------------------------------------------------------------------------


def rewrite(path: Path, change: Any) -> None:
    """Apply `change` to the list of JSON lines in `path`."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in change(rows)))


def test_export_row_twice(job: Path) -> None:
    rewrite(job / "output.jsonl", lambda rows: [rows[0], *rows])
    assert export_violations(job) == [
        "output.jsonl: a appears twice",
        "export: 1 line ids are used twice",
        "status: requests.succeeded is 2, the files say 3",
    ]


def test_export_row_missing(job: Path) -> None:
    rewrite(job / "output.jsonl", lambda rows: rows[:1])
    assert export_violations(job) == [
        "output.jsonl: b is missing (lost)",
        "status: requests.succeeded is 2, the files say 1",
    ]


def test_export_invalid_line_missing(job: Path) -> None:
    rewrite(job / "errors.jsonl", lambda rows: rows[1:])
    assert export_violations(job) == [
        "errors.jsonl: invalid line 2 is missing (lost)",
        "errors.jsonl: 0 invalid lines, the input has 1",
    ]


def test_export_out_of_input_order(job: Path) -> None:
    rewrite(job / "output.jsonl", lambda rows: rows[::-1])
    rewrite(job / "errors.jsonl", lambda rows: rows[::-1])
    assert export_violations(job) == [
        "output.jsonl: lines are not in input order",
        "errors.jsonl: lines are not in input order",
    ]


def test_export_answer_differs_from_the_journal(job: Path) -> None:
    def change(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows[1]["response"]["body"]["id"] = "chatcmpl-other"
        return rows

    rewrite(job / "output.jsonl", change)
    assert export_violations(job) == ["output.jsonl: b: the answer differs from the journal's"]


def test_export_failures_with_the_wrong_code(job: Path) -> None:
    def change(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows[0]["error"]["code"] = "invalid_request"  # the invalid line 2
        rows[2]["error"]["code"] = "engine_error"  # poison
        return rows

    rewrite(job / "errors.jsonl", change)
    assert export_violations(job) == [
        "errors.jsonl: line 2 (not JSON): code 'invalid_request', expected 'invalid_json'",
        "errors.jsonl: poison: code 'engine_error', line 5",
    ]


def test_status_that_disagrees_with_the_files(job: Path) -> None:
    status = json.loads((job / "status.json").read_text())
    status["status"] = "running"
    status["attempts"] = 4
    status["requests"]["pending"] = 1
    (job / "status.json").write_text(json.dumps(status))
    assert export_violations(job) == [
        "status: requests.pending is 1, the files say 0",
        "status: attempts is 4, the journal has 5",
        "status: the job is 'running', expected 'completed'",
    ]
