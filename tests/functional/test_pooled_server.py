"""``fnserve serve`` as a front process and a pool of inference workers (and with no pool at all)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest

from fnserve.bench.sweep import process_tree
from fnserve.core.errors import HandlerError
from fnserve.server import fronts
from fnserve.server.app import server_app
from fnserve.server.serve import inference_pool
from fnserve.settings import Settings
from fnserve.workers.pool import WorkerPool
from fnserve.workers.remote import PoolSession
from tests.helpers import BAD_NUMBERS, DEMO_HOLDOUT, DEMO_MANIFEST, write_test_manifest
from tests.moto import free_port
from tests.servers import start_server, wait_for

DIGITS = np.load(DEMO_HOLDOUT)["input"]
ACCURATE = DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"
FAST = DEMO_MANIFEST.parent / "digits-fast" / "1" / "model.onnx"


def body(x: np.ndarray) -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def post_all(app: object, requests: list[dict[str, object]], model: str) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=60) as client:
            return await asyncio.gather(*(client.post(f"/v2/models/{model}/infer", json=r) for r in requests))

    return asyncio.run(main())


@pytest.fixture(scope="module")
def batched_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    manifest = write_test_manifest(tmp_path_factory.mktemp("pooled"))
    manifest.write_text(
        manifest.read_text().replace('name = "digits-accurate"\n', 'name = "digits-accurate"\nmax_batch_time_ms = 20\n')
    )
    return manifest


@pytest.fixture(scope="module")
def pool(batched_manifest: Path) -> Iterator[WorkerPool]:
    pool = inference_pool(Settings(manifest=str(batched_manifest), parallel_workers=2, access_log=False))
    yield pool
    pool.close()


def test_the_front_process_loads_no_model_and_answers_as_onnxruntime_does(
    pool: WorkerPool, batched_manifest: Path
) -> None:
    settings = Settings(manifest=str(batched_manifest), parallel_workers=2, access_log=False)
    app = server_app(settings, pool)
    service = app.state.plane.service
    assert all(isinstance(service.registry.get(name).session, PoolSession) for name in service.registry.names())

    requests = [body(DIGITS[i : i + 1 + i % 3]) for i in range(40)]
    refused = {7: (body(np.zeros((1, 32), np.float32)), "must have 64 at axis 1")}  # refused in the front, alone
    refused |= {11 + 5 * n: (orjson.loads(text), reason) for n, (text, reason) in enumerate(BAD_NUMBERS)}
    for i, (request, _) in refused.items():
        requests[i] = request
    responses = post_all(app, requests, "digits-accurate")
    session = ort.InferenceSession(str(ACCURATE))
    for i, response in enumerate(responses):
        if i in refused:
            assert response.status_code == 422 and refused[i][1] in response.json()["error"], response.text
            continue
        assert response.status_code == 200, response.text
        expected = session.run(None, {"input": DIGITS[i : i + 1 + i % 3]})
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs["label"] == expected[0].tolist()
        np.testing.assert_allclose(outputs["probabilities"], expected[1].ravel(), rtol=1e-5, atol=1e-7)

    # A model without batching goes to the workers too, one request per call.
    fast = post_all(app, [body(DIGITS[:2])], "digits-fast")[0]
    assert fast.status_code == 200 and fast.json()["model_name"] == "digits-fast"
    metadata = asyncio.run(_get(app, "/v2/models/digits-accurate"))
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]


async def _get(app: object, path: str) -> dict[str, object]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
        response = await client.get(path)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


def test_a_worker_killed_under_load_fails_only_its_request_and_comes_back(batched_manifest: Path) -> None:
    settings = Settings(manifest=str(DEMO_MANIFEST), parallel_workers=2, access_log=False)
    pool = inference_pool(settings)
    try:
        app = server_app(settings, pool)
        victim = pool.worker_pids()[0]

        async def main() -> list[httpx.Response]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=60) as client:
                requests = [
                    asyncio.create_task(client.post("/v2/models/digits-accurate/infer", json=body(DIGITS[:4])))
                    for _ in range(60)
                ]
                while sum(r.done() for r in requests) < 5:  # under way
                    await asyncio.sleep(0.001)
                os.kill(victim, signal.SIGKILL)
                return await asyncio.gather(*requests)

        responses = asyncio.run(main())
        assert {r.status_code for r in responses} <= {200, 503}  # nothing hangs, nothing else fails
        assert sum(r.status_code == 503 for r in responses) <= 1  # at most the one it was running
        assert all("worker died" in r.json()["error"] for r in responses if r.status_code == 503)
        wait_for(lambda: pool.respawns == 1 and victim not in pool.worker_pids(), 30, "the worker to be replaced")
        later = post_all(app, [body(DIGITS[:2])] * 8, "digits-accurate")
        assert all(r.status_code == 200 for r in later)
    finally:
        pool.close()


def test_without_workers_inference_runs_in_the_server_process(batched_manifest: Path) -> None:
    app = server_app(Settings(manifest=str(batched_manifest), parallel_workers=0, access_log=False, eager_load=True))
    service = app.state.plane.service
    assert isinstance(service.registry.get("digits-accurate").session, ort.InferenceSession)
    responses = post_all(app, [body(DIGITS[i : i + 1]) for i in range(8)], "digits-accurate")
    session = ort.InferenceSession(str(ACCURATE))
    for i, response in enumerate(responses):
        assert response.json()["outputs"][0]["data"] == session.run(["label"], {"input": DIGITS[i : i + 1]})[0].tolist()


def test_the_default_layout_for_a_batching_model_is_one_process_that_loads_each_model_once(
    batched_manifest: Path, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    proc, url = start_server(["-m", str(batched_manifest)], log)
    try:
        response = httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:2]), timeout=30)
        assert response.status_code == 200, response.text
        text = log.read_text()
        assert "serving layout: 1 front process(es), 0 inference worker(s) each: 'digits-accurate' batches" in text
        # Loaded (and timed) once at start, then served by the same process: not loaded again.
        assert text.count("loaded model 'digits-accurate' version '1'") == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_fast_start_loads_each_model_once_a_front_process(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {**os.environ, "FNSERVE_FAST_START": "true", "FNSERVE_LOG_LEVEL": "INFO"}
    proc, url = start_server(["-m", str(write_test_manifest(tmp_path))], log, env=env)
    try:
        response = httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:4]), timeout=30)
        assert response.status_code == 200, response.text
        expected = ort.InferenceSession(str(ACCURATE)).run(["label"], {"input": DIGITS[:4]})[0].tolist()
        assert response.json()["outputs"][0]["data"] == expected
        text = log.read_text()
        laid_out = re.search(r"serving layout: (\d+) front process\(es\), 0 inference worker\(s\) each: fast", text)
        assert laid_out, text
        # No batch-1 timing, and the models loaded once a front process: the server's own process (the first)
        # before it was ready, the others' once they joined.
        assert "batch-1 run" not in text
        loads = "loaded model 'digits-accurate' version '1'"
        wait_for(lambda: log.read_text().count(loads) >= int(laid_out[1]), 60, "every front process to load")
        response = httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:4]), timeout=30)
        assert response.status_code == 200 and log.read_text().count(loads) == int(laid_out[1]), log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_fast_start_whose_model_cannot_load_stops_with_the_reason(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    zeros = 'sha256 = "' + "0" * 64 + '"'
    manifest.write_text(re.sub(r'sha256 = "[0-9a-f]{64}"', zeros, manifest.read_text(), count=1))
    done = serve_until_it_exits(["-m", str(manifest), "--fast-start", "--processes", "2", "--workers", "0"])
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    # The server's own process serves first, so the model's error is the start's, with nothing around it.
    assert re.fullmatch(r"error: model .* has sha256 [0-9a-f]{64}, but the manifest says 0{64}", last), last


def test_a_model_that_cannot_load_keeps_the_server_from_starting(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    zeros = 'sha256 = "' + "0" * 64 + '"'
    manifest.write_text(re.sub(r'sha256 = "[0-9a-f]{64}"', zeros, manifest.read_text(), count=1))
    with pytest.raises(HandlerError, match="cannot start: .*has sha256 .*but the manifest says 0{64}"):
        inference_pool(Settings(manifest=str(manifest), parallel_workers=1))


@pytest.mark.parametrize(
    ("options", "banner"),
    [
        (["--workers", "2"], "2 inference worker(s)"),
        (["--processes", "2", "--workers", "0"], "2 server processes, each in-process"),
        # No layout given: the demo models are light, so inference runs in the front processes.
        ([], "front process(es), 0 inference worker(s) each: every model's batch-1 run is well under"),
    ],
)
def test_serve_stops_cleanly_on_sigterm_to_its_process_group(tmp_path: Path, options: list[str], banner: str) -> None:
    log = tmp_path / "serve.log"
    proc, url = start_server(["-m", str(write_test_manifest(tmp_path)), *options], log, new_session=True)
    try:
        response = httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:3]), timeout=30)
        assert response.status_code == 200, response.text
        assert banner in log.read_text()
        os.killpg(proc.pid, signal.SIGTERM)  # as a container runtime or systemd stops a service
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn may re-raise the signal once it has stopped

        def group_gone() -> bool:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(group_gone, 30, "every worker to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in log.read_text()


def test_a_mixed_pool_overflows_past_the_gpu_capacity_and_says_which_device_answered(batched_manifest: Path) -> None:
    # Without a GPU, the "gpu" group is CPU workers too: what is tested is the dispatch, the labels and the answers.
    settings = Settings(
        manifest=str(batched_manifest), gpu_workers=1, gpu_capacity=1, parallel_workers=1, access_log=False
    )
    overflow = inference_pool(settings)
    try:
        assert [(g.device, g.pool.size, g.limit) for g in overflow.groups] == [("gpu", 1, 1), ("cpu", 1, 1)]
        sent = [json.loads(group.pool.spec.env["FNSERVE_SETTINGS"]) for group in overflow.groups]
        assert [s["device"] for s in sent] == ["any", "cpu"]  # CPU providers alone in the CPU workers
        app = server_app(settings, overflow)
        responses = post_all(app, [body(DIGITS[i : i + 1]) for i in range(40)], "digits-fast")
        session = ort.InferenceSession(str(FAST))
        devices = []
        for i, response in enumerate(responses):
            assert response.status_code == 200, response.text
            label = {o["name"]: o["data"] for o in response.json()["outputs"]}["label"]
            assert label == session.run(["label"], {"input": DIGITS[i : i + 1]})[0].tolist()
            devices.append(re.search(r'device;desc="(\w+)"', response.headers["server-timing"]).group(1))  # type: ignore[union-attr]
        assert set(devices) == {"gpu", "cpu"}, devices  # calls past the GPU's one in flight went to the CPU worker
        assert overflow.runs == {"gpu": devices.count("gpu"), "cpu": devices.count("cpu")}
    finally:
        overflow.close()


def _sockets(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp(port: int) -> dict[int, str]:
    """Inode -> TCP state (0A listening, 01 established) of the sockets on local port ``port``."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found[int(fields[9])] = fields[3]
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads sockets from Linux's /proc")
def test_front_processes_each_listen_on_their_own_socket_and_share_the_connections(tmp_path: Path) -> None:
    # uvicorn's workers share one socket: the first process awake accepted a whole burst of connections,
    # and with 2 front processes one run in three served everything from one of them.
    proc, url = start_server(
        ["-m", str(write_test_manifest(tmp_path)), "--processes", "2", "--workers", "0"],
        tmp_path / "serve.log",
        new_session=True,
    )
    try:
        port = int(url.rsplit(":", 1)[1])
        states = _tcp(port)
        listening = {pid: {i for i in _sockets(pid) if states.get(i) == "0A"} for pid in process_tree(proc.pid)}
        listening = {pid: inodes for pid, inodes in listening.items() if inodes}
        assert len(listening) == 2, listening
        first, second = listening.values()
        assert len(first) == len(second) == 1 and first != second  # a socket each, not one shared
        clients = [httpx.Client(base_url=url, timeout=30) for _ in range(32)]
        try:
            for client in clients:  # 32 keep-alive connections, as a load balancer's pool holds them
                assert client.post("/v2/models/digits-accurate/infer", json=body(DIGITS[:1])).status_code == 200
            established = {i for i, state in _tcp(port).items() if state == "01"}
            held = [len(_sockets(pid) & established) for pid in listening]
            assert sum(held) == 32 and all(held), held  # all on one would happen once in 2**31
        finally:
            for client in clients:
                client.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_directories_of_a_server_killed_outright_are_removed_by_the_next_one(tmp_path: Path) -> None:
    """Its statistics in /dev/shm hold memory until someone removes them; a server killed by SIGKILL cannot."""
    manifest = str(write_test_manifest(tmp_path))
    options = ["-m", manifest, "--processes", "2", "--workers", "0"]
    proc, _ = start_server(options, tmp_path / "killed.log", new_session=True)
    try:
        front = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{front}/environ").read_text().split("\0") if "=" in item
        )
        made = [Path(environ[fronts.STATISTICS_DIR_ENV]), Path(environ["PROMETHEUS_MULTIPROC_DIR"])]
        assert all(path.is_dir() for path in made)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert all(path.is_dir() for path in made)  # left behind

    proc, _ = start_server(options, tmp_path / "next.log", new_session=True)
    try:
        assert not any(path.exists() for path in made)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


