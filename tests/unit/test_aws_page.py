"""docs/aws-costs.md and docs/aws.md say what the code says: its prices and cost figures are what
``fnserve.bench.prices`` gives (a price update cannot leave the page stale: the failure prints what to paste),
``fnserve bench --lambda`` costs memory sizes with the same prices and formula, and the stack outputs the page lists
are template.yaml's."""

from __future__ import annotations

import inspect
import re

import pytest
import yaml
from cfnlint.decode.cfn_yaml import load

from fnserve.bench import prices, sizing
from fnserve.bench.main import Options
from fnserve.cli.bench import bench
from tests.helpers import REPO

PAGE = (REPO / "docs" / "aws-costs.md").read_text()
OUTPUTS_PAGE = (REPO / "docs" / "aws.md").read_text()
TEMPLATE = load(str(REPO / "template.yaml"))
MONTH_HOURS = 730  # a month as AWS's pricing pages count it, for what is billed by the second or the hour
BILLED_MS = (10, 100)  # the durations the page's table costs
ARCHITECTURES = ("x86_64", "arm64")


def money(usd: float) -> str:
    """Dollars with cents, and as many more digits as the figure has (prices go to ten thousandths of a cent)."""
    digits = f"{usd:.10f}".rstrip("0")
    whole, _, cents = digits.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def price_table() -> str:
    rows = [f"| {what} | {money(usd)} per {unit} |" for what, usd, unit in prices.TABLE]
    return "\n".join(["| what | price |", "| --- | --- |", *rows])


def cost_table() -> str:
    head = ["`ApiMemorySize` (MB)", "vCPU", "each billed ms, x86_64"]
    head += [f"{arch} at {ms} ms" for arch in ARCHITECTURES for ms in BILLED_MS]
    rows = []
    for memory in sizing.SIZES:
        x86 = prices.LAMBDA_GB_SECOND["x86_64"]
        cells = [str(memory), f"{sizing.vcpus(memory):.2f}", f"${1e6 / 1e3 * memory / 1024 * x86:.4f}"]
        for arch in ARCHITECTURES:
            for ms in BILLED_MS:
                cost = prices.lambda_cost_per_million(memory, ms, gb_second=prices.LAMBDA_GB_SECOND[arch])
                cells.append(f"${cost:.3f}")
        rows.append(cells)
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


SAGEMAKER = load(str(REPO / "infra" / "container" / "sagemaker.yaml"))
CLOUD_RUN = yaml.safe_load((REPO / "infra" / "gcp" / "cloudrun" / "service.yaml").read_text())


