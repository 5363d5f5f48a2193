"""The mixed-device pool's policy: the GPU group up to its capacity, then idle CPU workers, then the GPU again."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from fnserve.workers.remote import Group, Overflow


class HeldPool:
    """A pool whose calls finish when the test says: stands in for a group of workers (a slow model)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[Future[Any]] = []

    def invoke(self, request: Any, priority: int = 0) -> Future[Any]:
        future: Future[Any] = Future()
        self.calls.append(future)
        return future


def pools(gpu_capacity: int, cpu_workers: int) -> tuple[Overflow, HeldPool, HeldPool]:
    gpu, cpu = HeldPool(1), HeldPool(cpu_workers)
    return Overflow([Group("gpu", gpu, gpu_capacity), Group("cpu", cpu)]), gpu, cpu  # type: ignore[arg-type]


def test_the_gpu_takes_calls_up_to_its_capacity_then_idle_cpu_workers_then_the_gpu_again() -> None:
    overflow, gpu, cpu = pools(gpu_capacity=3, cpu_workers=2)
    devices = [overflow.invoke(n)[1] for n in range(8)]
    # Three fill the GPU, two overflow to the CPU workers, and with both full the rest queue for the GPU.
    assert devices == ["gpu", "gpu", "gpu", "cpu", "cpu", "gpu", "gpu", "gpu"]
    assert overflow.in_flight == [6, 2] and overflow.runs == {"gpu": 6, "cpu": 2}


def test_a_finished_call_makes_room_where_it_ran() -> None:
    overflow, gpu, cpu = pools(gpu_capacity=1, cpu_workers=1)
    assert [overflow.invoke(n)[1] for n in range(2)] == ["gpu", "cpu"]
    cpu.calls[0].set_result({})
    assert overflow.invoke(2)[1] == "cpu"  # the GPU is still full; the CPU worker is free again
    gpu.calls[0].set_exception(RuntimeError("a failed call frees its place too"))
    assert overflow.in_flight == [0, 1]
    assert overflow.invoke(3)[1] == "gpu"


def test_one_group_takes_every_call() -> None:
    pool = HeldPool(2)
    overflow = Overflow([Group("workers", pool)])  # type: ignore[arg-type]
    assert {overflow.invoke(n)[1] for n in range(5)} == {"workers"} and not overflow.mixed
    assert len(pool.calls) == 5
