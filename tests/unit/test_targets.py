"""``fnserve bench --targets``' arithmetic: each target's row against the same bill worked out by hand here, its front
door's included, the cold starts that low traffic meets, the break-even traffic, and the answer when no target meets
the budget."""

from __future__ import annotations

import math

import pytest

from fnserve.bench import cost, targets
from fnserve.bench.targets import Choices, Measured, Profile

MONTH = 730 * 3600
MEASURED = Measured(cpu_ms=2.0, p99_ms=3.0, start_ms=400.0, memory_mb=300.0)
PROFILE = Profile(rps=10.0, peak_rps=20.0, bytes_in=1000, bytes_out=500, p99_ms=100.0)
API = Choices(front_door="api")
# An ALB's month at the profile: its hours, and 10 requests a second of 1,500 bytes in LCUs of 1 GB an hour
ALB_MONTH = (0.0225 + 10 * 1500 * 3600 / 1e9 * 0.008) * 730


def row(name: str, found: list[targets.Row] | None = None) -> targets.Row:
    found = found if found is not None else targets.rows(MEASURED, PROFILE)
    return next(r for r in found if r.name == name)


def test_lambda_on_demand_bills_each_request_and_its_milliseconds_times_the_memory() -> None:
    share = 1024 / 1769  # a vCPU at 1,769 MB
    ms = 2.0 / share  # 3.46 ms: billed 4
    each = 0.20e-6 + 4 / 1e3 * 1.0 * 0.0000166667  # Lambda's request and the GB-seconds; a function URL is free
    found = row("Lambda x86_64 1024 MB")
    assert found.door == "function URL" and found.named == "Lambda x86_64 1024 MB via function URL"
    assert found.vcpus == pytest.approx(share)
    assert found.month == pytest.approx(each * 10 * MONTH)
    assert found.per_million == pytest.approx(each * 1e6)
    assert found.p99_ms == pytest.approx(3.0 / share) and found.cold_share < 1e-100
    assert math.ceil(ms) == 4 and found.meets(100.0)
    arm = row("Lambda arm64 1024 MB")
    assert arm.month == pytest.approx((0.20e-6 + 4 / 1e3 * 0.0000133334) * 10 * MONTH)


def test_lambda_provisioned_for_the_mean_bills_every_second_configured_and_cheaper_milliseconds() -> None:
    # 10 requests a second of 2 ms at 1,769 MB (one vCPU): 0.02 environments busy, 1 provisioned
    gb = 1769 / 1024
    each = 0.20e-6 + 2 / 1e3 * gb * 0.0000097222
    found = row("Lambda x86_64 provisioned 1769 MB x1")
    assert found.month == pytest.approx((1 * gb * 0.0000041667 + 10 * each) * MONTH)
    assert found.cold_share == 0 and found.p99_ms == pytest.approx(3.0)
    busy = targets.rows(MEASURED, PROFILE.at(2000.0))  # 2,000 a second of 2 ms: 4 environments at once
    assert row("Lambda x86_64 provisioned 1769 MB x4", busy).month == pytest.approx(
        (4 * gb * 0.0000041667 + 2000 * each) * MONTH
    )


def test_sagemaker_serverless_bills_compute_times_memory_and_the_data_in_and_out() -> None:
    share = 1 + (2048 - 1769) / (10240 - 1769) * 5  # Lambda's curve past one vCPU
    each = 2 / 1e3 * 2.0 * 0.00002 + 1500 / 2**30 * 0.016
    found = row("SageMaker Serverless 2048 MB")
    assert found.vcpus == pytest.approx(share)
    assert found.month == pytest.approx(each * 10 * MONTH)
    assert found.p99_ms == pytest.approx(3.0)


