"""Start-up failures answered by their cause, not by halving the batch size (issue 27, item 5),
each with its own advice and retry decision read from vLLM's figures (issue 36, item 2).

vLLM 0.32's own wordings (from its source: v1/worker/utils.py, v1/core/kv_cache_utils.py,
v1/executor/multiproc_executor.py) are raised by the echo engine at start
(BATCHRUN_ECHO_START_ERROR, _TIMES) through real `batchrun submit` subprocesses; a tensor-parallel
rank's error read from the worker's log is driven in process (a fake worker writes the log as
vLLM's ranks do).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.cli import cli, error_line
from support.fakes.workers import begin
from support.jobs import journal_records, submit_echo
from support.lines import chat_input

from batchrun.config import EngineSettings
from batchrun.engines.startup import (
    MemoryFigures,
    StartKind,
    classify,
    classify_message,
    log_since_start,
    root_cause,
)
from batchrun.errors import BatchrunError
from batchrun.job.journal import JournalWriter
from batchrun.job.paths import command
from batchrun.job.state import JobState
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.workers.holders import memory_holders, parse_compute_apps
from batchrun.workers.messages import Eof, Fatal, Inbox
from batchrun.workers.process import Worker

FREE_MEMORY = (
    "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
    "other processes."
)
MAX_SEQ_LEN = (
    "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (2.1 GiB). Based on the "
    "available memory, the estimated maximum model length is 17344. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
    "`max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
NCCL = (
    "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3"
)
WORKER_PROC = (
    "WorkerProc initialization failed due to an exception in a background process. See stack "
    "trace for root cause."
)
RANK_OOM_LOG = """\
(Worker_TP1 pid=4711) ERROR 11-25 10:00:01 [multiproc_executor.py:953] WorkerProc failed to start.
(Worker_TP1 pid=4711) Traceback (most recent call last):
(Worker_TP1 pid=4711)   File "vllm/v1/worker/gpu_model_runner.py", line 5981, in _dummy_sampler_run
(Worker_TP1 pid=4711) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. \
GPU 1 has a total capacity of 79.19 GiB of which 1.02 GiB is free.
(Worker_TP0 pid=4710) RuntimeError: NCCL communicator was aborted on rank 0.
"""


def test_vllm_wordings_are_classified() -> None:
    assert classify_message(FREE_MEMORY).kind is StartKind.FREE_MEMORY
    cpu = (
        "Available memory on node 0 (11.2/23.4 GiB) on startup is less than desired CPU memory "
        "utilization (0.92, 21.5 GiB). On the CPU backend, ..."
    )
    assert classify_message(cpu, oom=True).kind is StartKind.FREE_MEMORY
    found = classify_message(MAX_SEQ_LEN, oom=True)
    assert (found.kind, found.estimate) == (StartKind.MAX_MODEL_LEN, 17344)
    no_blocks = "No available memory for the cache blocks. Try increasing ..."
    assert classify_message(no_blocks, oom=True).kind is StartKind.NO_KV_CACHE
    assert classify_message("OutOfMemoryError: CUDA out of memory", oom=True).kind is StartKind.OOM
    assert classify_message(NCCL).kind is StartKind.TRANSIENT
    assert classify_message("OSError: [Errno 98] Address already in use").kind is (
        StartKind.TRANSIENT
    )
    assert classify_message("ValueError: no such model").kind is StartKind.OTHER


# vLLM 0.32's memory messages, CPU build (vllm/v1/worker/cpu_worker.py) and CUDA build
# (vllm/v1/worker/utils.py request_memory), as they read with their figures.
CPU_NEGATIVE_KV = (
    "Available memory on node 0 (5.85/11.96 GiB) on kv cache allocation is less than requested "
    "memory for kv (-0.32/1.17 GiB). Reduce CPU memory used by other processes."
)
CPU_KV_OVER_FREE = (
    "Available memory on node 0 (0.85/11.96 GiB) on kv cache allocation is less than requested "
    "memory for kv (1.2/4.79 GiB). Reduce CPU memory used by other processes."
)
CPU_KV_BYTES = (
    "Available memory on node 0 ({free}/11.96 GiB) on kv cache allocation is less than requested "
    "memory for kv ({kv} GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or "
    "reduce CPU memory used by other processes."
)
CUDA_BUDGET = (
    "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than the engine's budget "
    "after excluding external process's weights (0.9, 41.27 GiB). Decrease GPU memory "
    "utilization or reduce GPU memory used by other processes."
)
CUDA_EXTERNAL = (
    "Externally held weights on device cuda:0 (70.0/79.19 GiB) exceed the desired GPU memory "
    "utilization (0.5, 39.6 GiB). Increase GPU memory utilization or reduce GPU memory used by "
    "other processes."
)
LOAD_OOM_LOG = """\
=== worker 0, pid 7, 2026-11-28 10:00:00 ===
ERROR 11-28 10:00:09 [gpu_model_runner.py:5146] Failed to load model - not enough GPU memory. \
Try lowering --gpu-memory-utilization to free memory for weights, increasing \
--tensor-parallel-size, or using --quantization. (original error: CUDA out of memory.)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total \
capacity of 79.19 GiB of which 1.02 GiB is free.
"""


def test_memory_failures_are_told_apart_by_vllms_figures_and_only_curable_ones_retried() -> None:
    negative = classify_message(CPU_NEGATIVE_KV, oom=True)
    assert negative.kind is StartKind.NO_KV_CACHE and not negative.retried
    assert negative.memory == MemoryFigures(5.85, 11.96, 1.17, -0.32, on_cpu=True)
    assert negative.memory.engine_gib == pytest.approx(1.49)
    # The KV share is positive but more than is free now: held by others, waiting may help.
    over = classify_message(CPU_KV_OVER_FREE, oom=True)
    assert (over.kind, over.retried) == (StartKind.KV_OVER_FREE, True)
    # --kv-cache-memory-bytes more than free (retried), more than the whole memory (not).
    bytes_over = classify_message(CPU_KV_BYTES.format(free="0.5", kv="2.0"), oom=True)
    assert (bytes_over.kind, bytes_over.retried) == (StartKind.KV_OVER_FREE, True)
    whole = classify_message(CPU_KV_BYTES.format(free="10.5", kv="20.0"), oom=True)
    assert (whole.kind, whole.retried) == (StartKind.KV_OVER_FREE, False)
    # The model and the engine alone past the machine's memory: no fraction would do.
    huge = CPU_NEGATIVE_KV.replace("(-0.32/1.17 GiB)", "(-1.5/11.96 GiB)")
    assert classify_message(huge, oom=True).kind is StartKind.MODEL_TOO_LARGE
    # Memory held by other processes at start-up, on either build: retried.
    for held in (FREE_MEMORY, CUDA_BUDGET):
        found = classify_message(held, oom=True)
        assert (found.kind, found.retried) == (StartKind.FREE_MEMORY, True)
        assert found.memory is not None and not found.memory.on_cpu
    external = classify_message(CUDA_EXTERNAL, oom=True)
    assert (external.kind, external.retried) == (StartKind.NO_KV_CACHE, False)
    # PyTorch's out-of-memory error while vLLM loads the weights (its log says so): the model
    # is larger than the GPU; the same error elsewhere (profiling, warm-up) backs off.
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB."
    too_large = classify(oom, True, LOAD_OOM_LOG)
    assert (too_large.kind, too_large.retried) == (StartKind.MODEL_TOO_LARGE, False)
    assert classify(oom, True, RANK_OOM_LOG).kind is StartKind.OOM
    found = classify(f"RuntimeError: {WORKER_PROC}", False, LOAD_OOM_LOG)
    assert (found.kind, found.from_log) == (StartKind.MODEL_TOO_LARGE, True)


def test_a_rank_error_is_read_from_the_log_when_the_message_only_points_there() -> None:
    assert root_cause(RANK_OOM_LOG) == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 1 has a "
        "total capacity of 79.19 GiB of which 1.02 GiB is free."
    )
    found = classify(f"RuntimeError: {WORKER_PROC}", False, RANK_OOM_LOG)
    assert (found.kind, found.from_log) == (StartKind.OOM, True)
    # A message with its own cause is not second-guessed from the log.
    assert classify(f"RuntimeError: {NCCL}", False, RANK_OOM_LOG).kind is StartKind.TRANSIENT


def test_only_the_last_start_of_the_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_text(
        f"\n=== worker 0, pid 1, 2026-11-25 10:00:00 ===\n{RANK_OOM_LOG}"
        "\n=== worker 0, pid 2, 2026-11-25 10:01:00 ===\nValueError: something else\n"
    )
    text = log_since_start(log)
    assert text is not None and text.startswith("=== worker 0, pid 2") and "OutOfMemory" not in text
    assert log_since_start(tmp_path / "missing.log") is None


# -- nvidia-smi's list of what holds GPU memory --------------------------------------------------


def fake_nvidia_smi(bin_dir: Path, apps: str) -> Path:
    """An nvidia-smi first on PATH that lists `apps` for --query-compute-apps (nothing else)."""
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "if any(a.startswith('--query-compute-apps') for a in sys.argv[1:]):\n"
        f"    sys.stdout.write({apps!r})\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def test_memory_holders_names_the_processes_nvidia_smi_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert parse_compute_apps("4242, python3, 70000\n17, my, app, 512\n[N/A]\n") == [
        (4242, "python3", 70000),
        (17, "my, app", 512),
    ]
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "bin", "4242, python3, 70000\n")))
    assert memory_holders() == "held by pid 4242 python3 (70000 MiB)"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert memory_holders() == "nvidia-smi is not on PATH, so what holds the memory is not known"


# -- through `batchrun submit --engine echo` -----------------------------------------------------


def submit(tmp_path: Path, env: dict[str, str], n: int = 20, *extra: str) -> tuple[Any, Path]:
    src = chat_input(tmp_path / "in.jsonl", n, "m")
    job = tmp_path / "job"
    r = submit_echo(
        src, job, "--batch-size", "16", *extra, env={"BATCHRUN_START_RETRY_DELAY_S": "0", **env}
    )
    return r, job


def saved(job: Path) -> str:
    """How a start failure's line ends: what is kept, then the command that goes on."""
    return (
        "Everything finished so far is saved; once the cause is fixed, continue with: "
        + command("resume", job)
    )


