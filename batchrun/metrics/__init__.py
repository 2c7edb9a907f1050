"""Prometheus metrics of a run: one registry, fed by the scheduler (run/) and by serve.

`names`: the families (a contract); `recorder`: what a run counts and its registry;
`histogram`: a histogram cheap enough for the hot path; `gpu`: NVML gauges; `exporter`: the
/metrics endpoint of submit, resume and retry-failed.
"""

from __future__ import annotations

from batchrun.metrics.recorder import CostMeter, RunMetrics, gpu_units

__all__ = ["CostMeter", "RunMetrics", "gpu_units"]