# -- a supervisor that fails fast ------------------------------------------------------------------------------


def spawned_children(pid: int) -> list[int]:
    """The spawned processes ``pid`` started (front processes, or inference workers), from any of its threads."""
    children = [c for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def serve_until_it_exits(options: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``fnserve serve`` that must exit on its own within 30 s (the test fails if it is still running then)."""
    command = [sys.executable, "-m", "fnserve", "serve", "--port", str(free_port()), *options]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert time.monotonic() - began < 30
    return done


# What protobuf raises at import when the stubs' gencode is newer than its runtime, from a module only the front
# processes import (gRPC's, for --grpc-port): the server's own process loads the models and never imports it.
VERSION_ERROR = """
from google.protobuf.runtime_version import VersionError

raise VersionError("Detected incompatible Protobuf Gencode/Runtime versions when loading a stub: gencode 9.0.0")
"""


def test_front_processes_that_cannot_start_stop_the_server_with_their_error(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    (shadow / "grpc_health").mkdir(parents=True)
    (shadow / "grpc_health" / "__init__.py").write_text(VERSION_ERROR)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))}
    manifest = str(write_test_manifest(tmp_path))
    options = ["-m", manifest, "--processes", "2", "--workers", "0", "--grpc-port", str(free_port())]
    done = serve_until_it_exits(options, env)
    assert done.returncode == 1, done.stdout + done.stderr
    error = "VersionError: Detected incompatible Protobuf Gencode/Runtime versions when loading a stub: gencode 9.0.0"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: front processes failed to start {fronts.START_ATTEMPTS} time(s) in a row"), last
    assert last.endswith(error), last  # the child's own error, as the server's last word
    starts = done.stdout.count(f"stopped: {error}")  # each front process's own log line, with its traceback
    assert fronts.START_ATTEMPTS <= starts <= fronts.START_ATTEMPTS + 1, done.stdout  # not restarted for ever


def test_front_processes_whose_app_cannot_be_imported_stop_the_server_at_once(tmp_path: Path) -> None:
    script = (
        "from fnserve.server import fronts\n"
        "fronts.run('tests.no_such_module:factory', 2, {'host': '127.0.0.1', 'port': 0, 'log_level': 'warning'})\n"
    )
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert time.monotonic() - began < 30
    assert done.returncode == 1, done.stderr
    assert 'Could not import module "tests.no_such_module"' in done.stderr  # the child's own error (uvicorn's log)
    # uvicorn's start-failure status: nothing a second try would change.
    assert "front processes failed to start 1 time(s) in a row, the last (pid" in done.stderr


# A fast start's server process: the first front process itself (the gated app), the others from ``factory``.
FIRST_HERE = """
from fnserve.server import fronts
from tests.functional import gated_front
options = {{"host": "127.0.0.1", "port": {port}, "log_level": "warning"}}
listening = fronts.become_first_front(None)
fronts.serve_first(gated_front.factory(), "tests.functional.gated_front:{factory}", 2, options, listening)
"""


def test_a_fast_start_is_ready_once_its_first_front_process_listens_and_the_others_join(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    port = free_port()
    script = FIRST_HERE.format(port=port, factory="factory")
    env = {**os.environ, "FNSERVE_TEST_GATE": str(gate)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"

    def answers() -> httpx.Response | None:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            return None

    try:
        wait_for(lambda: (r := answers()) is not None and r.status_code == 200, 60, "the first front process")
        # Ready while the second waits at the gate: every connection goes to the first.
        assert len({httpx.get(url, timeout=5).json()["pid"] for _ in range(16)}) == 1
        gate.touch()

        def pids() -> set[int]:
            return {httpx.get(url, timeout=5).json()["pid"] for _ in range(32)}

        # New connections spread over both once the second joins (one process 32 times: once in 2**31).
        wait_for(lambda: len(pids()) == 2, 60, "the second front process to take connections")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_fast_start_whose_other_front_processes_cannot_start_stops_with_their_error(tmp_path: Path) -> None:
    """The server's own process serves while the others fail to start: after START_ATTEMPTS of them it stops
    serving, and exits with their error, instead of serving on with fewer processes than it was given."""
    env = {**os.environ, "FNSERVE_TEST_GATE": str(tmp_path / "gate")}
    script = FIRST_HERE.format(port=free_port(), factory="broken")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"front processes failed to start {fronts.START_ATTEMPTS} time(s) in a row" in done.stderr
    assert "RuntimeError: this front process cannot start" in done.stderr


# A supervisor whose front processes are slow to reach their own code: spawn imports this script again in each
# (as __mp_main__), and the sleep holds them there while the test kills the supervisor.
SLOW_SPAWN = """
import sys, time
if __name__ != "__main__":
    time.sleep(2)
else:
    from fnserve.server import fronts
    fronts.run("tests.functional.gated_front:factory", 2, {"host": "127.0.0.1", "port": int(sys.argv[1]),
               "log_level": "warning"})
"""


def test_front_processes_whose_supervisor_died_before_they_started_exit(tmp_path: Path) -> None:
    script = tmp_path / "supervisor.py"
    script.write_text(SLOW_SPAWN)
    env = {**os.environ, "FNSERVE_TEST_GATE": str(tmp_path / "gate"), "PYTHONPATH": os.getcwd()}
    (tmp_path / "gate").touch()
    proc = subprocess.Popen([sys.executable, str(script), str(free_port())], env=env)
    wait_for(lambda: len(process_tree(proc.pid)) >= 3, 30, "the front processes to be spawned")
    children = [pid for pid in process_tree(proc.pid) if pid != proc.pid]
    proc.kill()  # SIGKILL: the supervisor stops nothing
    proc.wait(timeout=30)

    def gone() -> bool:
        return not [pid for pid in children if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]

    wait_for(gone, 30, "the orphaned front processes to exit")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_inference_workers_that_cannot_load_a_model_stop_the_server_with_its_error(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    zeros = 'sha256 = "' + "0" * 64 + '"'
    manifest.write_text(re.sub(r'sha256 = "[0-9a-f]{64}"', zeros, manifest.read_text(), count=1))
    done = serve_until_it_exits(["-m", str(manifest), "--processes", "1", "--workers", "1"])
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert re.search("error: function inference-workers cannot start: .*has sha256 .*but the manifest says 0{64}", last)


def test_an_inference_worker_whose_replacements_cannot_start_stops_the_server(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    log = tmp_path / "serve.log"
    proc, url = start_server(["-m", str(manifest), "--processes", "1", "--workers", "1"], log, new_session=True)
    try:
        assert httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:2]), timeout=30).is_success
        (tmp_path / "identity.onnx").write_bytes(b"not the model the manifest names")  # a new worker cannot load it
        [worker] = spawned_children(proc.pid)
        os.kill(worker, signal.SIGKILL)
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    last = log.read_text().strip().splitlines()[-1]
    given_up = rf"\({fronts.START_ATTEMPTS} times in a row\)"
    assert re.search(rf"error: function inference-workers cannot start: .*identity.*sha256.*{given_up}", last), last


def test_a_front_process_killed_after_it_served_is_replaced_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    options = ["-m", str(write_test_manifest(tmp_path)), "--processes", "2", "--workers", "0"]
    proc, url = start_server(options, log, new_session=True)
    try:
        assert httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:2]), timeout=30).is_success
        before = spawned_children(proc.pid)
        assert len(before) == 2
        os.kill(before[0], signal.SIGKILL)

        def replaced() -> bool:
            now = spawned_children(proc.pid)
            return len(now) == 2 and before[0] not in now

        wait_for(replaced, 30, "the front process to be replaced")
        wait_for(lambda: "fnserve_front_respawns_total 1.0" in metrics(url), 30, "the replacement to be counted")
        for _ in range(8):  # new connections, spread over both front processes
            assert httpx.post(f"{url}/v2/models/digits-accurate/infer", json=body(DIGITS[:2]), timeout=30).is_success
        assert f"front process {before[0]} exited with status -9; starting another" in log.read_text()
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def metrics(url: str) -> str:
    try:
        return httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.TransportError:  # a connection the killed process held
        return ""
