"""Check batchrun's out-of-memory handling against real CUDA out-of-memory errors, through its real
workers and its real restart policy (not a copy of them).

    python scripts/gpu_oom_check.py [--device cuda:0] [--strict] [--no-gpu]

Needs PyTorch and batchrun's core (msgspec), never vLLM: the GPU machines this runs on have CUDA
PyTorch but no vLLM. The engine is scripts/gpu_check_engine.py, registered in each worker: a step
allocates GPU memory in proportion to the requests it runs, so PyTorch raises its own
`torch.OutOfMemoryError` above FIT requests at once. Through `batchrun.run.scheduler.Scheduler`
and real worker processes (`batchrun.workers.process.Worker`) it checks that

1. the back-off: a job started at batch size 32 runs out of memory in its worker, the worker
   classifies the real error (`batchrun.engines.oom.is_oom`), and the policy halves the size until
   it fits (32 -> 16 -> 8 -> 4), every request answered once;
2. the batch-size search (`batchrun.run.tuning.search_batch_size`) finds a size that fits, the
   sizes above FIT failing with real out-of-memory errors;
3. one request that needs twice the device on its own fails alone (`request_oom`), the others run;
4. (CUDA only) a rank the engine started (a process holding GPU memory that ignores SIGTERM, as a
   tensor-parallel rank stuck in NCCL does) is gone, and its memory with it, once the worker stops;
5. the classifier on real PyTorch errors of several shapes (scripts/gpu_oom_classify.py).

Without CUDA (or with --no-gpu) the engine simulates the same limits on the CPU, so 1-3 check the
policy's plumbing there; 4 is skipped (the suite emulates it: BATCHRUN_ECHO_SPAWN_RANKS), and 5
runs on a synthetic OutOfMemoryError and a real CPU allocator failure. Exit 0 when every check
passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # batchrun from this checkout

import gpu_check_engine

from batchrun.config import EngineSettings
from batchrun.engines.oom import is_oom
from batchrun.errors import BatchrunError
from batchrun.job.journal import JournalWriter, read_records
from batchrun.job.state import JobState
from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.run.tuning import search_batch_size
from batchrun.workers import process as worker_process

# Requests that fit at once on a worker of the check's engine (see gpu_check_engine.py).
FIT = 6
# How long a stuck rank may outlive its worker's stop.
RANK_GONE_S = 30.0


@dataclass
class Checks:
    """Checks and their outcomes."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    count: int = 0

    def expect(
        self, label: str, exc: BaseException, want_oom: bool, *, strict: bool = True
    ) -> None:
        """Check that is_oom(exc) is `want_oom`."""
        got = is_oom(exc)
        self.count += 1
        ok = got == want_oom
        kind = "OOM" if want_oom else "not OOM"
        status = "ok " if ok else ("FAIL" if strict else "WARN")
        summary = _describe(exc)
        print(f"  [{status}] {label}: expected {kind}, is_oom={got} <- {summary}")
        if not ok:
            message = f"{label}: expected {kind}, is_oom returned {got} for {summary}"
            (self.failures if strict else self.warnings).append(message)

    def check(self, label: str, ok: bool, detail: str = "") -> bool:
        """Count one check; print it."""
        self.count += 1
        print(f"  [{'ok ' if ok else 'FAIL'}] {label}" + (f": {detail}" if detail else ""))
        if not ok:
            self.failures.append(f"{label}" + (f": {detail}" if detail else ""))
        return ok

    def fail(self, message: str) -> None:
        """Count a failure."""
        self.count += 1
        print(f"  [FAIL] {message}")
        self.failures.append(message)


def _describe(exc: BaseException, limit: int = 150) -> str:
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {text}"


class Events:
    """The scheduler's reporter: its lines, printed and kept."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, message: str) -> None:
        """A line the scheduler says."""
        self.lines.append(message)
        print(f"    [batchrun] {message}")

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes journaled (counted from the journal instead)."""


def requests(n: int, huge: str | None = None) -> Iterator[Request]:
    """`n` requests r0, r1, ...; the one named `huge` asks for twice the device on its own."""
    for i in range(n):
        cid = f"r{i}"
        yield Request(cid, i + 1, CHAT, {"messages": [], "huge": cid == huge})


