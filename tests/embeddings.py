"""Shared by the tests of OpenAI's embeddings API on every target: the demo texts and their sentence-transformers
reference, the checks the official ``openai`` client runs against a target, and an httpx transport that carries
the client's requests to a Lambda handler as API Gateway events."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from fnserve.aws.events import LambdaContext, http_api_event, rest_api_event
from tests.helpers import DEMO_MANIFEST

DATA = Path(__file__).parent / "data"
SENTENCES = [line for line in (DATA / "sentences.txt").read_text().splitlines() if line]
REFERENCE = np.load(DATA / "minilm-reference.npz")["embedding"]
MAX_TOKENS = 256  # the demo pipeline's max_length
TOKENIZER = Tokenizer.from_file(str(DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"))
TOKENIZER.no_padding()
TOKENIZER.enable_truncation(MAX_TOKENS)  # as the pipeline cuts them (the file itself says 128, padded)
UNCUT = Tokenizer.from_file(str(DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"))
UNCUT.no_padding()
UNCUT.no_truncation()

# A batch of mixed lengths: a few words, sentences, and the one far past the model's 256 tokens.
LONGEST = max(range(len(SENTENCES)), key=lambda i: len(SENTENCES[i]))
MIXED = sorted({0, 1, 5, 17, 40, 99, 150, 241, LONGEST})


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def tokens(text: str) -> list[int]:
    """The demo tokenizer's ids of ``text``, special tokens included, cut as the pipeline cuts them."""
    return TOKENIZER.encode(text).ids


def vectors(response: Any) -> np.ndarray:
    """A client's embeddings response as an array, checked to be in input order."""
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def v2_embeddings(http: httpx.Client, texts: list[str], name: str = "minilm-embed") -> np.ndarray:
    """The same texts through the V2 route of the same target."""
    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    response = http.post(f"/v2/models/{name}/infer", json=body)
    assert response.status_code == 200, response.text
    out = response.json()["outputs"][0]
    return np.array(out["data"], dtype=np.float32).reshape(out["shape"])


def check_client(client: openai.OpenAI, http: httpx.Client) -> None:
    """What the official client does against any target serving the demo manifest, each answer checked against
    the V2 pipeline's (cosine >= 0.9999) and sentence-transformers' reference (within the int8 model's error)."""
    texts = [SENTENCES[i] for i in MIXED]
    got = client.embeddings.create(model="minilm-embed", input=texts, encoding_format="float")
    floats = vectors(got)
    assert floats.shape == (len(texts), 384) and got.model == "minilm-embed"
    assert cosine(floats, v2_embeddings(http, texts)).min() >= 0.9999
    similarity = cosine(floats, REFERENCE[MIXED])
    assert similarity.mean() >= 0.99 and similarity.min() >= 0.95, similarity
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(len(tokens(t)) for t in texts)
    # The client asks for base64 by default and decodes it (little-endian float32): the same numbers.
    np.testing.assert_array_equal(vectors(client.embeddings.create(model="minilm-embed", input=texts)), floats)
    # Token ids (the tokenizer's, special tokens included) are the text they encode.
    one = client.embeddings.create(model="minilm-embed", input=texts[1], encoding_format="float")
    ids = client.embeddings.create(model="minilm-embed", input=tokens(texts[1]), encoding_format="float")
    assert cosine(vectors(ids), vectors(one))[0] >= 0.9999
    many = client.embeddings.create(model="minilm-embed", input=[tokens(t) for t in texts[:3]])
    same = client.embeddings.create(model="minilm-embed", input=texts[:3])
    assert cosine(vectors(many), vectors(same)).min() >= 0.9999
    # Ids past the model's length are cut as its text is, the closing [SEP] kept.
    whole = UNCUT.encode(SENTENCES[LONGEST]).ids
    assert len(whole) > MAX_TOKENS
    cut = client.embeddings.create(model="minilm-embed", input=[whole], encoding_format="float")
    text = client.embeddings.create(model="minilm-embed", input=SENTENCES[LONGEST], encoding_format="float")
    assert cosine(vectors(cut), vectors(text))[0] >= 0.9999
    # OpenAI's own tokenizer's ids of "hello world", as LangChain's OpenAIEmbeddings sends them by default.
    with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length=False") as refused:
        client.with_options(max_retries=0).embeddings.create(model="minilm-embed", input=[[15339, 1917]])
    assert refused.value.response.json()["error"]["param"] == "input"
    assert len(vectors(client.embeddings.create(model="minilm-embed", input=texts[0], dimensions=384))[0]) == 384
    refusals(client)
    assert "minilm-embed" in [m.id for m in client.models.list()]
    assert client.models.retrieve("minilm-embed").id == "minilm-embed"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def refusals(client: openai.OpenAI) -> None:
    """Bad input answered in OpenAI's error shape, with the field at fault."""
    cases: list[tuple[dict[str, Any], type[Exception], str | None]] = [
        ({"input": ""}, openai.BadRequestError, "input"),
        ({"input": []}, openai.BadRequestError, "input"),
        ({"input": ["fine", ""]}, openai.BadRequestError, "input"),
        ({"input": ["a"] * 2049}, openai.BadRequestError, "input"),
        ({"input": [[101, 30522, 102]]}, openai.BadRequestError, "input"),  # past the vocabulary
        ({"input": "x", "dimensions": 100}, openai.BadRequestError, "dimensions"),
        ({"input": "x", "model": "text-embedding-3-small"}, openai.NotFoundError, "model"),
        ({"input": "x", "extra_body": {"input": 5}}, openai.BadRequestError, "input"),
        ({"input": "x", "extra_body": {"encoding_format": "int8"}}, openai.BadRequestError, "encoding_format"),
    ]
    no_retries = client.with_options(max_retries=0)
    for kwargs, error, param in cases:
        kwargs = {"model": "minilm-embed", **kwargs}
        try:
            no_retries.embeddings.create(**kwargs)
        except error as exc:
            body = exc.response.json()["error"]
            assert set(body) == {"message", "type", "param", "code"} and body["message"], body
            assert body["param"] == param and body["type"] == "invalid_request_error", body
        else:
            raise AssertionError(f"{kwargs} was answered")


