"""API keys on a real ``fnserve serve`` (HTTP and gRPC), called by the clients people use: the ``openai`` client,
``cohere``, ``huggingface_hub``, tritonclient over HTTP and gRPC, and curl. A wrong or missing key is a 401 in each
API's own shape (UNAUTHENTICATED over gRPC) before the body is read, health stays open, a key file's new key is
taken with no restart, and no key shows in the server's log."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cohere
import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from tritonclient.utils import InferenceServerException

from fnserve.adapters.keys import key_id
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.moto import free_port
from tests.servers import start_server, wait_for

FIRST = "fns-first-0123456789abcdef"  # from the key file
FIXED = "fns-fixed-0123456789abcdef"  # from FNSERVE_API_KEYS
NEXT = "fns-next-0123456789abcdef0"  # written to the file while the server runs
WRONG = "fns-wrong-0123456789abcdef"
DIGITS = np.load(DEMO_HOLDOUT)["input"][:2]


@dataclass
class Keyed:
    url: str
    grpc: str
    keys: Path
    log: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    directory = tmp_path_factory.mktemp("keyed")
    keys = directory / "keys"
    keys.write_text(f"{FIRST}\n")
    grpc_port = free_port()
    env = {
        **os.environ,
        "FNSERVE_API_KEYS": FIXED,
        "FNSERVE_API_KEYS_FILE": str(keys),
        "FNSERVE_MAX_REQUEST_BYTES": "65536",
    }
    options = [
        "-m",
        str(DEMO_MANIFEST),
        "--workers",
        "0",
        "--processes",
        "1",
        "--access-log",
        "--grpc-port",
        str(grpc_port),
    ]
    log = directory / "serve.log"
    proc, url = start_server(options, log, env=env)
    try:
        yield Keyed(url, f"127.0.0.1:{grpc_port}", keys, log, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}  # lower case: gRPC metadata must be


def test_health_and_the_scrape_stay_open(keyed: Keyed) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/ping", "/health", "/metrics"):
        assert httpx.get(keyed.url + path).status_code == 200, path
    refused = httpx.get(keyed.url + "/v2/models/digits-fast")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert "needs an API key" in refused.json()["error"]
    assert httpx.get(keyed.url + "/v2/models/digits-fast", headers=bearer(FIRST)).status_code == 200


def test_the_openai_client_with_its_key_and_without(keyed: Keyed) -> None:
    for key in (FIRST, FIXED):
        with openai.OpenAI(api_key=key, base_url=f"{keyed.url}/v1", max_retries=0) as client:
            assert len(client.embeddings.create(model="minilm-embed", input=["hello"]).data[0].embedding) == 384
    with (
        openai.OpenAI(api_key=WRONG, base_url=f"{keyed.url}/v1", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as refused,
    ):
        client.embeddings.create(model="minilm-embed", input=["hello"])
    assert refused.value.code == "invalid_api_key" and refused.value.type == "invalid_request_error"
    assert "not one this server holds" in refused.value.message


def test_cohere_and_tei_clients_hear_401_in_their_shape(keyed: Keyed) -> None:
    with httpx.Client() as http:
        rerank = cohere.ClientV2(api_key=FIRST, base_url=keyed.url, httpx_client=http)
        ranked = rerank.rerank(model="minilm-rerank", query="a cat", documents=["a dog", "a cat sat"])
        assert ranked.results[0].index == 1
        wrong = cohere.ClientV2(api_key=WRONG, base_url=keyed.url, httpx_client=http)
        with pytest.raises(cohere.errors.UnauthorizedError) as refused:
            wrong.rerank(model="minilm-rerank", query="q", documents=["d"])
    assert refused.value.body == {"message": "the API key sent is not one this server holds"}

    tei = httpx.post(keyed.url + "/embed", json={"inputs": "hello"})
    assert tei.status_code == 401 and tei.json()["error_type"] == "Unauthorized"
    with InferenceClient(base_url=keyed.url, api_key=FIXED) as hub:
        assert np.asarray(hub.feature_extraction("hello")).shape[-1] == 384
    with InferenceClient(base_url=keyed.url, api_key=WRONG) as hub, pytest.raises(HfHubHTTPError) as hub_refused:
        hub.feature_extraction("hello")
    assert hub_refused.value.response.status_code == 401


def test_tritonclient_over_http_and_grpc(keyed: Keyed) -> None:
    http = triton_http.InferenceServerClient(keyed.url.removeprefix("http://"))
    request = triton_http.InferInput("input", list(DIGITS.shape), "FP32")
    request.set_data_from_numpy(DIGITS, binary_data=True)
    try:
        assert http.is_server_live() and http.is_server_ready()  # probes need no key
        answered = http.infer("digits-fast", [request], headers=bearer(FIRST))
        assert answered.as_numpy("label").shape == (2,)
        with pytest.raises(InferenceServerException, match="needs an API key"):
            http.infer("digits-fast", [request])
    finally:
        http.close()

    client = triton_grpc.InferenceServerClient(keyed.grpc)
    request = triton_grpc.InferInput("input", list(DIGITS.shape), "FP32")
    request.set_data_from_numpy(DIGITS)
    try:
        assert client.is_server_live() and client.is_server_ready()
        answered = client.infer("digits-fast", [request], headers=bearer(FIXED))
        assert answered.as_numpy("label").shape == (2,)
        for headers, said in ((None, "needs an API key"), (bearer(WRONG), "not one this server holds")):
            with pytest.raises(InferenceServerException) as refused:
                client.infer("digits-fast", [request], headers=headers)
            assert refused.value.status() == "StatusCode.UNAUTHENTICATED" and said in refused.value.message()
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.get_model_metadata("digits-fast")
    finally:
        client.close()
    with grpc.insecure_channel(keyed.grpc) as channel:  # the platform's probe
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert status.status == health_pb2.HealthCheckResponse.SERVING


def test_curl(keyed: Keyed) -> None:
    body = '{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["hello"]}]}'
    base = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "content-type: application/json"]
    url = f"{keyed.url}/v2/models/minilm-embed/infer"
    run = lambda *extra: subprocess.run([*base, *extra, "-d", body, url], capture_output=True, text=True).stdout  # noqa: E731
    assert run("-H", f"Authorization: Bearer {FIRST}") == "200"
    assert run("-H", f"authorization: bearer {FIXED}") == "200"  # the scheme in any case
    assert run() == "401"
    assert run("-H", f"Authorization: Bearer {WRONG}") == "401"
    assert run("-H", f"Authorization: Basic {FIRST}") == "401"


def test_refused_before_the_body_is_read(keyed: Keyed) -> None:
    """A body far over the server's limit, never sent: the answer is the missing key's 401, not a 413, and it comes
    while the server still waits for the body."""
    host, port = keyed.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/digits-fast/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 50000000\r\n\r\n"
        )
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 401"), head


def test_a_new_key_in_the_file_is_taken_without_a_restart(keyed: Keyed) -> None:
    newer = keyed.keys.with_name("keys.new")
    newer.write_text(f"{NEXT}\n{FIRST}\n")  # the new key beside the old one while clients move
    newer.replace(keyed.keys)
    client = openai.OpenAI(api_key=NEXT, base_url=f"{keyed.url}/v1", max_retries=0)

    def taken() -> bool:
        try:
            client.embeddings.create(model="minilm-embed", input=["rotated"])
        except openai.AuthenticationError:
            return False
        return True

    wait_for(taken, 10, "the server to take the new key")
    newer.write_text(f"{NEXT}\n")  # the old key retired
    newer.replace(keyed.keys)
    with httpx.Client(base_url=keyed.url, headers=bearer(FIRST)) as old:
        wait_for(lambda: old.get("/v2/models/digits-fast").status_code == 401, 10, "the old key to be refused")
    assert taken() and keyed.proc.poll() is None
    client.close()


def test_no_key_in_the_log_only_its_id(keyed: Keyed) -> None:
    httpx.post(f"{keyed.url}/v1/embeddings", json={"model": "minilm-embed", "input": "x"}, headers=bearer(FIXED))
    wanted = key_id(FIXED)

    def logged() -> bool:
        return f'"api_key_id":"{wanted}"' in keyed.log.read_text()

    wait_for(logged, 10, "an access line naming the key's id")
    text = keyed.log.read_text()
    for key in (FIRST, FIXED, NEXT, WRONG):
        assert key not in text
    assert "API keys required" in text and key_id(FIRST) in text  # the start line names the keys by id
    assert "curl -s -H 'authorization: Bearer KEY'" in text  # the banner's lines to try carry a key
