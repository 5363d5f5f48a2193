"""``fnserve local`` enforces the API authorisation the template declares, as API Gateway's HTTP API does: the
repository's API-key mode with its own authorizer function and the ``openai`` client, and, on a hand-written
template, IAM (SigV4 by this machine's credentials: botocore's signer and curl's) and JWT (a local issuer's keys)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from joserfc import jwt
from joserfc.jwk import RSAKey

from fnserve.emulator.emulator import Emulator
from tests.e2e.emulator import running_local
from tests.helpers import REPO
from tests.moto import free_port
from tests.servers import wait_for


def test_the_api_key_mode_as_deployed_with_the_openai_client(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL") and k != "LOCALSTACK_HOST"}
    with running_local(["--workers", "1", "-p", "ApiAuth=APIKEY"], tmp_path / "local.log", env) as local:
        wait_for(lambda: "Ctrl-C stops it." in local["log"].read_text(), 60, "the banner")
        banner = local["log"].read_text().splitlines()
        key = next(line.rsplit("KEY=", 1)[1] for line in banner if line.startswith("  auth ") and "KEY=" in line)
        with openai.OpenAI(base_url=f"{local['url']}/v1", api_key=key, max_retries=0, timeout=60) as client:
            embedded = client.embeddings.create(model="minilm-embed", input=["a warm container answers"])
            assert len(embedded.data[0].embedding) == 384
        with openai.OpenAI(base_url=f"{local['url']}/v1", api_key="fns-not-the-key-0123456789", max_retries=0) as c:
            with pytest.raises(openai.PermissionDeniedError) as wrong:  # the authorizer said no: 403
                c.embeddings.create(model="minilm-embed", input=["x"])
        assert wrong.value.body == {"message": "Forbidden"}
        missing = httpx.post(f"{local['url']}/v1/embeddings", json={"model": "minilm-embed", "input": "x"})
        assert (missing.status_code, missing.json()) == (401, {"message": "Unauthorized"})  # API Gateway's own
        tried = next(line.removeprefix("  try ").strip() for line in banner if line.startswith("  try "))
        shell = {"PATH": "/usr/bin:/bin", "KEY": key}
        answer = subprocess.run(["bash", "-c", tried], env=shell, capture_output=True, text=True, timeout=60)
        assert json.loads(answer.stdout)["model_name"] == "digits", answer.stdout


TEMPLATE = """
Transform: AWS::Serverless-2016-10-31
Parameters:
  Issuer:
    Type: String
Resources:
  Echo:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: echo
      Handler: app.handler
      Runtime: python3.12
      Timeout: 5
  Api:
    Type: AWS::ApiGatewayV2::Api
    Properties:
      Name: auth
      ProtocolType: HTTP
  Integration:
    Type: AWS::ApiGatewayV2::Integration
    Properties:
      ApiId: !Ref Api
      IntegrationType: AWS_PROXY
      IntegrationUri: !Ref Echo
      PayloadFormatVersion: "2.0"
  Tokens:
    Type: AWS::ApiGatewayV2::Authorizer
    Properties:
      ApiId: !Ref Api
      Name: jwt
      AuthorizerType: JWT
      IdentitySource: [$request.header.Authorization]
      JwtConfiguration:
        Issuer: !Ref Issuer
        Audience: [fnserve-test]
  Signed:
    Type: AWS::ApiGatewayV2::Route
    Properties:
      ApiId: !Ref Api
      RouteKey: POST /iam
      Target: !Sub "integrations/${Integration}"
      AuthorizationType: AWS_IAM
  Bearer:
    Type: AWS::ApiGatewayV2::Route
    Properties:
      ApiId: !Ref Api
      RouteKey: GET /jwt
      Target: !Sub "integrations/${Integration}"
      AuthorizationType: JWT
      AuthorizerId: !Ref Tokens
"""
ECHO = """
import json

def handler(event, context):
    return {"statusCode": 200, "body": json.dumps(event["requestContext"].get("authorizer"))}