class LambdaTransport(httpx.BaseTransport):
    """Each request an API Gateway event (HTTP API's payload 2.0, or the REST API's 1.0) given to ``handler``, its
    answer the response: the openai client's own requests, as API Gateway hands them to the function."""

    def __init__(
        self,
        handler: Callable[[dict[str, Any], Any], dict[str, Any]],
        version: str,
        *,
        domain: str = "localhost",
        timeout: float = 30.0,
    ) -> None:
        self.handler = handler
        self.version = version
        self.domain = domain  # a function URL's (*.lambda-url.*): no API Gateway, no 29 s
        self.timeout = timeout  # the function's, for each invocation's context

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        status, headers, raw = self.answer(request.method, request.url.path, dict(request.headers), request.read())
        return httpx.Response(status, headers=headers, content=raw, request=request)

    def answer(self, method: str, path: str, given: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The function's answer to one request, as API Gateway hands it over and back."""
        headers = {k.lower(): v for k, v in given.items()}
        proxy = next((p for p in ("/v1/", "/v2/", "/tei/") if path.startswith(p)), None)
        if self.version == "2.0":
            route = f"ANY {proxy}{{proxy+}}" if proxy else f"{method} {path}"  # the template's route keys
            event = http_api_event(
                method, path, route_key=route, headers=headers, body=body or None, domain=self.domain
            )
        else:
            resource = f"{proxy}{{proxy+}}" if proxy else path
            multi = {k: [v] for k, v in headers.items()}
            event = rest_api_event(method, path, resource=resource, headers=multi, body=body or None)
        answer = self.handler(event, LambdaContext(timeout=self.timeout))
        content = answer.get("body") or ""
        raw = base64.b64decode(content) if answer.get("isBase64Encoded") else content.encode()
        headers = dict(answer.get("headers") or {})
        for name, values in (answer.get("multiValueHeaders") or {}).items():
            headers[name] = values[-1]
        return answer["statusCode"], headers, raw


class Httpx2LambdaTransport(httpx2.BaseTransport):
    """:class:`LambdaTransport` for the clients built on httpx2 (``huggingface_hub``'s)."""

    def __init__(self, lambda_transport: LambdaTransport) -> None:
        self.inner = lambda_transport

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        status, headers, raw = self.inner.answer(
            request.method, request.url.path, dict(request.headers), request.read()
        )
        return httpx2.Response(status, headers=headers, content=raw, request=request)