def test_cloud_run_request_based_bills_100_ms_steps_with_a_request_in_flight_and_each_request() -> None:
    busy_steps = 1 - math.exp(-10 * 0.1)  # 10 a second, each holding a 100 ms step
    memory_gib = 0.5  # 300 MB of model: Cloud Run's least, 512 MiB
    per_second = busy_steps * (0.000024 + memory_gib * 0.0000025) + 10 * 0.40e-6
    assert row("Cloud Run request-based 1 vCPU, min 0").month == pytest.approx(per_second * MONTH)
    idle = (1 - busy_steps) * (0.0000025 + memory_gib * 0.0000025)  # a minimum instance's idle time
    assert row("Cloud Run request-based 1 vCPU, min 1").month == pytest.approx((per_second + idle) * MONTH)


def test_cloud_run_instance_based_bills_every_instance_for_its_whole_life() -> None:
    per_second = 0.000018 + 0.5 * 0.000002
    assert row("Cloud Run instance-based 1 vCPU, min 1").month == pytest.approx(per_second * MONTH)
    # 1,000 a second of 2 ms: 2 vCPUs busy, kept at 60% by 3.33 instances of one vCPU
    found = row("Cloud Run instance-based 1 vCPU, min 0", targets.rows(MEASURED, PROFILE.at(1000.0)))
    assert found.month == pytest.approx(2 / 0.6 * per_second * MONTH)


def test_the_container_is_the_least_fargate_size_for_the_peak_queued_at_its_utilisation() -> None:
    found = row("container 0.25 vCPU, 1 GB")  # the peak, 20 a second of 2 ms, keeps 0.04 vCPU busy
    assert found.month == pytest.approx((0.25 * 0.04048 + 1 * 0.004445) * 730 + ALB_MONTH)
    assert found.p99_ms == pytest.approx(3.0 / 0.25 / (1 - 0.04 / 0.25))
    given = targets.rows(MEASURED, PROFILE, Choices(container_vcpus=2, container_vcpu_hour=0.05))
    assert row("container 2 vCPU, 4 GB", given).month == pytest.approx((2 * 0.05 + 4 * 0.004445) * 730 + ALB_MONTH)
    overloaded = targets.rows(MEASURED, PROFILE.at(5000.0), Choices(container_vcpus=4))  # 10,000 at peak: 20 vCPUs
    assert row("container 4 vCPU, 8 GB", overloaded).note == "overloaded at the peak"
    assert not row("container 4 vCPU, 8 GB", overloaded).meets(None)


def test_each_kind_of_row_is_priced_with_the_same_kind_of_front_door() -> None:
    own, api = targets.rows(MEASURED, PROFILE), targets.rows(MEASURED, PROFILE, API)
    doors = {(r.family, r.door) for r in own} | {(r.family, r.door) for r in api}
    assert doors == {
        (targets.LAMBDA, "function URL"),
        (targets.LAMBDA, "HTTP API"),
        (targets.LAMBDA_PROVISIONED, "function URL"),
        (targets.LAMBDA_PROVISIONED, "HTTP API"),
        (targets.SAGEMAKER, "InvokeEndpoint"),
        (targets.SAGEMAKER, "REST API"),
        (targets.CLOUD_RUN_REQUEST, "run.app URL"),
        (targets.CLOUD_RUN_REQUEST, "Google API Gateway"),
        (targets.CLOUD_RUN_INSTANCE, "run.app URL"),
        (targets.CLOUD_RUN_INSTANCE, "Google API Gateway"),
        (targets.CONTAINER, "ALB"),
        (targets.CONTAINER, "HTTP API + ALB"),
    }
    # Each by hand behind an API: the platform's bill as behind its own endpoint, and the API's fee for every request
    lambda_each = 0.20e-6 + 1.00e-6 + 4 / 1e3 * 1.0 * 0.0000166667  # one 512 KB step of HTTP API
    assert row("Lambda x86_64 1024 MB", api).month == pytest.approx(lambda_each * 10 * MONTH)
    sagemaker_each = 2 / 1e3 * 2.0 * 0.00002 + 1500 / 2**30 * 0.016 + 3.50e-6  # a REST API's request
    assert row("SageMaker Serverless 2048 MB", api).month == pytest.approx(sagemaker_each * 10 * MONTH)
    assert row("SageMaker Serverless 2048 MB", own).month == pytest.approx((sagemaker_each - 3.50e-6) * 10 * MONTH)
    cloud_run = row("Cloud Run instance-based 1 vCPU, min 1", own).month
    assert row("Cloud Run instance-based 1 vCPU, min 1", api).month == pytest.approx(cloud_run + 3.00e-6 * 10 * MONTH)
    container = (0.25 * 0.04048 + 1 * 0.004445) * 730
    assert row("container 0.25 vCPU, 1 GB", api).month == pytest.approx(container + ALB_MONTH + 1.00e-6 * 10 * MONTH)
    big = Profile(rps=10.0, peak_rps=20.0, bytes_in=600 * 1024, bytes_out=500)  # two of HTTP API's 512 KB steps
    assert row("Lambda x86_64 1024 MB", targets.rows(MEASURED, big, API)).month - row(
        "Lambda x86_64 1024 MB", targets.rows(MEASURED, big)
    ).month == pytest.approx(2 * 1.00e-6 * 10 * MONTH)
    with pytest.raises(ValueError, match="front door 'alb'"):
        targets.rows(MEASURED, PROFILE, Choices(front_door="alb"))


