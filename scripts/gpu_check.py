"""What scripts/gpu_check.sh runs: every check of batchrun that needs a real GPU and PyTorch only,
and what of it can run on a machine without one (docs/gpu.md says which is which).

    python scripts/gpu_check.py [--no-gpu]

Each check prints one line, PASS, FAIL or SKIP (with why), and the last line sums them up. Exit 0
when nothing failed. Skips are not failures: a machine without a GPU skips what needs one, and
says so.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The sample job needs vLLM and a model; it runs on a GPU only (on a CPU the suite runs vLLM).
SAMPLE = ROOT / "sample_data" / "requests.jsonl"


@dataclass
class Report:
    """The checks' results, printed as they come."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """One check that passed or failed."""
        line = f"{name}: {detail}" if detail else name
        print(f"{'PASS' if ok else 'FAIL'} {line}", flush=True)
        (self.passed if ok else self.failed).append(line)
        return ok

    def skip(self, name: str, why: str) -> None:
        """One check not run here, and why."""
        print(f"SKIP {name}: {why}", flush=True)
        self.skipped.append(f"{name} ({why})")


def run(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    """A subprocess's result (never raises: a failure is a returncode and a stderr)."""
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(args, 124, "", str(exc))


# -- what is here ---------------------------------------------------------------------------------

_TORCH_PROBE = """
import json, torch
info = {"version": torch.__version__, "cuda": torch.version.cuda, "available": False, "count": 0}
info["available"] = torch.cuda.is_available()
info["count"] = torch.cuda.device_count() if info["available"] else 0
print(json.dumps(info))
"""


def start(args: list[str]) -> subprocess.Popen[str]:
    """A subprocess started now, its output collected by `finish` (two checks overlap so)."""
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )


def finish(process: subprocess.Popen[str], timeout: float = 300) -> Any:
    """What a `start`ed subprocess said (killed, returncode 124, past `timeout`)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return subprocess.CompletedProcess(process.args, 124, out, err)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def torch_info(probe: subprocess.Popen[str]) -> dict[str, Any] | None:
    """PyTorch's version, CUDA build and devices (in a subprocess: no CUDA context here)."""
    done = finish(probe)
    if done.returncode != 0:
        return None
    info: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return info


def smi_gpus() -> list[dict[str, str]] | None:
    """nvidia-smi's GPUs (index, uuid, name, memory.total MiB); None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = run(
        [
            "nvidia-smi",
            "--query-gpu=index,uuid,name,memory.total",
            "--format=csv,noheader,nounits",
        ],
        timeout=30,
    )
    if done.returncode != 0:
        return []
    gpus = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append({"index": parts[0], "uuid": parts[1], "name": parts[2], "mib": parts[3]})
    return gpus


# -- the checks -----------------------------------------------------------------------------------


def check_doctor(
    report: Report, gpus: list[dict[str, str]] | None, doctor: subprocess.Popen[str]
) -> None:
    """batchrun's own reading of nvidia-smi (`batchrun doctor --json`) against nvidia-smi's."""
    done = finish(doctor)
    if done.returncode not in (0, 1) or not done.stdout.strip().startswith("{"):
        said = " ".join((done.stderr or done.stdout).split())[:200]
        report.skip("batchrun doctor --json", f"not available here ({said or 'no output'})")
        return
    seen = json.loads(done.stdout)
    found = seen.get("gpus") or []
    problems = [p.get("code") for p in seen.get("problems") or []]
    build = (seen.get("vllm") or {}).get("build")
    print(f"     doctor: vLLM build {build}, {len(found)} GPU(s), problems {problems or 'none'}")
    if gpus is None:
        report.check("doctor sees no GPU where there is no nvidia-smi", not found, f"{found}")
        return
    wanted = {g["uuid"] for g in gpus}
    got = {str(g.get("uuid")) for g in found}
    report.check("doctor's GPUs are nvidia-smi's (by UUID)", wanted == got, f"{sorted(got)}")
    memory = {str(g.get("uuid")): g.get("memory_total_mib") for g in found}
    wrong = [g["uuid"] for g in gpus if str(memory.get(g["uuid"])) != g["mib"]]
    report.check(
        "doctor's memory totals are nvidia-smi's", not wrong, f"differ: {wrong}" if wrong else ""
    )


def check_nvml(report: Report, gpus: list[dict[str, str]]) -> None:
    """NVML's readings against nvidia-smi's, and batchrun's own NVML reading."""
    try:
        pynvml: Any = importlib.import_module("pynvml")
        pynvml.nvmlInit()
    except Exception as exc:
        report.skip("NVML readings", f"pynvml (nvidia-ml-py) not usable: {exc}")
        return
    try:
        count = pynvml.nvmlDeviceGetCount()
        report.check("NVML counts nvidia-smi's GPUs", count == len(gpus), f"{count}")
        for g in gpus:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(g["index"]))
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            total = mem.total // 2**20
            report.check(
                f"NVML GPU {g['index']} is nvidia-smi's (UUID, memory)",
                uuid == g["uuid"] and abs(total - int(g["mib"])) <= 1,
                f"{uuid}, {total} MiB total, {mem.used // 2**20} MiB used",
            )
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    try:
        from batchrun.workers.gpu_memory import gpu_memory_mb
    except ImportError:
        report.skip("batchrun's NVML reading", "batchrun.workers.gpu_memory is not here")
        return
    readings = gpu_memory_mb([g["index"] for g in gpus])
    report.check(
        "batchrun reads every GPU's memory in use (NVML)",
        readings is not None and len(readings) == len(gpus),
        f"{readings}",
    )


