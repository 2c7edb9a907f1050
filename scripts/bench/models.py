"""Two base models in one batchrun job against the same lines as two jobs, one a model (issue 24).

    .venv/bin/python scripts/bench.py models                          # 256 lines, 2 rounds
    .venv/bin/python scripts/bench.py models --models-lines 128 --rounds 1
    .venv/bin/python scripts/bench.py models --models-echo --no-docs  # dry: echo engine

The two models: the packaged default model (`python -m batchrun.models`) served as `smol-a`, and
a second directory that is a symbolic link to it, served as `smol-b`: batchrun sees two models
(two names, two paths, an engine start each) without a second model to build, and both answer
alike, so the contenders do the same work. N chat lines (scripts/bench/harness.py's prompts, each
made unique), each naming one of the two drawn at random (fixed seed), temperature 0, short
max_tokens. Contenders, each command a fresh process, the rounds alternating which goes first:

  one job   `batchrun submit` of the whole file with `--model smol-a=DIR --model smol-b=LINK`
            (model by model: every smol-a line, then the engine restarts on smol-b), then export.
  two jobs  the same lines split by model into two files, one `batchrun submit` + `export` each
            with one `--model NAME=PATH`, one after the other; their times summed.

The ratio one job / two jobs, of wall times (target <= 1.1x), and of generation times: the sum,
over each model's pass, of the time from that pass's "worker 0 ready" line to its last result in
the journal (engine starts and shutdowns left out). Results are printed and written to
docs/benchmarks/results/models.md (section `bench:models`) unless --no-docs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.harness import (
    CPU_MEMORY_UTILIZATION,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SEED,
    _f,
    alternating_rounds,
    default_model_dir,
    engine_options,
    engine_setup,
    md_table,
    measured_lines,
    print_table,
    ratio_of,
    routed_arguments,
    routed_chat_requests,
    submit_and_export,
    write_jsonl,
    write_results,
)

NAMES = ("smol-a", "smol-b")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    routed_arguments(p, "models", "every job on the echo engine (no model loaded, no docs)")


def run_job(
    inp: Path, job: Path, log: Path, models: dict[str, str], engine_args: list[str]
) -> dict[str, Any]:
    """`batchrun submit` + `export` of `inp` on `models`: wall, per-pass generation, tokens."""
    model_args = [x for name, path in models.items() for x in ("--model", f"{name}={path}")]
    submit, export = submit_and_export(inp, job, log, [*model_args, *engine_args])
    readies = [t for t, _, x in submit.lines if " ready (" in x]
    last: dict[str, float] = {}
    for raw in (job / "journal.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        if rec.get("kind") == "result":
            name = str(rec.get("model") or next(iter(models)))
            last[name] = max(last.get(name, 0.0), float(rec["time"]))
    # The passes run in the order the models were given, one "ready" line each (one worker).
    passes: dict[str, float] = {}
    if len(readies) == len(models) and set(last) == set(models):
        passes = {name: last[name] - ready for name, ready in zip(models, readies, strict=True)}
    ok = tokens = 0
    for raw in (job / "output.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        ok += 1
        tokens += int(rec["response"]["body"]["usage"]["completion_tokens"])
    return {
        "wall_s": submit.wall_s + export.wall_s,
        "gen_s": sum(passes.values()) if passes else None,
        "passes": passes,
        "ok": ok,
        "tokens": tokens,
        "load": submit.load,
        "starts": len(readies),
    }


def _add(a: float | None, b: float | None) -> float | None:
    return a + b if a is not None and b is not None else None


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Make the second model's link and the file, run both contenders in rounds, report."""
    echo = bool(args.models_echo)
    cuda, dtype = engine_setup(args.dtype, echo)
    base = Path(default_model_dir())
    link = work / "smol-b"
    if not link.exists():
        link.symlink_to(base, target_is_directory=True)
    models = {NAMES[0]: str(base), NAMES[1]: str(link)}
    lines = routed_chat_requests(args.models_lines, NAMES, args.seed, args.models_max_tokens)
    whole = work / "models.jsonl"
    write_jsonl(whole, lines)
    parts = {name: work / f"{name}.jsonl" for name in NAMES}
    for name, path in parts.items():
        write_jsonl(path, [x for x in lines if x["body"]["model"] == name])
    counts = {name: sum(1 for x in lines if x["body"]["model"] == name) for name in NAMES}
    engine = engine_options(dtype, cuda, echo)
    print(
        f"{args.models_lines} lines ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
        f"max_tokens {args.models_max_tokens}, dtype {dtype}"
    )
    rows: list[list[str]] = []
    wall_ratios: list[float] = []
    gen_ratios: list[float] = []
    for rnd, order in alternating_rounds(args.rounds, ["one", "two"]):
        res: dict[str, dict[str, Any]] = {}
        for which in order:
            print(f"round {rnd}: {'one job' if which == 'one' else 'two jobs'} ...", flush=True)
            if which == "one":
                res["one"] = run_job(whole, work / "job-one", work / "one.log", models, engine)
                continue
            a, b = (
                run_job(parts[n], work / f"job-{n}", work / f"{n}.log", {n: models[n]}, engine)
                for n in NAMES
            )
            res["two"] = {
                "wall_s": a["wall_s"] + b["wall_s"],
                "gen_s": _add(a["gen_s"], b["gen_s"]),
                "ok": a["ok"] + b["ok"],
                "tokens": a["tokens"] + b["tokens"],
                "load": a["load"],
                "starts": a["starts"] + b["starts"],
                "passes": {**a["passes"], **b["passes"]},
                "note": f"wall {a['wall_s']:.1f} s + {b['wall_s']:.1f} s; ",
            }
        for which in order:
            r = res[which]
            label = "one job, two models" if which == "one" else "two jobs, one model each"
            rows.append(
                [label, str(rnd), _f(r["wall_s"]), _f(r["gen_s"]), f"{r['ok']:,}",
                 f"{r['tokens']:,}", str(r["starts"]), f"{r['load']:.2f}",
                 r.get("note", "") + "generation " + ", ".join(
                     f"{k} {v:.1f} s" for k, v in r["passes"].items())]
            )  # fmt: skip
        w = ratio_of(res["one"]["wall_s"], res["two"]["wall_s"])
        g = ratio_of(res["one"]["gen_s"], res["two"]["gen_s"])
        if w is not None:
            wall_ratios.append(w)
        if g is not None:
            gen_ratios.append(g)
    head = ["contender", "round", "wall (s)", "generation (s)", "answered", "tokens",
            "engine starts", "load avg", "notes"]  # fmt: skip
    print()
    print_table(head, rows)
    median = statistics.median(wall_ratios)
    verdict = (
        f"one job / two jobs, wall time: {', '.join(f'{x:.2f}x' for x in wall_ratios)} "
        f"(median {median:.2f}x; target <= 1.1x: {'met' if median <= 1.1 else 'not met'})"
    )
    if gen_ratios:
        verdict += (
            f"; generation time: {', '.join(f'{x:.2f}x' for x in gen_ratios)} "
            f"(median {statistics.median(gen_ratios):.2f}x)"
        )
    print(f"\n{verdict}")
    if args.no_docs or echo:
        return
    body = f"""## Two base models in one job against two separate jobs

{measured_lines(machine, command)}
- Models: `smol-a`, the packaged SmolLM2-135M-Instruct directory, and `smol-b`, a symbolic link
  to that directory under another name (two models to batchrun: two names, two engine starts;
  the same work for both contenders, since both answer alike).
- Workload: {args.models_lines} chat lines (scripts/bench/harness.py's prompts, seed {args.seed},
  each made unique; {", ".join(f"{k}: {v}" for k, v in counts.items())} lines), each naming one of
  the two drawn at random, temperature 0, max_tokens {args.models_max_tokens}.
- Engine settings for every job: dtype {dtype}, max_model_len {MAX_MODEL_LEN}, enforce_eager,
  `--batch-size {MAX_NUM_SEQS}`, seed {SEED}, gpu_memory_utilization {CPU_MEMORY_UTILIZATION}
  (of CPU memory).
- *one job*: `batchrun submit models.jsonl --model smol-a=DIR --model smol-b=LINK` then
  `batchrun export`. *two jobs*: the lines split by model, `batchrun submit smol-a.jsonl --model
  smol-a=DIR` and `... smol-b.jsonl --model smol-b=LINK`, each with its export, one after the
  other; times summed. Each command a fresh process; the rounds alternate which goes first.
- *wall*: submit + export. *generation*: the sum over the model passes of "worker 0 ready" to
  that model's last result in the journal (engine starts left out). *load avg*: the 1-minute
  load average at launch (2 cores, shared with other work).

{md_table(head, rows)}

- {verdict}.
"""
    write_results(__name__, "models", body)
