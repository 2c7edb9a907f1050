"""LoRA adapters interleaved at random per line, batchrun against raw `LLM.chat` (issue 24).

    .venv/bin/python scripts/bench.py lora                          # 256 lines, 2 rounds
    .venv/bin/python scripts/bench.py lora --lora-lines 128 --rounds 1
    .venv/bin/python scripts/bench.py lora --lora-echo --no-docs    # dry: echo engine, no vLLM

Raw vLLM's `LLM.chat` gets one `LoRARequest` per request in the file's order.

The workload: N chat lines (the generated prompts of scripts/bench/harness.py, each made unique)
over 4 rank-8 adapters on the packaged SmolLM2 model (scripts/testmodels/lora.py's make_adapter: random
weights, seeds 1-4), each line's adapter drawn at random (fixed seed), temperature 0, short
max_tokens. Two contenders, each in a process of its own, with the same engine settings (model,
dtype, max_model_len, max_num_seqs, seed, KV budget, enable_lora, max_loras, max_lora_rank), the
rounds alternating which goes first:

  batchrun  `batchrun submit` (--lora-modules x4, --max-loras: the adapters + 1 on a CPU, the rule
            of docs/adapters.md; the adapters on a GPU) then `batchrun export`.
  raw       one `LLM.chat(conversations, params, lora_request=[...])` call, the requests and
            their LoRARequests in the file's order, the engine core in-process
            (VLLM_ENABLE_V1_MULTIPROCESSING=0): batchrun's worker's layout, the model's threads
            on every core.

Times: *wall*, the whole command(s); *generation*, raw: the `LLM.chat` call; batchrun: from its
"worker 0 ready" line (time-stamped here as it arrives) to the last result in its journal. The
ratio raw / batchrun (of times: >= 1.0x means batchrun is no slower). The answers are compared too.
Results are printed and written to docs/benchmarks/results/lora.md (section `bench:lora`) unless
--no-docs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import (
    CPU_MEMORY_UTILIZATION,
    INPROC_ENV,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SEED,
    _f,
    batchrun_cmd,
    child_command,
    default_model_dir,
    effective_dtype,
    make_chat_requests,
    md_table,
    measured_lines,
    on_cuda,
    print_table,
    run_cmd,
    write_jsonl,
    write_results,
)

ADAPTERS = 4
RANK = 8
# Small enough that answers stay text, large enough that each adapter answers differently.
ADAPTER_SCALE = 0.08


def lora_lines(n: int, adapters: Sequence[str], seed: int, max_tokens: int) -> list[dict[str, Any]]:
    """`n` chat lines, each naming one of `adapters` drawn at random (seeded), all prompts unique."""
    rng = random.Random(seed)
    lines = make_chat_requests(n, seed)
    for i, line in enumerate(lines):
        body = line["body"]
        body["model"] = rng.choice(list(adapters))
        body["max_tokens"] = max_tokens
        # Unique prompts: neither contender gets to merge identical requests.
        body["messages"][-1]["content"] += f" (item {i})"
    return lines


def make_adapters(directory: Path, count: int) -> dict[str, str]:
    """`count` adapters (name -> directory), random weights under seeds 1..count."""
    from testmodels.lora import make_adapter

    return {
        f"adapter{i}": str(
            make_adapter(directory / f"adapter{i}", i, rank=RANK, scale=ADAPTER_SCALE)
        )
        for i in range(1, count + 1)
    }


def max_loras(adapters: int, cuda: bool) -> int:
    """docs/adapters.md's rule: on the CPU backend one slot more than the adapters, kept free."""
    return adapters if cuda else adapters + 1


def read_output(path: Path) -> tuple[dict[str, str], int]:
    """The answers by custom_id and the completion tokens of an OpenAI batch output file."""
    texts: dict[str, str] = {}
    tokens = 0
    for raw in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(raw)
        body = rec["response"]["body"]
        texts[rec["custom_id"]] = body["choices"][0]["message"]["content"]
        tokens += int(body["usage"]["completion_tokens"])
    return texts, tokens


def journal_last_time(job: Path) -> float | None:
    """The time of the last result record in a job's journal."""
    times = [
        float(r["time"])
        for r in (json.loads(x) for x in (job / "journal.jsonl").read_text().splitlines())
        if r.get("kind") == "result"
    ]
    return max(times) if times else None


def run_batchrun(
    inp: Path,
    job: Path,
    log: Path,
    engine_args: list[str],
    *,
    gpu_args: list[str],
) -> dict[str, Any]:
    """`batchrun submit` then `export` on `inp`: wall, generation time, answers, tokens, load."""
    shutil.rmtree(job, ignore_errors=True)
    submit = run_cmd(
        [*batchrun_cmd(), "submit", str(inp), "--job-dir", str(job), *engine_args, *gpu_args,
         "--no-progress"],
        log,
    )  # fmt: skip
    if submit.rc != 0:
        raise SystemExit(f"batchrun submit exited {submit.rc}; see {log}:\n{submit.tail(8)}")
    export = run_cmd(
        [*batchrun_cmd(), "export", "--job-dir", str(job)], log.with_suffix(".export.log")
    )
    if export.rc != 0:
        raise SystemExit(f"batchrun export exited {export.rc}:\n{export.tail(8)}")
    ready = submit.first(r"worker \d+.*? ready \(")
    last = journal_last_time(job)
    texts, tokens = read_output(job / "output.jsonl")
    return {
        "wall_s": submit.wall_s + export.wall_s,
        "start_s": ready[0] - submit.started_wall if ready else None,
        "gen_s": last - ready[0] if ready and last else None,
        "tokens": tokens,
        "texts": texts,
        "load": submit.load,
        "readies": sum(1 for _, _, x in submit.lines if " ready (" in x),
    }


