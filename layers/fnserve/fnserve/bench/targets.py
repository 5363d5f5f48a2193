"""``fnserve bench --targets``: what a model costs a month, and its p99, on each target at a traffic profile.

Arithmetic only, over three figures bench measures on this machine (``Measured``: a warm request's milliseconds and
its p99 at one full vCPU, and the cold start: import and model load in a fresh process at one vCPU) and a
``Profile`` (mean and peak requests a second, bytes in and out, a p99 budget); prices from ``fnserve.bench.prices``.

How each target's CPU share is read:

- **Lambda**: memory sets it, one vCPU at 1,769 MB (``sizing.vcpus``; "Lambda allocates CPU power in proportion to
  the amount of memory configured", https://docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html).
- **SageMaker Serverless Inference**: AWS says only that an endpoint's compute is in proportion to the memory size
  chosen and that it runs on Lambda (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html,
  "Memory size"); no vCPU figure is published, so Lambda's curve is applied at its sizes, 1024 to 6144 MB.
- **Cloud Run**: its CPU setting, 1 vCPU unless told (https://cloud.google.com/run/docs/configuring/services/cpu).
- **A container**, always on: the vCPUs given, else the smallest Fargate task size that keeps the peak within
  ``UTILISATION`` (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/fargate-tasks-services.html).

Every target is priced with a front door of the same kind (``FRONT_DOORS``, ``--front-door``), so that the same
callers get the same access on each: ``own``, each platform's own endpoint (a Lambda function URL, SageMaker's
InvokeEndpoint, Cloud Run's URL; a container has none, so an Application Load Balancer), callers signing with the
cloud's credentials or the app checking its own keys; ``api``, a managed API in front of each, with its keys, JWTs
and throttling (Lambda behind HTTP API, as the stack deploys it; SageMaker behind a REST API's AWS integration, which
HTTP API lacks; Cloud Run behind Google Cloud's API Gateway; the container behind HTTP API and its load balancer).

A request on a share ``s`` of a vCPU takes its one-vCPU time over ``min(s, 1)``: a quota below one vCPU stretches it,
and more than one does not shorten one request (it was measured at one). The cold start stretches the same way.
Arrivals are Poisson: a target that scales to zero after ``IDLE_S[target]`` seconds idle meets a cold environment
with the chance that no request came in that time; when that share passes 1%, the p99 is a cold request's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fnserve.bench import prices, sizing

LAMBDA = "Lambda"
LAMBDA_PROVISIONED = "Lambda provisioned"
SAGEMAKER = "SageMaker Serverless"
CLOUD_RUN_REQUEST = "Cloud Run request-based"
CLOUD_RUN_INSTANCE = "Cloud Run instance-based"
CONTAINER = "container"
FAMILIES = (LAMBDA, LAMBDA_PROVISIONED, SAGEMAKER, CLOUD_RUN_REQUEST, CLOUD_RUN_INSTANCE, CONTAINER)

ARCHITECTURES = ("x86_64", "arm64")
SAGEMAKER_SIZES = (1024, 2048, 3072, 4096, 5120, 6144)
SAGEMAKER_MAX_CONCURRENCY = 200  # an endpoint's most; requests past it are throttled, not queued
FARGATE_VCPUS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # a task's sizes; its least memory is 2 GB a vCPU
CLOUD_RUN_MIN_MIB = 512
CLOUD_RUN_STEP_MS = prices.CLOUD_RUN_ROUNDING_MS
HTTP_API_STEP_BYTES = 512 * 1024  # HTTP API meters a request in 512 KB steps
OWN, API = "own", "api"
FRONT_DOORS = (OWN, API)
ALB_GB_PER_LCU_HOUR = 1.0  # an LCU's processed bytes; clients that keep their connections make bytes the meter
GIB = 1024**3
COLD_QUANTILE = 0.01  # the share of requests a p99 leaves above it
# The CPU utilisation Cloud Run's autoscaler keeps instances at (https://cloud.google.com/run/docs/about-instance-
# autoscaling); a container sized for its peak is kept there too, where queueing stays short.
UTILISATION = 0.6
IDLE_S = {
    LAMBDA: 5 * 60.0,  # AWS publishes none; environments are commonly reclaimed 5 to 15 minutes idle: the shorter
    SAGEMAKER: 5 * 60.0,  # as Lambda, which it runs on
    CLOUD_RUN_REQUEST: 15 * 60.0,  # "up to 15 minutes" (about-instance-autoscaling, above)
    CLOUD_RUN_INSTANCE: 15 * 60.0,
}


@dataclass(frozen=True)
class Measured:
    """What bench measured of one model on this machine, at one full vCPU."""

    cpu_ms: float  # a warm request's time (median)
    p99_ms: float  # warm
    start_ms: float  # a fresh process's import and model load
    memory_mb: float  # peak resident memory


@dataclass(frozen=True)
class Profile:
    """The traffic to serve."""

    rps: float  # mean requests a second
    peak_rps: float
    bytes_in: int
    bytes_out: int
    p99_ms: float | None = None  # the budget; None: any finite p99

    def at(self, rps: float) -> Profile:
        """The same shape at another mean: the peak keeps its ratio to it."""
        return replace(self, rps=rps, peak_rps=self.peak_rps * rps / self.rps)


@dataclass(frozen=True)
class Choices:
    """Prices and sizes the user may set; the defaults are ``prices``' (us-east-1 and Cloud Run's tier 1)."""

    lambda_gb_second_x86: float = prices.LAMBDA_GB_SECOND["x86_64"]
    lambda_per_million: float = prices.LAMBDA_PER_MILLION
    container_vcpu_hour: float = prices.FARGATE_VCPU_HOUR["x86_64"]
    container_gb_hour: float = prices.FARGATE_GB_HOUR["x86_64"]
    cloud_run_vcpus: float = 1.0
    container_vcpus: float | None = None  # None: sized for the peak
    front_door: str = OWN  # one of FRONT_DOORS, the same kind before every target
    sagemaker_start_ms: float = 0.0  # the endpoint's container start, added to its cold start (AWS publishes none)

    def lambda_gb_second(self, arch: str) -> float:
        return self.lambda_gb_second_x86 if arch == "x86_64" else prices.LAMBDA_GB_SECOND[arch]


@dataclass(frozen=True)
class Row:
    """One target, configured one way, at one profile."""

    family: str
    target: str  # the platform: "Lambda arm64", "Cloud Run request-based"
    size: str  # how it is configured: "1769 MB", "1 vCPU, min 1"
    vcpus: float
    memory_mb: float
    month: float  # $ a month at the profile's mean
    per_million: float  # $ a million requests, the same bill divided
    p99_ms: float  # expected; math.inf when the peak overloads it
    cold_share: float  # of requests that meet a cold environment
    fits: bool  # the model's peak memory fits the size
    door: str  # the front door priced with it: "function URL", "HTTP API"
    note: str = ""  # why it cannot serve the profile, when it cannot

    @property
    def name(self) -> str:
        return f"{self.target} {self.size}"

    @property
    def named(self) -> str:
        """The row as the report names it: the target, its size and its front door."""
        return f"{self.name} via {self.door}"

    def meets(self, budget: float | None) -> bool:
        return self.fits and math.isfinite(self.p99_ms) and (budget is None or self.p99_ms <= budget)


@dataclass(frozen=True)
class BreakEven:
    """Where the cheapest target that meets the budget changes, going up in traffic."""

    rps: float
    below: str | None  # the family cheapest just under ``rps`` (None: none meets the budget there)
    above: str | None


# -- the parts every target shares ----------------------------------------------------------------------------------


def duration_ms(ms_at_one_vcpu: float, vcpus: float) -> float:
    """A request's (or a start's) time on ``vcpus``, from its time on one."""
    return ms_at_one_vcpu / min(vcpus, 1.0)


def cold_share(rps: float, idle_s: float) -> float:
    """The share of requests that come after ``idle_s`` seconds without one: Poisson arrivals at ``rps``."""
    return math.exp(-rps * idle_s)


def tail_ms(warm_p99: float, cold_ms: float, cold: float) -> float:
    """The p99 of warm requests mixed with a ``cold`` share of requests taking ``cold_ms``."""
    return max(warm_p99, cold_ms) if cold > COLD_QUANTILE else warm_p99


def queued_ms(ms: float, utilisation: float) -> float:
    """A latency stretched by queueing at ``utilisation``: one queue's 1 / (1 - utilisation), an upper bound for
    a server of several vCPUs; infinite when it cannot keep up."""
    return ms / (1 - utilisation) if utilisation < 1 else math.inf


def busy_vcpus(rps: float, cpu_ms: float) -> float:
    """vCPUs kept busy by ``rps`` requests a second of ``cpu_ms`` each."""
    return rps * cpu_ms / 1e3


def http_api_per_request(bytes_in: int) -> float:
    """HTTP API's fee for one request in front of Lambda: a request for each 512 KB step of its body."""
    return max(1, math.ceil(bytes_in / HTTP_API_STEP_BYTES)) * prices.HTTP_API_PER_MILLION / 1e6


