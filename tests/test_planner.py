"""The dispatch plan (run/planner.py) and deduplication (run/dedup.py): pure logic, then the echo
engine end to end, with a kill -9 in the middle of deduplicated groups."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.cli import cli
from support.jobs import journal_records, rerun, start_echo, submit_echo
from support.lines import chat_line, read_jsonl, write_jsonl
from support.processes import kill_9_after

from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.run import planner
from batchrun.run.dedup import Duplicates, copy_outcome, dedup_key
from batchrun.run.planner import MIN_SHARED, order_window, plan

DOC = "A long shared document. " * 20  # well over MIN_SHARED characters


def chat(cid: str, text: str, line: int = 1, **body: Any) -> Request:
    return Request(cid, line, CHAT, {"messages": [{"role": "user", "content": text}], **body})


def mixed_requests(seed: int, n: int = 300) -> list[Request]:
    """Documents with questions, few-shot items, independent prompts, repeated lines and
    sampled repeats, shuffled."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            text = f"doc {rng.randrange(8)} " + DOC + f" question {rng.randrange(10)}"
        elif kind == 1:
            text = "Few-shot examples. " * 30 + f"item {i}"
        elif kind == 2:
            text = f"independent prompt {i} " * rng.randint(1, 5)
        else:
            text = f"repeated {rng.randrange(5)}"
        body: dict[str, Any] = {"max_tokens": rng.choice([8, 64, None])}
        if rng.random() < 0.8:
            body["temperature"] = 0
        out.append(chat(f"r{i}", text, i + 1, **body))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("window", [7, 64, 100_000])
