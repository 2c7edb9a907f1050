"""A request past its timeout on the real vLLM engine (--request-timeout): aborted in the engine,
failed with code `timeout`, and the engine goes on without a restart (the echo engine's hangs:
tests/test_hangs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import journal_records
from support.lines import chat_line, write_jsonl


@pytest.mark.vllm
def test_the_vllm_engine_aborts_a_request_past_its_timeout_and_goes_on(tmp_path: Path) -> None:
    # Greedy and with vLLM's `ignore_eos`: the story runs to its 1900 tokens whatever the model
    # would end it with (greedy alone it ran 600 of 600 without an end, 15.9 s on 2 cores), so it
    # is still running at the 5 s timeout on both attempts. (Sampled, and before batchrun passed
    # `ignore_eos` on, a retry's story ended after 62 tokens, within the timeout.) The short
    # answer's 5 tokens meet it on a busy machine.
    long = chat_line(
        "long",
        "Write a very long story about a dragon.",
        max_tokens=1900,
        temperature=0,
        ignore_eos=True,
    )
    src = write_jsonl(tmp_path / "in.jsonl", [long, chat_line("short", "Say hi.", max_tokens=5)])
    job = tmp_path / "job"
    r = cli(
        "submit",
        str(src),
        "--job-dir",
        str(job),
        "--request-timeout",
        "5",
        "--max-attempts",
        "2",
        "--batch-size",
        "4",
        "--no-progress",
        timeout=400,
    )
    assert r.returncode == 1, r.stderr
    records = {(rec["custom_id"], rec["attempt"]): rec for rec in journal_records(job)}
    assert records[("short", 1)]["ok"] is True
    # Aborted in vLLM, then added again under the same id by the retry pass, and aborted again:
    # the engine stayed healthy (one worker, no restart).
    for attempt in (1, 2):
        assert records[("long", attempt)]["error"]["code"] == "timeout"
    assert set(records) == {("short", 1), ("long", 1), ("long", 2)}
    # No restart once the engine was ready (a start refused for memory a busy machine lacked, and
    # started again, happens before it and is not the abort's doing).
    events = [json.loads(x) for x in (job / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events if e["kind"] in ("ready", "restart")]
    assert "ready" in kinds and "restart" not in kinds[kinds.index("ready") :], events