@contextlib.contextmanager
def scheduler(
    work: Path, name: str, env: dict[str, str], size: int
) -> Iterator[tuple[Scheduler, Events, Path]]:
    """A real Scheduler with one real worker of the check's engine, journaling to work/name."""
    settings = EngineSettings(engine=gpu_check_engine.ENGINE, max_num_seqs=size, window=size)
    path = work / f"{name}.jsonl"
    log = work / f"{name}-worker.log"
    events = Events()
    journal = JournalWriter(path).open()
    sched = Scheduler(
        settings,
        [{**env, "BATCHRUN_WORKER_LOG": str(log)}],
        JournalSink(journal, JobState()),
        events,
    )
    try:
        yield sched, events, log
    finally:
        sched.close()
        journal.close()


def records(work: Path, name: str) -> dict[str, list[dict[str, Any]]]:
    """The journal's records by custom_id."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for rec in read_records(work / f"{name}.jsonl"):
        by_id.setdefault(rec["custom_id"], []).append(rec)
    return by_id


def back_off_check(checks: Checks, work: Path, env: dict[str, str], cuda: bool) -> None:
    """1. A too-big batch backs off, halving, until it fits; nothing lost or run twice."""
    print("\n1. Back-off through the real scheduler (start at 32; fits up to", FIT, "at once):")
    started = time.monotonic()
    with scheduler(work, "backoff", env, 32) as (sched, events, log):
        stats = sched.run(requests(120))
        size = sched.batch_size
    by_id = records(work, "backoff")
    halvings = [e.split(", batch size ", 1)[1] for e in events.lines if "backing off" in e]
    checks.check(
        "every request answered once",
        len(by_id) == 120 and all(len(r) == 1 and r[0]["ok"] for r in by_id.values()),
        f"{stats.succeeded} succeeded of 120",
    )
    checks.check(
        "halved 32 -> 16 -> 8 -> 4", halvings == ["32 -> 16", "16 -> 8", "8 -> 4"], str(halvings)
    )
    checks.check("runs on at batch size 4", size == 4, f"batch size {size}")
    text = log.read_text(errors="replace") if log.exists() else ""
    real = "torch.OutOfMemoryError" in text or "torch.cuda.OutOfMemoryError" in text
    wanted = "PyTorch's own OutOfMemoryError in the worker's log"
    if cuda:
        checks.check(wanted, real and "CUDA out of memory. Tried to allocate" in text, str(log))
    else:
        checks.check(
            "the simulated OutOfMemoryError in the worker's log", "OutOfMemoryError" in text
        )
    print(f"  ({time.monotonic() - started:.1f} s)")


def search_check(checks: Checks, work: Path, env: dict[str, str]) -> None:
    """2. The batch-size search finds a size that fits; the sizes above FIT run out."""
    print("\n2. The batch-size search through the real scheduler (sizes 1..32):")
    started = time.monotonic()
    with scheduler(work, "search", env, 1) as (sched, events, _):
        result = search_batch_size(sched, requests(400), events, lo=1, hi=32)
    seen = {p.size: p.ok for p in result.probes}
    checks.check(
        "the chosen size fits", 1 <= result.size <= FIT, f"chose {result.size}; probes {seen}"
    )
    wrong = {s: ok for s, ok in seen.items() if ok != (s <= FIT)}
    checks.check(f"sizes up to {FIT} ran, larger ones ran out of memory", not wrong, str(seen))
    print(f"  ({time.monotonic() - started:.1f} s)")


def request_oom_check(checks: Checks, work: Path, env: dict[str, str]) -> None:
    """3. One request that needs more than the device fails alone with request_oom."""
    print("\n3. One request too big for the device on its own (r17 of 40, batch size 4):")
    started = time.monotonic()
    try:
        with scheduler(work, "request-oom", env, 4) as (sched, _, _):
            sched.run(requests(40, huge="r17"))
    except BatchrunError as exc:
        checks.fail(f"the job failed: {exc}")
        return
    by_id = records(work, "request-oom")
    bad = by_id.get("r17", [{}])[0]
    code = (bad.get("error") or {}).get("code")
    checks.check("r17 failed alone with request_oom", code == "request_oom", f"code {code}")
    others = [cid for cid, r in by_id.items() if cid != "r17" and r[0]["ok"] and len(r) == 1]
    checks.check("the other 39 succeeded once each", len(others) == 39, f"{len(others)}")
    print(f"  ({time.monotonic() - started:.1f} s)")


def rank_check(checks: Checks, work: Path, env: dict[str, str]) -> None:
    """4. A stuck rank holding GPU memory is gone, with its memory, once its worker stops."""
    print("\n4. A stuck rank (1 GiB of GPU memory, SIGTERM ignored) after its worker stops:")
    pids_file = work / "rank-pids.txt"
    with scheduler(work, "ranks", {**env, "BATCHRUN_GPU_CHECK_RANK_PIDS": str(pids_file)}, 4) as (
        sched,
        _,
        _,
    ):
        sched.run(requests(8))
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    if not checks.check("the engine started its rank", bool(pids)):
        return
    deadline = time.monotonic() + RANK_GONE_S
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.2)
    checks.check(
        f"the rank is gone within {RANK_GONE_S:g} s of its worker's stop",
        not alive,
        f"alive: {alive}",
    )
    holders = _compute_apps()
    if holders is None:
        print("  [skip] nvidia-smi not there: whether its memory came back is not checked")
    else:
        left = [p for p in pids if p in holders]
        checks.check("nvidia-smi lists no memory held by it", not left, f"held by {left}")
    for pid in alive:  # ours: started by this check's engine; not to outlive the check
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not count: it holds no memory)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _compute_apps() -> set[int] | None:
    """The pids nvidia-smi lists as holding GPU memory (None without nvidia-smi)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(x) for x in done.stdout.split() if x.isdigit()}


