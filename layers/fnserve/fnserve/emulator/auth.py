"""The template's API authorisation, enforced by the emulator's gateway as API Gateway's HTTP API enforces it: a
request the deployed API would refuse is refused here, with the same status and body.

- ``AWS_IAM``: a SigV4 signature (botocore's own signer checks it) by credentials this machine's AWS chain holds;
  unsigned, 403 ``Forbidden``; signed by unknown keys or wrongly, 403 with API Gateway's message.
- ``JWT``: a token the issuer's keys sign (its ``/.well-known/openid-configuration``, read with joserfc), with the
  template's issuer and one of its audiences, not expired; else 401 ``Unauthorized``.
- ``CUSTOM``: the template's Lambda authorizer, run as a local function on the 2.0 authorizer event, its answer
  kept for the authorizer's TTL per identity; no identity, 401 without calling it; ``isAuthorized: false``, 403.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fnserve.aws import events
from fnserve.core.errors import FnserveError
from fnserve.workers.pool import Pool

UNAUTHORIZED = JSONResponse({"message": "Unauthorized"}, status_code=401)
FORBIDDEN = JSONResponse({"message": "Forbidden"}, status_code=403)
BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access "
    "Key and signing method. Consult the service documentation for details."
)


@dataclass
class Checked:
    """A request let through, and what the function's event then carries as ``requestContext.authorizer``."""

    authorizer: dict[str, Any] | None = None


class IamAuth:
    """``AWS_IAM``: the request signed (SigV4, service execute-api) by the credentials boto3 finds here."""

    mode = "IAM"

    async def check(
        self, request: Request, body: bytes, event: dict[str, Any], pools: Mapping[str, Pool]
    ) -> Checked | Response:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.session import Session

        header = request.headers.get("authorization", "")
        if not header.startswith("AWS4-HMAC-SHA256 "):
            return FORBIDDEN
        fields = dict(part.strip().split("=", 1) for part in header.removeprefix("AWS4-HMAC-SHA256 ").split(","))
        key, _, region, service, _ = (fields.get("Credential", "") + "////").split("/", 4)
        credentials = Session().get_credentials()
        if credentials is None or credentials.access_key != key:
            message = "The security token included in the request is invalid."
            return JSONResponse({"message": message}, status_code=403)
        signed = fields.get("SignedHeaders", "").split(";")
        headers = {name: request.headers.get(name, "") for name in signed}
        url = f"{request.url.scheme}://{request.headers.get('host', '')}{request.url.path}"
        asked = AWSRequest(request.method, url + (f"?{request.url.query}" if request.url.query else ""), headers, body)
        asked.context["timestamp"] = headers.get("x-amz-date", "")
        signer = SigV4Auth(credentials.get_frozen_credentials(), service or "execute-api", region)
        expected = signer.signature(signer.string_to_sign(asked, signer.canonical_request(asked)), asked)
        if expected != fields.get("Signature"):
            return JSONResponse({"message": BAD_SIGNATURE}, status_code=403)
        arn = f"arn:aws:iam::{events.ACCOUNT_ID}:user/local"
        return Checked({"iam": {"accessKey": key, "accountId": events.ACCOUNT_ID, "userArn": arn}})


@dataclass
class JwtAuth:
    """``JWT``: the issuer's signature, issuer, audience (``aud`` or ``client_id``) and times."""

    issuer: str
    audiences: list[str]
    mode: str = "JWT"

    async def check(
        self, request: Request, body: bytes, event: dict[str, Any], pools: Mapping[str, Pool]
    ) -> Checked | Response:
        from joserfc import jwt
        from joserfc.errors import JoseError

        token = request.headers.get("authorization", "").strip()
        if token.lower().startswith("bearer "):
            token = token[7:].strip()
        if not token:
            return UNAUTHORIZED
        try:
            keys = await asyncio.to_thread(_issuer_keys, self.issuer)
            claims = jwt.decode(token, keys).claims
            registry = jwt.JWTClaimsRegistry(iss={"essential": True, "value": self.issuer}, exp={"essential": True})
            registry.validate(claims)
        except (JoseError, OSError, ValueError, KeyError):
            return UNAUTHORIZED
        audience = claims.get("aud", claims.get("client_id"))
        said = audience if isinstance(audience, list) else [audience]
        if not set(said) & set(self.audiences):
            return UNAUTHORIZED
        scopes = str(claims["scope"]).split() if "scope" in claims else None
        return Checked({"jwt": {"claims": claims, "scopes": scopes}})