def contender_batchrun(
    inp: Path, work: Path, model: str, adapters: dict[str, str], dtype: str, cuda: bool, echo: bool
) -> dict[str, Any]:
    """batchrun on the LoRA file, every adapter on the command line."""
    args = ["--model", model, "--max-lora-rank", str(RANK)]
    args += ["--max-loras", str(max_loras(len(adapters), cuda))]
    for name, path in adapters.items():
        args += ["--lora-modules", f"{name}={path}"]
    if echo:
        args += ["--engine", "echo", "--batch-size", str(MAX_NUM_SEQS)]
        return run_batchrun(inp, work / "job", work / "batchrun.log", args, gpu_args=[])
    args += ["--batch-size", str(MAX_NUM_SEQS), "--max-model-len", str(MAX_MODEL_LEN)]
    args += ["--enforce-eager", "--dtype", dtype, "--seed", str(SEED)]
    gpu = [] if cuda else ["--gpu-memory-utilization", str(CPU_MEMORY_UTILIZATION)]
    return run_batchrun(inp, work / "job", work / "batchrun.log", args, gpu_args=gpu)


def contender_raw(
    inp: Path, work: Path, model: str, adapters: dict[str, str], dtype: str, cuda: bool
) -> dict[str, Any]:
    """Raw vLLM in a child process of its own (`child`)."""
    out = work / "raw-result.json"
    out.unlink(missing_ok=True)
    argv = child_command(
        __name__, input=inp, model=model, result=out, dtype=dtype, adapters=adapters,
        max_loras=max_loras(len(adapters), cuda),
    )  # fmt: skip
    run = run_cmd(argv, work / "raw.log", env={INPROC_ENV: "0"})
    if run.rc != 0 or not out.exists():
        raise SystemExit(f"raw vLLM exited {run.rc}; see {work / 'raw.log'}:\n{run.tail(8)}")
    data: dict[str, Any] = json.loads(out.read_text())
    data["wall_s"] = run.wall_s
    data["start_s"] = data["gen_start_wall"] - run.started_wall
    data["load"] = run.load
    return data


