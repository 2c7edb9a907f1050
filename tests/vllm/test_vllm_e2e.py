"""End to end on the real vLLM engine and the embedded default model (SmolLM2-135M-Instruct).

The jobs are session-scoped fixtures shared with tests/vllm/test_vllm_fidelity.py (tests/support/vllm_jobs.py
says what each holds and how many engine starts it costs): the chat job, whose lines 1-10 are this
file's (with bad lines mixed in), and the completions job, a batch of the generative server
(tests/support/vllm_served.py), which is killed with SIGKILL in its middle and started again in a local
Ray instance, one actor (so its tests are marked `ray` too).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from support.cli import cli
from support.hub_cache import HUB_ID
from support.jobs import journal_records
from support.lines import read_jsonl
from support.paths import ROOT
from support.vllm_jobs import (
    CHAT_E2E_IDS,
    CHAT_MODEL,
    CHAT_PREFIX_IDS,
    CHAT_SAMPLE,
    COMPLETIONS_E2E,
    COMPLETIONS_SAMPLE,
    KILL_N,
    ids_of,
    part,
    results,
)
from support.vllm_served import finished_with

pytestmark = pytest.mark.vllm

E2E_SUCCEEDED = {"math", "capital", "two", "stop", "short", "topp"}


@pytest.fixture
def chat_job(vllm_chat_job: dict[str, Any]) -> dict[str, Any]:
    return vllm_chat_job


def _outputs(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The e2e part's successes (the chat job's lines 1-10)."""
    return part(job["outputs"], CHAT_E2E_IDS)


def test_chat_job_runs_and_reports_bad_lines(chat_job: dict[str, Any]) -> None:
    run = chat_job["submit"]
    assert run.returncode == 1, run.stderr[-3000:]  # 1: it finished, with failed lines
    assert "Traceback" not in run.stderr
    assert "[batchrun] batch size 256 chosen" in run.stderr.splitlines()  # the size it picked
    assert chat_job["export"].returncode == 0
    assert set(_outputs(chat_job)) == E2E_SUCCEEDED
    errors = {e["error"]["line"]: e for e in read_jsonl(chat_job["job"] / "errors.jsonl")}
    assert sorted(line for line in errors if line <= 10) == [6, 7, 9, 10]
    assert errors[6]["custom_id"] is None and errors[6]["error"]["code"] == "invalid_json"
    assert errors[6]["error"]["message"] == (
        "line is not valid JSON: Expecting ',' delimiter at the end of the line (is it cut off?)"
    )
    assert errors[7]["custom_id"] == "toolong"
    assert errors[7]["error"]["code"] == "context_length_exceeded"
    assert errors[7]["response"]["status_code"] == 400
    assert errors[7]["error"]["message"] == (
        "this model's maximum context length is 1024 tokens; the prompt has 3031 tokens and 8 "
        "completion tokens were requested"
    )


def test_the_real_poison_lines_fail_alone_and_the_job_finishes(chat_job: dict[str, Any]) -> None:
    raw = chat_job["src"].read_text(encoding="utf-8").splitlines()
    assert "\\ud83d" in raw[8] and "1180591620717411303424" in raw[9]  # as the file had
    run = chat_job["submit"]
    assert "error:" not in run.stderr, run.stderr[-3000:]
    status = json.loads(cli("status", "--job-dir", str(chat_job["job"]), "--json").stdout)
    assert status["status"] == "completed"
    assert status["requests"]["pending"] == 0
    # The whole chat job: these 10 lines, the 20 of sample_data/chat_fidelity.jsonl, the
    # 5 of CHAT_PREFIX, the 3 of sample_data/chat_tool_choice.jsonl and the 14 of
    # sample_data/chat_vllm_extensions.jsonl (3 invalid: one of them names a token id outside
    # the model's vocabulary, which validation checks with the size the manifest keeps).
    assert status["requests"] == {
        "total": 52, "valid": 43, "succeeded": 41, "failed": 2, "invalid": 9, "pending": 0,
    }  # fmt: skip
    manifest = json.loads((chat_job["job"] / "manifest.json").read_text())
    assert manifest["vocab_sizes"] == {manifest["model"]: 49152}  # SmolLM2's config.json
    errors = {e["custom_id"]: e for e in read_jsonl(chat_job["job"] / "errors.jsonl")}
    sur, seed = errors["sur"]["error"], errors["bigseed"]["error"]
    assert (sur["line"], seed["line"]) == (9, 10)
    # Caught by validation, each names its field; the engine never saw them.
    assert errors["sur"]["response"] is None and errors["bigseed"]["response"] is None
    assert sur["message"] == (
        "body.messages[0].content contains a lone surrogate (\\ud83d) at character 17; it is not "
        "valid Unicode text (a \\uD800-\\uDFFF escape must be half of a pair: was the text cut in "
        "the middle of an emoji?)"
    )
    assert seed["message"] == (
        "body.seed must be between -9223372036854775808 and 9223372036854775807 (a signed 64-bit "
        "integer), got 1180591620717411303424"
    )
    assert set(_outputs(chat_job)) == E2E_SUCCEEDED


