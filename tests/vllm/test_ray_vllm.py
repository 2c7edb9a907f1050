"""The real vLLM engine in one Ray actor: the shared completions job (tests/support/vllm_served.py),
a batch of a server started locally and killed, finished by the server started again on Ray (the
echo engine on Ray: tests/test_ray.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.cli import cli
from support.jobs import journal_records
from support.lines import read_jsonl
from support.vllm_served import finished_with

pytestmark = pytest.mark.ray


@pytest.mark.vllm
def test_the_real_vllm_engine_in_one_actor(vllm_completions_job: dict[str, Any]) -> None:
    """The completions job, a batch of a server started without Ray and killed, is finished by
    the server started again with --ray local --workers 1: the rest of it (lines 33-44 at least,
    tests/support/vllm_served.py) runs in one actor."""
    job = vllm_completions_job["job"]
    finished_with(vllm_completions_job, 3)  # the completions sample's refused lines only
    first, second = vllm_completions_job["logs"]
    assert "ray worker" not in first
    assert "[batchrun serve] ray worker 0 starting vllm engine (batch size 4)" in second
    assert vllm_completions_job["export"].returncode == 0
    manifest = json.loads((job / "manifest.json").read_text())
    # (A run killed with SIGKILL never recorded how it ended.)
    assert [(run["mode"], run.get("ray")) for run in manifest["runs"]] == [
        ("serve", None),
        ("serve", "local"),
    ]
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert [(w["worker"], w["kind"]) for w in status["workers"]] == [(0, "ray")]
    # The answers that the actor gave (journaled after the second server started) are right.
    resumed_at = manifest["runs"][1]["started_at"]
    on_ray = {
        rec["custom_id"]: rec
        for rec in journal_records(job)
        if rec["kind"] == "result" and rec["time"] >= resumed_at
    }
    assert {"c0", "c1", "c2"} <= set(on_ray)
    got = {
        o["custom_id"]: o["response"]["body"]["choices"][0]["text"]
        for o in read_jsonl(job / "output.jsonl")
    }
    assert "5" in got["c1"] and "paris" in got["c0"].lower()  # "1, 2, 3, 4," and the capital
