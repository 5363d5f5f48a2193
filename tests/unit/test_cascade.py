from __future__ import annotations

import msgspec
import numpy as np
import pytest
from msgspec import ValidationError

from fnserve.core.errors import InvalidInput
from fnserve.core.jobs.cascade import confidence, confident
from fnserve.core.jobs.followups import FollowupIds
from fnserve.core.models.manifest.cascades import CascadeSettings
from fnserve.core.models.manifest.loading import Manifest


def cascade(**fields: object) -> CascadeSettings:
    return CascadeSettings.validate({"name": "c", "fast": "f", "slow": "s", "output": "p", "threshold": 0.8, **fields})


P = np.array([[0.9, 0.05, 0.05], [0.5, 0.4, 0.1], [0.34, 0.33, 0.33]])


def test_top1_rule_reads_the_top_class_probability() -> None:
    np.testing.assert_allclose(confidence(P, cascade()), [0.9, 0.5, 0.34])
    assert confident(P[:1], cascade()) and not confident(P, cascade())


def test_margin_rule_reads_the_gap_to_the_second_class() -> None:
    np.testing.assert_allclose(confidence(P, cascade(rule="margin")), [0.85, 0.1, 0.01])


def test_logits_go_through_a_softmax_first() -> None:
    logits = np.log(P)
    np.testing.assert_allclose(confidence(logits, cascade(scores="logits")), [0.9, 0.5, 0.34])


def test_the_scores_must_be_rows_of_classes() -> None:
    with pytest.raises(InvalidInput, match=r"must be \[rows, classes\]"):
        confidence(np.ones(3), cascade())


def test_ids_say_what_they_are_and_cannot_be_forged() -> None:
    ids = FollowupIds(b"key")
    value = ids.mint("pending", "digits-v2", now=1_800_000_000)
    claim = ids.parse(value)
    assert claim is not None and (claim.status, claim.created, claim.cascade) == ("pending", 1_800_000_000, "digits-v2")
    assert ids.parse(ids.mint("skipped", "c")).status == "skipped"  # type: ignore[union-attr]
    assert ids.parse(value.replace("p-", "s-", 1)) is None
    assert FollowupIds(b"other").parse(value) is None
    assert ids.parse("job-42") is None and ids.parse("") is None
    assert ids.mint("pending", "c") != ids.mint("pending", "c")


def test_manifest_cascades_must_name_real_models_and_not_clash() -> None:
    models = [{"name": n, "path": "x.onnx", "sha256": "a" * 64} for n in ("f", "s")]
    ok = Manifest.validate({"models": models, "cascades": [msgspec.to_builtins(cascade())]})
    assert ok.cascades[0].name == "c"
    for bad, message in (
        (cascade(name="f"), "already a model's, a pipeline's or a cascade's"),
        (cascade(slow="nope"), "its slow model 'nope' is not in the manifest"),
    ):
        with pytest.raises(ValidationError, match=message):
            Manifest.validate({"models": models, "cascades": [msgspec.to_builtins(bad)]})
    with pytest.raises(ValidationError, match="fast and slow are the same model"):
        cascade(slow="f")
    with pytest.raises(ValidationError, match="threshold"):
        cascade(threshold=1.5)