@dataclass(frozen=True)
class Door:
    """A front door: its name and its bill, per request and per second of its own."""

    name: str
    each: float = 0.0  # $ a request
    per_second: float = 0.0  # $ a second, whatever the traffic


def alb(profile: Profile) -> Door:
    """An Application Load Balancer: its hours, and its capacity units for the bytes through it at the mean."""
    gb_hour = profile.rps * (profile.bytes_in + profile.bytes_out) * 3600 / 1e9
    lcus = gb_hour / ALB_GB_PER_LCU_HOUR
    return Door("ALB", per_second=(prices.ALB_HOUR + lcus * prices.ALB_LCU_HOUR) / 3600)


def front_door(family: str, profile: Profile, kind: str) -> Door:
    """The front door of ``kind`` (``FRONT_DOORS``) before a target of ``family``."""
    if kind not in FRONT_DOORS:
        raise ValueError(f"front door {kind!r}: one of {', '.join(FRONT_DOORS)}")
    if family in (LAMBDA, LAMBDA_PROVISIONED):
        return Door("HTTP API", each=http_api_per_request(profile.bytes_in)) if kind == API else Door("function URL")
    if family == SAGEMAKER:
        return Door("REST API", each=prices.REST_API_PER_MILLION / 1e6) if kind == API else Door("InvokeEndpoint")
    if family in (CLOUD_RUN_REQUEST, CLOUD_RUN_INSTANCE):
        if kind == API:
            return Door("Google API Gateway", each=prices.GOOGLE_API_GATEWAY_PER_MILLION / 1e6)
        return Door("run.app URL")
    balancer = alb(profile)
    if kind == API:
        return Door("HTTP API + ALB", http_api_per_request(profile.bytes_in), balancer.per_second)
    return balancer


