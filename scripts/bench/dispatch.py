"""The dispatch plan (`--order auto`) against raw vLLM under a small KV cache budget (part C).

    .venv/bin/python scripts/bench.py dispatch --rounds 2                       # the full run
    .venv/bin/python scripts/bench.py dispatch --dispatch-scale 0.1 --no-docs   # a quick check

On the files people really run, all under one KV cache budget smaller than the workload's
distinct prefixes.

Workloads (seeded; temperature 0):

  (a) shared documents, shuffled: 20 documents of ~700 words x 10 questions, max_tokens 16;
  (b) one ~1,000-token few-shot prefix (a system message) + 400 items, max_tokens 16;
  (c) 20% duplicate lines: part A's independent prompts, a fifth of them repeated, shuffled;
  (d) part A's independent prompts (no regression wanted);
  (e) a two-level prefix tree: one ~300-word system prompt shared by every line, then 20
      documents of ~700 words x 10 questions, max_tokens drawn from 8..64, shuffled.

Contenders, each in a fresh process, with the same engine settings and KV cache budget
(`kv_cache_memory_bytes`): raw `LLM.chat` in input order (prefix caching on, vLLM's default), vLLM
`run_batch`, `batchrun --order input`, `batchrun --order auto`, raw `LLM.chat` in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`: on a CPU the model on every core, batchrun's layout), and
raw `LLM.chat` in-process on the same lines sorted by their prompt (by document: the best order
any tool could pick with every request in hand). The
rounds interleave every contender of every workload; each ratio is against raw vLLM of the same
workload and round, the default one (the targets) and the in-process one (what the order adds in
the same layout).
Generation time is measured as in part A; generated tokens are those delivered (a duplicate's
answer counts for each custom_id, as raw vLLM generates each). Hit rates are vLLM's own counters
(`vllm:prefix_cache_hits / queries`): from `batchrun status`, from `LLM.get_metrics()` for raw.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness as bench
from bench.harness import Result, count_output_tokens, run_cmd

MAX_MODEL_LEN = 2048
# Smaller than any workload's distinct prefixes (20 documents of ~1,000 tokens: about 20,000
# tokens; SmolLM2-135M keeps 23 KiB of KV per token in bf16, 46 in float32).
KV_CACHE_BYTES = 150_000_000
TARGETS = {"a": 2.0, "b": 1.3, "c": 1.3, "d": 0.98}
# Targets against raw vLLM in the same process layout (issue 29): (workload, base) -> ratio.
# "raw-sorted": raw in-process on the lines sorted by document; "raw-inproc": in the file's order.
SAME_LAYOUT_TARGETS = {
    ("a", "raw-sorted"): 0.95,
    ("a", "raw-inproc"): 2.0,
    ("e", "raw-sorted"): 0.95,
    ("e", "raw-inproc"): 2.0,
    ("d", "raw-inproc"): 0.98,
}
WORKLOADS = {
    "a": "(a) shared documents, shuffled",
    "b": "(b) one few-shot prefix + items",
    "c": "(c) 20% duplicate lines",
    "d": "(d) independent prompts",
    "e": "(e) system prompt > documents > questions, shuffled",
}
CONTENDERS = (
    "raw",
    "run_batch",
    "batchrun-input",
    "batchrun-auto",
    "raw-inproc",
    "raw-sorted",
    "batchrun-before",
)
_WORDS = (
    "river city market light garden winter music engine harbor forest letter window mountain "
    "story bridge silver paper morning station kitchen island village teacher doctor ocean "
    "summer machine valley castle painter library coffee season family journey animal planet "
    "desert thunder meadow captain factory number language history science country evening "
    "the a of and in on with from under over near beside after before during while because"
)
_VOCAB = _WORDS.split()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    p.add_argument(
        "--dispatch-scale",
        type=float,
        default=1.0,
        help="workload sizes as a fraction of the issue's (1.0: 200/400/200/200 lines)",
    )
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=150_000_000,
        help="the KV cache budget every contender gets (kv_cache_memory_bytes)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a folder holding batchrun's package as it was (`git archive COMMIT batchrun | tar "
        "-x -C DIR`): the batchrun-before contender runs it, to compare before and after",
    )
    p.add_argument(
        "--section",
        default="dispatch",
        help="the section of its results file to write (another keeps the full run's table)",
    )
    p.add_argument(
        "--workloads",
        default=None,
        help=f"comma list of workloads to run (default: all of {','.join(WORKLOADS)})",
    )
    p.add_argument("--only", default=None, help=f"comma list of contenders: {','.join(CONTENDERS)}")
    bench.contender_arguments(p, rounds=1)


@dataclass
class CResult(Result):
    """One contender's numbers on one workload."""

    workload: str = ""
    hit_rate: float | None = None


