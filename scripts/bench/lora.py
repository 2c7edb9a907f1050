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
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    CPU_MEMORY_UTILIZATION,
    INPROC_ENV,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SEED,
    _f,
    alternating_rounds,
    child_command,
    default_model_dir,
    engine_options,
    engine_setup,
    generation_span,
    md_table,
    measured_lines,
    print_table,
    ratio_of,
    routed_arguments,
    routed_chat_requests,
    run_cmd,
    submit_and_export,
    write_jsonl,
    write_results,
)

ADAPTERS = 4
RANK = 8
# Small enough that answers stay text, large enough that each adapter answers differently.
ADAPTER_SCALE = 0.08


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    routed_arguments(
        p, "lora", "batchrun with the echo engine only (no model, no raw vLLM, no docs)"
    )


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


def run_batchrun(inp: Path, job: Path, log: Path, options: list[str]) -> dict[str, Any]:
    """`batchrun submit` then `export` on `inp`: wall, generation time, answers, tokens, load."""
    submit, export = submit_and_export(inp, job, log, options)
    start_s, gen_s = generation_span(submit, job) or (None, None)
    texts, tokens = read_output(job / "output.jsonl")
    return {
        "wall_s": submit.wall_s + export.wall_s,
        "start_s": start_s,
        "gen_s": gen_s,
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
    options = [*args, *engine_options(dtype, cuda, echo)]
    return run_batchrun(inp, work / "job", work / "batchrun.log", options)


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


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Build the adapters and the file, run the contenders in alternating rounds, report."""
    echo = bool(args.lora_echo)
    cuda, dtype = engine_setup(args.dtype, echo)
    model = default_model_dir()
    adapters = make_adapters(work / "adapters", ADAPTERS)
    inp = work / "lora.jsonl"
    write_jsonl(
        inp, routed_chat_requests(args.lora_lines, list(adapters), args.seed, args.lora_max_tokens)
    )
    print(
        f"{args.lora_lines} lines over {len(adapters)} adapters (rank {RANK}), max_tokens "
        f"{args.lora_max_tokens}, dtype {dtype}, max_loras {max_loras(len(adapters), cuda)}"
    )
    rows: list[list[str]] = []
    gen_ratios: list[float] = []
    wall_ratios: list[float] = []
    equal_notes: list[str] = []
    for rnd, order in alternating_rounds(args.rounds, ["batchrun", "raw"]):
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
                 f"{r['tokens']:,}", _f(ratio_of(r["tokens"], r["gen_s"])), f"{r['load']:.2f}"]
            )  # fmt: skip
        if "raw" in results:
            b, raw = results["batchrun"], results["raw"]
            g, w = ratio_of(raw["gen_s"], b["gen_s"]), ratio_of(raw["wall_s"], b["wall_s"])
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
  (the adapters + 1 on a CPU: [adapters](../../adapters.md#vllms-cpu-bug-and-what-batchrun-does-about-it)),
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
