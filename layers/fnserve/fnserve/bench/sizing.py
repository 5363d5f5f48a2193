"""``fnserve bench --lambda``: the Lambda memory size to deploy, measured before deploying.

Lambda gives a function CPU in proportion to its memory: one full vCPU at 1,769 MB, up to six at
10,240 MB, enforced as a CFS quota. Here the Lambda HTTP handler (the API function's, on the same
manifest) runs in a child process placed in a cgroup whose CPU quota is that share, for each memory
size: cgroup v2's ``cpu.max``, or v1's ``cpu.cfs_quota_us`` where that is the controller mounted.
Where neither can be written (no permission, no controller), it says so and measures nothing that
would pass for a Lambda figure.

For each size: the init (import and model load, under the quota: the cold start's share that
memory decides), p50/p99 of warm invocations, the billed duration (rounded up to the millisecond),
the cost per million requests at the prices given (``fnserve.bench.prices``: x86 in us-east-1 by default),
and whether the process's peak memory fits the size.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fnserve.bench import prices
from fnserve.bench.requests import Request
from fnserve.bench.sweep import Config, variant_manifest

FULL_VCPU_MB = 1769
MAX_VCPUS = 6
SIZES = (512, 1024, 1769, 2048, 3008)
PERIOD_US = 100_000


MAX_MEMORY_MB = 10240


def vcpus(memory_mb: int) -> float:
    """Lambda's CPU share at ``memory_mb``: in proportion up to one vCPU at 1,769 MB; from there straight
    up to six at 10,240 MB (the two points AWS documents)."""
    if memory_mb <= FULL_VCPU_MB:
        return memory_mb / FULL_VCPU_MB
    above = (min(memory_mb, MAX_MEMORY_MB) - FULL_VCPU_MB) / (MAX_MEMORY_MB - FULL_VCPU_MB)
    return 1 + above * (MAX_VCPUS - 1)


# -- cgroups ------------------------------------------------------------------------------------------


@dataclass
class Cgroup:
    """A child cgroup of this process's own, with a CPU quota."""

    path: Path
    version: int

    def limit(self, cpus: float) -> None:
        quota = max(1000, int(cpus * PERIOD_US))
        if self.version == 2:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _own(line_controllers: Callable[[str], bool]) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if line_controllers(controllers):
            return path
    return None


def _mounts(kind: str, option: str | None = None) -> list[Path]:
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == kind and (option is None or option in fields[3].split(",")):
            found.append(Path(fields[1]))
    return found


def make_cgroup(name: str) -> Cgroup | str:
    """A new child cgroup with a writable CPU quota, or the reason there can be none."""
    reasons = []
    try:
        own2 = _own(lambda c: c == "")
        for mount in _mounts("cgroup2"):
            parent = mount / (own2 or "/").lstrip("/")
            if "cpu" not in (parent / "cgroup.controllers").read_text().split():
                reasons.append(f"cgroup v2 at {parent} has no cpu controller")
                continue
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text("+cpu")
            path = parent / name
            path.mkdir(exist_ok=True)
            if (path / "cpu.max").exists():
                return Cgroup(path, 2)
            path.rmdir()
            reasons.append(f"cgroup v2 at {parent} does not delegate cpu to its children")
        own1 = _own(lambda c: "cpu" in c.split(","))
        for mount in _mounts("cgroup", "cpu"):
            path = mount / (own1 or "/").lstrip("/") / name
            path.mkdir(exist_ok=True)
            return Cgroup(path, 1)
    except OSError as exc:
        reasons.append(f"{type(exc).__name__}: {exc}")
    return "; ".join(reasons) or "no cgroup cpu controller is mounted"


# -- one memory size ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    memory_mb: int
    vcpus: float
    emulated_cpus: float  # the quota applied (capped at this machine's CPUs)
    init_ms: float
    p50: float
    p99: float
    billed_ms: float  # mean billed duration per invocation
    cost_per_million: float
    peak_mb: float
    invocations: int

    @property
    def fits(self) -> bool:
        return self.peak_mb <= self.memory_mb


