"""GPU gauges on ``GET /metrics`` under Triton's names (``nv_gpu_*``): its dashboards and alerts read them as they are.

Read from NVML (``nvidia-ml-py``, in the ``gpu`` extra) at each scrape, once per machine-wide
reading: utilization, memory used and total, power drawn and its limit, per GPU (``gpu_uuid``).
Where NVML is not installed or finds no GPU, there are none of these series, and no error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class GpuCollector(Collector):
    """The ``nv_gpu_*`` gauges of every GPU ``nvml`` (the ``pynvml`` module, initialised) sees."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.gpus = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.uuids = [_text(nvml.nvmlDeviceGetUUID(handle)) for handle in self.gpus]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self.nvml
        labels = ["gpu_uuid"]
        utilization = GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=labels)
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=labels)
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=labels)
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=labels)
        limit = GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=labels)
        for handle, uuid in zip(self.gpus, self.uuids, strict=True):
            utilization.add_metric([uuid], nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total.add_metric([uuid], float(memory.total))
            used.add_metric([uuid], float(memory.used))
            try:  # milliwatts; not every board reports power
                power.add_metric([uuid], nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
                limit.add_metric([uuid], nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000)
            except nvml.NVMLError:
                pass
        yield from (utilization, total, used, power, limit)


def gpu_collector() -> GpuCollector | None:
    """The collector of this machine's GPUs, or None where NVML is not installed or sees none."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        collector = GpuCollector(pynvml)
    except pynvml.NVMLError:  # no driver, no device
        return None
    return collector if collector.gpus else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