def _row(
    profile: Profile,
    choices: Choices,
    family: str,
    target: str,
    size: str,
    *,
    vcpus: float,
    memory_mb: float,
    per_second: float,
    p99_ms: float,
    cold: float = 0.0,
    fits: bool = True,
    note: str = "",
) -> Row:
    """A row from a target's cost a second at the profile's mean, its front door's bill added."""
    door = front_door(family, profile, choices.front_door)
    month = (per_second + door.per_second + door.each * profile.rps) * prices.MONTH_SECONDS
    per_million = month / (profile.rps * prices.MONTH_SECONDS) * 1e6
    note = note or ("" if fits else "too small")
    return Row(family, target, size, vcpus, memory_mb, month, per_million, p99_ms, cold, fits, door.name, note)


# -- each target ----------------------------------------------------------------------------------------------------


def lambda_row(measured: Measured, profile: Profile, choices: Choices, arch: str, memory_mb: int) -> Row:
    """Lambda on demand: each request billed to the millisecond times the memory."""
    share = sizing.vcpus(memory_mb)
    ms = duration_ms(measured.cpu_ms, share)
    each = choices.lambda_per_million / 1e6
    each += math.ceil(ms) / 1e3 * memory_mb / 1024 * choices.lambda_gb_second(arch)
    cold = cold_share(profile.rps, IDLE_S[LAMBDA])
    p99 = tail_ms(duration_ms(measured.p99_ms, share), duration_ms(measured.start_ms, share) + ms, cold)
    return _row(
        profile,
        choices,
        LAMBDA,
        f"Lambda {arch}",
        f"{memory_mb} MB",
        vcpus=share,
        memory_mb=memory_mb,
        per_second=each * profile.rps,
        p99_ms=p99,
        cold=cold,
        fits=measured.memory_mb <= memory_mb,
    )


