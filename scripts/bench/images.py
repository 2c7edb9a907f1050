"""Image chat lines through batchrun against raw vLLM's `LLM.chat` on the same images.

    .venv/bin/python scripts/bench.py images --lines 64 --rounds 3  # the tiny test Idefics3
    .venv/bin/python scripts/bench.py images --model DIR --lines 256

Side by side in one run (each contender in a process of its own, the same engine settings).

Each line has its own image (a generated PNG, as a data URL) and a short question, temperature
0. Generation time: raw, the `LLM.chat` call; batchrun, from its worker's "ready" line to its
last answer (the reading of the media in the worker and the dispatch included). The
answers are compared as well: at temperature 0 they must be the same text.

Two raw contenders: "raw", one cold `LLM.chat` call (what the target is against), and "raw
warmed", the same after an untimed chat of one small image and one token, which is what
batchrun's worker does before it says it is ready (engines/vllm/media.py, warm_media_path). Each
round runs the three side by side; `--rounds N` repeats them and prints the medians. Nothing is
written to the results.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from testmodels.multimodal import build_idefics3, png_bytes

from bench.harness import ROOT, batchrun_cmd, run_cmd

WRITES_RESULTS = False

_RAW = """
import json, sys, time
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    lines = [json.loads(x) for x in open(sys.argv[2])]
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=2048, enforce_eager=True,
              gpu_memory_utilization=float(sys.argv[3]), seed=0)
    convs = [x["body"]["messages"] for x in lines]
    params = [SamplingParams(temperature=0, max_tokens=x["body"]["max_tokens"]) for x in lines]
    if sys.argv[4] == "warm":  # batchrun's worker's warm-up (engines/vllm/media.py), untimed
        import base64, io
        from PIL import Image
        buf = io.BytesIO()
        Image.new("RGB", (32, 32), (128, 128, 128)).save(buf, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        warm = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
        llm.chat([warm], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    start = time.monotonic()
    outs = llm.chat(convs, params, use_tqdm=False)
    gen = time.monotonic() - start
    print(json.dumps({"gen_s": gen, "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                      "texts": {x["custom_id"]: o.outputs[0].text for x, o in zip(lines, outs)}}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--model", type=Path, help="an image-language model directory")
    parser.add_argument("--lines", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", default="0.2")
    parser.add_argument("--rounds", type=int, default=1)


def image_lines(n: int, max_tokens: int) -> list[dict[str, object]]:
    """`n` chat lines, each with an image of its own."""
    lines: list[dict[str, object]] = []
    for i in range(n):
        png = png_bytes(32 + i % 48, 24 + (7 * i) % 40, ((37 * i) % 256, (91 * i) % 256, 128))
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        content = [
            {"type": "text", "text": f"Describe image {i}."},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        lines.append(
            {"custom_id": f"img-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    return lines


def run_round(work: Path, model: Path, src: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One side-by-side round: raw `LLM.chat`, then batchrun, on the same lines."""
    work.mkdir()
    (work / "raw.py").write_text(_RAW)
    raws: dict[str, Any] = {}
    for kind in ("cold", "warm"):
        log = work / f"raw-{kind}.log"
        raw = run_cmd(
            [sys.executable, str(work / "raw.py"), str(model), str(src),
             args.gpu_memory_utilization, kind],
            log,
        )  # fmt: skip
        out = [t for _, s, t in raw.lines if s == "out" and t.startswith("{")]
        assert raw.rc == 0 and out, log.read_text()[-3000:]
        raws[kind] = json.loads(out[-1])
    raw_result = raws["cold"]
    job = work / "job"
    run = run_cmd(
        [*batchrun_cmd(), "submit", str(src), "--job-dir", str(job), "--model", str(model),
         "--dtype", "float32", "--gpu-memory-utilization", args.gpu_memory_utilization,
         "--batch-size", str(args.lines), "--no-progress"],
        work / "batchrun.log",
    )  # fmt: skip
    assert run.rc == 0, (work / "batchrun.log").read_text()[-3000:]
    ready = next(t for t, _, x in run.lines if "ready (pid" in x)
    # The last answer's time (the journal's summary): the process's own exit (the engine's
    # shutdown, the summary) is not generation.
    end = json.loads((job / "summary.json").read_text())["tally"]["last_time"]
    subprocess.run([*batchrun_cmd(), "export", "--job-dir", str(job)], check=True, cwd=ROOT)
    texts, tokens = {}, 0
    for line in (job / "output.jsonl").read_text().splitlines():
        rec = json.loads(line)
        body = rec["response"]["body"]
        texts[rec["custom_id"]] = body["choices"][0]["message"]["content"]
        tokens += body["usage"]["completion_tokens"]
    return {
        "raw_s": raw_result["gen_s"],
        "raw_tokens": raw_result["tokens"],
        "warm_s": raws["warm"]["gen_s"],
        "batchrun_s": end - ready,
        "batchrun_tokens": tokens,
        "same": texts == raw_result["texts"] == raws["warm"]["texts"],
    }


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Run both contenders, `--rounds` times side by side, and print their figures."""
    model = args.model or build_idefics3(work / "idefics3")
    src = work / "images.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in image_lines(args.lines, args.max_tokens)))
    print(f"{args.lines} image lines, max_tokens {args.max_tokens}, model {model}")
    print(f"{'round':<7}{'raw s':>7}{'tok/s':>8}{'warm s':>8}{'batchrun s':>12}{'tok/s':>8}"
          f"{'vs raw':>8}{'vs warm':>9}  answers equal")  # fmt: skip
    ratios: list[float] = []
    warm_ratios: list[float] = []
    for i in range(1, args.rounds + 1):
        r = run_round(work / f"round-{i}", model, src, args)
        ratios.append(r["raw_s"] / r["batchrun_s"])
        warm_ratios.append(r["warm_s"] / r["batchrun_s"])
        print(
            f"{i:<7}{r['raw_s']:>7.2f}{r['raw_tokens'] / r['raw_s']:>8.1f}{r['warm_s']:>8.2f}"
            f"{r['batchrun_s']:>12.2f}{r['batchrun_tokens'] / r['batchrun_s']:>8.1f}"
            f"{ratios[-1]:>7.2f}x{warm_ratios[-1]:>8.2f}x  {r['same']}",
            flush=True,
        )
    for name, values in (("raw", ratios), ("raw warmed", warm_ratios)):
        print(f"batchrun / {name} throughput: median {statistics.median(values):.2f}x "
              f"(min {min(values):.2f}x, max {max(values):.2f}x, {len(values)} rounds)")  # fmt: skip
