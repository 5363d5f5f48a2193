"""Every start fnserve has, fresh process to first answer, beside its floor, and where its time goes.

    make bench        (or: python -m tests.bench.bench_start; BENCH_START_RUNS=3 for a quick, noisy look)

Each start is timed from the moment its process is started to its first answer, median of BENCH_START_RUNS (11)
starts interleaved with every other start's (so the disk cache and the machine's noise hit them alike), after one
round that is not timed (the files then come from the page cache). Every answer is checked against its floor's.

- Lambda API function: ``functions/api/app.py`` as the zip and the layers lay it out (the zip's folder is the task
  root, ``app.handler`` the handler, the models layer's manifest FNSERVE_MANIFEST), run by awslambdaric (the
  runtime interface client the Lambda image runs) against a Runtime API on loopback
  (:mod:`fnserve.emulator.runtime_api`), with the table and bucket template.yaml gives it (on a moto server); the
  event ``events/api-http-infer.json``. Beside it the peer, ``tests/bench/plain_server.handler`` (Mangum, FastAPI and
  onnxruntime, as one writes it by hand), started the same way.
- Lambda batch function: ``functions/batch/app.py`` the same way; the event ``events/batch-jobs.json`` with fresh
  job ids each start, its results written to DynamoDB on the moto server.
- fnserve serve: as Cloud Run's files run the image (a bare `fnserve serve`; FNSERVE_FAST_START=true,
  FNSERVE_GRPC_PORT=off, FNSERVE_ANSWER_WHILE_LOADING=false, the manifest in FNSERVE_MANIFEST),
  outside a container, on a manifest holding only digits-accurate, and one holding only minilm-embed (its model and
  pipeline); the first answer is the first 200 to a V2 inference request sent every 10 ms from the start.
- The same two in the CPU server image (``make image-test`` builds it; BENCH_START_IMAGE names another) under
  ``buildah run``, in one container made before the clock starts; skipped, with the reason, when it is not there.

Each one's floor is a bare process with the same model answering the same request through the same interface: a
Runtime API loop (``runtime_floor.py``) for the functions, ``http.server`` (``tests/image/floor_server.py``:
onnxruntime, and tokenizers and mean pooling for MiniLM) for the servers.

Peak RSS: the sum of VmHWM over the start's Python processes at its first answer (all of a server's). Then, by
phase: the interpreter's own start (``python -c pass``); a function's init (its start to its first poll of the
Runtime API) and first invocation, from the timed starts; a server's phases from the timestamps of its start log,
from the timed starts; each step of the start taken in one process with fnserve's own functions
(``start_phases.py``); and the imports on the path to the first answer by top-level package (PYTHONPROFILEIMPORTTIME
on the start itself, self time summed over its processes, cut at the first answer). The last two are the median of
min(3, BENCH_START_RUNS) more starts of each (not of the image's).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import numpy as np
import yaml

from tests.bench._starts import Start, Started, clock, http_start, lambda_start
from tests.bench._timing import fresh_process_seconds
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO, manifest_of
from tests.moto import aws_env, moto_server

RUNS = int(os.environ.get("BENCH_START_RUNS", "11"))
PHASE_RUNS = min(3, RUNS)
IMAGE = os.environ.get("BENCH_START_IMAGE", "localhost/fnserve:cpu-test")
MODELS = DEMO_MANIFEST.parent
HERE = Path(__file__).parent
FLOOR_SERVER = REPO / "tests" / "image" / "floor_server.py"
TABLE, BUCKET = "fnserve-start-results", "fnserve-start-payloads"
NAIVE_API = "naive Mangum + FastAPI handler (awslambdaric)"
SERVED = (("digits-accurate", "digits-accurate"), ("minilm-embed", "minilm-l6"))  # what is served, its model
TEXT = "A cold instance pays its whole start before its first answer."


def cloud_run_env() -> dict[str, str]:
    """How infra/gcp/cloudrun/service.yaml starts fnserve serve: its variables, but for where its models are."""
    service = yaml.safe_load((REPO / "infra" / "gcp" / "cloudrun" / "service.yaml").read_text())
    (container,) = service["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if e["name"] != "FNSERVE_MANIFEST"}


@dataclass
class Row:
    name: str
    start: Start
    floor_name: str
    floor: Start
    steps: Callable[[], dict[str, float]] | None = None  # one start step by step
    logged: bool = False  # a server: phases from its start log
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"start": [], "floor": []})
    rss: dict[str, list[float]] = field(default_factory=lambda: {"start": [], "floor": []})
    init: dict[str, list[float]] = field(default_factory=lambda: {"start": [], "floor": []})
    logs: list[Started] = field(default_factory=list)  # a server's timed starts, for the phases in their logs


# -- what the starts serve ----------------------------------------------------------------------------------------


def request_of(served: str) -> dict[str, Any]:
    if served == "minilm-embed":
        return {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [TEXT]}]}
    row = np.load(DEMO_HOLDOUT)["input"][:1]
    return {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row.ravel().tolist()}]}


def cold_demo_manifest() -> str:
    """The demo manifest with warm-up off on every model (for the step-by-step start), at its own base_dir."""
    text = DEMO_MANIFEST.read_text().replace("[[models]]\n", "[[models]]\nwarmup = false\n")
    return f"base_dir = {json.dumps(str(MODELS))}\n" + text


def batch_event(path: Path | None = None) -> dict[str, Any]:
    """``events/batch-jobs.json`` with fresh job ids (a job done before is not run again)."""
    event: dict[str, Any] = json.loads((REPO / "events" / "batch-jobs.json").read_text())
    run = uuid.uuid4().hex[:12]
    for record in event["Records"]:
        job = json.loads(record["body"])
        job["id"] = f"{job['id']}-{run}"
        record["body"] = json.dumps(job)
    if path is not None:
        path.write_text(json.dumps(event))
    return event


def labels(answer: Any) -> Any:
    """The label (or the embedding) in an answer: an API Gateway response, a V2 body, a batch's failures."""
    if isinstance(answer, dict) and "statusCode" in answer:
        answer = json.loads(answer["body"])
    if isinstance(answer, dict) and "outputs" in answer:
        tensor = next(o for o in answer["outputs"] if o["name"] in ("label", "embedding"))
        return np.round(np.asarray(tensor["data"], dtype=np.float64), 4)
    return answer