def provisioned_concurrency(rps: float, ms: float) -> int:
    """Environments that serve ``rps`` requests of ``ms`` each at once: the mean's concurrency, rounded up."""
    return max(1, math.ceil(rps * ms / 1e3))


def lambda_provisioned_row(measured: Measured, profile: Profile, choices: Choices, arch: str, memory_mb: int) -> Row:
    """Lambda with provisioned concurrency sized for the mean: every second of it configured, and each request's time
    at the provisioned duration price; requests past it (up to the peak) spill onto warm on-demand environments."""
    share = sizing.vcpus(memory_mb)
    ms = duration_ms(measured.cpu_ms, share)
    concurrency = provisioned_concurrency(profile.rps, ms)
    gb = memory_mb / 1024
    each = choices.lambda_per_million / 1e6
    each += math.ceil(ms) / 1e3 * gb * prices.LAMBDA_PROVISIONED_DURATION_GB_SECOND[arch]
    return _row(
        profile,
        choices,
        LAMBDA_PROVISIONED,
        f"Lambda {arch} provisioned",
        f"{memory_mb} MB x{concurrency}",
        vcpus=share,
        memory_mb=memory_mb,
        per_second=concurrency * gb * prices.LAMBDA_PROVISIONED_GB_SECOND[arch] + each * profile.rps,
        p99_ms=duration_ms(measured.p99_ms, share),
        fits=measured.memory_mb <= memory_mb,
    )


def sagemaker_row(measured: Measured, profile: Profile, choices: Choices, memory_mb: int) -> Row:
    """SageMaker Serverless Inference: each request's compute to the millisecond times the memory, and the data.

    Its cold start is the model's start measured here plus the endpoint's container start
    (``Choices.sagemaker_start_ms``); its concurrency is at most ``SAGEMAKER_MAX_CONCURRENCY``, past which requests
    are throttled. The row's note says which of the two sets its p99."""
    share = sizing.vcpus(memory_mb)
    ms = duration_ms(measured.cpu_ms, share)
    each = prices.sagemaker_serverless_cost_per_million(memory_mb, math.ceil(ms)) / 1e6
    each += (profile.bytes_in + profile.bytes_out) / GIB * prices.SAGEMAKER_SERVERLESS_DATA_GB
    cold = cold_share(profile.rps, IDLE_S[SAGEMAKER])
    start = duration_ms(measured.start_ms, share) + choices.sagemaker_start_ms
    p99 = tail_ms(duration_ms(measured.p99_ms, share), start + ms, cold)
    concurrency = math.ceil(busy_vcpus(profile.peak_rps, ms))
    throttled = concurrency > SAGEMAKER_MAX_CONCURRENCY
    if throttled:
        note = f"throttled at the peak: {concurrency} at once, past its {SAGEMAKER_MAX_CONCURRENCY}"
    elif cold > COLD_QUANTILE:
        container = f"+ {choices.sagemaker_start_ms:g} ms" if choices.sagemaker_start_ms else "not counted"
        note = f"p99 is a cold start: the model's here, the container's {container} (--sagemaker-start-ms)"
    else:
        note = ""
    return _row(
        profile,
        choices,
        SAGEMAKER,
        SAGEMAKER,
        f"{memory_mb} MB",
        vcpus=share,
        memory_mb=memory_mb,
        per_second=each * profile.rps,
        p99_ms=math.inf if throttled else p99,
        cold=cold,
        fits=measured.memory_mb <= memory_mb,
        note=note if measured.memory_mb <= memory_mb or throttled else "",
    )


def cloud_run_mib(peak_mb: float) -> float:
    """The memory a Cloud Run service is given: the model's peak, rounded up to 256 MiB, at least 512."""
    return max(CLOUD_RUN_MIN_MIB, math.ceil(peak_mb / 256) * 256)


def cloud_run_instances(rps: float, cpu_ms: float, vcpus: float) -> float:
    """Instances the autoscaler keeps for ``rps``, each near ``UTILISATION`` (fractional: a mean over time)."""
    return busy_vcpus(rps, cpu_ms) / (vcpus * UTILISATION)


def stepped_share(rps: float, ms: float) -> float:
    """The share of one instance's time billed with request-based billing: a step (``CLOUD_RUN_STEP_MS``) in which a
    request is in flight is billed whole (``ms`` rounded up to steps, spread at ``rps``, overlaps counted once)."""
    steps = math.ceil(ms / CLOUD_RUN_STEP_MS) * CLOUD_RUN_STEP_MS
    return 1 - math.exp(-rps * steps / 1e3)


