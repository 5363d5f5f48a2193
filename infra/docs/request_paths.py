"""A request's whole way through fnserve, from each transport to onnxruntime's ``session.run`` and back.

python infra/docs/request_paths.py                 (a markdown section, for docs/architecture.md)
python infra/docs/request_paths.py --json FILE     (the figures, for tests/functional/test_paths.py)

Each way starts the real thing in this process, its models in it too (no worker pool): the server's app on a
batched and on an unbatched model, its gRPC server on loopback, the Lambda HTTP and SQS handlers on events/*.json
with DynamoDB on a moto server. Each is warmed up, then ONE request is recorded by a profile hook on every thread
(the event loop's, the batcher's, asyncio's executor's), keeping the frames of fnserve's own files. The server's
app is called over ASGI without its lifespan, as the tests call it: its companions' timers (the metrics' flush)
would otherwise land in a recording by chance. PYTHONPATH set to another checkout's ``layers/fnserve`` traces
that one: only names both layouts have are imported, or the new layout's then the old one's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

R = TypeVar("R")
REPO = Path(__file__).resolve().parents[2]
WARM_UPS = 2  # requests before the recorded one: models loaded, first-call caches filled
LEGEND = (
    "*Files*: the fnserve files whose functions ran, in the order each was first entered, on every thread; "
    "*hops*: calls (a coroutine's resumption counts as one) from a function of a file in `core/` to one of an "
    "fnserve file outside `core/`, or the reverse, a function's caller being the nearest fnserve frame under it "
    "on its thread's stack, looked for no further down than the event loop."
)


@dataclasses.dataclass
class Traced:
    """One way's recorded request: what it visited, and how it ended."""

    way: str
    entry: str  # what was called, and on what
    files: list[str]  # package-relative, in the order each was first entered
    hops: dict[str, int]  # "caller -> callee" across core/'s edge: how many calls
    runs: list[str]  # "file (thread)" of each onnxruntime run, by the fnserve frame that called it
    threads: list[str]  # the threads that ran fnserve code
    answer: str  # how the answer came back, checked against onnxruntime's own

    @property
    def hop_count(self) -> int:
        return sum(self.hops.values())


class Tracer:
    """A profile hook for every thread, recording only while :meth:`recording` is open.

    Threads take the hook as they start (``threading.setprofile``), so :meth:`install` comes before anything
    starts one; the recording thread sets its own. Before Python 3.12 no hook reaches a thread already running.
    """

    def __init__(self) -> None:
        import onnxruntime

        import fnserve

        self.package = str(Path(fnserve.__file__).resolve().parent) + os.sep
        self.event_loop = str(Path(asyncio.__file__).parent) + os.sep
        session = onnxruntime.InferenceSession
        self.run_codes = {
            getattr(session, name).__code__
            for name in dir(session)
            if name.startswith("run") and hasattr(getattr(session, name), "__code__")
        }
        self.on = False
        self._files: dict[str, str | None] = {}
        self.calls: list[tuple[int, str | None, str]] = []  # thread, caller's file, callee's file
        self.runs: list[tuple[int, str]] = []  # thread, the file that called onnxruntime

    def install(self) -> None:
        threading.setprofile(self._hook)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self.calls, self.runs = [], []
        sys.setprofile(self._hook)
        self.on = True
        try:
            yield
        finally:
            self.on = False
            sys.setprofile(None)

    def _file(self, filename: str) -> str | None:
        """``filename`` relative to the package, or None outside it."""
        try:
            return self._files[filename]
        except KeyError:
            path = str(Path(filename).resolve())
            found = self._files[filename] = (
                Path(path).relative_to(self.package).as_posix() if path.startswith(self.package) else None
            )
            return found

    def _caller(self, frame: FrameType | None) -> str | None:
        """The file of the nearest fnserve frame from ``frame`` down, above the event loop's frames."""
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(self.event_loop):
                return None
            found = self._file(filename)
            if found is not None:
                return found
            frame = frame.f_back
        return None

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":  # a coroutine resumed is a call too
            return
        code = frame.f_code
        if code in self.run_codes:
            caller = self._caller(frame.f_back)
            if caller is not None:  # fnserve's run, not someone else's session
                self.runs.append((threading.get_ident(), caller))
            return
        callee = self._file(code.co_filename)
        if callee is not None:
            self.calls.append((threading.get_ident(), self._caller(frame.f_back), callee))

    def path(self, way: str, entry: str, answer: str) -> Traced:
        """What the last recording saw."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        files: dict[str, None] = {}
        hops: Counter[str] = Counter()
        threads: dict[str, None] = {}
        for thread, caller, callee in self.calls:
            threads[names.get(thread, str(thread))] = None
            if caller is not None:
                files[caller] = None
                if caller.startswith("core/") != callee.startswith("core/"):
                    hops[f"{caller} -> {callee}"] += 1
            files[callee] = None
        runs = [f"{caller} ({names.get(thread, thread)})" for thread, caller in self.runs]
        return Traced(way, entry, list(files), dict(hops), runs, list(threads), answer)


def first(*names: str) -> Any:
    """The first of ``module:attribute`` names that exists: the new layout's name, then the old one's."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # that module, not one it imports
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
                continue
            raise
        if hasattr(found, attribute):
            return getattr(found, attribute)
    raise ImportError(f"none of {', '.join(names)}")