def _chat(cid: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": bench.MODEL_NAME,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
        },
    }


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(words)).capitalize() + "."


def workload_lines(kind: str, scale: float, seed: int) -> list[dict[str, Any]]:
    """The input lines of workload `kind` ("a".."d"), `scale` times the issue's size."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    if kind == "a":
        docs = [_text(rng, 700) for _ in range(max(2, round(20 * scale)))]
        for d, doc in enumerate(docs):
            for q in range(10):
                question = f"Question {q}: what does the document say about the {_VOCAB[q]}?"
                content = f"Read the document, then answer.\n\n{doc}\n\n{question}"
                lines.append(_chat(f"a-{d}-{q}", [{"role": "user", "content": content}], 16))
        rng.shuffle(lines)
    elif kind == "b":
        shots = "\n".join(
            f"Review: {_text(rng, 20)}\nSentiment: {rng.choice(['positive', 'negative'])}"
            for _ in range(28)
        )
        system = f"Classify the sentiment of each review, as in these examples.\n\n{shots}"
        for i in range(max(4, round(400 * scale))):
            user = f"Review: {_text(rng, 20)}\nSentiment:"
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            lines.append(_chat(f"b-{i}", messages, 16))
    elif kind == "e":
        system = f"You answer questions about documents. {_text(rng, 300)}"
        docs = [_text(rng, 700) for _ in range(max(2, round(20 * scale)))]
        for d, doc in enumerate(docs):
            for q in range(10):
                question = f"Question {q}: what does the document say about the {_VOCAB[q]}?"
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Document:\n\n{doc}\n\n{question}"},
                ]
                lines.append(_chat(f"e-{d}-{q}", messages, rng.randint(8, 64)))
        rng.shuffle(lines)
    else:
        n = max(5, round(200 * scale))
        unique = bench.make_chat_requests(n if kind == "d" else n - n // 5, seed)
        lines = list(unique)
        if kind == "c":
            for i in range(n // 5):
                lines.append({**rng.choice(unique), "custom_id": f"dup-{i:05d}"})
            rng.shuffle(lines)
    return lines


# -- contenders --------------------------------------------------------------------------------


def sorted_by_prompt(inp: Path, out: Path) -> Path:
    """`inp`'s lines sorted by their messages (stable): grouped by document, as a person who
    knew the file would order it for raw vLLM."""
    lines = [json.loads(x) for x in inp.read_text().splitlines() if x.strip()]
    lines.sort(key=lambda r: json.dumps(r["body"]["messages"]))
    bench.write_jsonl(out, lines)
    return out


def run_raw(
    inp: Path,
    work: Path,
    model: str,
    dtype: str,
    kv: int,
    inproc: bool = False,
    sort: bool = False,
) -> CResult:
    """Raw vLLM: one `LLM.chat` call in input order, in a child process (`child`);
    `inproc`: its engine core in that process (the model on every core of a CPU); `sort`: in
    process, on the lines sorted by prompt."""
    if sort:
        res = CResult("raw-sorted", "raw vLLM in-process, sorted by document")
        inp = sorted_by_prompt(inp, work / f"sorted-{inp.name}")
        inproc = True
    elif inproc:
        res = CResult("raw-inproc", "raw vLLM in-process, one LLM.chat call")
    else:
        res = CResult("raw", "raw vLLM, one LLM.chat call")
    out = work / "raw-result.json"
    out.unlink(missing_ok=True)
    argv = bench.child_command(__name__, inp=inp, model=model, dtype=dtype, kv=kv, result=out)
    data = bench.run_raw_child(argv, work / f"{res.name}.log", out, res, inproc)
    if data is not None:
        res.hit_rate = data["hit_rate"]
    return res


def child(args: argparse.Namespace) -> None:
    """The raw vLLM child: engine start, then the timed `LLM.chat` call over every line."""
    import time

    import torch
    from vllm import LLM, SamplingParams
    from vllm.v1.metrics.reader import Counter

    requests = [json.loads(x) for x in Path(args.inp).read_text().splitlines() if x.strip()]
    kwargs: dict[str, Any] = {
        "model": args.model,
        "max_model_len": MAX_MODEL_LEN,
        "enforce_eager": True,
        "dtype": args.dtype,
        "max_num_seqs": bench.MAX_NUM_SEQS,
        "seed": bench.SEED,
        "kv_cache_memory_bytes": int(args.kv),
        "disable_log_stats": False,  # for the prefix-cache counters, as batchrun runs it
    }
    if not torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = bench.CPU_MEMORY_UTILIZATION
    llm = LLM(**kwargs)
    conversations = [r["body"]["messages"] for r in requests]
    params = [
        SamplingParams(temperature=0.0, max_tokens=int(r["body"]["max_tokens"]), seed=bench.SEED)
        for r in requests
    ]
    gen_start_wall = time.time()
    t0 = time.monotonic()
    outputs = llm.chat(conversations, params, use_tqdm=False)
    gen_s = time.monotonic() - t0
    counters = {m.name: m.value for m in llm.get_metrics() if isinstance(m, Counter)}
    queries = counters.get("vllm:prefix_cache_queries", 0)
    hits = counters.get("vllm:prefix_cache_hits", 0)
    Path(args.result).write_text(
        json.dumps(
            {
                "gen_s": gen_s,
                "gen_start_wall": gen_start_wall,
                "tokens": sum(len(c.token_ids) for o in outputs for c in o.outputs),
                "requests": len(outputs),
                "hit_rate": hits / queries if queries else None,
            }
        )
    )


def run_run_batch(inp: Path, work: Path, model: str, dtype: str, kv: int, cuda: bool) -> CResult:
    """vLLM's batch runner, timed from its "Reading batch from" line to "Writing outputs"."""
    res = CResult("run_batch", "vLLM run_batch")
    out = work / "run_batch-output.jsonl"
    out.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(inp), "-o", str(out),
        "--model", model, "--served-model-name", bench.MODEL_NAME,
        "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--dtype", dtype,
        "--max-num-seqs", str(bench.MAX_NUM_SEQS), "--seed", str(bench.SEED),
        "--kv-cache-memory-bytes", str(kv),
    ]  # fmt: skip
    if not cuda:
        argv += ["--gpu-memory-utilization", str(bench.CPU_MEMORY_UTILIZATION)]
    run = run_cmd(argv, work / "run_batch.log")
    res.wall_s, res.cpu_s, res.load = run.wall_s, run.cpu_s, run.load
    if run.rc != 0 or not out.exists():
        res.error = f"exited {run.rc}: {run.tail(5)}"
        return res
    begin, end = run.first(r"Reading batch from"), run.first(r"Writing outputs to")
    if begin and end:
        res.gen_s = end[0] - begin[0]
        res.ready_s = begin[0] - run.started_wall
    res.succeeded, res.tokens = count_output_tokens(out)
    return res