def test_sagemaker_says_when_its_cold_start_or_its_concurrency_sets_the_p99() -> None:
    quiet = PROFILE.at(0.001)
    found = row("SageMaker Serverless 2048 MB", targets.rows(MEASURED, quiet))
    assert found.p99_ms == pytest.approx(400.0 + 2.0) and "container's not counted" in found.note
    started = targets.rows(MEASURED, quiet, Choices(sagemaker_start_ms=3000.0))
    assert row("SageMaker Serverless 2048 MB", started).p99_ms == pytest.approx(3000.0 + 400.0 + 2.0)
    # a peak that keeps more requests in flight than one endpoint may run at once
    busy = row("SageMaker Serverless 2048 MB", targets.rows(MEASURED, PROFILE.at(100_000.0)))
    assert math.isinf(busy.p99_ms) and busy.note == "throttled at the peak: 400 at once, past its 200"


def test_at_low_traffic_a_share_of_requests_meets_a_cold_start_and_sets_the_p99() -> None:
    quiet = PROFILE.at(0.001)  # a request every 1,000 s: Lambda's environment is gone after 300 s idle
    found = row("Lambda x86_64 1769 MB", targets.rows(MEASURED, quiet))
    assert found.cold_share == pytest.approx(math.exp(-0.3))
    assert found.p99_ms == pytest.approx(400.0 + 2.0)  # the start and the request, at one vCPU
    assert not found.meets(100.0)
    assert row("Lambda x86_64 provisioned 1769 MB x1", targets.rows(MEASURED, quiet)).meets(100.0)
    assert row("Cloud Run request-based 1 vCPU, min 1", targets.rows(MEASURED, quiet)).cold_share == 0
    assert targets.tail_ms(3.0, 402.0, 0.009) == 3.0 and targets.tail_ms(3.0, 402.0, 0.011) == 402.0


def test_a_size_smaller_than_the_models_memory_is_never_recommended() -> None:
    big = Measured(cpu_ms=2.0, p99_ms=3.0, start_ms=400.0, memory_mb=1500.0)
    found = targets.rows(big, PROFILE)
    assert row("Lambda arm64 1024 MB", found).note == "too small"
    best = targets.cheapest(found, None)
    assert best is not None and best.fits and "1024 MB" not in best.name


def test_the_recommendation_is_the_cheapest_row_within_the_budget() -> None:
    found = targets.rows(MEASURED, PROFILE)
    best = targets.cheapest(found, 100.0)
    assert best is not None and best.month == min(r.month for r in found if r.meets(100.0))
    tight = targets.cheapest(found, 3.5)  # only rows at a vCPU or more, unqueued, are within 3.5 ms
    assert tight is not None and tight.p99_ms <= 3.5 and tight.vcpus >= 1


