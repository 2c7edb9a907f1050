"""scripts/gpu_check.sh, the real-GPU check, runs on a machine without a GPU too: it checks what it
can there (batchrun's doctor against nvidia-smi's absence; the real restart policy through real
workers, memory limits simulated) and names what it skipped (docs/gpu.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes.gpus import path_without_nvidia_smi
from support.paths import ROOT

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


def test_gpu_check_without_a_gpu_passes_what_it_can_and_names_what_it_skipped(
    tmp_path: Path,
) -> None:
    # No GPU whatever machine runs the suite: no nvidia-smi on PATH, none visible to CUDA. (On a GPU
    # machine nvidia-smi sits in /usr/bin beside bash: dropping that folder loses bash too.)
    env = {
        **os.environ,
        "PATH": path_without_nvidia_smi(tmp_path),
        "CUDA_VISIBLE_DEVICES": "",
        "BATCHRUN_PYTHON": sys.executable,
    }
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    lines = out.splitlines()
    assert "mode: no GPU" in lines
    assert "PASS doctor sees no GPU where there is no nvidia-smi: []" in lines
    passed = [line for line in lines if line.startswith("PASS restart policy and classifier")]
    assert len(passed) == 1 and "memory limits simulated on the CPU" in passed[0], out
    assert passed[0].endswith("checks passed on the CPU (simulated memory limits).")
    # What the policy check drove: the real scheduler's back-off and request_oom.
    stripped = [line.strip() for line in lines]
    assert "[ok ] halved 32 -> 16 -> 8 -> 4: ['32 -> 16', '16 -> 8', '8 -> 4']" in stripped
    assert "[ok ] r17 failed alone with request_oom: code request_oom" in stripped
    assert lines[-4:] == [
        "gpu_check (no GPU): 2 passed, 0 failed, 3 skipped",
        "  skipped: NVML readings (no GPU)",
        "  skipped: CUDA_VISIBLE_DEVICES and device order (no GPU)",
        "  skipped: the sample job (no GPU; the suite runs vLLM on the CPU)",
    ]