def _cuda_index(device: str) -> str | None:
    """The CUDA ordinal a worker should see (None: no CUDA here), without initialising CUDA in
    this process (its context would take memory the workers measure)."""
    probe = (
        "import torch, sys\n"
        "sys.stdout.write(str(torch.cuda.device_count()) if torch.cuda.is_available() else '0')\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
        )
        count = int(done.stdout.strip() or "0")
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if count == 0:
        return None
    index = device.partition(":")[2] or "0"
    return index if index.isdigit() and int(index) < count else None


def main(argv: list[str] | None = None) -> int:
    """Run the checks; 0 when all pass."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0", help="the CUDA device (default cuda:0)")
    parser.add_argument("--strict", action="store_true", help="also fail on best-effort checks")
    parser.add_argument("--no-gpu", action="store_true", help="check on the CPU even with CUDA")
    args = parser.parse_args(argv)

    # The workers run the check's engine: registered here and, through this entry point, in each.
    gpu_check_engine.register()
    setattr(worker_process, "worker_main", gpu_check_engine.worker_main_with_engine)  # noqa: B010
    index = None if args.no_gpu else _cuda_index(args.device)
    cuda = index is not None
    env = {
        "BATCHRUN_GPU_CHECK_FIT": str(FIT),
        "BATCHRUN_GPU_CHECK_DEVICE": "cuda" if cuda else "cpu",
    }
    if index is not None:
        # The worker sees that one GPU (the parent's entry, when the parent sees a list).
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        entries = [e.strip() for e in visible.split(",")] if visible else []
        env["CUDA_VISIBLE_DEVICES"] = entries[int(index)] if entries else index
    else:
        print("No CUDA GPU (or --no-gpu): the engine simulates the memory limits on the CPU.")
    checks = Checks()
    # The check's engine is found by the workers through the path of this script's folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")) if p
    )
    with tempfile.TemporaryDirectory(prefix="batchrun-gpu-oom-check-") as tmp:
        work = Path(tmp)
        back_off_check(checks, work, env, cuda)
        search_check(checks, work, env)
        request_oom_check(checks, work, env)
        if cuda:
            rank_check(checks, work, env)
        else:
            print(
                "\n4. [skip] stuck ranks holding GPU memory: needs CUDA (the suite emulates "
                "ranks without memory: BATCHRUN_ECHO_SPAWN_RANKS)"
            )
    print("\n5. The classifier on real PyTorch errors:")
    started = time.monotonic()
    try:
        import gpu_oom_classify
    except ImportError as exc:
        print(f"  [skip] PyTorch is not importable ({exc})")
    else:
        gpu_oom_classify.run(checks, "cpu" if not cuda else f"cuda:{index}")
        print(f"  ({time.monotonic() - started:.1f} s)")
    loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
    checks.check("vLLM was never imported", not loaded, str(loaded[:5]))

    if checks.warnings:
        print(f"\n{len(checks.warnings)} best-effort check(s) not met:")
        for w in checks.warnings:
            print(f"  - {w}")
        if args.strict:
            checks.failures.extend(checks.warnings)
    if checks.failures:
        print(f"\nFAILED: {len(checks.failures)} of {checks.count} checks:")
        for f in checks.failures:
            print(f"  - {f}")
        return 1
    where = f"CUDA device {index}" if cuda else "the CPU (simulated memory limits)"
    print(f"\nOK: {checks.count} checks passed on {where}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
