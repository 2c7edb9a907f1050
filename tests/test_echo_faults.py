"""The echo engine's GPU-shaped faults (engines/echo_faults.py): each does what its name says, so
the tests of the restart policy, the process trees and the watchdogs rest on faults that work."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from batchrun.config import EngineSettings
from batchrun.engines.echo import EchoEngine
from batchrun.engines.oom import is_oom
from batchrun.openai.records import CHAT, Request


def _request(custom_id: str) -> Request:
    return Request(custom_id, 1, CHAT, {"messages": [{"role": "user", "content": "hi there"}]})


def _engine(monkeypatch: pytest.MonkeyPatch, **env: str) -> EchoEngine:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return EchoEngine(EngineSettings(engine="echo"))


def _drain(engine: EchoEngine, steps: int = 50) -> list[str]:
    done: list[str] = []
    for _ in range(steps):
        done += [o.custom_id for o in engine.step()]
    return done


def test_start_error_every_start(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match=r"^NCCL error: unhandled system error$"):
        _engine(monkeypatch, BATCHRUN_ECHO_START_ERROR="NCCL error: unhandled system error")


def test_start_error_only_the_first_times(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BATCHRUN_ECHO_STATE_DIR", str(tmp_path))
    env = {"BATCHRUN_ECHO_START_ERROR": "boom", "BATCHRUN_ECHO_START_ERROR_TIMES": "2"}
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            _engine(monkeypatch, **env)
    engine = _engine(monkeypatch, **env)  # the third start works
    engine.close()


def test_start_error_counter_lives_beside_the_worker_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BATCHRUN_WORKER_LOG", str(tmp_path / "worker-0.log"))
    env = {"BATCHRUN_ECHO_START_ERROR": "boom", "BATCHRUN_ECHO_START_ERROR_TIMES": "1"}
    with pytest.raises(RuntimeError):
        _engine(monkeypatch, **env)
    _engine(monkeypatch, **env).close()
    assert (tmp_path / "echo-starts.count").read_text() == ".."


def test_spawned_ranks_ignore_sigterm_and_are_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pids_file = tmp_path / "ranks"
    engine = _engine(
        monkeypatch, BATCHRUN_ECHO_SPAWN_RANKS="2", BATCHRUN_ECHO_RANK_PIDS=str(pids_file)
    )
    pids = [int(p) for p in pids_file.read_text().split()]
    try:
        assert len(pids) == 2
        time.sleep(0.5)  # let them set their handlers
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
        for pid in pids:
            os.kill(pid, 0)  # still alive: raises if gone
        engine.close()
        for pid in pids:
            os.kill(pid, 0)  # closing the engine does not stop them either
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_hang_after_n_results_never_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(monkeypatch, BATCHRUN_ECHO_HANG_AFTER="3")
    for i in range(5):
        engine.add(_request(f"r{i}"))
    assert len(engine.step()) == 3
    stepper = threading.Thread(target=engine.step, daemon=True)
    stepper.start()
    stepper.join(timeout=1.0)
    assert stepper.is_alive()


def test_hang_on_ids_never_finish_and_abort_drops_them(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(monkeypatch, BATCHRUN_ECHO_HANG_ON="r1")
    for i in range(3):
        engine.add(_request(f"r{i}"))
    assert sorted(_drain(engine)) == ["r0", "r2"]
    assert engine.has_unfinished()
    engine.abort("r1")
    assert not engine.has_unfinished()


def test_oom_on_one_id_whatever_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(monkeypatch, BATCHRUN_ECHO_OOM_ON="bad")
    engine.add(_request("fine"))
    assert _drain(engine) == ["fine"]
    engine.add(_request("bad"))
    with pytest.raises(RuntimeError) as caught:
        engine.step()
    assert is_oom(caught.value)
    assert "'bad'" in str(caught.value)


def test_faults_match_the_custom_id_under_serve(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    engine = _engine(
        monkeypatch,
        BATCHRUN_ECHO_FAIL="bad",
        BATCHRUN_ECHO_HANG_ON="stuck",
        BATCHRUN_ECHO_RECORD=str(record),
    )
    for name in ("bad", "stuck", "good"):
        engine.add(_request(f"slot-1\x00{name}"))
    outcomes = {o.custom_id: o.ok for o in engine.step() + _drain(engine)}
    assert outcomes == {"slot-1\x00bad": False, "slot-1\x00good": True}
    engine.close()
    assert record.read_text().split() == ["bad", "stuck", "good"]