def starts(stderr: str) -> int:
    return len(re.findall(r"^\[batchrun\] worker 0 starting echo engine", stderr, re.M))


def test_free_memory_at_start_three_starts_then_one_line_naming_the_option_and_the_holder(
    tmp_path: Path,
) -> None:
    bin_dir = fake_nvidia_smi(tmp_path / "bin", "4242, python3, 70000\n")
    env = {
        "BATCHRUN_ECHO_START_ERROR": FREE_MEMORY,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    r, job = submit(tmp_path, env, 20, "--gpu-memory-utilization", "0.9")
    assert r.returncode == 1, r.stderr
    assert starts(r.stderr) == 3, r.stderr
    assert "batch size 16 (start 2 of 3)" in r.stderr and "backing off" not in r.stderr
    assert error_line(r.stderr) == (
        "error: not enough free memory to start the engine, 3 starts in a row (RuntimeError: "
        "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 71.27 GiB)); held by pid 4242 python3 (70000 MiB). Free that "
        f"memory, or lower --gpu-memory-utilization (now 0.9). {saved(job)}"
    )
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_free_memory_twice_then_the_job_runs_at_the_same_batch_size(tmp_path: Path) -> None:
    env = {"BATCHRUN_ECHO_START_ERROR": FREE_MEMORY, "BATCHRUN_ECHO_START_ERROR_TIMES": "2"}
    r, job = submit(tmp_path, env, 30)
    assert r.returncode == 0, r.stderr
    assert starts(r.stderr) == 3, r.stderr
    assert "out of memory" not in r.stderr and "backing off" not in r.stderr
    assert "worker 0 ready (pid " in r.stderr and ", batch size 16, started in" in r.stderr
    assert len(journal_records(job)) == 30
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["batch_size"] == 16 and status["requests"]["succeeded"] == 30


def test_max_seq_len_too_large_stops_at_once_naming_max_model_len_and_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KV cache sized by the memory fraction (vLLM's default), not the tests' fixed one
    # (conftest.py): the fix then names --gpu-memory-utilization.
    monkeypatch.delenv("BATCHRUN_KV_CACHE_MEMORY_BYTES", raising=False)
    env = {"BATCHRUN_ECHO_START_ERROR": MAX_SEQ_LEN}
    r, job = submit(tmp_path, env, 5, "--max-model-len", "131072")
    assert r.returncode == 1, r.stderr
    assert starts(r.stderr) == 1, r.stderr
    assert error_line(r.stderr) == (
        "error: --max-model-len 131072 does not fit in the KV cache (RuntimeError: To serve at least one "
        "request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (2.1 GiB)); vLLM estimates the longest that "
        "fits at 17344 tokens: set --max-model-len 17344 or lower, or raise "
        f"--gpu-memory-utilization. {saved(job)}"
    )


def test_a_fraction_below_the_models_own_need_stops_at_once_saying_to_raise_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM-cpu's negative KV share: the fix is a larger fraction, never a smaller one, and no
    wait or second start changes it."""
    monkeypatch.delenv("BATCHRUN_KV_CACHE_MEMORY_BYTES", raising=False)
    env = {"BATCHRUN_ECHO_START_ERROR": CPU_NEGATIVE_KV}
    r, job = submit(tmp_path, env, 5, "--gpu-memory-utilization", "0.1")
    assert r.returncode == 1, r.stderr
    assert starts(r.stderr) == 1, r.stderr
    assert error_line(r.stderr) == (
        "error: --gpu-memory-utilization (now 0.1) is below what the model and the engine take "
        "(1.49 of 11.96 GiB), which leaves the KV cache nothing (RuntimeError: Available memory "
        "on node 0 (5.85/11.96 GiB) on kv cache allocation is less than requested memory for kv "
        f"(-0.32/1.17 GiB)); raise --gpu-memory-utilization above 0.13. {saved(job)}"
    )


def test_a_kv_cache_over_free_memory_is_retried_then_names_the_kv_option(tmp_path: Path) -> None:
    env = {"BATCHRUN_ECHO_START_ERROR": CPU_KV_BYTES.format(free="0.5", kv="2.0")}
    r, job = submit(tmp_path, env, 5, "--kv-cache-memory-bytes", "2147483648")
    assert r.returncode == 1, r.stderr
    assert starts(r.stderr) == 3, r.stderr
    assert "(not enough free memory for the KV cache: RuntimeError:" in r.stderr
    assert error_line(r.stderr) == (
        "error: not enough free memory for the KV cache, 3 starts in a row (RuntimeError: "
        "Available memory on node 0 (0.5/11.96 GiB) on kv cache allocation is less than "
        "requested memory for kv (2.0 GiB)); other processes on this machine hold its memory. "
        f"Free that memory, or lower --kv-cache-memory-bytes (now 2,147,483,648). {saved(job)}"
    )
    # More than the whole memory: no wait can help, one start.
    env = {"BATCHRUN_ECHO_START_ERROR": CPU_KV_BYTES.format(free="10.5", kv="20.0")}
    (tmp_path / "whole").mkdir()
    r, job = submit(tmp_path / "whole", env, 5, "--kv-cache-memory-bytes", str(20 * 2**30))
    assert r.returncode == 1, r.stderr
    assert starts(r.stderr) == 1, r.stderr
    assert error_line(r.stderr).startswith(
        "error: the KV cache asked for is more than the whole memory (11.96 GiB) (RuntimeError: "
    )
    assert error_line(r.stderr).endswith(
        f"; give --kv-cache-memory-bytes less (now 21,474,836,480). {saved(job)}"
    )


def test_an_nccl_system_error_once_is_retried_and_the_job_completes(tmp_path: Path) -> None:
    env = {"BATCHRUN_ECHO_START_ERROR": NCCL, "BATCHRUN_ECHO_START_ERROR_TIMES": "1"}
    r, job = submit(tmp_path, env, 20)
    assert r.returncode == 0, r.stderr
    assert starts(r.stderr) == 2, r.stderr
    assert (
        "worker 0 could not start (a failure that usually passes: RuntimeError: NCCL error: "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3); "
        "starting it again in 0s at batch size 16 (start 2 of 3)"
    ) in r.stderr
    assert len(journal_records(job)) == 20


# -- a tensor-parallel rank's error, read from the worker's log ----------------------------------


class RankFailingWorker(Worker):
    """Fails its start as vLLM does when a TP rank fails: the rank's error in the worker's log
    (vLLM's ranks inherit its stderr), the worker's own message only "WorkerProc ... failed"."""

    starts: ClassVar[int] = 0
    windows: ClassVar[list[int]] = []

    def start(self, inbox: Inbox) -> None:
        begin(self, inbox)
        RankFailingWorker.starts += 1
        RankFailingWorker.windows.append(self.settings.window)
        assert self.log is not None
        with open(self.log, "a") as f:
            f.write(f"\n=== worker 0, pid 1, 2026-11-25 10:00:00 ===\n{RANK_OOM_LOG}")
        inbox.put(
            (self.index, self.generation, Fatal(oom=False, message=f"RuntimeError: {WORKER_PROC}"))
        )
        inbox.put((self.index, self.generation, Eof()))

    def _on_eof(self) -> None:
        pass

    def stop(self, timeout: float = 10.0) -> None:
        self.process = None


def test_a_rank_oom_behind_workerproc_initialization_failed_is_recognised(tmp_path: Path) -> None:
    from support.fakes.workers import Events, requests

    RankFailingWorker.starts, RankFailingWorker.windows = 0, []
    settings = EngineSettings(engine="echo", max_num_seqs=4, window=4)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    events = Events()
    env = {"BATCHRUN_WORKER_LOG": str(tmp_path / "worker-0.log")}
    scheduler = Scheduler(
        settings, [env], JournalSink(journal, JobState()), events, RankFailingWorker
    )
    with pytest.raises(BatchrunError, match="out of memory even at batch size 1"):
        scheduler.run(iter(requests(3)))
    journal.close()
    # Recognised as an out-of-memory error of the profiling pass (sized by the batch): backed off.
    assert RankFailingWorker.windows == [4, 2, 1]
    assert events.lines[1] == (
        "worker 0 ran out of memory at batch size 4 while starting (read from its log: "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 1 has a "
        "total capacity of 79.19 GiB of which 1.02 GiB is free.)"
    )


def test_messages_are_one_line_and_keep_vllms_facts_not_its_advice() -> None:
    from batchrun.engines.startup import first_sentence

    assert first_sentence(FREE_MEMORY) == (
        "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 71.27 GiB)"
    )
    assert first_sentence("NCCL error:\n  unhandled system error. Retry.") == (
        "NCCL error: unhandled system error"
    )
