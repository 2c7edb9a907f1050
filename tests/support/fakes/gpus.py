"""Emulated GPU machines for tests: a fake nvidia-smi first on PATH, fake vLLM/torch packages."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from batchrun.workers import devices

FAKES = Path(__file__).resolve().parent
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def gpu(i: int, name: str = H100, memory_mib: int = 81559, **more: Any) -> dict[str, Any]:
    """One GPU as the fake nvidia-smi lists it, its UUID made from `i`."""
    return {
        "name": name,
        "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}",
        "memory_mib": memory_mib,
        **more,
    }


def mig(i: int, j: int, profile: str = "1g.10gb") -> dict[str, str]:
    """One MIG slice of GPU `i`."""
    return {"profile": profile, "uuid": f"MIG-{i:04d}{j:04d}-dddd-eeee-ffff-{j:012d}"}


def install_nvidia_smi(folder: Path, spec: dict[str, Any]) -> dict[str, str]:
    """Write the fake nvidia-smi (described by `spec`, see nvidia_smi.py) into folder/bin; returns
    the environment that puts it first on PATH."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (folder / "nvidia-smi.json").write_text(json.dumps(spec))
    script = bin_dir / "nvidia-smi"
    # exec: a hung fake is then the process its caller kills, as a real nvidia-smi would be.
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKES / "nvidia_smi.py"}" "$@"\n')
    script.chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_NVIDIA_SMI": str(folder / "nvidia-smi.json"),
    }


def no_nvidia_smi_path(folder: Path) -> str:
    """A PATH with no nvidia-smi on it (the Python running the tests needs none)."""
    empty = folder / "empty-bin"
    empty.mkdir(parents=True, exist_ok=True)
    return str(empty)


def path_without_nvidia_smi(folder: Path) -> str:
    """This PATH with every nvidia-smi hidden, every other program kept: a folder that holds one
    (as /usr/bin on a GPU machine, beside bash) is replaced by links to all its other programs."""
    kept: list[str] = []
    for i, d in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if not d or not (Path(d) / "nvidia-smi").exists():
            kept.append(d)
            continue
        shadow = folder / f"no-nvidia-smi-{i}"
        shadow.mkdir(parents=True, exist_ok=True)
        for program in Path(d).iterdir():
            link = shadow / program.name
            if program.name != "nvidia-smi" and not link.exists():
                link.symlink_to(program)
        kept.append(str(shadow))
    return os.pathsep.join(kept)


def fake_packages(folder: Path, **versions: str) -> list[str]:
    """Folders of fake installed distributions (`*.dist-info` with METADATA) by name:
    fake_packages(dir, vllm="0.32.0", torch="2.13.0+cu128"); for builds.SEARCH_PATH."""
    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    for name, version in versions.items():
        dist = name.replace("-", "_")
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        )
    return [str(site)]


def emulate_machine(
    monkeypatch: pytest.MonkeyPatch, folder: Path, spec: dict[str, Any], visible: str | None
) -> None:
    """This process on an emulated GPU machine: the fake nvidia-smi of `spec` (written into
    `folder`) first on PATH, CUDA_VISIBLE_DEVICES `visible` (None: unset), and nvidia-smi's
    answers this process kept dropped."""
    for key, value in install_nvidia_smi(folder, spec).items():
        monkeypatch.setenv(key, value)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    devices._CACHE.clear()
