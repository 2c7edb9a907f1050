"""Check batchrun's out-of-memory handling against real CUDA out-of-memory errors.

    python scripts/gpu_oom_check.py [--hi ROWS] [--lo ROWS] [--strict]

Needs only PyTorch and batchrun (never vLLM): the GPU machines this runs on have CUDA PyTorch but
no vLLM. On a CUDA machine it

1. provokes real `torch.cuda.OutOfMemoryError`s on purpose (a workload of rows x seq x hidden floats
   and two matmuls, doubling the rows until it runs out of memory; one impossible allocation; an
   out-of-memory failure inside a matmul; the same wrapped in other exceptions, as the worker sees
   them) and checks that `batchrun.engines.oom.is_oom` recognises every one, and that ordinary CUDA
   errors (a shape mismatch, a device mismatch) are not taken for one;
2. drives `batchrun.sizing.BatchSizeSearch` with real probes of that workload between `--lo` and
   `--hi` rows, catching the real out-of-memory errors (`torch.cuda.empty_cache()` after each);
3. backs off with `batchrun.sizing.back_off` from the smallest size that ran out of memory until
   a size runs;

and prints a table: phase, size, ok/OOM, seconds, throughput (rows/s), peak memory
(`torch.cuda.max_memory_allocated`). It exits 1 if a real out-of-memory error is not recognised, a
non-OOM error is taken for one, or the search does not converge.

Best effort, reported but not counted unless `--strict`: out-of-memory failures that happen outside
PyTorch's caching allocator (a cuBLAS handle created while the device is full), which reach the
worker as plain RuntimeErrors.

Without CUDA it says so, runs the classifier checks on a synthetic exception class named
OutOfMemoryError and on a real CPU allocator failure, drives the same search over a small CPU
workload with a simulated memory cap, and exits 0 when all of that passes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # batchrun from this checkout

import torch

from batchrun.engines.oom import is_oom
from batchrun.run.sizing import BatchSizeSearch, Probe, back_off

# The workload: `rows` sequences of SEQ positions of HIDDEN float32 values, through two matmuls.
# About 3 tensors of rows x SEQ x HIDDEN x 4 bytes live at the peak: 1.5 MiB a row, so an 80 GiB
# GPU runs out between 32k and 64k rows, well inside the default bounds.
SEQ = 128
HIDDEN = 1024
ROW_BYTES = SEQ * HIDDEN * 4

# The CPU stand-in: a small workload and a simulated memory cap.
CPU_SEQ = 8
CPU_HIDDEN = 64
CPU_CAP_BYTES = 64 * 2**20


class OutOfMemoryError(RuntimeError):
    """Synthetic stand-in for torch.cuda.OutOfMemoryError (is_oom matches by class name)."""


@dataclass
class Checks:
    """Classifier checks and their outcomes."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    count: int = 0

    def expect(
        self, label: str, exc: BaseException, want_oom: bool, *, strict: bool = True
    ) -> None:
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

    def fail(self, message: str) -> None:
        print(f"  [FAIL] {message}")
        self.failures.append(message)


def _describe(exc: BaseException, limit: int = 150) -> str:
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {text}"


def _wrapped(inner: BaseException, *, explicit: bool) -> BaseException:
    """`inner` as the worker may see it: wrapped in another exception, `from` it or during it."""
    try:
        try:
            raise inner
        except BaseException as exc:
            if explicit:
                raise RuntimeError("engine step failed") from exc
            raise ValueError("error while handling a failed step")  # noqa: B904
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


# torch.OutOfMemoryError is new in PyTorch 2.5; torch.cuda.OutOfMemoryError is older.
_OOM_TYPES: tuple[type[BaseException], ...] = tuple(
    t
    for t in (
        getattr(torch, "OutOfMemoryError", None),
        getattr(torch.cuda, "OutOfMemoryError", None),
        MemoryError,
    )
    if isinstance(t, type)
)


def _looks_like_oom(exc: BaseException) -> bool:
    """A failure that is certainly about memory, whatever is_oom says (to catch what it misses)."""
    if isinstance(exc, _OOM_TYPES):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "alloc_failed" in text or "can't allocate memory" in text


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# -- workloads ----------------------------------------------------------------------------------