def test_chat_bodies_parse_with_the_openai_types(chat_job: dict[str, Any]) -> None:
    for cid, line in _outputs(chat_job).items():
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.object == "chat.completion"
        # The name the request asked for; "math" names none: the hub id it ran as (--model).
        assert body.model == (HUB_ID if cid == "math" else CHAT_MODEL), cid
        assert body.usage is not None and body.usage.completion_tokens > 0
        assert all(c.message.role == "assistant" for c in body.choices)


def test_the_model_really_answers(chat_job: dict[str, Any]) -> None:
    outputs = _outputs(chat_job)
    math = outputs["math"]["response"]["body"]["choices"][0]["message"]["content"]
    assert "2" in math
    capital = outputs["capital"]["response"]["body"]["choices"][0]["message"]["content"]
    assert "paris" in capital.lower()


def test_per_request_sampling_fields_reach_vllm(chat_job: dict[str, Any]) -> None:
    outputs = _outputs(chat_job)
    two = outputs["two"]["response"]["body"]
    assert len(two["choices"]) == 2 and [c["index"] for c in two["choices"]] == [0, 1]
    short = outputs["short"]["response"]["body"]
    assert short["usage"]["completion_tokens"] == 3
    assert short["choices"][0]["finish_reason"] == "length"
    stop = outputs["stop"]["response"]["body"]["choices"][0]
    assert "7" not in stop["message"]["content"] and stop["finish_reason"] == "stop"
    capital = outputs["capital"]["response"]["body"]
    assert capital["usage"]["completion_tokens"] <= 8


def test_chat_parquet_is_readable_by_pandas(chat_job: dict[str, Any]) -> None:
    assert chat_job["parquet"].returncode == 0
    df = pd.read_parquet(chat_job["job"] / "results.parquet")
    # One row per line of the job, in input order: these 10, the chat sample's 20, CHAT_PREFIX,
    # the tool-choice sample's 3, the vLLM-extensions sample's 14.
    assert list(df["line"]) == list(range(1, 53))
    e2e = df[df["line"] <= 10]
    assert len(e2e) == 10
    assert list(e2e["line"]) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    by_id = e2e.set_index("line")
    assert by_id.loc[1, "status"] == "succeeded" and "2" in by_id.loc[1, "content"]
    assert by_id.loc[6, "status"] == "invalid"
    assert by_id.loc[7, "error_code"] == "context_length_exceeded"
    assert list(by_id.loc[[9, 10], "status"]) == ["invalid", "invalid"]
    assert list(by_id.loc[[9, 10], "error_code"]) == ["invalid_request", "invalid_request"]


def test_the_prefix_cache_hit_rate_comes_from_vllm_and_duplicates_run_once(
    chat_job: dict[str, Any],
) -> None:
    """Lines 31-35: three questions over one document, and two identical greedy lines."""
    run = chat_job["submit"]
    assert "prefix cache" in run.stdout and "vLLM's counters" in run.stdout, run.stdout
    status = json.loads(cli("status", "--job-dir", str(chat_job["job"]), "--json").stdout)
    cache = status["prefix_cache"]
    assert cache is not None and 0 < cache["hits"] <= cache["queries"], cache
    assert cache["hit_rate"] == round(cache["hits"] / cache["queries"], 4)
    # Every identical greedy (or seeded) line of the job ran once: this pair, and the sample's
    # own repeats (seed-b of seed-a; two sample lines repeat e2e lines).
    copies = {(r["custom_id"], r["copy_of"]) for r in results(chat_job["job"]) if "copy_of" in r}
    assert ("dup-b", "dup-a") in copies and ("seed-b", "seed-a") in copies, copies
    assert status["deduplicated"] == len(copies) and status["order"] == "auto"
    assert f"{len(copies)} requests answered from an identical one" in run.stdout, run.stdout
    shown = cli("status", "--job-dir", str(chat_job["job"]))
    assert f"{cache['hit_rate']:.1%} hit rate" in shown.stdout, shown.stdout
    # The KV cache vLLM reported at start: the planner's budget, in status and the summary.
    kv = status["kv_cache_tokens"]
    assert isinstance(kv, int) and kv > 0, status
    assert [w["kv_cache_tokens"] for w in status["workers"]] == [kv], status["workers"]
    assert f"{kv:,} tokens a worker" in shown.stdout and f"{kv:,} tokens a worker" in run.stdout
    outputs = part(chat_job["outputs"], CHAT_PREFIX_IDS)
    assert set(outputs) == CHAT_PREFIX_IDS
    a, b = (outputs[c]["response"]["body"] for c in ("dup-a", "dup-b"))
    assert a["id"] != b["id"] and a["choices"] == b["choices"] and a["usage"] == b["usage"]
    # Each answer says how many of its prompt tokens vLLM found cached, as OpenAI's usage does
    # (`prompt_tokens_details.cached_tokens`): the document's questions after the first find its
    # first blocks in the cache (whole blocks only: 128 tokens on the CPU backend, 16 on a GPU).
    usages = {c: o["response"]["body"]["usage"] for c, o in outputs.items()}
    cached = {c: u["prompt_tokens_details"]["cached_tokens"] for c, u in usages.items()}
    assert all(0 <= cached[c] <= usages[c]["prompt_tokens"] for c in cached), usages
    assert max(cached[f"doc-{i}"] for i in range(3)) > 0, cached
    assert cached["dup-a"] == cached["dup-b"], cached  # a copy reports its representative's
    # results.parquet carries the same counts in its cached_tokens column.
    df = pd.read_parquet(chat_job["job"] / "results.parquet").set_index("custom_id")
    assert {c: df.loc[c, "cached_tokens"] for c in cached} == cached