def _cloud_run_p99(measured: Measured, profile: Profile, vcpus: float, min_instances: int) -> tuple[float, float]:
    """The p99 at the peak (queued at the autoscaler's utilisation, or less), and the cold share."""
    ms = duration_ms(measured.cpu_ms, vcpus)
    utilisation = min(UTILISATION, busy_vcpus(profile.peak_rps, measured.cpu_ms) / vcpus)
    warm = queued_ms(duration_ms(measured.p99_ms, vcpus), utilisation)
    cold = 0.0 if min_instances else cold_share(profile.rps, IDLE_S[CLOUD_RUN_REQUEST])
    return tail_ms(warm, duration_ms(measured.start_ms, vcpus) + ms, cold), cold


def cloud_run_request_row(measured: Measured, profile: Profile, choices: Choices, min_instances: int) -> Row:
    """Cloud Run, request-based billing: an instance's time with a request in flight, each request's fee, and
    a minimum instance's idle time at the idle price."""
    vcpus, mib = choices.cloud_run_vcpus, cloud_run_mib(measured.memory_mb)
    ms = duration_ms(measured.cpu_ms, vcpus)
    active = max(stepped_share(profile.rps, ms), cloud_run_instances(profile.rps, measured.cpu_ms, vcpus))
    idle = max(0.0, min_instances - active)
    per_second = active * (vcpus * prices.CLOUD_RUN_VCPU_SECOND + mib / 1024 * prices.CLOUD_RUN_GIB_SECOND)
    per_second += idle * (vcpus * prices.CLOUD_RUN_IDLE_VCPU_SECOND + mib / 1024 * prices.CLOUD_RUN_IDLE_GIB_SECOND)
    per_second += profile.rps * prices.CLOUD_RUN_PER_MILLION / 1e6
    p99, cold = _cloud_run_p99(measured, profile, vcpus, min_instances)
    size = f"{vcpus:g} vCPU, min {min_instances}"
    return _row(
        profile,
        choices,
        CLOUD_RUN_REQUEST,
        CLOUD_RUN_REQUEST,
        size,
        vcpus=vcpus,
        memory_mb=mib,
        per_second=per_second,
        p99_ms=p99,
        cold=cold,
    )


def cloud_run_instance_row(measured: Measured, profile: Profile, choices: Choices, min_instances: int) -> Row:
    """Cloud Run, instance-based billing: every instance's whole life, idle included (an instance stays up to
    ``IDLE_S`` after its last request), no per-request fee."""
    vcpus, mib = choices.cloud_run_vcpus, cloud_run_mib(measured.memory_mb)
    alive = 1 - cold_share(profile.rps, IDLE_S[CLOUD_RUN_INSTANCE])
    up = max(min_instances, alive, cloud_run_instances(profile.rps, measured.cpu_ms, vcpus))
    per_instance = vcpus * prices.CLOUD_RUN_INSTANCE_VCPU_SECOND + mib / 1024 * prices.CLOUD_RUN_INSTANCE_GIB_SECOND
    p99, cold = _cloud_run_p99(measured, profile, vcpus, min_instances)
    size = f"{vcpus:g} vCPU, min {min_instances}"
    return _row(
        profile,
        choices,
        CLOUD_RUN_INSTANCE,
        CLOUD_RUN_INSTANCE,
        size,
        vcpus=vcpus,
        memory_mb=mib,
        per_second=up * per_instance,
        p99_ms=p99,
        cold=cold,
    )


def container_vcpus(peak_rps: float, cpu_ms: float) -> float:
    """The smallest Fargate task size whose vCPUs the peak keeps within ``UTILISATION`` (past the largest: as many
    vCPUs as that takes, in several tasks)."""
    need = busy_vcpus(peak_rps, cpu_ms) / UTILISATION
    return next((size for size in FARGATE_VCPUS if size >= need), float(math.ceil(need)))


def container_gb(vcpus: float, peak_mb: float) -> float:
    """A task's memory: Fargate's least for its vCPUs (2 GB each), or the model's peak in whole GB if more."""
    return max(2 * vcpus, float(math.ceil(peak_mb / 1024)))