def _issuer_keys(issuer: str) -> Any:
    from joserfc.jwk import KeySet

    with urllib.request.urlopen(f"{issuer.rstrip('/')}/.well-known/openid-configuration", timeout=5) as answer:
        jwks_uri = json.load(answer)["jwks_uri"]
    with urllib.request.urlopen(jwks_uri, timeout=5) as answer:
        return KeySet.import_key_set(json.load(answer))


@dataclass
class LambdaAuth:
    """``CUSTOM``: the template's Lambda authorizer function (payload 2.0, simple responses)."""

    function: str
    identity: list[str]  # its identity sources: "$request.header.Authorization"
    ttl: float
    mode: str = "APIKEY"
    _answers: dict[tuple[str, ...], tuple[float, dict[str, Any]]] = field(default_factory=dict)

    async def check(
        self, request: Request, body: bytes, event: dict[str, Any], pools: Mapping[str, Pool]
    ) -> Checked | Response:
        values = [_identity(request, source) for source in self.identity]
        if any(value is None for value in values):
            return UNAUTHORIZED  # API Gateway refuses it without calling the authorizer
        known = tuple(str(value) for value in values)
        kept = self._answers.get(known)
        if kept is not None and kept[0] > time.monotonic():
            answer = kept[1]
        else:
            try:
                invoked = pools[self.function].invoke(events.authorizer_event(event, known))
                answer = await asyncio.wrap_future(invoked)
            except FnserveError:
                return JSONResponse({"message": "Internal Server Error"}, status_code=500)
            if not isinstance(answer, dict) or not isinstance(answer.get("isAuthorized"), bool):
                return JSONResponse({"message": "Internal Server Error"}, status_code=500)
            if self.ttl > 0:
                self._answers[known] = (time.monotonic() + self.ttl, answer)
        if not answer["isAuthorized"]:
            return FORBIDDEN
        return Checked({"lambda": answer.get("context") or {}})


def _identity(request: Request, source: str) -> str | None:
    """An identity source's value in ``request`` (headers and query strings, as API Gateway reads them)."""
    if source.startswith("$request.header."):
        return request.headers.get(source.removeprefix("$request.header.")) or None
    if source.startswith("$request.querystring."):
        return request.query_params.get(source.removeprefix("$request.querystring.")) or None
    return None


RouteAuth = IamAuth | JwtAuth | LambdaAuth


def route_auth(kind: str, authorizer: dict[str, Any] | None) -> RouteAuth | None:
    """The check of a route whose ``AuthorizationType`` is ``kind``, with its ``AWS::ApiGatewayV2::Authorizer``'s
    properties (resolved); None for ``NONE``."""
    if kind == "AWS_IAM":
        return IamAuth()
    if kind == "JWT" and authorizer is not None:
        config = authorizer.get("JwtConfiguration") or {}
        return JwtAuth(str(config.get("Issuer", "")), [str(a) for a in config.get("Audience") or []])
    if kind == "CUSTOM" and authorizer is not None:
        uri = str(authorizer.get("AuthorizerUri", ""))
        function = uri.split("/functions/", 1)[-1].split("/invocations", 1)[0].removesuffix(".Arn")
        if ":function:" in function:  # an ARN the resolver made of the function's name
            function = function.split(":function:", 1)[1].split(":", 1)[0]
        identity = [str(source) for source in authorizer.get("IdentitySource") or []]
        return LambdaAuth(function, identity, float(authorizer.get("AuthorizerResultTtlInSeconds", 300)))
    return None