def child(args: argparse.Namespace) -> None:
    """Raw vLLM in this (fresh) process: engine start, then one timed `LLM.chat` call."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    requests = [json.loads(x) for x in Path(args.input).read_text().splitlines() if x.strip()]
    adapters: dict[str, str] = args.adapters
    kwargs: dict[str, Any] = {
        "model": args.model,
        "max_model_len": MAX_MODEL_LEN,
        "enforce_eager": True,
        "dtype": args.dtype,
        "max_num_seqs": MAX_NUM_SEQS,
        "seed": SEED,
        "enable_lora": True,
        "max_loras": args.max_loras,
        "max_lora_rank": RANK,
    }
    if not torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = CPU_MEMORY_UTILIZATION
    llm = LLM(**kwargs)
    ids = {name: i for i, name in enumerate(adapters, start=1)}
    loras = [
        LoRARequest(r["body"]["model"], ids[r["body"]["model"]], adapters[r["body"]["model"]])
        for r in requests
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=int(r["body"]["max_tokens"]), seed=SEED)
        for r in requests
    ]
    conversations: list[Any] = [r["body"]["messages"] for r in requests]
    gen_start_wall = time.time()
    t0 = time.monotonic()
    outputs = llm.chat(conversations, params, lora_request=loras, use_tqdm=False)
    gen_s = time.monotonic() - t0
    Path(args.result).write_text(
        json.dumps(
            {
                "gen_s": gen_s,
                "gen_start_wall": gen_start_wall,
                "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                "texts": {
                    r["custom_id"]: o.outputs[0].text
                    for r, o in zip(requests, outputs, strict=True)
                },
            }
        )
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def part_lora(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Build the adapters and the file, run the contenders in alternating rounds, report."""
    echo = bool(args.lora_echo)
    cuda = False if echo else on_cuda()
    dtype = "auto" if echo else effective_dtype(args.dtype, cuda)[0]
    model = default_model_dir()
    adapters = make_adapters(work / "adapters", ADAPTERS)
    inp = work / "lora.jsonl"
    write_jsonl(inp, lora_lines(args.lora_lines, list(adapters), args.seed, args.lora_max_tokens))
    print(
        f"{args.lora_lines} lines over {len(adapters)} adapters (rank {RANK}), max_tokens "
        f"{args.lora_max_tokens}, dtype {dtype}, max_loras {max_loras(len(adapters), cuda)}"
    )
    rows: list[list[str]] = []
    gen_ratios: list[float] = []
    wall_ratios: list[float] = []
    equal_notes: list[str] = []
    for rnd in range(1, args.rounds + 1):
        order = ["batchrun", "raw"] if rnd % 2 else ["raw", "batchrun"]
        if echo:
            order = ["batchrun"]
        results: dict[str, dict[str, Any]] = {}
        for name in order:
            print(f"round {rnd}: {name} ...", flush=True)
            if name == "batchrun":
                results[name] = contender_batchrun(inp, work, model, adapters, dtype, cuda, echo)
            else:
                results[name] = contender_raw(inp, work, model, adapters, dtype, cuda)
        for name in order:
            r = results[name]
            rows.append(
                [name, str(rnd), _f(r["wall_s"]), _f(r["start_s"]), _f(r["gen_s"]),
                 f"{r['tokens']:,}", _f(_ratio(r["tokens"], r["gen_s"])), f"{r['load']:.2f}"]
            )  # fmt: skip
        if "raw" in results:
            b, raw = results["batchrun"], results["raw"]
            g, w = _ratio(raw["gen_s"], b["gen_s"]), _ratio(raw["wall_s"], b["wall_s"])
            if g is not None and w is not None:
                gen_ratios.append(g)
                wall_ratios.append(w)
            same = sum(1 for k, v in raw["texts"].items() if b["texts"].get(k) == v)
            equal_notes.append(f"{same} of {len(raw['texts'])}")
        else:
            answered = len(results["batchrun"]["texts"])
            print(f"echo engine: batchrun answered {answered} of {args.lora_lines} lines")
    head = ["contender", "round", "wall (s)", "start (s)", "generation (s)", "tokens",
            "tok/s (generation)", "load avg"]  # fmt: skip
    print()
    print_table(head, rows)
    if not gen_ratios:
        return
    verdict = (
        f"raw / batchrun, generation time: {', '.join(f'{x:.2f}x' for x in gen_ratios)} "
        f"(median {statistics.median(gen_ratios):.2f}x; target >= 1.0x: "
        f"{'met' if statistics.median(gen_ratios) >= 1.0 else 'not met'}); wall time: "
        f"{', '.join(f'{x:.2f}x' for x in wall_ratios)} (median {statistics.median(wall_ratios):.2f}x)"
    )
    same_line = f"answers text-equal to raw vLLM's, per round: {', '.join(equal_notes)}"
    print(f"\n{verdict}\n{same_line}")
    if args.no_docs or echo:
        return
    body = f"""## LoRA: 4 adapters interleaved at random, batchrun against raw `LLM.chat`

{measured_lines(machine, command)}
- Workload: {args.lora_lines} chat lines (scripts/bench/harness.py's prompts, seed {args.seed},
  each made unique), each naming one of 4 rank-{RANK} LoRA adapters on SmolLM2-135M-Instruct
  drawn at random (scripts/testmodels/lora.py's `make_adapter`, random weights, seeds 1-4, scale
  {ADAPTER_SCALE}), temperature 0, max_tokens {args.lora_max_tokens}.
- Engine settings, the same for both: dtype {dtype}, max_model_len {MAX_MODEL_LEN}, enforce_eager,
  max_num_seqs {MAX_NUM_SEQS}, seed {SEED}, enable_lora, max_loras {max_loras(len(adapters), cuda)}
  (the adapters + 1 on a CPU: [adapters](adapters.md#vllms-cpu-bug-and-what-batchrun-does-about-it)),
  max_lora_rank {RANK}, gpu_memory_utilization {CPU_MEMORY_UTILIZATION} (of CPU memory).
- batchrun: `batchrun submit --lora-modules adapterN=DIR x4 --max-loras ... --batch-size
  {MAX_NUM_SEQS}` then `batchrun export` (the plan, `--order auto`, groups the lines by adapter).
  raw: one `LLM.chat(conversations, params, lora_request=[one LoRARequest per request])` in the
  file's order, its engine core in-process (`{INPROC_ENV}=0`, batchrun's worker's layout).
  Each in a fresh process; the rounds alternate which runs first.
- *generation*: raw, the `LLM.chat` call; batchrun, from "worker 0 ready" to its journal's last
  result. *start*: launch to the start of generation. *wall*: the whole command(s), export
  included. *load avg*: the 1-minute load average at launch (2 cores, shared with other work).

{md_table(head, rows)}

- {verdict}.
- {same_line}.
"""
    write_results(__name__, "lora", body)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    p.add_argument("--lora-lines", type=int, default=256, help="chat lines in the file (256)")
    p.add_argument("--lora-max-tokens", type=int, default=16, help="max_tokens of each line (16)")
    p.add_argument(
        "--lora-echo",
        action="store_true",
        help="dry run: batchrun with the echo engine only (no model, no raw vLLM, no docs)",
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds, alternating the order (2)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the lines and their adapters")
    p.add_argument("--dtype", default=None, help="dtype for both (default: batchrun's auto here)")


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """The LoRA benchmark; dry with --lora-echo (no results written)."""
    if args.lora_echo:
        args.no_docs = True
    part_lora(args, work, command, machine)