"""
KEY = RSAKey.generate_key(2048, parameters={"kid": "local-1"})
OTHER = RSAKey.generate_key(2048, parameters={"kid": "local-1"})  # the same kid, not the issuer's key


@pytest.fixture(scope="module")
def issuer() -> Iterator[str]:
    """An OpenID issuer on loopback: its discovery document and its public keys."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    documents = {
        "/.well-known/openid-configuration": {"issuer": url, "jwks_uri": f"{url}/jwks"},
        "/jwks": {"keys": [KEY.as_dict(private=False)]},
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(documents[self.path]).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, issuer: str) -> Iterator[str]:
    root = tmp_path_factory.mktemp("auth")
    (root / "template.yaml").write_text(TEMPLATE)
    (root / "echo").mkdir()
    (root / "echo" / "app.py").write_text(ECHO)
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("LOCALSTACK_HOST", raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "local-signer")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "local-secret")
        emulator = Emulator(root / "template.yaml", port=port, parameters={"Issuer": issuer})
        try:
            emulator.start()
            yield f"http://127.0.0.1:{port}"
        finally:
            emulator.stop()


def signature(url: str, body: bytes, secret: str = "local-secret") -> dict[str, str]:
    request = AWSRequest("POST", url, {"content-type": "application/json"}, body)
    SigV4Auth(Credentials("local-signer", secret), "execute-api", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def signed(url: str, body: bytes, secret: str = "local-secret") -> httpx.Response:
    return httpx.post(url, content=body, headers=signature(url, body, secret))


def test_iam_wants_a_signature_by_this_machines_credentials(gateway: str) -> None:
    body = b'{"inputs": []}'
    unsigned = httpx.post(f"{gateway}/iam", content=body)
    assert (unsigned.status_code, unsigned.json()) == (403, {"message": "Forbidden"})
    answer = signed(f"{gateway}/iam", body)
    assert answer.status_code == 200 and answer.json()["iam"]["accessKey"] == "local-signer"
    wrong = signed(f"{gateway}/iam", body, secret="not-the-secret")
    assert wrong.status_code == 403 and "signature we calculated does not match" in wrong.json()["message"]
    tampered = httpx.post(f"{gateway}/iam", content=b'{"inputs": [1]}', headers=signature(f"{gateway}/iam", body))
    assert tampered.status_code == 403  # the body is part of what is signed
    curl = ["curl", "-s", "--aws-sigv4", "aws:amz:us-east-1:execute-api", "--user", "local-signer:local-secret"]
    done = subprocess.run([*curl, "-d", "{}", f"{gateway}/iam"], capture_output=True, text=True, timeout=30)
    assert json.loads(done.stdout)["iam"]["accessKey"] == "local-signer", done.stdout


def token(issuer: str, key: RSAKey = KEY, audience: str = "fnserve-test", expires: float = 300) -> str:
    now = int(time.time())
    claims = {"iss": issuer, "aud": audience, "sub": "user-1", "iat": now, "exp": now + int(expires)}
    return jwt.encode({"alg": "RS256", "kid": "local-1"}, claims, key)


def test_jwt_wants_a_token_the_issuer_signed_for_the_audience(gateway: str, issuer: str) -> None:
    def call(value: str | None) -> httpx.Response:
        return httpx.get(f"{gateway}/jwt", headers={"authorization": f"Bearer {value}"} if value else {})

    answer = call(token(issuer))
    assert answer.status_code == 200 and answer.json()["jwt"]["claims"]["sub"] == "user-1"
    for refused in (None, token(issuer, audience="another-app"), token(issuer, expires=-60), token(issuer, OTHER)):
        response = call(refused)
        assert (response.status_code, response.json()) == (401, {"message": "Unauthorized"})


def test_the_security_pages_signing_transport_passes_iam(gateway: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/security.md's httpx transport for the openai client, as written, signs what IAM checks."""
    page = (REPO / "docs" / "security.md").read_text()
    block = next(b for b in page.split("```py\n")[1:] if "class SigV4" in b).split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(block.split("\nclient = ", 1)[0], "security.md", "exec"), namespace)  # the class, not the stack's
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with httpx.Client(auth=namespace["SigV4"]()) as client:
        answer = client.post(f"{gateway}/iam", json={"model": "minilm-embed", "input": ["x"]})
    assert answer.status_code == 200 and answer.json()["iam"]["accessKey"] == "local-signer"
