"""The start floor in the server image: a bare process that loads the same model (and tokenizer) as fnserve and
answers a V2 inference request with it, on the standard library's HTTP server. Nothing is imported or built but
what the answer needs, so its start is what any server of this model in this image pays at least.

Run by the image's Python: ``python floor_server.py PORT MODEL [TOKENIZER]``; mounted into the container by
``test_start_budget``, never installed in the image.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import onnxruntime as ort

port, model = int(sys.argv[1]), sys.argv[2]
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
tokenizer = None
if len(sys.argv) > 3:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(sys.argv[3])
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()


def answer(request: dict) -> dict:  # type: ignore[type-arg]
    tensor = request["inputs"][0]
    if tokenizer is None:
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        return {"outputs": [{"name": "label", "data": session.run(["label"], {"input": x})[0].tolist()}]}
    encodings = tokenizer.encode_batch(tensor["data"])
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    tokens = session.run(None, feed)[0]
    weights = mask[..., None].astype(np.float32)
    pooled = (tokens * weights).sum(axis=1) / weights.sum(axis=1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    return {"outputs": [{"name": "embedding", "data": pooled.ravel().tolist()}]}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.dumps(answer(json.loads(self.rfile.read(int(self.headers["content-length"]))))).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