_VISIBLE_PROBE = """
import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
uuid = str(torch.cuda.get_device_properties(0).uuid) if n else None
print(json.dumps({"count": n, "uuid": uuid}))
"""


def check_visible_devices(report: Report, gpus: list[dict[str, str]]) -> None:
    """CUDA_VISIBLE_DEVICES as batchrun's GPU ids assume CUDA reads it (PCI bus order)."""
    last = gpus[-1]
    order = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    for label, value, count, uuid in (
        (f"an index ({last['index']})", last["index"], 1, last["uuid"]),
        ("a UUID", last["uuid"], 1, last["uuid"]),
        ("empty", "", 0, None),
        ("Slurm's NoDevFiles", "NoDevFiles", 0, None),
    ):
        done = run(
            [sys.executable, "-c", _VISIBLE_PROBE],
            env={**order, "CUDA_VISIBLE_DEVICES": value},
            timeout=300,
        )
        if done.returncode != 0:
            report.check(f"CUDA_VISIBLE_DEVICES {label}", False, done.stderr.strip()[-200:])
            continue
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        got_uuid = seen["uuid"]
        same = uuid is None or (got_uuid or "").removeprefix("GPU-") == uuid.removeprefix("GPU-")
        report.check(
            f"CUDA_VISIBLE_DEVICES {label}: {count} GPU(s) seen"
            + (", nvidia-smi's" if uuid else ""),
            seen["count"] == count and same,
            f"{seen}",
        )


def check_visible_repeats(report: Report, gpus: list[dict[str, str]]) -> None:
    """A GPU named twice in CUDA_VISIBLE_DEVICES (by its index, then its UUID): what PyTorch
    counts, and batchrun's doctor counting it once and naming the repeat (issue 36)."""
    last = gpus[-1]
    value = f"{last['index']},{last['uuid']}"
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": value}
    probe = run([sys.executable, "-c", _VISIBLE_PROBE], env=env, timeout=300)
    said = probe.stdout.strip().splitlines()[-1] if probe.returncode == 0 else probe.stderr
    print(f"     PyTorch under CUDA_VISIBLE_DEVICES={value}: {' '.join(said.split())[:200]}")
    done = run([sys.executable, "-m", "batchrun", "doctor", "--json"], env=env, timeout=300)
    if not done.stdout.strip().startswith("{"):
        report.check("doctor names a GPU named twice", False, done.stderr.strip()[-200:])
        return
    seen = json.loads(done.stdout)
    codes = [p.get("code") for p in seen.get("problems") or []]
    report.check(
        "doctor counts a GPU named twice once and names the repeat",
        len(seen.get("gpus") or []) == 1 and "cuda_visible_devices_repeated" in codes,
        f"{len(seen.get('gpus') or [])} GPU(s), problems {codes}",
    )