def same_answer(row: Row, answer: Any, floor: Any) -> None:
    got, want = labels(answer), labels(floor)
    if isinstance(want, np.ndarray):
        np.testing.assert_allclose(got, want, atol=1e-3, err_msg=row.name)
    elif got != want:
        raise AssertionError(f"{row.name}: answered {got!r}, its floor {want!r}")


# -- phases -------------------------------------------------------------------------------------------------------


def step_by_step(kind: str, names: str, env: dict[str, str], work: Path) -> Callable[[], dict[str, float]]:
    """One start taken step by step in a fresh process (``start_phases.py``): phase -> seconds."""

    def run() -> dict[str, float]:
        event = "-"
        if kind == "api":
            event = str(REPO / "events" / "api-http-infer.json")
        elif kind == "batch":
            event = str(work / "phases-batch.json")
            batch_event(Path(event))
        done = subprocess.run(
            [sys.executable, str(HERE / "start_phases.py"), kind, event, names],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("phases ")), None)
        if done.returncode != 0 or line is None:
            raise RuntimeError(f"start_phases.py {kind}: {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        phases: dict[str, float] = json.loads(line.removeprefix("phases "))
        return phases

    return run


def imports_by_package(output: str) -> dict[str, float]:
    """PYTHONPROFILEIMPORTTIME's self times summed by top-level package, in ms."""
    totals: dict[str, float] = collections.defaultdict(float)
    for match in re.finditer(r"import time:\s+(\d+) \|\s+\d+ \|\s+(\S+)", output):
        totals[match.group(2).lstrip(".").split(".")[0]] += int(match.group(1)) / 1e3
    return totals


def median_by_package(counted: list[dict[str, float]]) -> dict[str, float]:
    names = set().union(*counted)
    return {name: statistics.median(c.get(name, 0.0) for c in counted) for name in names}


TIMESTAMP = re.compile(r'"timestamp":"([^"]+)"')


def log_phases(started: Started) -> dict[str, float] | None:
    """A server's phases from its start log: its JSON lines' timestamps, and the load time it logs."""
    layout: float | None = None
    loaded: float | None = None
    load_s = 0.0
    for line in started.output.splitlines():
        stamp = TIMESTAMP.search(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f%z").timestamp() - started.wall
        if layout is None and "serving layout" in line:
            layout = at
        found = re.search(r"loaded model .* in (\d+\.\d+) s", line)
        if loaded is None and found:
            loaded, load_s = at, float(found.group(1))
    if layout is None or loaded is None:
        return None
    return {
        "process start -> 'serving layout' logged (interpreter, CLI, settings, manifest, layout)": layout,
        "layout logged -> the first model's load begins (imports, app, data plane)": loaded - load_s - layout,
        'model load (its "loaded model ... in N s": read, sha256, session, warm-up)': load_s,
        "model loaded -> first 200 (pipeline, uvicorn listening, ready, the request)": started.seconds - loaded,
    }


# -- the starts ---------------------------------------------------------------------------------------------------


def lambda_rows(moto_url: str, work: Path) -> list[Row]:
    base = clean_env()
    function = {  # what template.yaml gives the functions, pointed at the moto server (as tests/lambda_runtime.py)
        **base,
        **aws_env(moto_url),
        "FNSERVE_MANIFEST": str(DEMO_MANIFEST),
        "FNSERVE_RESULTS_TABLE": TABLE,
        "FNSERVE_RESULTS_BUCKET": BUCKET,
        "POWERTOOLS_METRICS_NAMESPACE": "fnserve",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "2048",
    }
    cold = work / "demo-cold.toml"
    cold.write_text(cold_demo_manifest())
    ric = [sys.executable, "-m", "awslambdaric", "app.handler"]
    floor = [sys.executable, str(HERE / "runtime_floor.py")]
    api_event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    rows = []
    for kind, event, models in (
        ("api", lambda: api_event, "digits-accurate"),
        ("batch", batch_event, "digits-accurate,digits-fast"),
    ):
        env = {**function, "AWS_LAMBDA_FUNCTION_NAME": f"fnserve-{kind}"}
        rows.append(
            Row(
                f"Lambda {kind.replace('api', 'API')} function (awslambdaric)",
                lambda_start(ric, REPO / "functions" / kind, env, event),
                "bare Runtime API loop" + (" + boto3" if kind == "batch" else ""),
                lambda_start([*floor, kind, str(MODELS)], REPO, {**env, "TABLE": TABLE}, event),
                steps=step_by_step(kind, models, {**env, "FNSERVE_MANIFEST": str(cold)}, work),
            )
        )
    # The peer users would write by hand, started the same way: the row the Lambda cold start compares against.
    api = rows[0]
    peer = {**function, "AWS_LAMBDA_FUNCTION_NAME": "naive-api", "PYTHONPATH": str(REPO)}
    peer["PLAIN_MODEL_PATH"] = str(MODELS / "digits-accurate" / "1" / "model.onnx")
    naive = [sys.executable, "-m", "awslambdaric", "tests.bench.plain_server.handler"]
    rows.insert(1, Row(NAIVE_API, lambda_start(naive, REPO, peer, lambda: api_event), api.floor_name, api.floor))
    return rows


def serve_rows(work: Path) -> list[Row]:
    """fnserve serve outside a container, on each manifest, beside floor_server.py."""
    fnserve = str(Path(sys.executable).parent / "fnserve")
    env = {**clean_env(), **cloud_run_env()}
    rows = []
    for served, model in SERVED:
        manifest, cold = work / f"{served}.toml", work / f"{served}-cold.toml"
        manifest.write_text(manifest_of(served, str(MODELS)))
        cold.write_text(manifest_of(served, str(MODELS), warmup=False))
        floor = [sys.executable, str(FLOOR_SERVER), "PORT", str(MODELS / model / "1" / "model.onnx")]
        floor += [str(MODELS / model / "tokenizer.json")] if served != model else []
        names = model if served == model else f"{model},{served}"
        rows.append(
            Row(
                f"fnserve serve, fast start: {served}",
                http_start(
                    partial(local, [fnserve, "serve"], {**env, "FNSERVE_MANIFEST": str(manifest)}),
                    served,
                    request_of(served),
                ),
                "onnxruntime + http.server" + (" + tokenizers" if served != model else ""),
                http_start(partial(local, floor, clean_env()), served, request_of(served)),
                steps=step_by_step("serve", names, {**env, "FNSERVE_MANIFEST": str(cold)}, work),
                logged=True,
            )
        )
    return rows


def local(
    command: list[str], env: dict[str, str], port: int, extra: dict[str, str], out: IO[bytes]
) -> subprocess.Popen[bytes]:
    """``command`` (its PORT the port) started here, serving ``port`` (FNSERVE_PORT, for fnserve)."""
    command = [str(port) if arg == "PORT" else arg for arg in command]
    run = {**env, **extra, "FNSERVE_PORT": str(port)}
    return subprocess.Popen(command, env=run, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def image_rows(work: Path) -> tuple[list[Row], str | None, Callable[[], None]]:
    """The same servers in the CPU image, or why not; and what removes its container."""
    if shutil.which("buildah") is None:
        return [], "buildah is not installed", lambda: None
    from fnserve.emulator.images import Container, image_exists

    if not image_exists(IMAGE):
        return [], f"{IMAGE} is not in buildah's storage (make image-test builds it, then removes it)", lambda: None
    mount, models, python = "/start-bench", "/opt/ml/model", "/opt/fnserve/bin/python"
    files = work / "image"
    files.mkdir()
    os.chmod(work, 0o755)
    os.chmod(files, 0o755)  # the image's user reads it
    shutil.copy(FLOOR_SERVER, files / "floor_server.py")
    box = Container(IMAGE, [], volumes={str(files): mount}).create()
    rows = []
    for served, model in SERVED:
        (files / f"{served}.toml").write_text(manifest_of(served, models))
        floor = [python, f"{mount}/floor_server.py", "PORT", f"{models}/{model}/1/model.onnx"]
        floor += [f"{models}/{model}/tokenizer.json"] if served != model else []
        env = cloud_run_env()
        rows.append(
            Row(
                f"CPU image, fast start: {served}",
                http_start(
                    partial(in_box, box, ["fnserve", "serve"], {**env, "FNSERVE_MANIFEST": f"{mount}/{served}.toml"}),
                    served,
                    request_of(served),
                ),
                "the same floor in the image; both started by buildah run, its own start included",
                http_start(partial(in_box, box, floor, {}), served, request_of(served)),
                logged=True,
            )
        )
    return rows, None, box.stop


def in_box(
    box: Any, command: list[str], env: dict[str, str], port: int, extra: dict[str, str], out: IO[bytes]
) -> subprocess.Popen[bytes]:
    """``command`` (its PORT the port) started by ``buildah run`` in ``box``, serving ``port``."""
    from fnserve.emulator.images import Container

    command = [str(port) if arg == "PORT" else arg for arg in command]
    run = {**env, **extra, "FNSERVE_PORT": str(port)}
    process = Container(box.image, command, run, volumes=box.volumes, output=out, name=box.name).start().process
    assert process is not None
    return process


def clean_env() -> dict[str, str]:
    """This environment without fnserve's, Lambda's or AWS's variables: each start gets its own. Bytecode is
    written, as the deployed layer and images carry it compiled: a shell's PYTHONDONTWRITEBYTECODE would have every
    timed start compile fnserve's modules again."""
    drop = ("FNSERVE_", "AWS_", "POWERTOOLS_", "PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE")
    return {key: value for key, value in os.environ.items() if not key.startswith(drop)}


# -- the run ------------------------------------------------------------------------------------------------------


def measure(rows: list[Row], work: Path) -> None:
    """One untimed round, then RUNS rounds, the order reversed each round; every answer checked."""
    starts = [(row, which) for row in rows for which in ("floor", "start")]
    answers: dict[tuple[str, str], Any] = {}
    for n in range(RUNS + 1):
        for row, which in starts if n % 2 else reversed(starts):
            started = (row.floor if which == "floor" else row.start)(work / f"{which}.log", {})
            answers.setdefault((row.name, which), started.answer)
            if which == "start" and (row.name, "floor") in answers:
                same_answer(row, started.answer, answers[(row.name, "floor")])
            elif which == "floor" and (row.name, "start") in answers:
                same_answer(row, answers[(row.name, "start")], started.answer)
            if n == 0:
                continue
            row.seconds[which].append(started.seconds)
            row.rss[which].append(started.rss_mb)
            if started.init is not None:
                row.init[which].append(started.init)
            if which == "start" and row.logged:
                row.logs.append(started)


def import_times(start: Start, work: Path) -> dict[str, float]:
    """The imports on the path to the first answer, by package: median of PHASE_RUNS starts."""
    counted = []
    for _ in range(PHASE_RUNS):
        started = start(work / "importtime.log", {"PYTHONPROFILEIMPORTTIME": "1"})
        counted.append(imports_by_package(started.output))
    return median_by_package(counted)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}"


def top(by_package: dict[str, float], n: int) -> str:
    largest = sorted(by_package.items(), key=lambda item: -item[1])[:n]
    listed = ", ".join(f"{name} {value:.0f}" for name, value in largest)
    return f"{sum(by_package.values()):.0f} ms in all; {listed}"


def report(rows: list[Row], skipped: str | None, load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    before, after = (" ".join(f"{x:.2f}" for x in avg) for avg in load)
    versions = f"Python {sys.version.split()[0]}, onnxruntime {metadata.version('onnxruntime')}"
    print(
        f"\nstarts: fresh process -> first answer, median of {RUNS} interleaved starts (min-max), "
        f"{os.cpu_count()} CPUs, {versions}; load average (1, 5, 15 min) {before} before, {after} after"
    )
    columns = f"{'ms':>6} {'min-max':>11} {'floor ms':>9} {'min-max':>11} {'x floor':>8} {'RSS MB':>7} {'floor':>6}"
    print(f"  {'start':<46}{columns}")
    for row in rows:
        start, floor = (statistics.median(row.seconds[w]) for w in ("start", "floor"))
        spread = {w: f"{ms(min(row.seconds[w]))}-{ms(max(row.seconds[w]))}" for w in ("start", "floor")}
        rss = {w: statistics.median(row.rss[w]) for w in ("start", "floor")}
        print(
            f"  {row.name:<46}{ms(start):>6} {spread['start']:>11} {ms(floor):>9} {spread['floor']:>11}"
            f" {start / floor:>7.2f}x {rss['start']:>7.0f} {rss['floor']:>6.0f}"
        )
    if skipped:
        print(f"  (no CPU image rows: {skipped})")
    print("  RSS: the sum of VmHWM over the start's Python processes at its first answer, median. The floors:")
    for row in rows:
        print(f"    {row.name}: {row.floor_name}")


def breakdowns(rows: list[Row], work: Path) -> None:
    interpreter = statistics.median(fresh_process_seconds("pass", env=clean_env()) for _ in range(RUNS))
    print(f"\nby phase; the interpreter's own start (python -c pass), median of {RUNS}: {ms(interpreter)} ms")
    for row in rows:
        print(f"  {row.name}: {ms(statistics.median(row.seconds['start']))} ms")
        if row.init["start"]:
            print(f"    at the Runtime API, median of the {RUNS} timed starts (init: the start to its first GET next):")
            for which in ("start", "floor"):
                init = statistics.median(row.init[which])
                invoke = statistics.median(row.seconds[which]) - init
                name = "the function" if which == "start" else "its floor"
                print(f"      {name:<14} init {ms(init):>5} ms, then the first event to its answer {ms(invoke):>5} ms")
        if row.logged:
            logged = [p for p in map(log_phases, row.logs) if p is not None]
            if logged:
                print(f"    from its start log, median of the {len(logged)} timed starts:")
                for phase in logged[0]:
                    print(f"      {phase:<88}{ms(statistics.median(p[phase] for p in logged)):>5} ms")
            else:
                print("    (its start log has no 'serving layout' and 'loaded model' lines to time phases by)")
        if row.steps is not None:
            taken = [row.steps() for _ in range(PHASE_RUNS)]
            print(f"    step by step in one process (start_phases.py), median of {PHASE_RUNS}:")
            total = 0.0
            for phase in taken[0]:
                value = statistics.median(t[phase] for t in taken)
                total += value
                print(f"      {phase:<70}{ms(value):>5} ms")
            print(f"      {'in all, with the interpreter start':<70}{ms(total + interpreter):>5} ms")
            imports = "imports to the first answer, self ms by top-level package (its processes summed)"
            print(f"    {imports}, median of {PHASE_RUNS}:")
            print(f"      start: {top(import_times(row.start, work), 10)}")
            print(f"      floor: {top(import_times(row.floor, work), 5)}")


def main() -> None:
    began = clock()
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-start-"))
    load_before = os.getloadavg()
    try:
        with moto_server(work / "moto.log") as url:
            import boto3

            aws = {"endpoint_url": url, "region_name": "us-east-1"} | {
                "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing",
            }
            boto3.client("dynamodb", **aws).create_table(
                TableName=TABLE,
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            boto3.client("s3", **aws).create_bucket(Bucket=BUCKET)
            rows = lambda_rows(url, work) + serve_rows(work)
            in_image, skipped, remove_box = image_rows(work)
            try:
                measure(rows + in_image, work)
                load_after = os.getloadavg()
                report(rows + in_image, skipped, (load_before, load_after))
                breakdowns(rows + in_image, work)
            finally:
                remove_box()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n(the whole bench: {clock() - began:.0f} s)")


if __name__ == "__main__":
    main()
