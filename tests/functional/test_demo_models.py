"""The committed demo models, served by the real InferenceService on held-out digits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fnserve.core.codec.datafiles import read_data
from fnserve.core.execution.service import InferenceService
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST

MODELS = ["digits-fast", "digits-accurate", "digits-accurate-int8"]


@pytest.fixture(scope="module")
def service() -> InferenceService:
    return InferenceService.from_manifest(DEMO_MANIFEST, eager=True)


@pytest.mark.parametrize("model", MODELS)
def test_accuracy_on_held_out_digits_matches_what_the_build_recorded(service: InferenceService, model: str) -> None:
    data = read_data(DEMO_HOLDOUT, ["input"])
    out = service.predict(model, data.inputs)
    recorded = json.loads((DEMO_MANIFEST.parent / model / "1" / "accuracy.json").read_text())
    accuracy = float(np.mean(out["label"] == data.labels))
    assert accuracy >= recorded["holdout_accuracy"] - 1e-4
    assert accuracy > 0.9
    assert out["probabilities"].shape == (data.rows, 10)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(out["probabilities"].argmax(axis=1), out["label"])


def test_batch_one_predictions_match_the_batched_ones(service: InferenceService) -> None:
    data = read_data(DEMO_HOLDOUT, ["input"]).head(20)
    batched = service.predict("digits-accurate", data.inputs)["label"]
    single = [service.predict("digits-accurate", {"input": row[None]})["label"][0] for row in data.inputs["input"]]
    np.testing.assert_array_equal(single, batched)


def test_int8_model_agrees_with_the_float_model(service: InferenceService) -> None:
    data = read_data(DEMO_HOLDOUT, ["input"])
    fp32 = service.predict("digits-accurate", data.inputs)["label"]
    int8 = service.predict("digits-accurate-int8", data.inputs)["label"]
    assert np.mean(fp32 == int8) > 0.98


def test_raw_pixel_lists_work_as_a_caller_would_send_them(service: InferenceService) -> None:
    data = read_data(DEMO_HOLDOUT, ["input"]).head(3)
    out = service.predict("digits-fast", {"input": data.inputs["input"].tolist()}, outputs=["label"])
    np.testing.assert_array_equal(out["label"], data.labels)
