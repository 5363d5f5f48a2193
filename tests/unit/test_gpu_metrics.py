"""The nv_gpu_* gauges, under Triton's names, from NVML: read at each scrape, none where NVML sees no GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from fnserve.observability.gpu_metrics import GpuCollector, gpu_collector
from fnserve.observability.metrics import ServerMetrics


class FakeNvml:
    """What fnserve asks of ``pynvml``: two GPUs, the second without power readings."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.busy = 0.0

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (NVML's names)
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:  # noqa: N802
        return f"GPU-{handle}".encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=int(self.busy * 100), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(total=80 << 30, used=(handle + 1) << 30, free=0)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        if handle == 1:
            raise self.NVMLError("not supported")
        return 250_000

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:  # noqa: N802
        return 700_000


def test_each_gpu_is_read_at_each_scrape() -> None:
    nvml = FakeNvml()
    registry = CollectorRegistry()
    registry.register(GpuCollector(nvml))
    nvml.busy = 0.42
    first = generate_latest(registry).decode()
    assert 'nv_gpu_utilization{gpu_uuid="GPU-0"} 0.42' in first
    assert 'nv_gpu_memory_total_bytes{gpu_uuid="GPU-1"} 8.589934592e+10' in first
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 2.147483648e+09' in first
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-0"} 250.0' in first
    assert 'nv_gpu_power_limit{gpu_uuid="GPU-0"} 700.0' in first
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-1"}' not in first  # the board does not say: no series
    nvml.busy = 0.9
    assert 'nv_gpu_utilization{gpu_uuid="GPU-0"} 0.9' in generate_latest(registry).decode()


def test_the_server_shows_them_beside_its_own_and_none_without_a_gpu() -> None:
    with_gpu = ServerMetrics(gpu=GpuCollector(FakeNvml()))
    assert b"nv_gpu_utilization{" in with_gpu.render() and b"fnserve_requests" in with_gpu.render()
    assert b"nv_gpu_" not in ServerMetrics(gpu=None).render()
    assert gpu_collector() is None  # this machine: NVML absent, or no GPU