def run_batchrun(
    inp: Path, work: Path, dtype: str, kv: int, order: str, baseline: Path | None = None
) -> CResult:
    """`batchrun submit --order ORDER` then `batchrun export`; the hit rate from its status.
    `baseline`: batchrun's package from that folder instead (`--baseline`)."""
    res = CResult(f"batchrun-{order}", f"batchrun --order {order}")
    job = work / f"job-{order}"
    br = bench.batchrun_cmd()
    env = None
    if baseline is not None:
        res = CResult("batchrun-before", f"batchrun --order {order}, before (--baseline)")
        job = work / f"job-before-{order}"
        br, env = [sys.executable, "-m", "batchrun"], {"PYTHONPATH": str(baseline)}
    shutil.rmtree(job, ignore_errors=True)
    submit = run_cmd(
        [
            *br, "submit", str(inp), "--job-dir", str(job), "--order", order,
            "--batch-size", str(bench.MAX_NUM_SEQS), "--max-model-len", str(MAX_MODEL_LEN),
            "--enforce-eager", "--dtype", dtype, "--seed", str(bench.SEED),
            "--kv-cache-memory-bytes", str(kv), "--no-progress",
        ],
        work / f"{res.name}.log",
        env=env,
    )  # fmt: skip
    res.wall_s, res.cpu_s, res.load = submit.wall_s, submit.cpu_s, submit.load
    if submit.rc != 0:
        res.error = f"submit exited {submit.rc}: {submit.tail(5)}"
        return res
    export = run_cmd(
        [*br, "export", "--job-dir", str(job)], work / f"export-{res.name}.log", env=env
    )
    if export.rc != 0:
        res.error = f"export exited {export.rc}: {export.tail(5)}"
        return res
    span = bench.generation_span(submit, job)
    if span is not None:
        res.ready_s, res.gen_s = span
    res.succeeded, res.tokens = count_output_tokens(job / "output.jsonl")
    status = run_cmd([*br, "status", "--job-dir", str(job), "--json"], work / "status.log", env=env)
    text = "\n".join(t for _, s, t in status.lines if s == "out")
    if status.rc == 0 and text.strip():
        data = json.loads(text)
        res.hit_rate = (data.get("prefix_cache") or {}).get("hit_rate")
        if data.get("deduplicated"):
            res.note = f"{data['deduplicated']} duplicates answered from one run"
    return res


