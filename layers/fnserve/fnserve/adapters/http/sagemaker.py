"""SageMaker's hosting contract on the server's port: ``GET /ping`` and ``POST /invocations``.

So the container image runs unchanged as a SageMaker real-time or asynchronous endpoint
(``docker run IMAGE serve``, port 8080, models under /opt/ml/model). The V2 routes stay on the
same port. ``/invocations`` takes what SageMaker clients send:

- ``application/json``: a V2 request; ``application/octet-stream`` with
  ``Inference-Header-Content-Length``: the binary tensor extension. Both answer as the V2 route does.
- ``application/x-npy``: one array, for the model's only input (or the input named by
  ``input=NAME`` in the custom attributes); ``application/x-npz``: arrays by input name.
  These answer with V2 JSON, or with ``Accept: application/x-npy`` (the one output, or the one
  named by ``output=NAME``) or ``application/x-npz`` (every output).

The model: ``X-Amzn-SageMaker-Target-Model`` (a multi-model endpoint's ``name.tar.gz`` or
``name/version.tar.gz``), else ``model=NAME[,version=V]`` in ``X-Amzn-SageMaker-Custom-Attributes``,
else ``FNSERVE_DEFAULT_MODEL``, else the manifest's only served name.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from fnserve.adapters.http.infer import JSON, InferenceRoute, Receive, V2Request, encode_v2
from fnserve.adapters.http.middleware import json_response
from fnserve.core.codec.tensors import JSON_HEADER, InferenceRequest
from fnserve.core.errors import BadRequest, InvalidInput
from fnserve.core.serving.dataplane import Answer
from fnserve.observability.envelope import RequestRecorder

NPY = "application/x-npy"
NPZ = "application/x-npz"
TARGET_MODEL = "x-amzn-sagemaker-target-model"
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"


class SageMakerRoutes:
    """``/ping`` and ``/invocations`` over the V2 routes' data plane."""

    def __init__(self, inference: InferenceRoute) -> None:
        self.inference = inference
        self.plane = inference.plane
        v2_recorder = inference.recorder  # the same records and access lines; spans named by this route
        self.recorder = RequestRecorder(
            "http", v2_recorder.telemetry, access_log=v2_recorder.access_log, route="/invocations"
        )
        self.default_model = inference.default_model

    async def ping(self) -> Response:
        """200 once every model is loaded (and warmed, at start), else 503: SageMaker sends no traffic before."""
        ready = self.plane.catalog.ready()
        return json_response({"ready": ready}, 200 if ready else 503)

    async def invocations(self, request: Request) -> Response:
        headers = request.headers
        attributes = custom_attributes(headers.get(CUSTOM_ATTRIBUTES, ""))
        name, version = self.model(headers.get(TARGET_MODEL), attributes)
        media = headers.get("content-type", JSON).split(";")[0].strip().lower()
        arrived = (name, version, headers.get("traceparent"), request.receive, headers.get("content-length"))
        if media not in (NPY, NPZ):
            v2 = V2Request(*arrived, self.inference.limit, headers.get(JSON_HEADER))
            payload, media_type, extra = await self.inference.answer(v2, self.recorder)
        else:
            accept = headers.get("accept", JSON).split(";")[0].strip().lower()
            numpy = NumpyRequest(*arrived, self.inference.limit, self, media, accept, attributes)
            payload, media_type, extra = await self.inference.answer(numpy, self.recorder)
        return Response(payload, media_type=media_type, headers=extra)

    def encode(
        self, answer: Answer, request: InferenceRequest, accept: str, attributes: Mapping[str, str]
    ) -> tuple[bytes, str, dict[str, str]]:
        """A NumPy request's answer: .npy (one output), .npz (every output), or V2 JSON."""
        buffer = io.BytesIO()
        if accept == NPY:
            output = attributes.get("output") or _only(list(answer.outputs), "output", answer.name)
            if output not in answer.outputs:
                raise InvalidInput(f"model {answer.name!r} has no output {output!r}; it has {list(answer.outputs)}")
            np.save(buffer, answer.outputs[output], allow_pickle=False)
            return buffer.getvalue(), NPY, {}
        if accept == NPZ:
            np.savez(buffer, **answer.outputs)  # type: ignore[arg-type]  # numpy types the keywords as its own
            return buffer.getvalue(), NPZ, {}
        return encode_v2(answer, request)

    def model(self, target: str | None, attributes: Mapping[str, str]) -> tuple[str, str | None]:
        """The served name (and version) a request is for, from SageMaker's headers or the default."""
        if target:
            stem = target.removesuffix(".tar.gz").strip("/")
            name, _, version = stem.partition("/")
            return name, version or None
        if "model" in attributes:
            return attributes["model"], attributes.get("version")
        if self.default_model:
            return self.default_model, None
        served = self.plane.catalog.served_names()
        if len(served) == 1:
            return served[0], None
        raise BadRequest(
            f"say which model: X-Amzn-SageMaker-Target-Model, 'model=NAME' in X-Amzn-SageMaker-Custom-Attributes, "
            f"or FNSERVE_DEFAULT_MODEL; this endpoint serves {served}"
        )

    def arrays(
        self, name: str, version: str | None, media: str, body: bytes, attributes: Mapping[str, str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """The request's tensors from a .npy (the model's one input) or .npz (by input name) body."""
        try:
            if media == NPY:
                array = np.load(io.BytesIO(body), allow_pickle=False)
                names = [spec["name"] for spec in self.plane.catalog.metadata(name, version)["inputs"]]
                return {attributes.get("input") or _only(names, "input", name): array}
            with np.load(io.BytesIO(body), allow_pickle=False) as npz:
                return {key: npz[key] for key in npz.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise BadRequest(f"the body is not a valid {media} document: {exc}") from None


class NumpyRequest(V2Request):
    """An invocation whose body is a .npy document (the model's one input) or a .npz (by input name), answered as
    .npy (one output), .npz (every output) or V2 JSON, as its Accept says."""

    __slots__ = ("_routes", "_media", "_accept", "_attributes")

    def __init__(
        self,
        name: str,
        version: str | None,
        traceparent: str | None,
        receive: Receive,
        declared: str | None,
        limit: int,
        routes: SageMakerRoutes,
        media: str,
        accept: str,
        attributes: Mapping[str, str],
    ) -> None:
        super().__init__(name, version, traceparent, receive, declared, limit)
        self._routes = routes
        self._media = media
        self._accept = accept
        self._attributes = attributes

    def decode(self, raw: bytes) -> InferenceRequest:
        return InferenceRequest(self._routes.arrays(self.name, self.version, self._media, raw, self._attributes))

    def encode(self, answer: Answer) -> tuple[bytes, str, dict[str, str]]:
        assert self._v2 is not None, "encoded before it was decoded"
        return self._routes.encode(answer, self._v2, self._accept, self._attributes)


def custom_attributes(value: str) -> dict[str, str]:
    """``key=value`` pairs of X-Amzn-SageMaker-Custom-Attributes, separated by commas or semicolons."""
    pairs = (part.partition("=") for part in value.replace(";", ",").split(","))
    return {key.strip(): val.strip() for key, sep, val in pairs if sep and key.strip()}


def _only(names: list[str], kind: str, model: str) -> str:
    if len(names) != 1:
        raise BadRequest(
            f"model {model!r} has {kind}s {names}: name one with '{kind}=NAME' in X-Amzn-SageMaker-Custom-Attributes"
        )
    return names[0]
