"""GPU memory and utilization, read from NVML at scrape time (the parent reads them: NVML needs no
CUDA context, so the parent stays off the GPUs).

NVML comes from `nvidia-ml-py` (module `pynvml`), as in workers/gpu_memory.py. Where it is not
installed, no driver loads, or no GPU is found, the families are absent, not zero: a CPU job's
dashboard shows no data rather than an idle GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchrun import nvml
from batchrun.metrics import names


@dataclass(frozen=True)
class GpuReading:
    """One GPU's memory in use (bytes) and its utilization over NVML's last sample (0 to 1)."""

    gpu: str
    memory_used_bytes: int
    utilization: float


def read_gpus(devices: Sequence[str] | None = None) -> list[GpuReading]:
    """What NVML says of `devices` (CUDA_VISIBLE_DEVICES entries: an index, or a GPU-/MIG- UUID),
    or of every GPU it sees when None; empty when NVML cannot be read."""
    with nvml.opened() as pynvml:
        if pynvml is None:
            return []
        try:
            if devices is None:
                devices = [str(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
            readings = []
            for device in devices:
                with contextlib.suppress(Exception):  # a device gone, or a name NVML cannot resolve
                    readings.append(_reading(pynvml, device.strip()))
            return readings
        except Exception:
            return []


def _reading(pynvml: Any, device: str) -> GpuReading:
    handle = nvml.device_handle(pynvml, device)
    used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    try:
        utilization = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
    except Exception:  # a MIG instance has no utilization of its own: memory only
        utilization = float("nan")
    return GpuReading(device, used, utilization)


class GpuCollector(Collector):
    """batchrun_gpu_memory_used_bytes{gpu} and batchrun_gpu_utilization_ratio{gpu}."""

    def __init__(self, devices: Callable[[], Sequence[str] | None] = lambda: None) -> None:
        self.devices = devices

    def collect(self) -> Iterator[Metric]:
        """The two families, or nothing where NVML finds no GPU."""
        readings = read_gpus(self.devices())
        if not readings:
            return
        memory = GaugeMetricFamily(
            names.GPU_MEMORY, "GPU memory in use (NVML), bytes.", labels=["gpu"]
        )
        utilization = GaugeMetricFamily(
            names.GPU_UTILIZATION,
            "Fraction of time a kernel ran on the GPU over NVML's last sample period.",
            labels=["gpu"],
        )
        for r in readings:
            memory.add_metric([r.gpu], r.memory_used_bytes)
            if r.utilization == r.utilization:  # not NaN
                utilization.add_metric([r.gpu], r.utilization)
        yield memory
        if utilization.samples:
            yield utilization