# -- the part ----------------------------------------------------------------------------------


def ratio(results: list[CResult], r: CResult, base: str = "raw") -> float | None:
    """r's generation tok/s over raw vLLM's (`base`: "raw" or "raw-inproc") on the same workload
    in the same round."""
    raw = next(
        (x for x in results if x.name == base and x.workload == r.workload and x.round == r.round),
        None,
    )
    if raw is None or not raw.tok_per_s or not r.tok_per_s:
        return None
    return r.tok_per_s / raw.tok_per_s


def auto_ratios(results: list[CResult], kind: str, base: str = "raw") -> list[float]:
    """batchrun --order auto's ratio to `base` on workload `kind`, one per round measured."""
    return [
        x
        for r in results
        if r.name == "batchrun-auto" and r.workload == kind
        if (x := ratio(results, r, base)) is not None
    ]


def verdicts(results: list[CResult], rounds: int) -> list[str]:
    """Per workload: batchrun --order auto / raw vLLM per round, and whether the target held in
    at least two rounds (in the one round, with --rounds 1)."""
    lines = []
    for kind, target in TARGETS.items():
        ratios = auto_ratios(results, kind)
        if not ratios:
            continue
        met = sum(x >= target for x in ratios)
        need = min(2, rounds)
        each = ", ".join(f"{x:.2f}x" for x in ratios)
        same = ", ".join(f"{x:.2f}x" for x in auto_ratios(results, kind, "raw-inproc"))
        inproc = f"; against raw vLLM in-process (the same layout): {same}" if same else ""
        lines.append(
            f"{WORKLOADS[kind]}: batchrun --order auto / raw vLLM, generation tok/s: {each}; "
            f"median {statistics.median(ratios):.2f}x; target >= {target}x in {need} rounds: "
            f"{'met' if met >= need else 'NOT met'} ({met} of {len(ratios)}){inproc}"
        )
    for (kind, base), target in SAME_LAYOUT_TARGETS.items():
        ratios = auto_ratios(results, kind, base)
        if not ratios:
            continue
        met = sum(x >= target for x in ratios)
        need = min(2, rounds)
        each = ", ".join(f"{x:.2f}x" for x in ratios)
        lines.append(
            f"{WORKLOADS[kind]}: batchrun --order auto / {LABELS[base]}, generation tok/s: "
            f"{each}; target >= {target}x in {need} rounds: "
            f"{'met' if met >= need else 'NOT met'} ({met} of {len(ratios)})"
        )
    return lines


LABELS = {
    "raw": "raw vLLM",
    "raw-inproc": "raw vLLM in-process, file order",
    "raw-sorted": "raw vLLM in-process, sorted by document",
}


HEAD = [
    "workload", "contender", "round", "generation (s)", "generated tokens", "tok/s (generation)",
    "vs raw", "vs raw in-process", "vs raw sorted", "prefix-cache hit rate", "wall (s)", "load avg", "notes",
]  # fmt: skip


def rows(results: list[CResult]) -> list[list[str]]:
    """The table's rows."""
    out = []
    for r in results:
        x = ratio(results, r)
        y = ratio(results, r, "raw-inproc")
        z = ratio(results, r, "raw-sorted")
        hit = f"{r.hit_rate:.1%}" if r.hit_rate is not None else "n/a"
        out.append(
            [
                WORKLOADS[r.workload], r.label, str(r.round), bench._f(r.gen_s),
                f"{r.tokens:,}" if r.tokens is not None else "n/a", bench._f(r.tok_per_s),
                f"{x:.2f}x" if x is not None else "n/a",
                f"{y:.2f}x" if y is not None else "n/a",
                f"{z:.2f}x" if z is not None else "n/a", hit, bench._f(r.wall_s),
                bench._f(r.load, "{:.2f}"), (r.error or r.note)[:160],
            ]
        )  # fmt: skip
    return out


