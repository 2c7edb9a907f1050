"""Real out-of-memory errors from PyTorch, classified by batchrun: part of
scripts/gpu_oom_check.py, kept apart because it imports torch (the check's worker processes must
not: on a machine without CUDA they start in a fraction of a second without it).

On CUDA it provokes real `torch.OutOfMemoryError`s on purpose (a workload of rows x seq x hidden
floats and two matmuls, doubling the rows until it runs out of memory; one impossible
allocation; an out-of-memory failure inside a matmul; the same wrapped in other exceptions, as the
worker sees them) and checks that `batchrun.engines.oom.is_oom` recognises every one, and that
ordinary CUDA errors (a shape mismatch, a device mismatch) are not taken for one. Best effort,
reported but not counted unless `--strict`: out-of-memory failures outside PyTorch's caching
allocator (a cuBLAS handle created while the device is full), which reach the worker as plain
RuntimeErrors. Without CUDA: a synthetic OutOfMemoryError and a real CPU allocator failure.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Protocol

import torch

# The workload: `rows` sequences of SEQ positions of HIDDEN float32 values, through two matmuls.
# About 3 tensors of rows x SEQ x HIDDEN x 4 bytes live at the peak: 1.5 MiB a row, so an 80 GiB
# GPU runs out between 32k and 64k rows.
SEQ = 128
HIDDEN = 1024


class CheckList(Protocol):
    """Where checks are counted (gpu_oom_check.Checks)."""

    def expect(
        self, label: str, exc: BaseException, want_oom: bool, *, strict: bool = True
    ) -> None:
        """Check that is_oom(exc) is `want_oom`."""
        ...

    def fail(self, message: str) -> None:
        """Count a failure."""
        ...


class OutOfMemoryError(RuntimeError):
    """Synthetic stand-in for torch.cuda.OutOfMemoryError (is_oom matches by class name)."""


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
    """One CUDA probe of `rows` rows: allocate, two matmuls, synchronise. Raises on out of memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gen = torch.Generator(device="cpu").manual_seed(0)
        scale = HIDDEN**-0.5
        self.w1 = (torch.randn(HIDDEN, HIDDEN, generator=gen) * scale).to(device)
        self.w2 = (torch.randn(HIDDEN, HIDDEN, generator=gen) * scale).to(device)
        self.stage = ""

    def run(self, rows: int) -> float:
        """Seconds one probe took."""
        torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        self.stage = "input"
        x = torch.empty(rows, SEQ, HIDDEN, device=self.device).uniform_(-1.0, 1.0)
        self.stage = "matmul 1"
        h = torch.relu_(x @ self.w1)
        self.stage = "matmul 2"
        y = h @ self.w2
        self.stage = "sync"
        torch.cuda.synchronize(self.device)
        checksum = float(y[0, 0, 0])  # keep the work from being skipped
        del x, h, y, checksum
        self.stage = ""
        return time.perf_counter() - started


# -- 1. classifier checks -----------------------------------------------------------------------


def classifier_checks_cpu(checks: CheckList) -> None:
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


def _non_oom_checks(checks: CheckList, device: torch.device) -> None:
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


def classifier_checks_cuda(checks: CheckList, device: torch.device, work: Workload) -> None:
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


def _outside_allocator_check(checks: CheckList, device: torch.device, work: Workload) -> None:
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


def run(checks: CheckList, device_name: str) -> None:
    """The classifier checks on `device_name` (a CUDA device) if CUDA is there, else on the CPU."""
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}")
    if torch.cuda.is_available():
        device = torch.device(device_name)
        torch.cuda.set_device(device)
        classifier_checks_cuda(checks, device, Workload(device))
    else:
        classifier_checks_cpu(checks)
