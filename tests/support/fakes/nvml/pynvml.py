"""A fake `pynvml` (nvidia-ml-py) for tests: FAKE_NVML_GPUS GPUs, GPU i using (i + 1) GiB and
busy 25 * (i + 1) percent; FAKE_NVML_INIT_ERROR set: nvmlInit fails as with no driver."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    """As pynvml's."""


def nvmlInit() -> None:
    if os.environ.get("FAKE_NVML_INIT_ERROR"):
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return int(os.environ.get("FAKE_NVML_GPUS", "1"))


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    raise NVMLError("Not Found")


def nvmlDeviceGetMemoryInfo(handle: int) -> Any:
    return SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30)


def nvmlDeviceGetUtilizationRates(handle: int) -> Any:
    return SimpleNamespace(gpu=25 * (handle + 1), memory=0)