def part_c(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Run every workload and contender, interleaved, `args.rounds` times; print and write docs."""
    model = bench.default_model_dir()
    cuda = bench.on_cuda()
    dtype, dtype_note = bench.effective_dtype(args.dtype, cuda)
    kv = args.kv_cache_bytes
    scale = args.dispatch_scale
    only = set(args.only.split(",")) if args.only else set(CONTENDERS) - {"batchrun-before"}
    if "batchrun-before" in only and args.baseline is None:
        raise SystemExit("the batchrun-before contender needs --baseline")
    inputs = {}
    kinds = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    for kind in kinds:
        inputs[kind] = work / f"workload-{kind}.jsonl"
        bench.write_jsonl(inputs[kind], workload_lines(kind, scale, args.seed))
    print(f"Part C: dispatch, KV cache {kv:,} bytes, dtype {dtype}, scale {scale}, model {model}")
    steps: dict[str, Callable[[Path], CResult]] = {
        "raw": lambda inp: run_raw(inp, work, model, dtype, kv),
        "run_batch": lambda inp: run_run_batch(inp, work, model, dtype, kv, cuda),
        "batchrun-input": lambda inp: run_batchrun(inp, work, dtype, kv, "input"),
        "batchrun-auto": lambda inp: run_batchrun(inp, work, dtype, kv, "auto"),
        "raw-inproc": lambda inp: run_raw(inp, work, model, dtype, kv, inproc=True),
        "raw-sorted": lambda inp: run_raw(inp, work, model, dtype, kv, sort=True),
        "batchrun-before": lambda inp: run_batchrun(inp, work, dtype, kv, "auto", args.baseline),
    }
    results: list[CResult] = []
    for round_ in range(1, args.rounds + 1):
        for kind, inp in inputs.items():
            for name, fn in steps.items():
                if name not in only:
                    continue
                print(f"  {WORKLOADS[kind]}: {name} (round {round_})...", flush=True)
                r = fn(inp)
                r.workload, r.round = kind, round_
                results.append(r)
                print(
                    f"    generation {bench._f(r.gen_s)} s, {r.tokens} tokens, "
                    f"{bench._f(r.tok_per_s)} tok/s, hit rate {r.hit_rate}"
                    + (f", ERROR: {r.error}" if r.error else ""),
                    flush=True,
                )
    table = rows(results)
    print()
    bench.print_table(HEAD, table)
    found = verdicts(results, args.rounds)
    for v in found:
        print("  " + v)
    if args.no_docs:
        return
    sizes = ", ".join(f"{kind} {sum(1 for _ in inputs[kind].open())} lines" for kind in inputs)
    quick = "\n**A reduced run (--dispatch-scale below 1): for development only.**\n"
    title = (
        "Dispatch: prefix-aware, duplicate-aware, length-aware order against raw vLLM"
        if args.section == "dispatch"
        else f"Dispatch against raw vLLM (section {args.section}: workloads {', '.join(inputs)})"
    )
    body = f"""## {title}
{quick if scale < 1 else ""}
{bench.measured_lines(machine, command)}
- Workloads ({sizes}; seed {args.seed}; temperature 0): {"; ".join(WORKLOADS[k] for k in inputs)}.
- The same engine settings for every contender: model {bench.MODEL_NAME}, max_model_len
  {MAX_MODEL_LEN}, enforce_eager, dtype {dtype} ({dtype_note}), max_num_seqs
  {bench.MAX_NUM_SEQS}, seed {bench.SEED}, KV cache {kv:,} bytes (`kv_cache_memory_bytes`,
  smaller than the documents' prefixes), prefix caching on (vLLM's default), stat logging on.
- Rounds interleave every contender of every workload; *vs raw* is generated tokens/s over the
  generation time, divided by raw vLLM's on the same workload in the same round (the targets are
  against it). *vs raw in-process*: the same against raw vLLM with its engine core in-process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), batchrun's process layout: on a CPU the model then runs
  on every core, where vLLM's default keeps one back for its engine-core process (see the vLLM
  section). It shows what the order and deduplication add on the same cores. *vs raw sorted*:
  against raw vLLM in-process on the same lines sorted by their prompt (by document), the best
  order any tool could pick with every request in hand (issue 29's target). Generation time
  as in the vLLM section above. Hit rates: vLLM's counters (`vllm:prefix_cache_hits` over
  `vllm:prefix_cache_queries`), from `batchrun status --json` and from raw vLLM's
  `LLM.get_metrics()`; run_batch's are not read (n/a).

{bench.md_table(HEAD, table)}

{chr(10).join(f"- {v}." for v in found)}
"""
    bench.write_results(__name__, args.section, body)


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Part C."""
    part_c(args, work, command, machine)
