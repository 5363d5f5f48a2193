"""The steps Hugging Face models need beside tokenize and mean_pool: prompts, text pairs, pooling by mode, sigmoid."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from fnserve.core.errors import InvalidInput
from fnserve.core.execution.cache import cache_key
from fnserve.core.execution.embeddings import Prompted, TokenIds, prompted
from fnserve.core.execution.steps import Pool, Sigmoid, Tokenize
from fnserve.core.models.manifest.steps import PoolStep, SigmoidStep, TokenizeStep
from fnserve.core.models.registry import ModelRegistry
from tests.helpers import DEMO_MANIFEST

PROMPTS = {"query": "query: ", "passage": "passage: "}
TOKENIZER = str(DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json")


def rows(*values: object) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # one by one: a tuple of token ids is one element
        array[i] = value
    return array


@pytest.fixture(scope="module")
def minilm() -> object:
    from fnserve.core.models.manifest.loading import load_manifest

    return ModelRegistry(load_manifest(DEMO_MANIFEST)).get("minilm-l6")


@pytest.fixture(scope="module")
def reference() -> Tokenizer:
    tokenizer = Tokenizer.from_file(TOKENIZER)
    tokenizer.no_padding()  # the file pads to 128, as the model was exported
    tokenizer.no_truncation()
    return tokenizer


def tokenize(minilm: object, **settings: object) -> Tokenize:
    step = TokenizeStep.validate({"step": "tokenize", "tokenizer": TOKENIZER, **settings})
    return Tokenize(step, minilm, DEMO_MANIFEST.parent)  # type: ignore[arg-type]


def ids_of(out: dict[str, np.ndarray], row: int) -> list[int]:
    return out["input_ids"][row][out["attention_mask"][row] == 1].tolist()


def test_the_default_prompt_goes_before_every_text_a_request_named_none_for(
    minilm: object, reference: Tokenizer
) -> None:
    step = tokenize(minilm, prompts=PROMPTS, default_prompt="passage")
    texts = prompted(rows("how tall is it", "it is tall"), PROMPTS, "query", "e5")
    out = step({"text": np.concatenate([texts, rows("how tall is it")])})
    assert ids_of(out, 0) == reference.encode("query: how tall is it").ids  # named: its own prompt alone
    assert ids_of(out, 2) == reference.encode("passage: how tall is it").ids  # none named: the default
    # The same words asked with another prompt are another answer, never one from the cache of the other.
    named = cache_key("e5", "1", {"text": rows(Prompted("passage: x"))}, None)
    plain = cache_key("e5", "1", {"text": rows("passage: x")}, None)
    assert named != plain
    # Token ids run as they are: a prompt is text.
    ids = TokenIds((101, 2023, 102))
    assert prompted(rows(ids), PROMPTS, "query", "e5")[0] is ids


def test_an_unknown_prompt_is_refused_naming_those_there_are() -> None:
    with pytest.raises(InvalidInput, match=r"'doc' is not one of e5's prompts \('passage', 'query'\)"):
        prompted(rows("a"), PROMPTS, "doc", "e5")
    with pytest.raises(InvalidInput, match="none"):
        prompted(rows("a"), {}, "query", "minilm")
    with pytest.raises(ValueError, match="default_prompt 'doc' is not one of the prompts"):
        TokenizeStep.validate({"step": "tokenize", "tokenizer": "t.json", "prompts": PROMPTS, "default_prompt": "doc"})


def test_a_pair_is_one_sequence_as_the_tokenizer_makes_it(minilm: object, reference: Tokenizer) -> None:
    step = tokenize(minilm, pair="document", max_length=64)
    assert [s.name for s in step.reads] == ["text", "document"]
    queries, documents = rows("what is a cat", "who won"), rows("a cat is a small animal", "the home team won")
    out = step({"text": queries, "document": documents})
    for row in range(2):
        expected = reference.encode(queries[row], documents[row])
        assert ids_of(out, row) == expected.ids
        assert out["token_type_ids"][row][out["attention_mask"][row] == 1].tolist() == expected.type_ids
    assert not out["truncated"].any()
    assert out["token_count"].tolist() == [
        len(reference.encode(q, d).ids) for q, d in zip(queries, documents, strict=True)
    ]


def test_past_max_length_the_document_is_cut_first_then_the_query_past_half(
    minilm: object, reference: Tokenizer
) -> None:
    step = tokenize(minilm, pair="document", max_length=16)
    room = 16 - 3  # [CLS] query [SEP] document [SEP]
    query, document = "what is a cat", " ".join(["word"] * 40)
    long_query = " ".join(["question"] * 40)
    out = step({"text": rows(query, long_query), "document": rows(document, document)})
    plain = len(reference.encode(query, add_special_tokens=False).ids)
    assert out["truncated"].tolist() == [True, True]
    assert out["token_count"].tolist() == [16, 16]
    types = out["token_type_ids"]
    assert int(types[0].sum()) == room - plain + 1  # the whole query kept, the document cut to fit (and its [SEP])
    assert int(types[1].sum()) == room - room // 2 + 1  # a query over half the room keeps half of it
    with pytest.raises(InvalidInput, match="longer than the model's 16 tokens"):
        tokenize(minilm, pair="document", max_length=16, truncate=False)(
            {"text": rows(query), "document": rows(document)}
        )


def test_a_pair_is_text_on_both_sides(minilm: object) -> None:
    step = tokenize(minilm, pair="document")
    with pytest.raises(InvalidInput, match="input 'document' row 0: a text pair is tokenized from text"):
        step({"text": rows("q"), "document": rows(TokenIds((101, 102)))})
    with pytest.raises(InvalidInput, match="input 'document' row 0: text is empty"):
        step({"text": rows("q"), "document": rows(" ")})
    with pytest.raises(ValueError, match="prompts are for embedders"):
        TokenizeStep.validate({"step": "tokenize", "tokenizer": "t.json", "pair": "document", "prompts": PROMPTS})


def st_pool(tokens: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """sentence-transformers' Pooling module, its formulas as written there."""
    m = mask[:, :, None].astype(np.float32)
    if mode == "mean":
        return (tokens * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
    if mode == "cls":
        return tokens[:, 0]
    if mode == "max":
        return np.where(m > 0, tokens, -1e9).max(1)
    return tokens[np.arange(len(tokens)), mask.sum(1) - 1]


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "last_token"])
@pytest.mark.parametrize("normalize", [True, False])
def test_pooling_by_mode_is_sentence_transformers_own(minilm: object, mode: str, normalize: bool) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.standard_normal((3, 7, 5)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 3 + [0] * 4, [1] * 5 + [0] * 2])
    settings = PoolStep.validate({"step": "pool", "mode": mode, "input": "hidden", "normalize": normalize})
    pooled = Pool(settings, minilm)({"hidden": tokens, "attention_mask": mask})["embedding"]  # type: ignore[arg-type]
    expected = st_pool(tokens, mask, mode)
    if normalize:
        expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(pooled, expected, rtol=1e-5, atol=1e-6)
    # A batcher's padding past the request's mask changes nothing.
    padded = np.pad(tokens, [(0, 0), (0, 3), (0, 0)], constant_values=100.0)
    again = Pool(settings, minilm)({"hidden": padded, "attention_mask": mask})["embedding"]  # type: ignore[arg-type]
    np.testing.assert_array_equal(again, pooled)


def test_sigmoid_of_any_logit_is_a_probability() -> None:
    step = Sigmoid(SigmoidStep.validate({"step": "sigmoid", "input": "logits", "output": "score"}))
    logits = np.array([[-1000.0], [0.0], [2.0], [1000.0]], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        score = step({"logits": logits})["score"]
    np.testing.assert_allclose(score[:, 0], [0.0, 0.5, 1 / (1 + np.exp(-2.0)), 1.0], rtol=1e-6)
    assert score.dtype == np.float32


def test_a_pipeline_ending_in_pool_embeds() -> None:
    from fnserve.core.models.manifest.pipelines import PipelineSettings

    with pytest.raises(ValueError, match="first step must be tokenize"):
        PipelineSettings.validate({"name": "p", "model": "m", "post": [{"step": "pool"}], "embedding": {}})
    settings = PipelineSettings.validate(
        {"name": "p", "model": "m", "pre": [{"step": "tokenize", "tokenizer": "t"}], "post": [{"step": "pool"}]}
    )
    from fnserve.core.execution.embeddings import embedding_output

    assert embedding_output(settings) == "embedding"
