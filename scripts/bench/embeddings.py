"""An embeddings job at corpus scale against its chat-completion twin, echo engine (issue 40).

    .venv/bin/python scripts/bench.py embeddings                      # 200,000 of 1,024 dims
    .venv/bin/python scripts/bench.py embeddings --requests 20000 --rounds 2 --no-docs

Two jobs of N requests each on the echo engine (no model: what is measured is batchrun's own
cost), run one after the other in each round, the rounds alternating which goes first, so that
both meet the same machine (a shared one is noisy: compare the two within a round):

  embeddings  /v1/embeddings lines, `dimensions` D (1,024), float and base64 alternating.
  chat        /v1/chat/completions lines of the same count, each answered with 8 tokens
              (a 10-word message, `max_tokens` 8).

Each command is a process of its own (`submit --batch-size 1024`, `export`, `export --parquet`);
the figures: its wall time and requests/s, the parent's own CPU seconds (its engine worker not
counted), and the journal's bytes per result. Targets: the embeddings journal at most 1.5x the
vectors' float32 bytes (4 x D), and the embeddings job's submit at least half the chat job's
requests/s. Results are printed and, unless --no-docs, written to
docs/benchmarks/results/embeddings.md (section `bench:embeddings`).
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import sys
from pathlib import Path

from bench.harness import (
    alternating_rounds,
    machine_line,
    md_table,
    print_table,
    write_results,
)
from bench.scale import run_phase

KINDS = ("embeddings", "chat")
PHASES = ("submit", "export", "export --parquet")
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--requests", type=int, default=200_000, help="requests in each job")
    parser.add_argument("--dimensions", type=int, default=1024, help="each vector's size")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the two jobs")


def write_inputs(work: Path, n: int, dimensions: int) -> dict[str, Path]:
    """The two input files: N embeddings lines and their N chat twins (written without json)."""
    paths = {kind: work / f"{kind}.jsonl" for kind in KINDS}
    with (
        paths["embeddings"].open("w", buffering=1 << 20) as emb,
        paths["chat"].open("w", buffering=1 << 20) as chat,
    ):
        for i in range(n):
            text = (
                f"passage {i} {WORDS[i % 8]} {WORDS[(i // 8) % 8]} {WORDS[(i // 64) % 8]} "
                "of the corpus to embed"
            )  # 10 words: the chat answer is its first 8
            fmt = ',"encoding_format":"base64"' if i % 2 else ""
            emb.write(
                f'{{"custom_id":"r{i:07d}","method":"POST","url":"/v1/embeddings","body":'
                f'{{"model":"echo","input":"{text}","dimensions":{dimensions}{fmt}}}}}\n'
            )
            chat.write(
                f'{{"custom_id":"r{i:07d}","method":"POST","url":"/v1/chat/completions","body":'
                f'{{"model":"echo","max_tokens":8,"messages":[{{"role":"user","content":"{text}"}}]}}}}\n'
            )
    return paths


def float_text_bytes(dimensions: int, sample: int = 200) -> float:
    """The mean size of the echo engine's vectors as a JSON float list (as an earlier version
    journaled them): what the journal's base64 replaces."""
    from batchrun.engines.echo import echo_vector

    lists = [
        json.dumps(echo_vector(f"v{i}", dimensions), separators=(",", ":")) for i in range(sample)
    ]
    return sum(len(x) for x in lists) / sample


def check_output(path: Path, n: int, kind: str, dimensions: int) -> str | None:
    """What is wrong with an export's output.jsonl (None: N lines, vectors of D values)."""
    lines = 0
    with path.open("rb") as f:
        for raw in f:
            lines += 1
            if kind == "embeddings" and lines <= 4:
                vector = json.loads(raw)["response"]["body"]["data"][0]["embedding"]
                size = (
                    len(base64.b64decode(vector)) // 4 if isinstance(vector, str) else len(vector)
                )
                if size != dimensions:
                    return f"a vector of {size} values, not {dimensions}"
    return None if lines == n else f"{lines} lines, not {n}"