# -- the five ways --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Ground:
    """What the ways share: the manifests, the events, and what onnxruntime itself answers them."""

    directory: Path
    unbatched: Path  # the demo's digits models
    batched: Path  # the same, digits-accurate with max_batch_time_ms
    api_event: dict[str, Any]
    sqs_event: dict[str, Any]
    labels: Callable[[str, Any], list[int]]  # a model's labels of rows, by onnxruntime alone
    table: str = "fnserve-results"
    bucket: str = "fnserve-payloads"


MODEL = "digits-accurate"  # the model the events name
BATCH_MS = 2


def ground(directory: Path) -> Ground:
    """The tests' manifest of the demo's digits models, and a copy with ``MODEL`` batched, as their fixtures do."""
    import numpy as np
    import onnxruntime

    from tests.helpers import DEMO_MANIFEST, write_test_manifest

    (directory / "unbatched").mkdir()
    (directory / "batched").mkdir()
    unbatched = write_test_manifest(directory / "unbatched")
    batched = write_test_manifest(directory / "batched")
    entry = f'name = "{MODEL}"\n'
    batched.write_text(batched.read_text().replace(entry, f"{entry}max_batch_time_ms = {BATCH_MS}\n"))
    sessions: dict[str, Any] = {}

    def labels(model: str, rows: Any) -> list[int]:
        if model not in sessions:
            sessions[model] = onnxruntime.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
        return [int(x) for x in sessions[model].run(["label"], {"input": np.asarray(rows, np.float32)})[0]]

    events = REPO / "events"
    api_event = json.loads((events / "api-http-infer.json").read_text())
    sqs_event = json.loads((events / "batch-jobs.json").read_text())
    return Ground(directory, unbatched, batched, api_event, sqs_event, labels)


def request_rows(ground: Ground) -> Any:
    """The rows of the API event's request: every transport sends these."""
    import numpy as np

    tensor = json.loads(ground.api_event["body"])["inputs"][0]
    return np.asarray(tensor["data"], np.float32).reshape(tensor["shape"])


def labels_of(outputs: list[dict[str, Any]]) -> list[int]:
    return [int(x) for x in next(o for o in outputs if o["name"] == "label")["data"]]


def recorded(tracer: Tracer, requests: list[R], send: Callable[[R], Any], check: Callable[[R, Any], str]) -> str:
    """The requests sent in turn, the last one recorded: what :func:`check` says of its answer."""
    for request in requests[:-1]:
        check(request, send(request))
    with tracer.recording():
        response = send(requests[-1])
    return check(requests[-1], response)


async def recorded_async(
    tracer: Tracer, requests: list[R], send: Callable[[R], Awaitable[Any]], check: Callable[[R, Any], str]
) -> str:
    """:func:`recorded`, on one event loop (a batcher's queue and tasks are the loop's)."""
    for request in requests[:-1]:
        check(request, await send(request))
    with tracer.recording():
        response = await send(requests[-1])
    return check(requests[-1], response)


def checked(ok: bool, what: str, detail: Any) -> str:
    if not ok:
        raise AssertionError(f"{what}: {str(detail)[:2000]}")
    return what


def server_app(manifest: Path) -> Any:
    """``fnserve serve``'s front process's app, its models in this process (no worker pool)."""
    compose = first("fnserve.server.app:server_app", "fnserve.bootstrap:server_app")
    return compose(settings(manifest))


def settings(manifest: Path, **values: Any) -> Any:
    from fnserve.settings import Settings

    return Settings(manifest=str(manifest), **values)


