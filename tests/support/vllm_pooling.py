"""The real-engine score and rerank jobs (vLLM's /v1/score and /v1/rerank) that
tests/vllm/test_vllm_score.py reads, and the references their scores are checked against.

- The score job and the rerank job: sample_data/score.jsonl and sample_data/rerank.jsonl on
  all-MiniLM-L6-v2 (an embedding model: pairs score the cosine similarity of their embeddings),
  batches of the pooling server (tests/support/vllm_served.py, one engine start with the embeddings
  job); conftest.py makes them the session fixtures vllm_score_job and vllm_rerank_job.
- The cross-encoder job, 1 start: CROSS_LINES (/v1/score) on a cross-encoder made here from
  all-MiniLM-L6-v2's weights and a classifier head of one label (seeded, untrained: its scores
  mean nothing, but transformers computes the same ones from the same weights, which is what the
  test compares), in float32 (`--dtype`: vLLM's "auto" would run it in float16), so that the
  scores agree to float32 rounding.

The references are computed with transformers alone, never with vLLM: MiniLM's sentence
embedding is the mean of its last hidden states over the prompt's tokens (its
sentence-transformers pooling), and the cross-encoder's score the sigmoid of its one logit.
Except `raw-embed` (run as a script with tests/ on the path: `PYTHONPATH=tests python
tests/support/vllm_pooling.py raw-embed MODEL IN OUT`, as support/reference.py runs it):
raw vLLM's own `LLM.embed` of the inputs, the reference that embeddings are compared with bit
for bit (tests/vllm/test_vllm_fidelity.py, tests/vllm/test_vllm_embeddings.py).

- The embeddings kill job, 2 starts (and raw vLLM's reference beside it, 1): KILL_EMBEDDINGS
  lines on all-MiniLM-L6-v2, the submit killed with SIGKILL (its whole process group) once 150
  results are journaled, then resumed and exported (tests/vllm/test_vllm_embeddings.py).
"""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from batchrun.openai.embeddings import embedding_inputs
from support.cli import cli, start_cli
from support.jobs import journal_records
from support.lines import write_jsonl
from support.paths import ROOT
from support.reference import reference_run
from support.vllm_jobs import SAMPLES, embedding_model_dir, exports
from support.waits import wait_until

SCORE_SAMPLE = SAMPLES / "score.jsonl"
RERANK_SAMPLE = SAMPLES / "rerank.jsonl"
LONG = "word " * 300  # more tokens than MiniLM's 256


# --- the cross-encoder job ------------------------------------------------------------------


def _submit(tmp: Path, src: Path, model: Path, *args: str) -> dict[str, Any]:
    job = tmp / "job"
    run = cli(
        "submit", str(src), "--job-dir", str(job), "--batch-size", "32", "--model", str(model),
        "--no-progress", *args,
    )  # fmt: skip
    return {"job": job, "src": src, "submit": run, **exports(job)}


