"""The HTTP benchmark's load, which the others reuse: digits-accurate at batch 1, one held-out digit as V2 JSON."""

from __future__ import annotations

import json

import numpy as np

from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST

MODEL = "digits-accurate"
MODEL_PATH = DEMO_MANIFEST.parent / MODEL / "1" / "model.onnx"
x1 = np.load(DEMO_HOLDOUT)["input"][:1]
BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x1.ravel().tolist()}]})