def test_a_break_even_is_where_a_flat_bill_meets_one_that_grows_with_traffic() -> None:
    found = targets.break_evens(lambda rps: {"flat": 10.0, "per request": rps}, targets.traffic(0.1, 1000.0))
    assert len(found) == 1
    assert found[0].rps == pytest.approx(10.0, rel=1e-6)
    assert (found[0].below, found[0].above) == ("per request", "flat")
    assert targets.break_evens(lambda rps: {"alone": rps}, targets.traffic(0.1, 1000.0)) == []


def test_the_break_even_of_sagemaker_and_the_container_is_worked_out_by_hand() -> None:
    measured = Measured(cpu_ms=5.0, p99_ms=6.0, start_ms=400.0, memory_mb=300.0)
    steady = Profile(rps=1.0, peak_rps=1.0, bytes_in=1000, bytes_out=500)
    # Behind an API each: the container's 0.25 vCPU and 1 GB (enough to 30 a second) and its load balancer's hours,
    # then for each request a second a month of HTTP API's fee and the balancer's LCUs
    container = (0.25 * 0.04048 + 1 * 0.004445 + 0.0225) * 730
    container_each = 1.00e-6 * MONTH + 1500 * 3600 / 1e9 * 0.008 * 730
    # a request at 1024 MB, its data, and the REST API's fee
    sagemaker = math.ceil(5.0 / (1024 / 1769)) / 1e3 * 0.00002 + 1500 / 2**30 * 0.016 + 3.50e-6
    pair = (targets.SAGEMAKER, targets.CONTAINER)

    def costs(rps: float) -> dict[str, float]:
        return {f: c for f, c in targets.family_costs(measured, steady, API, rps).items() if f in pair}

    found = targets.break_evens(costs, targets.traffic(1.0, 30.0))
    assert [(b.below, b.above) for b in found] == [pair]
    assert found[0].rps == pytest.approx(container / (sagemaker * MONTH - container_each), rel=1e-6)


def test_break_evens_read_as_a_sentence_and_targets_taking_turns_are_said_once() -> None:
    turns = [
        targets.BreakEven(0.01, None, "Lambda provisioned"),
        targets.BreakEven(91.5, "Lambda provisioned", "container"),
        targets.BreakEven(3284.0, "container", "Cloud Run"),
        targets.BreakEven(4740.0, "Cloud Run", "container"),
        targets.BreakEven(6567.0, "container", "Cloud Run"),
    ]
    assert cost.changes(turns) == (
        "nothing meets the budget; Lambda provisioned from 0.01; container from 91.5; "
        "Cloud Run and container take turns from 3,284 to 6,567"
    )


def test_a_profile_no_target_meets_is_answered_in_a_sentence() -> None:
    impossible = Profile(rps=1.0, peak_rps=1.0, bytes_in=1000, bytes_out=500, p99_ms=0.5)  # measured p99: 3 ms
    found = targets.rows(MEASURED, impossible)
    assert targets.cheapest(found, 0.5) is None
    text = cost.summary(MEASURED, impossible, found, [])
    first = text.splitlines()[0]
    assert first.startswith("no target meets p99 <= 0.5 ms at 1 req/s mean")
    assert "the lowest p99 is" in first and "3.00 ms" in first and "Raise --p99-ms" in first


def test_the_peak_keeps_its_ratio_to_the_mean_along_the_traffic() -> None:
    assert PROFILE.at(1.0) == Profile(1.0, 2.0, 1000, 500, 100.0)
    grid = targets.traffic(0.001, 10.0, per_decade=2)
    assert grid[0] == pytest.approx(0.001) and grid[-1] == pytest.approx(10.0) and len(grid) == 9