class Workload:
    """One probe of `rows` rows: allocate, two matmuls, synchronise. Raises on out of memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.seq, self.hidden = (SEQ, HIDDEN) if self.cuda else (CPU_SEQ, CPU_HIDDEN)
        gen = torch.Generator(device="cpu").manual_seed(0)
        scale = self.hidden**-0.5
        self.w1 = (torch.randn(self.hidden, self.hidden, generator=gen) * scale).to(device)
        self.w2 = (torch.randn(self.hidden, self.hidden, generator=gen) * scale).to(device)
        self.stage = ""

    def bytes_for(self, rows: int) -> int:
        return 3 * rows * self.seq * self.hidden * 4

    def run(self, rows: int) -> tuple[float, float | None]:
        """(seconds, peak memory in MiB) of one probe."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.bytes_for(rows) > CPU_CAP_BYTES:
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {self.bytes_for(rows) / 2**20:.2f} MiB "
                f"(simulated on CPU: cap {CPU_CAP_BYTES / 2**20:.0f} MiB)"
            )
        started = time.perf_counter()
        self.stage = "input"
        x = torch.empty(rows, self.seq, self.hidden, device=self.device).uniform_(-1.0, 1.0)
        self.stage = "matmul 1"
        h = torch.relu_(x @ self.w1)
        self.stage = "matmul 2"
        y = h @ self.w2
        self.stage = "sync"
        if self.cuda:
            torch.cuda.synchronize(self.device)
        checksum = float(y[0, 0, 0])  # keep the work from being skipped
        seconds = time.perf_counter() - started
        del x, h, y, checksum
        self.stage = ""
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            peak = self.bytes_for(rows) / 2**20  # an estimate: the three live tensors
        return seconds, peak


# -- 1. classifier checks -----------------------------------------------------------------------


def classifier_checks_cpu(checks: Checks) -> None:
    print("Classifier checks (synthetic OutOfMemoryError, real CPU errors):")
    synthetic = OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 3.12 GiB is free."
    )
    checks.expect("synthetic OutOfMemoryError", synthetic, True)
    checks.expect("synthetic, raised from", _wrapped(synthetic, explicit=True), True)
    checks.expect("synthetic, raised during", _wrapped(synthetic, explicit=False), True)
    checks.expect(
        "synthetic class name, other message", OutOfMemoryError("allocation failed"), True
    )
    # A real allocation failure of PyTorch's CPU allocator: 1 PiB is refused at once.
    try:
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as exc:
        checks.expect("real CPU allocator failure (1 PiB)", exc, True)
    else:
        print("  [skip] a 1 PiB CPU allocation succeeded (overcommit?); not checked")
    _free()
    _non_oom_checks(checks, torch.device("cpu"))


def _non_oom_checks(checks: Checks, device: torch.device) -> None:
    try:
        torch.ones(2, 3, device=device) @ torch.ones(4, 5, device=device)
    except RuntimeError as exc:
        checks.expect(f"shape mismatch on {device.type}", exc, False)
        checks.expect(
            f"shape mismatch on {device.type}, wrapped", _wrapped(exc, explicit=True), False
        )
    if device.type == "cuda":
        try:
            torch.ones(2, 2, device=device) @ torch.ones(2, 2)
        except RuntimeError as exc:
            checks.expect("device mismatch (cuda @ cpu)", exc, False)
    try:
        torch.ones(2, device=device).view(3)
    except RuntimeError as exc:
        checks.expect(f"invalid view on {device.type}", exc, False)
    checks.expect("ValueError", ValueError("temperature must be non-negative"), False)


def classifier_checks_cuda(checks: Checks, device: torch.device, work: Workload) -> None:
    print(f"Classifier checks on {torch.cuda.get_device_name(device)} (real CUDA errors):")
    free, total = torch.cuda.mem_get_info(device)
    print(f"  memory: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")

    # a) Grow the workload, doubling the rows, until it runs out of memory.
    rows, grown = 1024, 0
    while rows <= 2**24:
        try:
            work.run(rows)
        except Exception as exc:
            stage = work.stage
            if not _looks_like_oom(exc):
                raise
            checks.expect(f"workload OOM at {rows} rows (during {stage})", exc, True)
            checks.expect("  the same, raised from", _wrapped(exc, explicit=True), True)
            checks.expect("  the same, raised during", _wrapped(exc, explicit=False), True)
            grown += 1
            break
        rows *= 2
    if not grown:
        checks.fail(f"the workload never ran out of memory up to {rows // 2} rows")
    _free()

    # b) One impossible allocation (twice the device's memory).
    try:
        torch.empty(2 * total, dtype=torch.uint8, device=device)
    except Exception as exc:
        if not _looks_like_oom(exc):
            raise
        checks.expect("impossible allocation (2x the device)", exc, True)
    _free()

    # c) Running out inside a matmul: the input fits, its product does not.
    free, _ = torch.cuda.mem_get_info(device)
    n = int(free * 0.6) // (HIDDEN * 4)
    x = None
    stage = "the input"
    try:
        x = torch.empty(n, HIDDEN, device=device).uniform_(-1.0, 1.0)
        stage = "the matmul"
        y = x @ work.w1
        torch.cuda.synchronize(device)
        del y
        print("  [skip] the matmul fitted after all; no in-matmul OOM to check")
    except Exception as exc:
        if not _looks_like_oom(exc):
            raise
        checks.expect(f"OOM in {stage} (sized so the input fits, its product not)", exc, True)
    del x
    _free()

    # d) Ordinary CUDA errors are not out-of-memory failures.
    _non_oom_checks(checks, device)
    _free()

    # e) Best effort: out of memory outside the caching allocator.
    _outside_allocator_check(checks, device, work)
    _free()