def measure(
    work: Path, src: Path, kind: str, n: int, dimensions: int
) -> dict[str, tuple[float, int, float]]:
    """One job of `kind`: (wall s, exit code, the parent's CPU s) of each phase, and the journal
    and output sizes (as phases "journal" and "output": (bytes, 0, 0))."""
    job, out = work / f"job-{kind}", work / f"out-{kind}"
    shutil.rmtree(job, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    results: dict[str, tuple[float, int, float]] = {}
    for phase in PHASES:
        if phase == "submit":
            args = ["submit", str(src), "--job-dir", str(job), "--engine", "echo",
                    "--batch-size", "1024", "--no-progress"]  # fmt: skip
        else:
            args = ["export", "--job-dir", str(job), "--output-dir", str(out), *phase.split()[1:]]
        wall, rc, _rss, cpu = run_phase(args)
        results[phase] = (wall, rc, cpu)
        if phase == "submit":
            # The journal and its side file of vectors (job/vectors.py), where it has one.
            side = job / "journal.f32"
            held = (job / "journal.jsonl").stat().st_size + (
                side.stat().st_size if side.exists() else 0
            )
            results["journal"] = (held, 0, 0.0)
        elif phase == "export":
            results["output"] = ((out / "output.jsonl").stat().st_size, 0, 0.0)
            problem = check_output(out / "output.jsonl", n, kind, dimensions)
            if problem is not None:
                print(f"{kind}: output.jsonl has {problem}", file=sys.stderr)
                results[phase] = (wall, rc or 1, cpu)
    shutil.rmtree(job, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return results


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> int:
    """Run the two jobs in rounds; print the table (and write it into the results)."""
    status = 0
    n, dims = args.requests, args.dimensions
    inputs = write_inputs(work, n, dims)
    rounds: list[dict[str, dict[str, tuple[float, int, float]]]] = []
    for _, order in alternating_rounds(args.rounds, KINDS):
        rounds.append({kind: measure(work, inputs[kind], kind, n, dims) for kind in order})
    head = ["round", "job", "command", "wall s", "requests/s", "parent CPU s",
            "requests/parent CPU s", "bytes/result"]  # fmt: skip
    rows: list[list[str]] = []
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for r, measured in enumerate(rounds, start=1):
        for kind in KINDS:
            for phase in PHASES:
                wall, rc, cpu = measured[kind][phase]
                status |= rc
                size = ""
                if phase == "submit":
                    size = f"{measured[kind]['journal'][0] / n:,.0f} (journal)"
                elif phase == "export":
                    size = f"{measured[kind]['output'][0] / n:,.0f} (output.jsonl)"
                rows.append([str(r), kind, phase + ("" if rc == 0 else f" (exit {rc})"),
                             f"{wall:.2f}", f"{n / wall:,.0f}", f"{cpu:.2f}",
                             f"{n / cpu:,.0f}" if cpu else "", size])  # fmt: skip
        emb, chat = measured["embeddings"]["submit"], measured["chat"]["submit"]
        ratios.append(chat[0] / emb[0])  # requests/s, embeddings over chat
        if emb[2] and chat[2]:
            cpu_ratios.append(chat[2] / emb[2])  # requests a parent CPU second
    journal = statistics.median(m["embeddings"]["journal"][0] for m in rounds) / n
    vector = 4 * dims
    ratio = statistics.median(ratios)
    as_text = float_text_bytes(dims)
    lines = [
        f"embeddings journal: {journal:,.0f} bytes a result for {vector:,} bytes of float32 "
        f"({journal / vector:.2f}x; target at most 1.5x): "
        + ("met" if journal <= 1.5 * vector else "NOT met")
        + f"; the same vectors as JSON float text, as journaled before: {as_text:,.0f} bytes "
        f"each ({as_text / vector:.1f}x)",
        "embeddings submit requests/s over chat's, by round: "
        + ", ".join(f"{x:.2f}" for x in ratios)
        + f"; median {ratio:.2f} (target at least 0.5): "
        + ("met" if ratio >= 0.5 else "NOT met"),
        "the same by the parent's CPU (requests per parent CPU second, which a loaded "
        "machine inflates less than wall time): " + ", ".join(f"{x:.2f}" for x in cpu_ratios),
    ]
    print_table(head, rows)
    print("\n".join(lines))
    if not args.no_docs:
        text = (
            "## Embeddings at corpus scale: vectors journaled as float32\n\n"
            f"`{command}`; {machine_line(machine)}. {n:,} /v1/embeddings requests of "
            f"{dims:,} dimensions (float and base64 alternating) and their chat-completion "
            "twin (the same count, 8-token answers), both on the echo engine, one after the "
            "other in each round (the rounds alternate which goes first). Each command is a "
            "process of its own; parent CPU s: that process's own (its engine worker not "
            "counted); bytes/result: the journal's after submit, output.jsonl's after "
            "export.\n\n" + md_table(head, rows) + "\n\n" + "\n".join(f"- {x}" for x in lines)
        )
        write_results(__name__, "embeddings", text)
    return 0 if status == 0 else 1