def check_oom_policy(report: Report, cuda: bool) -> None:
    """scripts/gpu_oom_check.py: real OOMs through batchrun's real workers and restart policy."""
    args = [sys.executable, str(ROOT / "scripts" / "gpu_oom_check.py")]
    if not cuda:
        args.append("--no-gpu")
    started = time.monotonic()
    done = run(args, timeout=1800)
    print("\n".join("     " + line for line in done.stdout.splitlines()))
    if done.returncode != 0 and done.stderr:
        print("\n".join("     " + line for line in done.stderr.splitlines()[-20:]))
    where = "real CUDA out-of-memory errors" if cuda else "memory limits simulated on the CPU"
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-200:]
    report.check(
        f"restart policy and classifier on {where} (scripts/gpu_oom_check.py, "
        f"{time.monotonic() - started:.0f} s)",
        done.returncode == 0,
        last,
    )


def check_sample_job(report: Report) -> None:
    """The sample job through vLLM on the GPU, exported."""
    with tempfile.TemporaryDirectory(prefix="batchrun-gpu-sample-") as tmp:
        job = str(Path(tmp) / "sample")
        done = run(
            [
                sys.executable,
                "-m",
                "batchrun",
                "submit",
                str(SAMPLE),
                "--job-dir",
                job,
                "--no-progress",
            ],
            timeout=3600,
        )
        if done.returncode == 0:
            done = run([sys.executable, "-m", "batchrun", "export", "--job-dir", job], timeout=600)
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        report.check("the sample job on the GPU (submit, export)", done.returncode == 0, tail)


def main(argv: list[str] | None = None) -> int:
    """Run what this machine can run; 0 when nothing failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--no-gpu", action="store_true", help="check as on a machine without one")
    args = parser.parse_args(argv)
    report = Report()
    # Both import heavy packages (torch; the doctor maybe vLLM's metadata): side by side.
    probe = start([sys.executable, "-c", _TORCH_PROBE])
    doctor = start([sys.executable, "-m", "batchrun", "doctor", "--json"])
    torch = torch_info(probe)
    gpus = None if args.no_gpu else smi_gpus()
    vllm = importlib.util.find_spec("vllm") is not None
    cuda = bool(torch and torch["available"]) and not args.no_gpu
    print(
        f"python {sys.version.split()[0]}; torch "
        + (f"{torch['version']} (CUDA build {torch['cuda']})" if torch else "not importable")
        + f"; vLLM {'importable' if vllm else 'not importable'}; nvidia-smi "
        + ("not on PATH" if gpus is None else f"lists {len(gpus)} GPU(s)")
    )
    mode = "GPU" if cuda and gpus else "no GPU"
    print(f"mode: {mode}\n", flush=True)
    if gpus:
        report.check(
            "PyTorch sees nvidia-smi's GPUs",
            cuda and torch is not None and torch["count"] == len(gpus),
            f"torch: {torch['count'] if torch else 'none'}, nvidia-smi: {len(gpus)}"
            + ("" if cuda else " (a CPU build of torch on a GPU machine?)"),
        )
    if args.no_gpu:
        finish(doctor)
        report.skip("batchrun doctor against nvidia-smi", "--no-gpu")
    else:
        check_doctor(report, gpus, doctor)
    if mode == "GPU" and gpus:
        check_nvml(report, gpus)
        check_visible_devices(report, gpus)
        check_visible_repeats(report, gpus)
    else:
        report.skip("NVML readings", "no GPU")
        report.skip("CUDA_VISIBLE_DEVICES and device order", "no GPU")
    if torch is None:
        report.skip("restart policy on real out-of-memory errors", "PyTorch is not importable")
    elif importlib.util.find_spec("msgspec") is None:
        report.skip(
            "restart policy on real out-of-memory errors",
            "batchrun's core needs msgspec (BATCHRUN_WHEELHOUSE: see docs/gpu.md)",
        )
    else:
        check_oom_policy(report, mode == "GPU")
    if mode == "GPU" and vllm:
        check_sample_job(report)
    elif mode == "GPU":
        report.skip("the sample job", "vLLM is not importable")
    else:
        report.skip("the sample job", "no GPU; the suite runs vLLM on the CPU")
    print(
        f"\ngpu_check ({mode}): {len(report.passed)} passed, {len(report.failed)} failed, "
        f"{len(report.skipped)} skipped"
    )
    for line in report.skipped:
        print(f"  skipped: {line}")
    for line in report.failed:
        print(f"  FAILED: {line}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