def _outside_allocator_check(checks: Checks, device: torch.device, work: Workload) -> None:
    """Fill the device, then do a matmul in a new thread: it needs a new cuBLAS handle, which
    cuBLAS allocates itself (not through PyTorch's allocator)."""
    ballast: list[torch.Tensor] = []
    chunk = 1 << 30
    try:
        while chunk >= 1 << 20:
            try:
                ballast.append(torch.empty(chunk, dtype=torch.uint8, device=device))
            except Exception as exc:
                if not _looks_like_oom(exc):
                    raise
                chunk //= 4
        caught: list[BaseException] = []

        def in_thread() -> None:
            try:
                a = torch.ones(64, 64, device=device)
                (a @ a).sum().item()
            except BaseException as exc:
                caught.append(exc)

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        if caught:
            checks.expect(
                "small matmul in a new thread with the device full (new cuBLAS handle)",
                caught[0],
                _looks_like_oom(caught[0]),
                strict=False,
            )
            if not _looks_like_oom(caught[0]):
                print("         (not a memory error; shown for information)")
        else:
            print("  [skip] the matmul in a new thread ran with the device full; nothing to check")
    finally:
        ballast.clear()
        _free()


# -- 2. and 3. search and back-off ---------------------------------------------------------------


@dataclass
class Row:
    phase: str
    size: int
    ok: bool
    seconds: float
    rows_per_s: float
    peak_mb: float | None
    note: str = ""


def probe(work: Workload, size: int, checks: Checks) -> tuple[Probe, str]:
    """Run one size; a real OOM becomes a failed Probe (and must be recognised)."""
    try:
        seconds, peak = work.run(size)
    except Exception as exc:
        if not _looks_like_oom(exc):
            raise
        note = f"during {work.stage}" if work.stage else ""
        if not is_oom(exc):
            checks.fail(f"a real out-of-memory error at {size} rows was not recognised: {exc}")
            note += " NOT RECOGNISED"
        peak = torch.cuda.max_memory_allocated(work.device) / 2**20 if work.cuda else None
    else:
        rate = size / seconds if seconds > 0 else 0.0
        return Probe(size, True, size, seconds, rate, peak), ""
    # Outside the except block: the exception's traceback no longer holds the probe's tensors.
    _free()
    return Probe(size=size, ok=False, requests=size, peak_memory_mb=peak, note="oom"), note