def test_the_plan_is_a_permutation_and_deterministic(
    monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    monkeypatch.setattr(planner, "WINDOW_REQUESTS", window)
    requests = mixed_requests(1)
    runs = []
    for _ in range(2):
        held = Duplicates()
        sent = list(plan(iter(requests), "auto", held))
        copies = [d for group in held.held.values() for d in group]
        ids = [r.custom_id for r in sent + copies]
        assert Counter(ids) == Counter(r.custom_id for r in requests)  # nothing lost or twice
        assert not {r.custom_id for r in sent} & {r.custom_id for r in copies}
        runs.append(
            (
                [r.custom_id for r in sent],
                {k: [r.custom_id for r in v] for k, v in held.held.items()},
            )
        )
    assert runs[0] == runs[1]
    # Without deduplication, the plan is still a permutation of everything.
    plain = list(plan(iter(requests), "auto"))
    assert sorted(r.custom_id for r in plain) == sorted(r.custom_id for r in requests)


def test_order_input_sends_every_line_in_the_files_order() -> None:
    requests = mixed_requests(2, 50)
    held = Duplicates()
    assert list(plan(iter(requests), "input", held)) == requests
    assert held.held == {}


def test_requests_sharing_a_prefix_go_together_each_group_whole() -> None:
    docs = {d: f"document {d}: " + DOC for d in "ABC"}
    requests = [
        chat(f"{d}{q}", docs[d] + f" question {q}", max_tokens=8) for q in range(3) for d in "ABC"
    ]
    random.Random(3).shuffle(requests)
    order = [r.custom_id for r in order_window(requests)]
    # Grouped by document, each group whole: nothing of B's among A's.
    assert order == ["A0", "A1", "A2", "B0", "B1", "B2", "C0", "C1", "C2"]


def test_groups_with_more_work_go_first_and_independent_prompts_are_not_grouped() -> None:
    short = [chat(f"s{i}", "short " + DOC + f" {i}", max_tokens=4) for i in range(2)]
    long = [chat(f"l{i}", "long " + DOC + f" q{i}", max_tokens=500) for i in range(2)]
    lone = [chat(f"x{i}", f"an unrelated question number {i}", max_tokens=1) for i in range(2)]
    order = [r.custom_id for r in order_window([*short, *lone, *long])]
    # The long group first, then the short one, the lone prompts last.
    assert order == ["l0", "l1", "s0", "s1", "x0", "x1"]
    assert len("an unrelated question number") < MIN_SHARED


def test_independent_prompts_keep_the_files_order_whatever_their_length() -> None:
    """Longest first among prompts that share nothing would crowd the KV cache with the longest
    answers at once (more preemptions than the file's order): they keep the file's order."""
    lone = [
        chat(f"x{i}", f"unrelated question {i} " * (1 + i % 3), max_tokens=[8, 128, 32][i % 3])
        for i in range(9)
    ]
    group = [chat(f"d{i}", DOC + f" question {i}", max_tokens=4) for i in range(2)]
    order = [r.custom_id for r in order_window([*lone[:4], *group, *lone[4:]])]
    assert order == ["d0", "d1", *(f"x{i}" for i in range(9))]


def test_only_identical_deterministic_requests_are_merged() -> None:
    greedy = chat("a", "hi", temperature=0)
    assert dedup_key(greedy) == dedup_key(chat("b", "hi", temperature=0))
    # The same body with its keys in another order is the same request.
    reordered = Request(
        "c", 1, CHAT, {"temperature": 0, "messages": [{"content": "hi", "role": "user"}]}
    )
    assert dedup_key(reordered) == dedup_key(greedy)
    assert dedup_key(chat("d", "hi", temperature=0.7, seed=5)) is not None
    for sampled in (
        chat("e", "hi"),
        chat("f", "hi", temperature=0.7),
        chat("g", "hi", temperature=0, n=2),
    ):
        assert dedup_key(sampled) is None
    assert dedup_key(chat("h", "hi", temperature=0, max_tokens=5)) != dedup_key(greedy)


def test_a_copy_has_its_own_custom_id_and_response_id() -> None:
    body = {"id": "chatcmpl-abc", "object": "chat.completion", "choices": [], "usage": {}}
    rep = Outcome("rep", True, 200, msgspec.Raw(json.dumps(body).encode()), completion_tokens=3)
    copy = copy_outcome(rep, chat("dup", "hi"))
    assert copy.custom_id == "dup" and copy.extra == {"copy_of": "rep"}
    assert copy.completion_tokens == 3
    assert isinstance(copy.body, msgspec.Raw)
    copied = json.loads(bytes(copy.body))
    assert copied["id"].startswith("chatcmpl-") and copied["id"] != "chatcmpl-abc"
    assert {k: v for k, v in copied.items() if k != "id"} == {
        k: v for k, v in body.items() if k != "id"
    }


# -- end to end, echo engine ------------------------------------------------------------------------


def _lines(groups: int, size: int) -> list[dict[str, Any]]:
    """`groups` sets of `size` identical greedy lines (interleaved), and two sampled repeats."""
    lines = [
        chat_line(f"g{g}-{k}", f"question {g}", max_tokens=4, temperature=0)
        for k in range(size)
        for g in range(groups)
    ]
    lines += [chat_line(f"sampled-{k}", "tell me a story", max_tokens=4) for k in range(2)]
    return lines


def _results_by_id(job: Path) -> Counter[str]:
    return Counter(r["custom_id"] for r in journal_records(job) if r["kind"] == "result")


def test_duplicates_run_once_and_each_custom_id_gets_its_own_answer(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", _lines(groups=3, size=4))
    record = tmp_path / "engine.txt"
    job = tmp_path / "job"
    run = submit_echo(src, job, env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert run.returncode == 0, run.stderr
    sent = record.read_text().split()
    # One of each group of identical greedy lines ran; both sampled repeats ran.
    assert sorted(s.split("-")[0] for s in sent if s.startswith("g")) == ["g0", "g1", "g2"]
    assert {"sampled-0", "sampled-1"} <= set(sent)
    assert "9 requests answered from an identical one" in run.stdout
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["deduplicated"] == 9 and status["prefix_cache"] is None  # echo has no cache
    assert cli("export", "--job-dir", str(job)).returncode == 0
    out = read_jsonl(job / "output.jsonl")
    assert len(out) == 14 and len({x["custom_id"] for x in out}) == 14
    assert len({x["response"]["body"]["id"] for x in out}) == 14
    by_id = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"] for x in out}
    assert all(by_id[f"g{g}-{k}"] == f"question {g}" for g in range(3) for k in range(4))


def test_order_input_runs_every_line_itself(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", _lines(groups=2, size=3))
    record = tmp_path / "engine.txt"
    job = tmp_path / "job"
    run = submit_echo(src, job, "--order", "input", env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert run.returncode == 0, run.stderr
    assert record.read_text().split() == [x["custom_id"] for x in read_jsonl(src)]
    assert json.loads((job / "manifest.json").read_text())["order"] == "input"


@pytest.mark.slow
def test_deduplicated_groups_broken_by_a_kill_resume_exactly_once(tmp_path: Path) -> None:
    """kill -9 mid-run, then the journal's last records cut as a torn group would leave them
    (a representative's record kept, some of its copies' lost): resume answers every custom_id
    exactly once, running again only what has no record."""
    groups, size = 60, 3
    src = write_jsonl(tmp_path / "in.jsonl", _lines(groups, size))
    record = tmp_path / "engine.txt"
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_DELAY_MS": "40", "BATCHRUN_ECHO_RECORD": str(record)}
    p = start_echo(src, job, "--batch-size", "2", env=env)
    kill_9_after(p, job, 40)
    records = journal_records(job)
    results = [r for r in records if r["kind"] == "result"]
    assert len(results) < groups * size + 2, "the kill came too late to break anything"
    # Cut the journal back to just after a representative with its first copy: the copies
    # after it were lost, as if the write that held them was torn.
    copies = [i for i, r in enumerate(records) if "copy_of" in r]
    cut = copies[len(copies) // 2]
    lost = records[cut + 1 :]
    kept = records[: cut + 1]
    (job / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert any("copy_of" in r for r in lost)
    record.write_text("")
    resume = rerun("resume", job, env=env)
    assert resume.returncode == 0, resume.stderr
    counts = _results_by_id(job)
    wanted = {x["custom_id"] for x in read_jsonl(src)}
    assert set(counts) == wanted and set(counts.values()) == {1}, counts.most_common(3)
    # Resume ran nothing that already had a record.
    done_before = {r["custom_id"] for r in kept if r["kind"] == "result"}
    assert not set(record.read_text().split()) & done_before
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert len(read_jsonl(job / "output.jsonl")) == len(wanted)
