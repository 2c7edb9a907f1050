"""Hostile and broken input through the real CLI (echo engine): the corpus in tests/data/.

tests/data/hostile.jsonl mixes valid requests with more than 30 kinds of bad line (broken JSON,
non-UTF-8 bytes, a BOM in the middle, wrong types, absurd values, unknown urls, stream, n of
10,000, duplicate and 10 KB ids, empty messages, a role that does not exist, ...), with CRLF endings
and blank lines; tests/data/hostile.expected.jsonl says what each line must become. Both are
written by tests/data/make_hostile.py. The cases too big to commit (two 50 MB lines, 200,000
levels of nesting) are appended here at test time.

Each bad line must give exactly one error record with its line number, its code and a message a
person understands; every valid line must still run (with the right answer); memory must stay
bounded; nothing may crash; and no id or input name may make batchrun write outside the job
directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "hostile.jsonl"
EXPECTED = DATA / "hostile.expected.jsonl"

MB = 1024 * 1024
MEMORY_LIMIT_KB = 1024 * 1024  # 1 GiB, in ru_maxrss units (kB on Linux)

# Runs a command and writes the peak resident memory of its whole (waited-for) process tree:
# RUSAGE_CHILDREN of a fresh parent covers batchrun and its engine workers, and nothing else.
MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc)\n"
)


def load_expected() -> list[dict[str, Any]]:
    return [json.loads(x) for x in EXPECTED.read_text(encoding="utf-8").splitlines()]


def batchrun(
    *args: str, cwd: Path, measure: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m batchrun ARGS` in `cwd`, optionally measuring the peak memory into `measure`."""
    cmd = [sys.executable, "-m", "batchrun", *args]
    if measure is not None:
        cmd = [sys.executable, "-c", MEASURE, str(measure), *cmd]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=dict(os.environ)
    )


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def big_cases(first_line: int) -> tuple[bytes, list[dict[str, Any]]]:
    """Lines too big to commit, numbered from `first_line`, and what each must become."""
    huge = "A" * (50 * MB)
    cut = json.dumps(
        {"custom_id": "big-cut", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": huge}]}}
    )[: 50 * MB]  # fmt: skip
    big_n = json.dumps(
        {"custom_id": "big-n", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": huge}], "n": 10_000}}
    )  # fmt: skip
    deep = '{"custom_id": "deeper", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    after = json.dumps(
        {"custom_id": "after-the-big-ones", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": "still here"}]}}
    )  # fmt: skip
    lines = [
        (cut, {"kind": "a 50 MB line, cut off", "valid": False, "code": "invalid_json",
               "message": "cut off?", "custom_id": None}),
        (big_n, {"kind": "a 50 MB line with n of 10,000", "valid": False,
                 "code": "invalid_request", "message": "body.n must be between 1 and 128",
                 "custom_id": "big-n"}),
        (deep, {"kind": "nested 200,000 levels deep", "valid": False, "code": "invalid_json",
                "message": "nested too deeply", "custom_id": None}),
        (after, {"kind": "valid, after the big lines", "valid": True,
                 "custom_id": "after-the-big-ones", "answer": "still here"}),
    ]  # fmt: skip
    raw = b"".join(text.encode() + b"\n" for text, _ in lines)
    expected = [{**exp, "line": first_line + i} for i, (_, exp) in enumerate(lines)]
    return raw, expected


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Submit the corpus plus the big cases from a sandbox directory, then export."""
    root = tmp_path_factory.mktemp("hostile")
    sandbox = root / "sandbox"
    sandbox.mkdir()
    corpus = CORPUS.read_bytes()
    assert corpus.endswith(b"\n")
    expected = load_expected()
    last = corpus.count(b"\n")
    raw, more = big_cases(last + 1)
    (sandbox / "input.jsonl").write_bytes(corpus + raw)
    expected += more
    before = tree(root)
    peak = root / "peak_kb"
    submit = batchrun(
        "submit", "input.jsonl", "--job-dir", "jobs/hostile", "--engine", "echo", "--no-progress",
        cwd=sandbox, measure=peak,
    )  # fmt: skip
    export = batchrun("export", "--job-dir", "jobs/hostile", cwd=sandbox)
    status = batchrun("status", "--job-dir", "jobs/hostile", "--json", cwd=sandbox)
    job = sandbox / "jobs" / "hostile"
    (sandbox / "input.jsonl").unlink()  # 100 MB: not kept around for the other tests
    return {
        "root": root,
        "sandbox": sandbox,
        "job": job,
        "expected": expected,
        "submit": submit,
        "export": export,
        "status": json.loads(status.stdout) if status.returncode == 0 else None,
        "peak_kb": int(peak.read_text()) if peak.exists() else None,
        "before": before,
        "after": tree(root),
        "output": [json.loads(x) for x in (job / "output.jsonl").read_bytes().splitlines()]
        if (job / "output.jsonl").exists()
        else [],
        "errors": [json.loads(x) for x in (job / "errors.jsonl").read_bytes().splitlines()]
        if (job / "errors.jsonl").exists()
        else [],
    }


# --- the corpus itself ----------------------------------------------------------------------


def test_the_committed_corpus_is_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("make_hostile", DATA / "make_hostile.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    corpus, expected = mod.build()
    assert CORPUS.read_bytes() == corpus, "run tests/data/make_hostile.py"
    assert EXPECTED.read_bytes() == mod.render_expected(expected), "run tests/data/make_hostile.py"


def test_the_corpus_is_small_and_has_more_than_30_kinds_of_bad_line() -> None:
    expected = load_expected()
    bad_kinds = {e["kind"] for e in expected if not e["valid"]}
    assert len(bad_kinds) >= 30, sorted(bad_kinds)
    assert sum(1 for e in expected if e["valid"]) >= 10
    assert CORPUS.stat().st_size < 100_000
    raw = CORPUS.read_bytes()
    # The framing the corpus must exercise: a BOM first, CRLF endings, blank lines, bad bytes.
    assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw
    assert re.search(rb"\n[ \t]*\r?\n", raw)  # blank and whitespace-only lines
    assert b"caf\xe9" in raw  # Latin-1, not UTF-8


# --- through the CLI --------------------------------------------------------------------------


def test_nothing_crashes_and_the_job_finishes(hostile: dict[str, Any]) -> None:
    submit = hostile["submit"]
    assert submit.returncode == 1, submit.stderr[-2000:]  # finished, with invalid lines
    assert "Traceback" not in submit.stderr
    assert hostile["export"].returncode == 0, hostile["export"].stderr
    status = hostile["status"]
    assert status is not None and status["status"] == "completed"


def test_each_bad_line_gives_one_error_with_its_line_number_and_code(
    hostile: dict[str, Any],
) -> None:
    bad = {e["line"]: e for e in hostile["expected"] if not e["valid"]}
    by_line: dict[int, list[dict[str, Any]]] = {}
    for rec in hostile["errors"]:
        by_line.setdefault(rec["error"]["line"], []).append(rec)
    problems = []
    for line, want in sorted(bad.items()):
        got = by_line.get(line, [])
        if len(got) != 1:
            problems.append(f"line {line} ({want['kind']}): {len(got)} error records")
            continue
        rec = got[0]
        err = rec["error"]
        if err["code"] != want["code"]:
            problems.append(
                f"line {line} ({want['kind']}): code {err['code']!r}, not {want['code']!r}"
            )
        if want["message"] not in (err["message"] or ""):
            problems.append(
                f"line {line} ({want['kind']}): message {err['message']!r} lacks {want['message']!r}"
            )
        if rec["custom_id"] != want["custom_id"]:
            problems.append(f"line {line} ({want['kind']}): custom_id {rec['custom_id']!r}")
        if rec["response"] is not None:
            problems.append(f"line {line} ({want['kind']}): an invalid line has a response")
    extra = sorted(set(by_line) - set(bad))
    assert not extra, f"error records for lines that are not bad: {extra}"
    assert not problems, "\n".join(problems)


def test_every_valid_line_still_runs_with_the_right_answer(hostile: dict[str, Any]) -> None:
    valid = [e for e in hostile["expected"] if e["valid"]]
    out = hostile["output"]
    assert [o["custom_id"] for o in out] == [e["custom_id"] for e in valid]  # in input order
    for o, e in zip(out, valid, strict=True):
        body = o["response"]["body"]
        assert body["choices"][0]["message"]["content"] == e["answer"], e["kind"]


def test_status_counts_match_the_files(hostile: dict[str, Any]) -> None:
    req = hostile["status"]["requests"]
    n_valid = sum(1 for e in hostile["expected"] if e["valid"])
    n_bad = len(hostile["expected"]) - n_valid
    assert req == {
        "total": n_valid + n_bad,
        "valid": n_valid,
        "succeeded": len(hostile["output"]),
        "failed": 0,
        "invalid": len(hostile["errors"]),
        "pending": 0,
    }
    assert len(hostile["errors"]) == n_bad


def test_memory_stays_bounded_with_two_50_mb_lines(hostile: dict[str, Any]) -> None:
    peak = hostile["peak_kb"]
    assert peak is not None
    assert peak < MEMORY_LIMIT_KB, f"peak resident memory {peak / 1024:.0f} MiB"


def test_messages_read_like_sentences(hostile: dict[str, Any]) -> None:
    """A person reads these: no doubled words, no Python internals, nothing huge."""
    problems = []
    for rec in hostile["errors"]:
        msg = rec["error"]["message"]
        line = rec["error"]["line"]
        if not msg or len(msg) > 400:
            problems.append(f"line {line}: message of {len(msg or '')} characters")
        if re.search(r"\b(\w+) \1\b", msg):
            problems.append(f"line {line}: a doubled word in {msg!r}")
        for internal in ("Traceback", "sys.", "set_int_max_str_digits", "<class", "NoneType"):
            if internal in msg:
                problems.append(f"line {line}: {internal!r} in {msg!r}")
    assert not problems, "\n".join(problems)


# --- nothing escapes the job directory --------------------------------------------------------


def test_ids_are_data_not_paths(hostile: dict[str, Any]) -> None:
    """Ids such as ../../etc/passwd or $(touch pwned) come back verbatim and create nothing."""
    created = hostile["after"] - hostile["before"]
    allowed = {
        "sandbox/jobs",
        "sandbox/jobs/hostile",
        *(f"sandbox/jobs/hostile/{n}" for n in
          ("manifest.json", "journal.jsonl", "lock", "output.jsonl", "errors.jsonl", "logs",
           "logs/worker-0.log", "summary.json", "events.jsonl", "run_clock.json")),
        "peak_kb",
    }  # fmt: skip
    # The worker's shard of bodies (job/shards.py), under a name of its own making.
    shards = {
        p
        for p in created
        if re.fullmatch(r"sandbox/jobs/hostile/shards(/w0-[0-9a-f]{12}\.res)?", p)
    }
    assert created - shards <= allowed, sorted(created - shards - allowed)
    ids = {o["custom_id"] for o in hostile["output"]}
    for cid in ("../../etc/passwd", "/etc/shadow", "..", ".", "nul\u0000new\nline\ttab"):
        assert cid in ids
    assert not list(hostile["root"].rglob("pwned*"))


@pytest.mark.parametrize("name", ["...jsonl", "..jsonl", ".jsonl"])
def test_the_default_job_dir_stays_under_jobs_whatever_the_input_is_called(
    tmp_path: Path, name: str
) -> None:
    """Without --job-dir the job goes to jobs/<input name>: a file named "...jsonl" (stem "..")
    must not put the job in the current directory, nor "..jsonl" (stem ".") in jobs/ itself."""
    work = tmp_path / "work"
    work.mkdir()
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
    }
    (work / name).write_text(json.dumps(line) + "\n")
    r = batchrun("submit", name, "--engine", "echo", "--no-progress", cwd=work, timeout=300)
    assert r.returncode == 0, r.stderr
    manifests = [p.relative_to(work) for p in work.rglob("manifest.json")]
    assert len(manifests) == 1
    job = manifests[0].parent
    assert len(job.parts) == 2 and job.parts[0] == "jobs", (
        f"the job went to {job}/ (from input {name!r})"
    )
    assert not (work / "journal.jsonl").exists() and not (work / "jobs" / "journal.jsonl").exists()
