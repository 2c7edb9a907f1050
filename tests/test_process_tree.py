"""A worker's whole process tree dies with it (workers/process_group.py): the ranks an engine starts
(BATCHRUN_ECHO_SPAWN_RANKS: processes that ignore SIGTERM and never exit, as tensor-parallel
ranks stuck in NCCL do) are gone when the worker crashes, when the job ends, when the parent is
killed with SIGKILL, and before a restarted worker starts; a worker whose parent died before its
death signal was armed exits at once."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.cli import cli_process, start_cli
from support.lines import chat_input
from support.paths import ROOT
from support.processes import worker_pids
from support.waits import wait_until

from batchrun.config import EngineSettings
from batchrun.workers import gpu_release, process_group
from batchrun.workers.gpu_release import wait_for_gpus
from batchrun.workers.messages import Inbox
from batchrun.workers.process import Worker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie is dead: only its exit status is left)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _input(tmp_path: Path, n: int) -> Path:
    return chat_input(tmp_path / "in.jsonl", n, "hello")


def _rank_env(pids: Path, **extra: str) -> dict[str, str]:
    return {"BATCHRUN_ECHO_SPAWN_RANKS": "2", "BATCHRUN_ECHO_RANK_PIDS": str(pids), **extra}


def _submit(tmp_path: Path, n: int, *args: str) -> list[str]:
    job = tmp_path / "job"
    return ["submit", str(_input(tmp_path, n)), "--job-dir", str(job), "--engine", "echo",
            "--no-progress", *args]  # fmt: skip


def _kill_all(pids: list[int]) -> None:
    """Clean up after a failing test: no rank may outlive it."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_ranks_die_with_a_finished_job(tmp_path: Path) -> None:
    pids = tmp_path / "ranks"
    # A process of its own: what is tested is that it waits for its workers' groups to be gone.
    r = cli_process(*_submit(tmp_path, 6, "--batch-size", "2"), env=_rank_env(pids))
    ranks = _pids(pids)
    try:
        assert r.returncode == 0, r.stderr
        assert len(ranks) == 2
        # The parent waited for the worker's group to be gone before it exited.
        assert [p for p in ranks if _alive(p)] == []
    finally:
        _kill_all(ranks)


@pytest.mark.slow
def test_ranks_die_when_the_worker_crashes(tmp_path: Path) -> None:
    """The crashed worker's ranks are killed while the job runs on with a fresh worker."""
    pids = tmp_path / "ranks"
    p = start_cli(
        *_submit(tmp_path, 40, "--batch-size", "1"),
        env=_rank_env(pids, BATCHRUN_ECHO_CRASH_AFTER="3", BATCHRUN_ECHO_DELAY_MS="300"),
    )
    try:
        wait_until(lambda: len(_pids(pids)) >= 4, "a second worker started its ranks", 60)
        first = _pids(pids)[:2]
        wait_until(lambda: not any(map(_alive, first)), "the crashed worker's ranks are dead", 10)
        assert p.poll() is None  # killed by the running job, not at its exit
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        _kill_all(_pids(pids))


def test_ranks_are_gone_before_a_restarted_worker_starts(tmp_path: Path) -> None:
    pids = tmp_path / "ranks"
    p = start_cli(
        *_submit(tmp_path, 40, "--batch-size", "1"),
        env=_rank_env(pids, BATCHRUN_ECHO_CRASH_AFTER="2", BATCHRUN_ECHO_DELAY_MS="50"),
    )
    try:
        # Each worker's ranks are started by its engine: when the next worker's are recorded,
        # every earlier worker's must already be dead (no grace period).
        for n in (4, 6):

            def recorded(n: int = n) -> bool:
                return len(_pids(pids)) >= n

            wait_until(recorded, f"worker {n // 2} started its ranks", 60)
            earlier = _pids(pids)[: n - 2]
            assert [pid for pid in earlier if _alive(pid)] == []
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        _kill_all(_pids(pids))


@pytest.mark.parametrize(
    "fault",
    [{"BATCHRUN_ECHO_DELAY_MS": "1000"}, {"BATCHRUN_ECHO_HANG_AFTER": "1"}],
    ids=["busy", "engine-step-hung"],
)
def test_ranks_die_when_the_parent_is_killed(tmp_path: Path, fault: dict[str, str]) -> None:
    pids = tmp_path / "ranks"
    p = start_cli(*_submit(tmp_path, 40, "--batch-size", "1"), env=_rank_env(pids, **fault))
    tree: list[int] = []
    try:
        wait_until(lambda: len(_pids(pids)) >= 2, "the worker started its ranks", 60)
        time.sleep(0.5)  # the engine at work (or stuck in its step)
        tree = _pids(pids) + worker_pids(p.pid)
        assert len(tree) == 3
        os.kill(p.pid, signal.SIGKILL)  # the parent alone: its worker is not told
        p.wait()
        wait_until(lambda: not any(map(_alive, tree)), "the worker's tree died with the parent", 10)
    finally:
        _kill_all(_pids(pids) + tree)


