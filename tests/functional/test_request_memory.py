"""A request's size never decides a process's memory, nor outlives its deadline: 64 texts of 256 tokens through
the batched ``fnserve serve`` (unbatched, it runs the functions' road) and the Lambda API function, 32 through the
Cloud Function, each process's peak RSS read from /proc; then 1,000 such texts, which no deadline here fits (the
caller's timeout, API Gateway's 29 s), refused at once in OpenAI's shape. Padded into one feed of their longest, 64
such texts take a process past 1.2 GB, 128 past 1.9 GB (the attention scores of every row at once); 128 and the
unbatched server were measured so too (docs/design/memory.md), and left out here for make test's minutes."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

import fnserve.adapters.handler as handler_module
from tests.embeddings import SENTENCES, LambdaTransport
from tests.helpers import DEMO_MANIFEST, REPO
from tests.helpers.functions import FUNCTIONS_FRAMEWORK, load_function
from tests.servers import free_port, start_http, start_server

# What the demo MiniLM's token budget (1,024 tokens, 32,768 attention scores a run) may add to a process, with the
# request's own body and answer: docs/design/memory.md gives the figures.
MAX_GROWTH_MB = 300
WORDS = " ".join(SENTENCES).split()
# Texts of the model's whole 256 tokens (about 190 words of the demo's prose each, cut at 256).
TEXTS = [" ".join(WORDS[(i * 37) % 2000 : (i * 37) % 2000 + 230]) for i in range(1000)]


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *(p for child in children for p in tree(int(child)))]


def status(pid: int, field: str) -> int:
    """A /proc/PID/status field in MB (VmRSS: now; VmHWM: the peak since the last reset)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no {field} for {pid}")


class Peaks:
    """Each process's RSS now, its peak reset to it (``clear_refs`` 5), and later how far above it each peaked."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.before = {pid: status(pid, "VmRSS") for pid in pids}
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")

    def growth(self) -> dict[int, int]:
        return {pid: status(pid, "VmHWM") - self.before[pid] for pid in self.pids}


def embed_checked(
    client: openai.OpenAI,
    pids: list[int],
    where: str,
    refusing: openai.OpenAI | None = None,
    many: int = 64,
    paced: Callable[[float], None] | None = None,
) -> str:
    """``many`` texts of 256 tokens answered whole, no process growing past the budget's memory; then 1,000 refused
    at once, naming the deadline and what to do instead: by ``refusing`` (its deadline its own), else by ``client``
    waiting three times what the ``many`` took. ``paced`` learns what they took, before the refusal."""
    client.embeddings.create(model="minilm-embed", input=TEXTS[:4])  # warm: the pace the refusal foresees by
    peaks = Peaks(pids)
    started = time.monotonic()
    answer = client.embeddings.create(model="minilm-embed", input=TEXTS[:many])
    took = time.monotonic() - started
    assert len(answer.data) == many and answer.usage.prompt_tokens == many * 256
    grown = peaks.growth()
    assert max(grown.values()) <= MAX_GROWTH_MB, f"{where}: peak RSS rose by {grown} MB for {many} texts"
    # The client waits three times what the texts took (its timeout, which it sends): 1,000 need many times more.
    refusing = refusing or client.with_options(timeout=3 * took)
    if paced is not None:
        paced(took)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        refusing.embeddings.create(model="minilm-embed", input=TEXTS)
    took = time.monotonic() - started
    error = refused.value.body
    assert refused.value.status_code == 413, error
    assert isinstance(error, dict) and error["type"] == "invalid_request_error", error
    assert error["code"] == "request_too_long" and "deadline" in error["message"], error
    assert "fnserve submit" in error["message"], error
    assert took < 5, f"{where}: refused after {took:.1f} s, not at once"
    return str(error["message"])


def checked_process(proc: subprocess.Popen[bytes], url: str, where: str, many: int = 64) -> None:
    """:func:`embed_checked` against a process serving OpenAI's routes at ``url``, which is stopped after."""
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0) as client:
            embed_checked(client, tree(proc.pid), where, many=many)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_batched_server_keeps_its_memory_and_refuses_past_its_callers_timeout(tmp_path: Path) -> None:
    options = ["-m", str(DEMO_MANIFEST), "--processes", "1"]
    proc, url = start_server(options, tmp_path / "serve.log", env=dict(os.environ), new_session=True)
    checked_process(proc, url, "fnserve serve (batched)")


@pytest.fixture
def api_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
    for name in ("FNSERVE_RESULTS", "FNSERVE_RESULTS_TABLE"):
        monkeypatch.delenv(name, raising=False)


def test_the_lambda_api_function_keeps_its_memory_and_refuses_past_api_gateway(
    api_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = load_function(REPO / "functions" / "api" / "app.py").handler

    # 64 texts through a function URL (no API Gateway: the function's own timeout bounds them, here 120 s, however
    # the other tests load the CPU), then 1,000 through API Gateway's HTTP API, its 29 s scaled to this CPU: three
    # times what the 64 took, which a fast CPU's 1,000 would fit in unscaled.
    def scaled(took: float) -> None:
        monkeypatch.setattr(handler_module, "API_GATEWAY_SECONDS", round(3 * took, 1))

    url = LambdaTransport(handler, "2.0", domain="abc.lambda-url.us-east-1.on.aws", timeout=120.0)
    gateway = LambdaTransport(handler, "2.0", timeout=60.0)  # the function may run longer than API Gateway waits
    with (
        httpx.Client(transport=url, base_url="https://fn.example") as http,
        httpx.Client(transport=gateway, base_url="https://api.example") as via_gateway,
    ):
        with openai.OpenAI(base_url="https://fn.example/v1", api_key="unused", http_client=http) as client:
            refusing = openai.OpenAI(base_url="https://api.example/v1", api_key="unused", http_client=via_gateway)
            said = embed_checked(client, [os.getpid()], "the Lambda API function", refusing, paced=scaled)
    assert "API Gateway's" in said, said


def test_the_cloud_function_keeps_its_memory_and_refuses_past_its_timeout(tmp_path: Path) -> None:
    port = free_port()
    source = REPO / "functions" / "gcp_api" / "main.py"
    command = [FUNCTIONS_FRAMEWORK, "--target", "infer", "--source", str(source), "--signature-type", "http"]
    command += ["--asgi", "--port", str(port), "--host", "127.0.0.1"]
    env = {**os.environ, "FNSERVE_MANIFEST": str(DEMO_MANIFEST)}
    env.pop("FNSERVE_RESULTS", None)
    proc, url = start_http(command, port, tmp_path / "function.log", env=env)
    # The Lambda function's road (the data plane unbatched, PipelineServable.run), held to it above: 32 here.
    checked_process(proc, url, "the Cloud Function", many=32)