def targets_table() -> str:
    """A million requests on each serverless target as its file in the repository sizes it, each request taking
    10 or 100 ms: Lambda (the API function), SageMaker Serverless (Mode=serverless), Cloud Run (service.yaml)."""
    lambda_mb = int(TEMPLATE["Parameters"]["ApiMemorySize"]["Default"])
    sagemaker_mb = int(SAGEMAKER["Parameters"]["ServerlessMemorySizeInMB"]["Default"])
    limits = CLOUD_RUN["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    cpus, gib = float(limits["cpu"]), float(limits["memory"].removesuffix("Gi"))
    rows = [
        (
            f"Lambda, `ApiMemorySize` {lambda_mb} MB, x86_64",
            "each invocation, and its milliseconds times the memory",
            [prices.lambda_cost_per_million(lambda_mb, ms) for ms in BILLED_MS],
        ),
        (
            f"SageMaker Serverless, `ServerlessMemorySizeInMB` {sagemaker_mb}",
            "each invocation's compute milliseconds times the memory size, and the data processed (apart)",
            [prices.sagemaker_serverless_cost_per_million(sagemaker_mb, ms) for ms in BILLED_MS],
        ),
        (
            f"Cloud Run, {cpus:g} vCPU and {gib:g} GiB, one request at a time",
            f"each request, and the instance's time with one in flight, rounded up to "
            f"{prices.CLOUD_RUN_ROUNDING_MS} ms",
            [prices.cloud_run_cost_per_million(cpus, gib, ms, alone=True) for ms in BILLED_MS],
        ),
        (
            f"Cloud Run, {cpus:g} vCPU and {gib:g} GiB, busy",
            "the same, the instance's time shared by the requests in flight (each taking its share)",
            [prices.cloud_run_cost_per_million(cpus, gib, ms, alone=False) for ms in BILLED_MS],
        ),
    ]
    head = ["target, as its file sizes it", "billed for", *(f"at {ms} ms" for ms in BILLED_MS)]
    lines = [head, ["---"] * len(head)]
    lines += [[what, billed, *(f"${cost:.3f}" for cost in costs)] for what, billed, costs in rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def alarm_metrics() -> int:
    """What the template's alarms bill for: one metric each, or each metric a metric-math alarm reads."""
    alarms = [r["Properties"] for r in TEMPLATE["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    return sum(len([m for m in a["Metrics"] if "MetricStat" in m]) if "Metrics" in a else 1 for a in alarms)


def idle_lines() -> list[str]:
    secrets = [  # those the default stack deploys: ApiAuth=APIKEY's own comes with that mode
        r for r in TEMPLATE["Resources"].values() if r["Type"] == "AWS::SecretsManager::Secret" and "Condition" not in r
    ]
    metrics = alarm_metrics()
    idle = len(secrets) * prices.SECRET_MONTH + metrics * prices.ALARM_METRIC_MONTH
    memory = int(TEMPLATE["Parameters"]["ApiMemorySize"]["Default"])
    warm = memory / 1024 * MONTH_HOURS * 3600 * prices.LAMBDA_PROVISIONED_GB_SECOND["x86_64"]
    polled = len(polled_queues())
    polls = prices.sqs_idle_requests_a_month(polled)
    return [
        f"{len(secrets)} secret and {metrics} alarm metrics: **{money(idle)} a month**",
        f"each of the {polled} queues, {polls:,.0f} empty receives: "
        f"**{money(round(prices.sqs_idle_cost_a_month(polled), 2))} a month**",
        f"one environment of the default {memory:,} MB costs {money(round(warm, 2))} a month on x86_64",
    ]


def polled_queues() -> set[str]:
    """The queues Lambda polls: those a function's SQS event source reads (the zip and image twins share them)."""
    functions = [r["Properties"] for r in TEMPLATE["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    sources = [e["Properties"] for f in functions for e in f.get("Events", {}).values() if e["Type"] == "SQS"]
    return {str(s["Queue"]) for s in sources}


def test_the_prices_and_the_cost_table_are_what_the_prices_give() -> None:
    paste = "stale: `python -m tests.unit.test_aws_page` prints what docs/aws-costs.md should say"
    assert f"AWS's list prices for us-east-1, recorded on {prices.AS_OF}" in PAGE, paste
    assert price_table() in PAGE, f"the price table is {paste}"
    assert cost_table() in PAGE, f"the cost table is {paste}"
    assert targets_table() in PAGE, f"the serverless targets' table is {paste}"
    for line in idle_lines():
        assert line in PAGE, f"the idle cost is {paste}"
    assert prices.request_figures_table() in PAGE, f"what a request is billed on is {paste}"
    assert prices.worked_totals_table() in PAGE, f"the worked totals are {paste}"


def test_the_worked_totals_price_the_stack_the_template_deploys() -> None:
    parameters = TEMPLATE["Parameters"]
    assert int(parameters["ApiMemorySize"]["Default"]) == prices.API_MEMORY_MB  # where the billed ms hold
    assert parameters["Architecture"]["Default"] == "x86_64"  # the duration's price
    assert parameters["XRayTracing"]["Default"] == "Active"  # X-Ray's line
    assert len(polled_queues()) == prices.POLLED_QUEUES
    config = TEMPLATE["Globals"]["Function"]["LoggingConfig"]
    # At WARN Lambda writes none of its START and REPORT lines, which the log bytes leave out.
    assert config["LogFormat"] == "JSON" and config["SystemLogLevel"] == "WARN"
    assert set(prices.REQUESTS) == set(prices.LAMBDA_BILLED_MS) == set(prices.FUNCTION_LOG_BYTES)
    assert set(prices.REQUESTS) == set(prices.CACHE_ITEM_BYTES)


def test_the_formulas_around_lambda() -> None:
    # X-Ray: every request while one a second or fewer; then one and 5% of the rest.
    assert prices.xray_sampled_share(0.5) == prices.xray_sampled_share(1) == 1.0
    assert prices.xray_sampled_share(100) == pytest.approx((1 + 0.05 * 99) / 100)
    assert prices.xray_cost_per_million(100) == pytest.approx(0.0595 * prices.XRAY_PER_MILLION_TRACES)
    # SQS: five pollers, a request each every 20 s, all month; a fixed cost spread over a month of requests.
    assert prices.sqs_idle_requests_a_month(1) == 5 * 730 * 3600 / 20 == 657_000
    assert prices.per_million_requests(2.628, 1) == pytest.approx(1.0)  # $2.628 over 2,628,000 requests
    # Logs: a GB a million requests costs a GB's ingestion.
    assert prices.logs_cost_per_million(1024**3 / 1e6) == pytest.approx(prices.LOGS_INGESTED_GB)
    # DynamoDB: a miss reads half a unit and writes a unit a KB; a hit reads half a unit per 4 KB and writes nothing.
    miss = 0.5 * prices.DYNAMODB_READS_PER_MILLION + 2 * prices.DYNAMODB_WRITES_PER_MILLION
    assert prices.dynamodb_cache_cost_per_million(1025) == pytest.approx(miss)
    assert prices.dynamodb_cache_cost_per_million(5000, hit_share=1.0) == pytest.approx(
        prices.DYNAMODB_READS_PER_MILLION
    )


def test_the_table_costs_the_sizes_fnserve_bench_measures_at_the_prices_it_uses() -> None:
    defaults = {name: p.default for name, p in inspect.signature(bench).parameters.items()}
    assert defaults["memory"] == ",".join(map(str, sizing.SIZES))
    assert defaults["price_gb_second"] == Options.price_gb_second == prices.LAMBDA_GB_SECOND["x86_64"]
    assert defaults["price_per_million"] == Options.price_per_million == prices.LAMBDA_PER_MILLION
    # The formula apart: memory in GB times billed seconds times a million invocations, then the requests' price.
    assert prices.lambda_cost_per_million(2048, 10, gb_second=1.0, per_million=0.0) == pytest.approx(20_000)
    assert prices.lambda_cost_per_million(2048, 10, gb_second=0.0, per_million=0.2) == pytest.approx(0.2)
    assert prices.lambda_cost_per_million(2048, 10) == pytest.approx(
        20_000 * prices.LAMBDA_GB_SECOND["x86_64"] + prices.LAMBDA_PER_MILLION
    )


def test_the_outputs_the_page_lists_are_the_templates() -> None:
    section = OUTPUTS_PAGE.split("## The stack's outputs", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    assert listed == list(TEMPLATE["Outputs"]), "docs/aws.md's outputs table is not template.yaml's Outputs"


def test_the_other_targets_formulas() -> None:
    # SageMaker Serverless: compute seconds times the memory size in GB, nothing per request.
    assert prices.sagemaker_serverless_cost_per_million(2048, 100) == pytest.approx(
        1e6 * 0.1 * 2 * prices.SAGEMAKER_SERVERLESS_GB_SECOND
    )
    per_second = 2 * prices.CLOUD_RUN_VCPU_SECOND + 4 * prices.CLOUD_RUN_GIB_SECOND
    # Cloud Run alone: 10 ms billed as the whole step; busy: 10 ms each; 150 ms alone billed as 200.
    alone, busy = (prices.cloud_run_cost_per_million(2, 4, 10, alone=flag) for flag in (True, False))
    assert alone == pytest.approx(prices.CLOUD_RUN_PER_MILLION + 1e6 * 0.1 * per_second)
    assert busy == pytest.approx(prices.CLOUD_RUN_PER_MILLION + 1e6 * 0.01 * per_second)
    assert prices.cloud_run_cost_per_million(2, 4, 150, alone=True) == pytest.approx(
        prices.CLOUD_RUN_PER_MILLION + 1e6 * 0.2 * per_second
    )


def test_money_keeps_cents_and_every_digit_of_a_price() -> None:
    assert [money(0.2), money(1.0), money(0.0000166667), money(0.625)] == ["$0.20", "$1.00", "$0.0000166667", "$0.625"]


if __name__ == "__main__":
    print(f"AWS's list prices for us-east-1, recorded on {prices.AS_OF}\n")
    print(price_table(), cost_table(), prices.request_figures_table(), prices.worked_totals_table(), sep="\n\n")
    print(targets_table(), *idle_lines(), sep="\n\n")