def _score_line(cid: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": "/v1/score", "body": body}


CROSS_LINES = [
    _score_line("pair", text_1="What do cats eat?", text_2="Cats eat fish and meat."),
    _score_line(
        "one-to-many",
        queries="Where is Paris?",
        documents=["Paris is in France.", "The sea is blue.", "Bread is baked."],
    ),
    _score_line(
        "many-to-many",
        text_1=["The sun is hot.", "Dogs bark."],
        text_2=["It is a warm day.", "A puppy barks loudly."],
    ),
    _score_line(
        "truncated",
        text_1="The quick brown fox jumps over the lazy dog.",
        text_2="A fox jumps over a dog near the river bank.",
        truncate_prompt_tokens=12,
    ),
    # More than the cross-encoder's 512 positions (its directory has no sentence-transformers
    # config to cap it at MiniLM's 256).
    _score_line("too-long", text_1="hello", text_2=LONG * 2),
]


def cross_encoder_model(tmp: Path) -> Path:
    """A BERT cross-encoder (one label) from all-MiniLM-L6-v2's encoder and a seeded new head."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    source = embedding_model_dir()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(source, num_labels=1)
    with torch.no_grad():
        # Far larger than the usual initialisation, so that pairs score far apart (0.66 to 0.90
        # here, where a 0.02 spread leaves them all within 0.01 of 0.5).
        model.classifier.weight.normal_(0.0, 1.0)
    target = tmp / "cross-encoder"
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def run_cross_encoder_job(tmp: Path) -> dict[str, Any]:
    """CROSS_LINES on the cross-encoder made from all-MiniLM-L6-v2."""
    model = cross_encoder_model(tmp)
    src = write_jsonl(tmp / "cross.jsonl", CROSS_LINES)
    result = _submit(tmp, src, model, "--dtype", "float32")
    result["model"] = model
    return result


# --- references, with transformers ------------------------------------------------------------


@cache
def _loaded(path: Path, kind: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    cls = AutoModel if kind == "embed" else AutoModelForSequenceClassification
    model = cls.from_pretrained(path).eval()
    return AutoTokenizer.from_pretrained(path), model


def minilm_tokens(text: str, **kwargs: Any) -> list[int]:
    """A text's token ids as MiniLM's tokenizer encodes it ([CLS] ... [SEP])."""
    tokenizer, _ = _loaded(embedding_model_dir(), "embed")
    return [int(t) for t in tokenizer(text, **kwargs)["input_ids"]]


def minilm_embedding(ids: Sequence[int]) -> list[float]:
    """MiniLM's sentence embedding of a prompt's token ids: the mean of its last hidden states."""
    import torch

    _, model = _loaded(embedding_model_dir(), "embed")
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([list(ids)])).last_hidden_state[0]
    return [float(x) for x in hidden.mean(dim=0)]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def cross_encoder_score(model: Path, query: str, document: str, **kwargs: Any) -> float:
    """The cross-encoder's score of a pair: the sigmoid of its one logit."""
    import torch

    tokenizer, classifier = _loaded(model, "classify")
    encoded = tokenizer(query, document, return_tensors="pt", **kwargs)
    with torch.no_grad():
        return float(torch.sigmoid(classifier(**encoded).logits[0, 0]))


def cross_encoder_tokens(model: Path, query: str, document: str, **kwargs: Any) -> int:
    """How many tokens the cross-encoder's prompt of a pair has."""
    tokenizer, _ = _loaded(model, "classify")
    return len(tokenizer(query, document, **kwargs)["input_ids"])


# --- the embeddings kill job ------------------------------------------------------------------


def _embedding_line(i: int) -> dict[str, Any]:
    """Line i of the kill job: float and base64 alternating; some token ids, some two texts."""
    text = f"Passage {i}: the {['cat', 'dog', 'market', 'river', 'train'][i % 5]} is {i % 13}."
    item: Any = text
    if i % 7 == 3:
        item = [101, 7592 + i % 50, 2088, 102]  # [CLS] hello-ish world [SEP], as token ids
    elif i % 11 == 5:
        item = [text, f"Another sentence, number {i}."]
    body: dict[str, Any] = {"model": "text-embedding-3-small", "input": item}
    if i % 2:
        body["encoding_format"] = "base64"
    return {"custom_id": f"k{i}", "method": "POST", "url": "/v1/embeddings", "body": body}


KILL_EMBEDDINGS = [_embedding_line(i) for i in range(1200)]


def results(job: Path) -> int:
    """How many result records a job's journal holds."""
    if not (job / "journal.jsonl").exists():
        return 0
    return sum(r["kind"] == "result" for r in journal_records(job))


def run_embedding_kill_job(tmp: Path) -> dict[str, Any]:
    """KILL_EMBEDDINGS on all-MiniLM-L6-v2: killed with SIGKILL after 150 results, resumed,
    exported; raw vLLM's `LLM.embed` of every input, run beside it, as `raw` (float32 bytes, in
    the order of `items`: (custom_id, input index))."""
    model = embedding_model_dir()
    src = write_jsonl(tmp / "embeddings.jsonl", KILL_EMBEDDINGS)
    items = [
        (line["custom_id"], i, item)
        for line in KILL_EMBEDDINGS
        for i, item in enumerate(embedding_inputs(line["body"]["input"]))
    ]
    raw_in, raw_out = tmp / "raw-in.json", tmp / "raw-out.json"
    raw_in.write_text(json.dumps([item for _, _, item in items]))
    job = tmp / "job"
    # Raw vLLM runs beside the job: an engine start is mostly one process loading.
    reference = reference_run(
        [sys.executable, str(ROOT / "tests" / "support" / "vllm_pooling.py"), "raw-embed", str(model),
         str(raw_in), str(raw_out)],
        tmp / "raw.log",
    )  # fmt: skip
    with reference as finish:
        proc = start_cli(
            "submit", str(src), "--job-dir", str(job), "--model", str(model),
            "--batch-size", "8", "--no-progress",
        )  # fmt: skip
        try:
            wait_until(lambda: results(job) >= 150, "150 embeddings are journaled", timeout=600)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        killed_at = results(job)
        resumed = cli("resume", "--job-dir", str(job), "--no-progress", timeout=900)
        exported = exports(job)
        finish()
    raw = [bytes.fromhex(x) for x in json.loads(raw_out.read_text())]
    return {"job": job, "killed_at": killed_at, "resume": resumed, "items": items, "raw": raw,
            **exported}  # fmt: skip


# --- raw vLLM, for the bit-for-bit reference --------------------------------------------------


def raw_embed(model: Path, inputs: Path, out: Path) -> None:
    """Raw vLLM's `LLM.embed` of `inputs` (a JSON list of strings and token id lists), loaded as
    batchrun loads a pooling model on this machine (its dtype choice): each vector's float32
    bytes, as hex, in order, into `out` (a JSON list)."""
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from batchrun.engines.vllm.dtype import resolve_dtype

    items = json.loads(inputs.read_text())
    prompts = [x if isinstance(x, str) else TokensPrompt(prompt_token_ids=x) for x in items]
    llm = LLM(
        model=str(model),
        runner="pooling",
        dtype=resolve_dtype("auto", cuda=False),
        enforce_eager=True,
        gpu_memory_utilization=0.3,
    )
    vectors = [o.outputs.embedding for o in llm.embed(prompts)]
    out.write_text(json.dumps([struct.pack(f"<{len(v)}f", *v).hex() for v in vectors]))


if __name__ == "__main__":
    if sys.argv[1:2] != ["raw-embed"] or len(sys.argv) != 5:
        sys.exit("usage: vllm_pooling.py raw-embed MODEL IN.json OUT.json")
    raw_embed(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