def http_way(tracer: Tracer, ground: Ground, batched: bool) -> Traced:
    import httpx

    app = server_app(ground.batched if batched else ground.unbatched)
    body = ground.api_event["body"].encode()
    expected = ground.labels(MODEL, request_rows(ground))

    def check(_: object, response: httpx.Response) -> str:
        ok = response.status_code == 200 and labels_of(response.json()["outputs"]) == expected
        return checked(ok, "200, labels as onnxruntime's", response.text)

    async def main() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fnserve") as client:
            send = functools.partial(client.post, f"/v2/models/{MODEL}/infer")
            return await recorded_async(tracer, [body] * (WARM_UPS + 1), lambda b: send(content=b), check)

    answer = asyncio.run(main())
    if batched:
        return tracer.path(
            "HTTP V2, batched model",
            f"The server's app over ASGI, `{MODEL}` with `max_batch_time_ms = {BATCH_MS}`",
            answer,
        )
    return tracer.path("HTTP V2, unbatched model", f"The server's app over ASGI, `{MODEL}`", answer)


def grpc_way(tracer: Tracer, ground: Ground) -> Traced:
    import grpc
    import numpy as np

    from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb

    plane = server_app(ground.unbatched).state.plane
    compose = first("fnserve.server.app:grpc_server", "fnserve.bootstrap:grpc_server")
    # Port 0: any free one. The server app gives its gRPC server its own metrics' telemetry: so does this.
    server = compose(settings(ground.unbatched, grpc_port=0), plane, server_telemetry("grpc"))
    rows = request_rows(ground)
    expected = ground.labels(MODEL, rows)
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input", datatype="FP32", shape=list(rows.shape))
    request.raw_input_contents.append(rows.tobytes())

    def check(_: object, response: Any) -> str:
        names = [o.name for o in response.outputs]
        label = np.frombuffer(response.raw_output_contents[names.index("label")], "<i8").tolist()
        return checked(label == expected, "OK, labels as onnxruntime's", response)

    async def main() -> str:
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                infer = channel.unary_unary(
                    "/inference.GRPCInferenceService/ModelInfer",
                    request_serializer=pb.ModelInferRequest.SerializeToString,
                    response_deserializer=pb.ModelInferResponse.FromString,
                )
                return await recorded_async(tracer, [request] * (WARM_UPS + 1), infer, check)
        finally:
            await server.stop()

    answer = asyncio.run(main())
    return tracer.path("gRPC", f"The server's gRPC service on loopback, over its app's data plane, `{MODEL}`", answer)


def server_telemetry(transport: str) -> Any:
    """A server's Prometheus metrics of ``transport``'s requests (None where there are none to import)."""
    try:
        metrics = first("fnserve.observability.metrics:ServerMetrics", "fnserve.adapters.metrics:ServerMetrics")
    except ImportError:
        return None
    return metrics().telemetry(transport)


