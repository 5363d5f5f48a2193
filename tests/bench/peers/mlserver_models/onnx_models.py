"""The demo's models as MLServer custom runtimes, written the way MLServer's custom runtime guide shows: an
``MLModel`` subclass whose ``load`` opens the model and whose ``predict`` answers an Open Inference Protocol
request, one folder per model with its ``model-settings.json``, served by ``mlserver start``.

    PYTHONPATH=. MLSERVER_PARALLEL_WORKERS=2 mlserver start tests/bench/peers/mlserver_models    (repository root)

The same ONNX files as fnserve's demo manifest (each settings file's ``uri``), one single-threaded onnxruntime
session each in every inference worker (bench_peers starts one per CPU). ``OnnxModel`` runs the tensors it is sent
and answers every output; ``EmbedModel`` tokenizes the texts it is sent, runs MiniLM, mean-pools and normalises, as
the naive text server does. The MiniLM models batch adaptively (``max_batch_size`` and ``max_batch_time`` in their
settings).
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri, to_absolute_path

from tests.bench._embed import embed, tokenizer_from


async def session(model: MLModel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # an inference worker per CPU: one thread each, as the naive servers run
    path = await get_model_uri(model.settings)
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


class OnnxModel(MLModel):
    """An ONNX model: the request's tensors in, every output out."""

    async def load(self) -> bool:
        self.session = await session(self)
        self.output_names = [output.name for output in self.session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        outputs = self.session.run(None, feed)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(n, a) for n, a in zip(self.output_names, outputs, strict=True)],
        )


class EmbedModel(MLModel):
    """Texts in, their sentence embeddings out (the settings' ``extra.tokenizer`` beside the model's file)."""

    async def load(self) -> bool:
        self.session = await session(self)
        extra = self.settings.parameters.extra if self.settings.parameters else None
        self.tokenizer = tokenizer_from(to_absolute_path(self.settings, (extra or {})["tokenizer"]))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        texts = StringCodec.decode_input(payload.inputs[0])
        pooled = embed(self.tokenizer, self.session, texts)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("embedding", pooled)])