def search_and_back_off(work: Workload, lo: int, hi: int, checks: Checks) -> list[Row]:
    rows: list[Row] = []
    work.run(min(lo, 8))  # warm up (kernels, cuBLAS handle) so the first probe's time is fair

    def record(phase: str, p: Probe, note: str) -> None:
        rows.append(Row(phase, p.size, p.ok, p.seconds, p.tokens_per_s, p.peak_memory_mb, note))

    search = BatchSizeSearch(lo=lo, hi=hi)
    limit = 2 * len(search.sizes) + 4
    steps = 0
    while (size := search.next_size()) is not None:
        steps += 1
        if steps > limit:
            checks.fail(f"the batch-size search did not converge in {limit} probes")
            break
        p, note = probe(work, size, checks)
        search.report(p)
        record("search", p, note)
    best = search.best()
    ooms = sorted(p.size for p in search.probes if not p.ok)
    largest_ok = search.largest_ok()
    if best is None:
        checks.fail(f"the search found no size that runs between {lo} and {hi}")
    else:
        print(
            f"Search: {steps} probes; largest size that ran {largest_ok}; "
            f"smallest that ran out of memory {ooms[0] if ooms else 'none'}; best {best.size} "
            f"({best.tokens_per_s:,.0f} rows/s)"
        )
        if ooms and largest_ok is not None and largest_ok >= ooms[0]:
            checks.fail(
                f"inconsistent search: {largest_ok} ran but the smaller {ooms[0]} ran out of memory"
            )
    if not ooms:
        print(f"Search: no size up to {hi} ran out of memory; nothing to back off from")
        return rows

    # Back off from the smallest size that ran out of memory, as the scheduler does.
    current: int | None = ooms[0]
    backoffs = 0
    while current is not None:
        p, note = probe(work, current, checks)
        record("back-off", p, note)
        if p.ok:
            print(f"Back-off: {ooms[0]} -> {current} in {backoffs} halvings; it runs")
            if largest_ok is not None and current > largest_ok:
                print(f"  note: {current} ran now though the search saw it fail (memory is noisy)")
            break
        backoffs += 1
        current = back_off(current)
        if backoffs > 64:
            current = None
    if current is None:
        checks.fail(f"backing off from {ooms[0]} reached no size that runs")
    return rows


def print_table(rows: list[Row], cuda: bool) -> None:
    mem = "peak memory" if cuda else "memory (est.)"
    head = ["phase", "size", "result", "seconds", "rows/s", mem, "note"]
    body = [
        [
            r.phase,
            f"{r.size:,}",
            "ok" if r.ok else "OOM",
            f"{r.seconds:.3f}" if r.ok else "-",
            f"{r.rows_per_s:,.0f}" if r.ok else "-",
            f"{r.peak_mb:,.0f} MiB" if r.peak_mb is not None else "-",
            r.note,
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    right = {1, 3, 4, 5}
    fmt: Callable[[list[str]], str] = lambda cells: "  ".join(  # noqa: E731
        c.rjust(w) if i in right else c.ljust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )
    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    for b in body:
        print(fmt(b))


# -- main ---------------------------------------------------------------------------------------


def _check_no_vllm(checks: Checks) -> None:
    loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
    if loaded:
        checks.fail(f"importing batchrun.sizing / batchrun.engines.oom loaded vLLM: {loaded[:5]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lo", type=int, default=1, help="smallest size to search (rows)")
    parser.add_argument("--hi", type=int, default=2**20, help="largest size to search (rows)")
    parser.add_argument("--strict", action="store_true", help="also fail on the best-effort checks")
    parser.add_argument("--device", default="cuda:0", help="the CUDA device (default cuda:0)")
    args = parser.parse_args(argv)

    checks = Checks()
    _check_no_vllm(checks)
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}")
    if torch.cuda.is_available():
        device = torch.device(args.device)
        torch.cuda.set_device(device)
        work = Workload(device)
        classifier_checks_cuda(checks, device, work)
        print(
            f"\nBatch-size search on a real workload: rows x {SEQ} x {HIDDEN} float32, two matmuls "
            f"({ROW_BYTES * 3 / 2**20:.1f} MiB a row at the peak), rows in {args.lo}..{args.hi}"
        )
        rows = search_and_back_off(work, args.lo, args.hi, checks)
        print_table(rows, cuda=True)
    else:
        print("No CUDA GPU available: checking the classifier on a synthetic OutOfMemoryError,")
        print("and the search on a small CPU workload with a simulated memory cap.\n")
        classifier_checks_cpu(checks)
        work = Workload(torch.device("cpu"))
        print(
            f"\nBatch-size search on CPU (simulated cap {CPU_CAP_BYTES / 2**20:.0f} MiB): rows x "
            f"{CPU_SEQ} x {CPU_HIDDEN} float32, two matmuls, rows in {args.lo}..{args.hi}"
        )
        rows = search_and_back_off(work, args.lo, args.hi, checks)
        print_table(rows, cuda=False)
    _check_no_vllm(checks)

    if checks.warnings:
        print(f"\n{len(checks.warnings)} best-effort check(s) not met:")
        for w in checks.warnings:
            print(f"  - {w}")
        if args.strict:
            checks.failures.extend(checks.warnings)
    if checks.failures:
        print(f"\nFAILED: {len(checks.failures)} problem(s):")
        for f in checks.failures:
            print(f"  - {f}")
        return 1
    print(f"\nOK: {checks.count} classifier checks passed; the search converged and backed off.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