def _child(
    manifest: str, target: str, request: tuple[bytes, dict[str, str]], seconds: float, go: Any, out: Any
) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # EMF metrics and log lines: written, as in Lambda, just not to the terminal
    os.dup2(devnull, 2)
    # Every model loaded in the init, as the API function does with its models layer warm.
    environ = {
        "FNSERVE_MANIFEST": manifest,
        "FNSERVE_EAGER_LOAD": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "fnserve-bench",
    }
    os.environ.update(environ)
    go.wait()  # in its cgroup from here
    began = time.perf_counter()
    from fnserve.adapters.lambda_.http import create_handler
    from fnserve.aws.events import LambdaContext, http_api_event

    handler = create_handler()
    init_ms = (time.perf_counter() - began) * 1e3
    body, headers = request
    binary = headers.get("Content-Type") != "application/json"
    path = f"/v2/models/{target}/infer"
    heads = {k.lower(): v for k, v in headers.items()} | {"content-length": str(len(body))}
    event = http_api_event("POST", path, route_key="$default", headers=heads, body=body, binary=binary)
    context = LambdaContext(memory_mb=FULL_VCPU_MB)
    latencies: list[float] = []
    until = time.perf_counter() + seconds
    while (now := time.perf_counter()) < until or len(latencies) < 20:
        answer = handler(event, context)
        latencies.append((time.perf_counter() - now) * 1e3)
        if answer["statusCode"] >= 300:
            out.send(("error", f"{answer['statusCode']}: {answer.get('body', '')[:300]}"))
            return
    out.send(("ok", (init_ms, latencies, peak_mb())))


def peak_mb() -> float:
    """This process's peak resident memory, in MB, since it started its program.

    /proc's VmHWM belongs to the address space, which exec replaces; getrusage's ru_maxrss outlives exec, so a
    spawned child (fork, then exec) would report its parent's size as its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_size(
    cgroup: Cgroup,
    manifest: Path,
    target: str,
    request: Request,
    memory_mb: int,
    machine_cpus: int,
    *,
    seconds: float,
    price_gb_second: float,
    price_per_million: float,
) -> Size:
    share = min(vcpus(memory_mb), machine_cpus)
    cgroup.limit(share)
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    answers, out = context.Pipe(duplex=False)
    child = context.Process(
        target=_child, args=(str(manifest), target, (request.body, request.headers), seconds, go, out)
    )
    child.start()
    out.close()  # the child's end: once the child is gone, a read sees the end instead of waiting
    try:
        assert child.pid is not None
        cgroup.add(child.pid)
        go.set()
        if not answers.poll(seconds + 300):
            raise RuntimeError(f"the Lambda handler did not answer within {seconds + 300:.0f} s")
        try:
            status, found = answers.recv()
        except EOFError:
            raise RuntimeError(
                f"the measured process exited ({child.exitcode}) before answering: run the handler alone to see why"
            ) from None
    finally:
        answers.close()
        child.join(timeout=60)
    if status != "ok":
        raise RuntimeError(f"the Lambda handler answered {found}")
    init_ms, latencies, peak_mb = found
    billed = statistics.fmean(math.ceil(ms) for ms in latencies)
    cost = prices.lambda_cost_per_million(memory_mb, billed, gb_second=price_gb_second, per_million=price_per_million)
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return Size(
        memory_mb,
        vcpus(memory_mb),
        share,
        init_ms,
        statistics.median(ordered),
        p99,
        billed,
        cost,
        peak_mb,
        len(ordered),
    )


def measure(
    manifest: Path,
    target: str,
    request: Request,
    sizes: Sequence[int] = SIZES,
    *,
    machine_cpus: int,
    seconds: float = 3.0,
    price_gb_second: float = prices.LAMBDA_GB_SECOND["x86_64"],
    price_per_million: float = prices.LAMBDA_PER_MILLION,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Size] | str:
    """Every size's figures, or why CPU quotas cannot be applied on this machine."""
    cgroup = make_cgroup(f"fnserve-bench-{os.getpid()}")
    if isinstance(cgroup, str):
        return f"no CPU quota can be applied here ({cgroup}): Lambda sizes are not emulated"
    workdir = Path(tempfile.mkdtemp(prefix="fnserve-lambda-"))
    try:
        manifest = variant_manifest(manifest, target, Config(), workdir)  # the target alone, no result cache
        found = []
        for memory in sizes:
            progress(f"Lambda {memory} MB ({vcpus(memory):.2f} vCPU)")
            found.append(
                measure_size(
                    cgroup,
                    manifest,
                    target,
                    request,
                    memory,
                    machine_cpus,
                    seconds=seconds,
                    price_gb_second=price_gb_second,
                    price_per_million=price_per_million,
                )
            )
        return found
    finally:
        cgroup.remove()
        shutil.rmtree(workdir, ignore_errors=True)


def cheapest(sizes: Sequence[Size], p99_ms: float | None) -> Size | None:
    """The lowest cost per million among sizes that fit (and meet the p99 budget, when given)."""
    good = [s for s in sizes if s.fits and (p99_ms is None or s.p99 <= p99_ms)]
    return min(good, key=lambda s: s.cost_per_million) if good else None