# --- the completions job: lines c0-c2 are this file's; killed on the way -------------------------
# A batch of the generative server (tests/support/vllm_served.py), killed with SIGKILL in its middle and
# finished by the server started again on Ray (in one actor): tests/test_ray.py's real engine in
# an actor.

COMPLETIONS_IDS = [line["custom_id"] for line in COMPLETIONS_E2E]  # c0, c1, c2
SAMPLE_REFUSED = {"refused-suffix", "refused-best-of", "refused-echo-logprobs"}


@pytest.mark.ray
def test_completions_job(vllm_completions_job: dict[str, Any]) -> None:
    job = vllm_completions_job
    finished_with(job, len(SAMPLE_REFUSED))  # the sample's refused lines, no other
    assert set(job["errors"]) == SAMPLE_REFUSED
    assert job["export"].returncode == 0
    out = part(job["outputs"], set(COMPLETIONS_IDS))
    assert list(out) == ["c0", "c1", "c2"]  # in input order
    bodies = [Completion.model_validate(o["response"]["body"]) for o in out.values()]
    assert all(b.object == "text_completion" and b.choices[0].text for b in bodies)
    assert "5" in bodies[1].choices[0].text


@pytest.mark.ray
def test_kill_9_in_the_middle_then_start_again(vllm_completions_job: dict[str, Any]) -> None:
    """kill -9 of the whole server (its engine worker included) in the middle of the batch; the
    server started again finishes it: nothing lost, nothing run twice. (A worker killed alone,
    and the halving that finds the request that killed it, run on the echo engine:
    test_echo_pipeline.py, test_poison.py.)"""
    job = vllm_completions_job
    job_dir = job["job"]
    valid = [f"k{i}" for i in range(KILL_N)]
    valid += [*COMPLETIONS_IDS, *(ids_of(COMPLETIONS_SAMPLE) - SAMPLE_REFUSED)]
    n = len(valid)
    assert n == 41
    assert 8 <= job["done_before"] < n  # the whole server killed in the middle
    finished_with(job, len(SAMPLE_REFUSED))
    assert " died " not in job["log"]
    # Every valid request has exactly one result; every invalid line exactly one record.
    assert sorted(r["custom_id"] for r in results(job_dir)) == sorted(valid)
    invalid = [r for r in journal_records(job_dir) if r["kind"] == "invalid"]
    assert sorted(r["custom_id"] for r in invalid) == sorted(SAMPLE_REFUSED)
    assert job["export"].returncode == 0
    out = read_jsonl(job_dir / "output.jsonl")
    assert sorted(o["custom_id"] for o in out) == sorted(valid)
    status = json.loads(cli("status", "--job-dir", str(job_dir), "--json").stdout)
    assert status["status"] == "completed" and status["requests"]["succeeded"] == n
    assert status["requests"] == {
        "total": 44, "valid": 41, "succeeded": 41, "failed": 0, "invalid": 3, "pending": 0,
    }  # fmt: skip


def test_sample_data_is_valid() -> None:
    """The README's first command runs sample_data/requests.jsonl: every line of it must be valid."""
    from batchrun.openai.reader import read_input
    from batchrun.openai.records import Request

    items = list(read_input(ROOT / "sample_data" / "requests.jsonl"))
    assert items and all(isinstance(i, Request) for i in items)


def test_the_chat_job_holds_the_whole_chat_sample(chat_job: dict[str, Any]) -> None:
    """Lines 11-30 of the chat job are sample_data/chat_fidelity.jsonl (test_vllm_fidelity.py)."""
    raw = chat_job["src"].read_text(encoding="utf-8").splitlines()
    assert raw[10:30] == CHAT_SAMPLE.read_text(encoding="utf-8").splitlines()
    assert not CHAT_E2E_IDS & ids_of(CHAT_SAMPLE)  # distinct custom_ids
