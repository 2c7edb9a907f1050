"""How CPU engine workers share the machine's cores (workers/devices.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchrun.workers.devices import cpu_worker_envs, physical_cores


def _topology(root: Path, cores: dict[int, tuple[int, int]]) -> str:
    """A fake /sys/devices/system/cpu: cpu id -> (package, core)."""
    for cpu, (package, core) in cores.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return str(root)


@pytest.fixture
def no_user_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)


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
    topo = _topology(tmp_path, {c: (0, c) for c in range(4)})
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


def test_a_users_own_thread_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_worker_envs(2) == [{}, {}]
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert cpu_worker_envs(1) == [{}]