def container_row(measured: Measured, profile: Profile, choices: Choices) -> Row:
    """A container always on, on N vCPUs at a $/vCPU-hour and $/GB-hour (Fargate's by default)."""
    vcpus = choices.container_vcpus or container_vcpus(profile.peak_rps, measured.cpu_ms)
    gb = container_gb(vcpus, measured.memory_mb)
    utilisation = busy_vcpus(profile.peak_rps, measured.cpu_ms) / vcpus
    return _row(
        profile,
        choices,
        CONTAINER,
        CONTAINER,
        f"{vcpus:g} vCPU, {gb:g} GB",
        vcpus=vcpus,
        memory_mb=gb * 1024,
        per_second=(vcpus * choices.container_vcpu_hour + gb * choices.container_gb_hour) / 3600,
        p99_ms=queued_ms(duration_ms(measured.p99_ms, vcpus), utilisation),
        note="overloaded at the peak" if utilisation >= 1 else "",
    )


# -- every target, the answer, and where it changes -----------------------------------------------------------------


def rows(measured: Measured, profile: Profile, choices: Choices = Choices()) -> list[Row]:
    """Every target at every size, each behind the front door ``choices`` names: Lambda (each architecture and
    ``sizing.SIZES``, on demand and provisioned), SageMaker Serverless, Cloud Run (both billings, min instances 0
    and 1), the container."""
    found = [lambda_row(measured, profile, choices, a, m) for a in ARCHITECTURES for m in sizing.SIZES]
    found += [lambda_provisioned_row(measured, profile, choices, a, m) for a in ARCHITECTURES for m in sizing.SIZES]
    found += [sagemaker_row(measured, profile, choices, m) for m in SAGEMAKER_SIZES]
    found += [cloud_run_request_row(measured, profile, choices, n) for n in (0, 1)]
    found += [cloud_run_instance_row(measured, profile, choices, n) for n in (0, 1)]
    found.append(container_row(measured, profile, choices))
    return found


def cheapest(found: Sequence[Row], budget: float | None) -> Row | None:
    """The lowest cost a month among rows that fit and meet the budget."""
    good = [row for row in found if row.meets(budget)]
    return min(good, key=lambda row: row.month) if good else None


def fastest(found: Sequence[Row]) -> Row | None:
    """The lowest p99 among rows that fit."""
    fitting = [row for row in found if row.fits]
    return min(fitting, key=lambda row: row.p99_ms) if fitting else None


def by_family(found: Sequence[Row], budget: float | None) -> dict[str, Row]:
    """Each family's cheapest row that meets the budget (families with none are left out)."""
    best = {}
    for family in FAMILIES:
        row = cheapest([r for r in found if r.family == family], budget)
        if row is not None:
            best[family] = row
    return best


def traffic(low: float, high: float, per_decade: int = 12) -> list[float]:
    """Mean requests a second from ``low`` to ``high``, evenly on a log scale."""
    steps = max(1, round(math.log10(high / low) * per_decade))
    return [low * (high / low) ** (i / steps) for i in range(steps + 1)]


def family_costs(measured: Measured, profile: Profile, choices: Choices, rps: float) -> dict[str, float]:
    """Each family's best cost a month at mean ``rps`` (the profile's shape and budget)."""
    at = profile.at(rps)
    return {family: row.month for family, row in by_family(rows(measured, at, choices), at.p99_ms).items()}


def break_evens(
    costs: Callable[[float], dict[str, float]], grid: Sequence[float], *, iterations: int = 40
) -> list[BreakEven]:
    """The traffic at which each cheapest family gives way to the next, along ``grid`` (found between grid points
    by bisection on a log scale); ``costs(rps)`` is each family's cost a month at that mean."""

    def leader(rps: float) -> str | None:
        found = costs(rps)
        return min(found, key=found.__getitem__) if found else None

    points = []
    lo, lead = grid[0], leader(grid[0])
    for hi in grid[1:]:
        ahead = leader(hi)
        if ahead != lead:
            a, b = lo, hi
            for _ in range(iterations):
                mid = math.sqrt(a * b)
                a, b = (mid, b) if leader(mid) == lead else (a, mid)
            points.append(BreakEven(b, lead, leader(b)))
        lo, lead = hi, ahead
    return points