def lambda_invocations(event: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """(event, context) of each invocation, each its own copy of the event."""
    context = first("fnserve.aws.events:LambdaContext", "fnserve.adapters.lambda_.events:LambdaContext")
    return [(json.loads(json.dumps(event)), context()) for _ in range(WARM_UPS + 1)]


def aws_settings(ground: Ground) -> Any:
    return settings(ground.unbatched, results_table=ground.table, results_bucket=ground.bucket)


def lambda_api_way(tracer: Tracer, ground: Ground) -> Traced:
    from fnserve.adapters.lambda_ import http as lambda_http

    handler = lambda_http.create_handler(settings=aws_settings(ground))
    expected = ground.labels(MODEL, request_rows(ground))

    def check(_: object, response: dict[str, Any]) -> str:
        ok = response["statusCode"] == 200 and labels_of(json.loads(response["body"])["outputs"]) == expected
        return checked(ok, "200, labels as onnxruntime's", response)

    answer = recorded(tracer, lambda_invocations(ground.api_event), lambda call: handler(*call), check)
    return tracer.path("Lambda API event", "The HTTP function's handler on `events/api-http-infer.json`", answer)


def sqs_way(tracer: Tracer, ground: Ground) -> Traced:
    import numpy as np

    from fnserve.adapters.lambda_ import sqs as lambda_sqs
    from fnserve.stores import job_client

    handler = lambda_sqs.create_handler(settings=aws_settings(ground))
    invocations = lambda_invocations(ground.sqs_event)
    for n, (event, _) in enumerate(invocations):
        for record in event["Records"]:  # new jobs each time: a job already done is skipped
            record["body"] = json.dumps(
                {**json.loads(record["body"]), "id": f"{n}-" + json.loads(record["body"])["id"]}
            )

    def check(call: tuple[dict[str, Any], Any], response: dict[str, Any]) -> str:
        jobs = [json.loads(record["body"]) for record in call[0]["Records"]]
        results = job_client.fetch_results(ground.table, [job["id"] for job in jobs])
        done = {i: [int(x) for x in outputs["label"]] for i, outputs in results.done.items()}
        tensors = {job["id"]: job for job in jobs if isinstance(job["inputs"], list)}
        good = {
            i: ground.labels(job["model"], np.reshape(job["inputs"][0]["data"], job["inputs"][0]["shape"]))
            for i, job in tensors.items()
        }
        poison = sorted(job["id"] for job in jobs if job["id"] not in tensors)
        ok = response["batchItemFailures"] == [] and done == good and sorted(results.failed) == poison
        what = f"{len(good)} jobs done, labels as onnxruntime's, in DynamoDB; {len(poison)} refused, its reason stored"
        return checked(ok, what, (response, results))

    answer = recorded(tracer, invocations, lambda call: handler(*call), check)
    return tracer.path("SQS batch", "The batch function's handler on `events/batch-jobs.json`", answer)


@contextlib.contextmanager
def dynamodb(ground: Ground) -> Iterator[None]:
    """A moto server with the results table and the payload bucket, as the functional tests' ``aws`` fixture."""
    from fnserve.aws import clients
    from tests.moto import aws_env, moto_server

    with moto_server(ground.directory / "moto.log") as url:
        os.environ.update(aws_env(url))
        os.environ.pop("LOCALSTACK_HOST", None)
        clients.reset()
        client = clients.client("dynamodb")
        client.create_table(
            TableName=ground.table,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        clients.client("s3").create_bucket(Bucket=ground.bucket)
        yield


@contextlib.contextmanager
def quiet(log: Path) -> Iterator[None]:
    """Standard output (access lines, logs, EMF metrics) into ``log``: what this prints is the section alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with log.open("wb") as out:
            os.dup2(out.fileno(), 1)
            try:
                yield
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def trace_all() -> list[Traced]:
    """Every way's recorded request, in this process (the tracer installed first)."""
    sys.path.insert(0, str(REPO))  # tests.helpers and tests.moto: the fixtures' manifests and moto server
    tracer = Tracer()
    tracer.install()
    with tempfile.TemporaryDirectory(prefix="request-paths-") as tmp:
        directory = Path(tmp)
        try:
            with quiet(directory / "stdout.log"):
                found = _trace_all(tracer, ground(directory))
        except BaseException:
            sys.stderr.write((directory / "stdout.log").read_text(errors="replace")[-4000:])
            raise
    return found


def _trace_all(tracer: Tracer, ground: Ground) -> list[Traced]:
    from tests.helpers import close_main_loop

    found = [http_way(tracer, ground, batched=True), http_way(tracer, ground, batched=False), grpc_way(tracer, ground)]
    with dynamodb(ground):
        found.append(lambda_api_way(tracer, ground))
        close_main_loop()  # Mangum's
        found.append(sqs_way(tracer, ground))
    return found


def traced_in_fresh_process(env: dict[str, str] | None = None) -> list[Traced]:
    """:func:`trace_all` in a new interpreter, where the hook is on every thread from its start (a test process's
    threads, started before it, would be missed)."""
    with tempfile.TemporaryDirectory(prefix="request-paths-") as tmp:
        out = Path(tmp) / "paths.json"
        subprocess.run([sys.executable, __file__, "--json", str(out)], check=True, env=env, timeout=300)
        return [Traced(**entry) for entry in json.loads(out.read_text())]


def markdown(paths: list[Traced]) -> str:
    lines = [
        "## A request's way through fnserve, from each transport to onnxruntime and back",
        "",
        LEGEND,
        "",
        "| way | files | hops core <-> rest | session.run called from |",
        "|---|---|---|---|",
    ]
    for p in paths:
        runs = ", ".join(f"`{run}`" + (f" x{n}" if n > 1 else "") for run, n in Counter(p.runs).items())
        lines.append(f"| {p.way} | {len(p.files)} | {p.hop_count} | {runs} |")
    for p in paths:
        lines += ["", f"### {p.way}", "", f"{p.entry}: {p.answer}; threads: {', '.join(p.threads)}.", ""]
        lines += [f"{n}. `{file}`" for n, file in enumerate(p.files, 1)]
        hops = ", ".join(f"`{pair}` x{count}" for pair, count in p.hops.items())  # in the order first made
        lines += ["", f"{len(p.files)} files, {p.hop_count} hops: {hops or 'none'}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here instead of printing the section")
    args = parser.parse_args()
    paths = trace_all()
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(p) for p in paths], indent=1))
    else:
        sys.stdout.write(markdown(paths))


if __name__ == "__main__":
    main()
