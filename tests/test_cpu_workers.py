"""How CPU engine workers share the machine's cores (workers/cpu_layout.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchrun.workers.cpu_claims import CLAIMS_ENV, live_claims, release_claim
from batchrun.workers.cpu_layout import cpu_worker_envs, physical_cores


def _topology(root: Path, cores: dict[int, tuple[int, int]]) -> str:
    """A fake /sys/devices/system/cpu: cpu id -> (package, core)."""
    for cpu, (package, core) in cores.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return str(root)


@pytest.fixture
def no_user_threads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No thread settings of the user's, and a claims directory of this test's own."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    claims = tmp_path / "claims"
    monkeypatch.setenv(CLAIMS_ENV, str(claims))
    yield claims
    release_claim()


def test_one_thread_per_physical_core_hyperthreads_left_out(tmp_path: Path) -> None:
    # Two packages of two cores, each with two hyperthreads numbered as Linux does (0-3, 4-7).
    layout = {c: (c % 4 // 2, c % 2) for c in range(8)}
    topo = _topology(tmp_path, layout)
    assert physical_cores(list(range(8)), topo) == [0, 1, 2, 3]
    assert physical_cores([1, 5, 6], topo) == [1, 6]
    # Unreadable topology (not Linux, a container hiding /sys): every CPU given.
    assert physical_cores([0, 1, 2], str(tmp_path / "none")) == [0, 1, 2]


def test_one_worker_gets_every_core_none_kept_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_user_threads: None
) -> None:
    topo = _topology(tmp_path / "sys", {c: (0, c) for c in range(4)})
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    every = {"OMP_NUM_THREADS": "4", "BATCHRUN_CPU_AFFINITY": "0,1,2,3"}
    assert cpu_worker_envs(1, topo) == [every]
    assert cpu_worker_envs(2, topo) == [
        {"OMP_NUM_THREADS": "2", "BATCHRUN_CPU_AFFINITY": "0,1"},
        {"OMP_NUM_THREADS": "2", "BATCHRUN_CPU_AFFINITY": "2,3"},
    ]
    # More workers than cores: each still gets one (the last ones share).
    shares = [e["BATCHRUN_CPU_AFFINITY"] for e in cpu_worker_envs(5, topo)]
    assert shares == ["0", "1", "2", "3", "3"]


def test_a_users_own_thread_settings_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_user_threads: Path
) -> None:
    topo = _topology(tmp_path / "sys", {c: (0, c) for c in range(8)})
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    # Threads per worker as the user says, each worker pinned to that many cores.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_worker_envs(2, topo) == [
        {"OMP_NUM_THREADS": "3", "BATCHRUN_CPU_AFFINITY": "0,1,2"},
        {"OMP_NUM_THREADS": "3", "BATCHRUN_CPU_AFFINITY": "3,4,5"},
    ]
    # More threads than cores: the user's threads, unpinned.
    assert cpu_worker_envs(3, topo) == [{}, {}, {}]
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # OpenMP's nested form: left to OpenMP
    assert cpu_worker_envs(1, topo) == [{}]
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert cpu_worker_envs(1, topo) == [{}]


# --- another job's cores (workers/cpu_claims.py) ----------------------------------------------

_HOLDER = """
import sys, time
from batchrun.workers.cpu_claims import hold_claim
hold_claim([int(c) for c in sys.argv[1].split(",")], "jobs/other")
print("held", flush=True)
time.sleep(600)
"""


def _other_job(cores: str) -> subprocess.Popen[str]:
    """Another process that claims `cores` and lives on (until killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, cores], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def four_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_user_threads: Path) -> str:
    """A machine of four cores (its fake topology), all this process's to use."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    return _topology(tmp_path / "sys", {c: (0, c) for c in range(4)})


def test_a_second_job_takes_the_cores_another_live_job_left_free(
    four_cores: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = four_cores
    other = _other_job("0,1")
    try:
        assert [(c.pid, c.cores, c.job) for c in live_claims()] == [
            (other.pid, (0, 1), "jobs/other")
        ]
        assert cpu_worker_envs(1, topo, job="jobs/mine") == [
            {"OMP_NUM_THREADS": "2", "BATCHRUN_CPU_AFFINITY": "2,3"}
        ]
        # Asked again (a retry pass), this process's own claim is not another job's.
        assert cpu_worker_envs(1, topo)[0]["BATCHRUN_CPU_AFFINITY"] == "2,3"
        # Jobs given their shares with OMP_NUM_THREADS get cores of their own.
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert cpu_worker_envs(2, topo) == [
            {"OMP_NUM_THREADS": "1", "BATCHRUN_CPU_AFFINITY": "2"},
            {"OMP_NUM_THREADS": "1", "BATCHRUN_CPU_AFFINITY": "3"},
        ]
        assert cpu_worker_envs(3, topo) == [{}, {}, {}]  # two cores free: not pinned
    finally:
        other.kill()
        other.wait()


def test_when_every_core_is_taken_the_job_shares_them_and_says_with_whom(
    four_cores: str, no_user_threads: Path
) -> None:
    topo = four_cores
    other = _other_job("0,1,2,3")
    try:
        assert cpu_worker_envs(1, topo) == [
            {
                "OMP_NUM_THREADS": "4",
                "BATCHRUN_CPU_AFFINITY": "0,1,2,3",
                "BATCHRUN_CPU_SHARED_WITH": f"pid {other.pid}, jobs/other",
            }
        ]
    finally:
        other.send_signal(signal.SIGKILL)  # as kill -9: the kernel drops its lock
        other.wait()
    # Its claim is stale now: every core is free again, and its file is gone (only this
    # process's own claim is left).
    assert cpu_worker_envs(1, topo)[0] == {
        "OMP_NUM_THREADS": "4",
        "BATCHRUN_CPU_AFFINITY": "0,1,2,3",
    }
    left = [json.loads(p.read_text()) for p in no_user_threads.iterdir()]
    assert [(c["pid"], c["cores"]) for c in left] == [(os.getpid(), [0, 1, 2, 3])]


def test_a_job_that_ends_leaves_no_claim_behind(no_user_threads: Path) -> None:
    code = "from batchrun.workers.cpu_claims import hold_claim\nhold_claim([0], 'jobs/done')"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert list(no_user_threads.iterdir()) == []