def test_a_worker_whose_parent_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    """The parent dies before the worker arms its death signal: the worker exits instead of
    starting an engine that nobody would ever stop."""
    pids = tmp_path / "ranks"
    worker = textwrap.dedent(
        f"""
        import os, sys, time
        from multiprocessing import Pipe
        parent = int(sys.argv[1])
        while os.getppid() == parent:  # the parent is gone before the worker goes on
            time.sleep(0.01)
        from batchrun.workers.child import worker_main
        mine, theirs = Pipe()
        os.environ.update({{"BATCHRUN_ECHO_SPAWN_RANKS": "1",
                            "BATCHRUN_ECHO_RANK_PIDS": {str(pids)!r}}})
        worker_main(theirs, {{"engine": "echo"}}, {{}}, "0", parent)
        """
    )
    # A harness adopts the orphan (a child subreaper), so that its exit status can be read.
    harness = textwrap.dedent(
        f"""
        import ctypes, os, subprocess, sys
        ctypes.CDLL("libc.so.6").prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        parent = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys, os; "
            "subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())])",
            {worker!r}])
        parent.wait()  # the worker's parent has exited; the worker is now ours
        pid, status = os.wait()
        print(os.waitstatus_to_exitcode(status))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", harness], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    try:
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(process_group.PARENT_GONE_EXIT), r.stderr
        assert _pids(pids) == []  # no engine was started
    finally:
        _kill_all(_pids(pids))


def test_kill_group_reaches_an_orphaned_rank(tmp_path: Path) -> None:
    """The group outlives its leader: a dead worker's ranks are killed by the pid it had."""
    code = textwrap.dedent(
        """
        import os, subprocess, sys
        os.setsid()
        rank = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        print(rank.pid, flush=True)
        os._exit(0)
        """
    )
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None
    rank = int(leader.stdout.readline())
    leader.wait()
    try:
        assert process_group.group_members(leader.pid) == [rank]
        process_group.kill_group(leader.pid)
        assert process_group.wait_group_gone(leader.pid, timeout=10)
        assert not _alive(rank)
    finally:
        _kill_all([rank])


def test_wait_group_gone_is_bounded() -> None:
    started = time.monotonic()
    assert not process_group.wait_group_gone(os.getpgrp(), timeout=0.2)  # this test's own group
    assert time.monotonic() - started < 5


class _Gpus:
    """NVML's readings of one GPU, in turn (the last one repeats)."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = readings
        self.read_at: list[float] = []

    def __call__(self, devices: Sequence[str]) -> list[float] | None:
        assert list(devices) == ["0"]
        self.read_at.append(time.monotonic())
        return [self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]]


@pytest.fixture
def no_gpu_used_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process has started no engine on any GPU before."""
    monkeypatch.setattr(gpu_release, "_BASELINES", {})


@pytest.mark.usefixtures("no_gpu_used_yet")
def test_a_restart_waits_until_the_gpus_memory_is_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before a worker starts again on its GPU, NVML must show the GPU back to what it held
    before the first start (within a slack): a killed engine's memory is freed late."""
    from batchrun.workers import gpu_memory

    gpus = _Gpus([500.0, 70_000.0, 70_000.0, 30_000.0, 600.0])
    monkeypatch.setattr(gpu_memory, "gpu_memory_mb", gpus)
    worker = Worker(0, EngineSettings(engine="echo"), {"CUDA_VISIBLE_DEVICES": "0"})
    inbox: Inbox = queue.Queue()
    worker.start(inbox)  # the first start on GPU 0 records what it holds: 500 MiB
    try:
        assert len(gpus.read_at) == 1
        worker.kill()
        worker.start(inbox)
        assert len(gpus.read_at) == 5  # 70000, 70000, 30000: waited; 600: within the slack
        assert worker.started_at >= gpus.read_at[-1]
    finally:
        worker.kill()


@pytest.mark.usefixtures("no_gpu_used_yet")
def test_the_wait_for_gpu_memory_is_bounded() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    assert wait_for_gpus(env, read=_Gpus([500.0]))  # the first engine there: no wait
    started = time.monotonic()
    assert not wait_for_gpus(env, timeout=0.5, read=_Gpus([70_000.0]))
    assert time.monotonic() - started < 5


@pytest.mark.usefixtures("no_gpu_used_yet")
def test_no_wait_for_gpu_memory_without_nvml_or_on_the_cpu() -> None:
    def no_nvml(devices: Sequence[str]) -> list[float] | None:
        return None

    env = {"CUDA_VISIBLE_DEVICES": "0"}
    assert wait_for_gpus(env, read=_Gpus([500.0]))
    assert wait_for_gpus(env, timeout=60, read=no_nvml)
    cpu = _Gpus([1.0])
    assert wait_for_gpus({"OMP_NUM_THREADS": "2"}, read=cpu)
    assert cpu.read_at == []


def test_the_first_worker_is_born_with_ctrl_c_blocked(tmp_path: Path) -> None:
    """A Ctrl-C to the terminal's process group while a worker's Python imports must wait for the
    worker to set it aside (a traceback on the terminal otherwise). The first spawn of a process
    starts multiprocessing's resource tracker, whose start unblocks SIGINT and SIGTERM: a fresh
    interpreter, then, where no tracker runs yet. The child's first act copies its own status."""
    status = tmp_path / "status"
    script = textwrap.dedent(
        f"""
        import multiprocessing as mp, shutil
        from batchrun.workers.process import start_shielded
        if __name__ == "__main__":
            p = mp.get_context("spawn").Process(
                target=shutil.copyfile, args=("/proc/self/status", {str(status)!r})
            )
            start_shielded(p)
            p.join()
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    text = status.read_text()
    blocked = int(text.split("SigBlk:")[1].split()[0], 16)
    for sig in (signal.SIGINT, signal.SIGTERM):
        assert blocked & (1 << (sig - 1)), (sig, text)
