"""OpenAI's embeddings codec and the pieces of core it rests on: texts or token ids in, tokens counted, cut lengths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fnserve.adapters.http.openai import MAX_INPUTS, error_parts, texts_of
from fnserve.core.errors import ConfigError, InvalidInput, Overloaded
from fnserve.core.execution.cache import cache_key
from fnserve.core.execution.embeddings import MIN_FILL, TOKENS, TRUNCATED, TokenBudget, TokenIds, embedders, shorten
from fnserve.core.execution.steps import Tokenize
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.manifest.steps import TokenizeStep
from fnserve.core.models.registry import ModelRegistry
from tests.helpers import DEMO_MANIFEST

TOKENIZER = str(DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json")


@pytest.fixture(scope="module")
def minilm() -> object:
    return ModelRegistry(load_manifest(DEMO_MANIFEST)).get("minilm-l6")


def tokenize(minilm: object, **settings: object) -> Tokenize:
    step = TokenizeStep.validate({"step": "tokenize", "tokenizer": TOKENIZER, "max_length": 8, **settings})
    return Tokenize(step, minilm, DEMO_MANIFEST.parent)  # type: ignore[arg-type]


def rows(*values: object) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("one text", ["one text"]),
        (["a", "b"], ["a", "b"]),
        ([101, 2023, 102], [(101, 2023, 102)]),
        ([[101, 102], [101, 7592, 102]], [(101, 102), (101, 7592, 102)]),
    ],
)
def test_input_is_one_row_a_text_or_token_ids(value: object, expected: list[object]) -> None:
    got = texts_of(value)
    assert got.shape == (len(expected),) and list(got) == expected
    assert all(type(row) is (str if isinstance(row, str) else TokenIds) for row in got)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "input is an empty string"),
        ([], "must not be an empty array"),
        (["a", ""], r"input\[1\] is an empty string"),
        (["a", 1], "must be a string, an array of strings"),
        ([[101], []], r"input\[1\] must be a non-empty array of token ids"),
        ([[101], [1.5]], r"input\[1\] must be a non-empty array of token ids"),
        ([True, 1], "must be a string, an array of strings"),
        (5, "must be a string or an array, got int"),
        ({"text": "a"}, "got dict"),
        (["a"] * (MAX_INPUTS + 1), f"at most {MAX_INPUTS}"),
    ],
)
def test_bad_input_is_a_400_naming_it(value: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as caught:
        texts_of(value)
    status, body, _ = error_parts(caught.value)
    assert status == 400 and b'"param":"input"' in body and b'"type":"invalid_request_error"' in body


def test_errors_in_openai_shape() -> None:
    assert error_parts(InvalidInput("row 3 is wrong"))[:2] == (
        400,
        b'{"error":{"message":"row 3 is wrong","type":"invalid_request_error","param":"input","code":null}}',
    )
    status, body, headers = error_parts(Overloaded("busy"))
    assert (status, headers) == (503, {"retry-after": "1"})
    assert body == b'{"error":{"message":"busy","type":"server_error","param":null,"code":"overloaded"}}'


def test_token_ids_run_as_given_checked_against_the_vocabulary(minilm: object) -> None:
    step = tokenize(minilm)
    text = step(dict(text=rows("hello world")))
    ids = step(dict(text=rows(TokenIds(text["input_ids"][0].tolist()))))
    for name in ("input_ids", "attention_mask", "token_type_ids", TOKENS):
        np.testing.assert_array_equal(ids[name], text[name])
    mixed = step(dict(text=rows("hello", TokenIds((101, 7592, 2088, 2088, 102)))))
    assert mixed[TOKENS].tolist() == [3, 5] and mixed["attention_mask"].sum(axis=1).tolist() == [3, 5]
    with pytest.raises(InvalidInput, match=r"row 1: token id 30522 is outside the vocabulary \(0 to 30521\)"):
        step(dict(text=rows("fine", TokenIds((101, 30522)))))
    with pytest.raises(InvalidInput, match="token id -1"):
        step(dict(text=rows(TokenIds((-1,)))))


def test_long_texts_are_cut_and_say_so_or_refused(minilm: object) -> None:
    long = "one two three four five six seven eight nine ten"
    out = tokenize(minilm)(dict(text=rows("short", long, TokenIds((101, *range(1000, 1018), 102)))))
    assert out[TOKENS].tolist() == [3, 8, 8] and out[TRUNCATED].tolist() == [False, True, True]
    assert out["input_ids"][2].tolist() == [101, *range(1000, 1006), 102]  # cut as a text is: [SEP] kept
    with pytest.raises(InvalidInput, match="row 1: the text is longer than the model's 8 tokens"):
        tokenize(minilm, truncate=False)(dict(text=rows("short", long)))


def test_token_ids_of_another_tokenizer_are_refused_with_the_langchain_setting(minilm: object) -> None:
    step = tokenize(minilm)
    assert step(dict(text=rows(TokenIds((101, 7592, 2088, 102)))))[TOKENS].tolist() == [4]  # its own: "hello world"
    for ids in ((15339, 1917), (101, 15339, 1917), (15339, 1917, 102)):  # tiktoken's, with one end or none
        with pytest.raises(
            InvalidInput,
            match=r"start with \[CLS\] \(101\) and end with \[SEP\] \(102\).*"
            "check_embedding_ctx_length=False",
        ):
            step(dict(text=rows(TokenIds(ids))))


def test_token_ids_and_a_text_that_reads_like_them_have_other_cache_keys() -> None:
    as_ids = cache_key("m", "1", {"text": rows(TokenIds((101, 102)))}, None)
    as_text = cache_key("m", "1", {"text": rows("(101, 102)")}, None)
    assert as_ids != as_text
    assert as_ids == cache_key("m", "1", {"text": rows(TokenIds((101, 102)))}, None)


def test_which_pipelines_embed_text(tmp_path: Path) -> None:
    demo = embedders(load_manifest(DEMO_MANIFEST))
    assert list(demo) == ["minilm-embed"]
    assert (demo["minilm-embed"].text, demo["minilm-embed"].output) == ("text", "embedding")
    manifest = tmp_path / "manifest.toml"
    body = DEMO_MANIFEST.read_text().split("# A cross-encoder")[0]  # minilm-embed the last pipeline
    body = body.replace('path = "', f'path = "{DEMO_MANIFEST.parent}/')
    body = body.replace('tokenizer = "', f'tokenizer = "{DEMO_MANIFEST.parent}/')
    body = body.replace('labels = "', f'labels = "{DEMO_MANIFEST.parent}/')
    manifest.write_text(body + "\n[pipelines.embedding]\ndimensions = [256, 128, 128]\n")
    assert embedders(load_manifest(manifest))["minilm-embed"].dimensions == (128, 256)
    manifest.write_text(body.replace('[[pipelines.post]]\nstep = "mean_pool"', "") + "\n[pipelines.embedding]\n")
    with pytest.raises(ConfigError, match="name the embedding's output"):
        load_manifest(manifest)


def test_a_cut_embedding_is_unit_length_again() -> None:
    vectors = np.array([[3.0, 4.0, 12.0]], dtype=np.float32) / 13
    np.testing.assert_allclose(shorten(vectors, 2), [[0.6, 0.8]], rtol=1e-6)


def test_a_batch_of_texts_runs_sorted_by_tokens_in_chunks_within_the_budget() -> None:
    """A model with max_batch_tokens: a job batch's texts tokenized at once, run shortest first in chunks of at most
    the budget's padded tokens, each answer back in its row."""
    from fnserve.core.execution.service import InferenceService
    from tests.embeddings import SENTENCES, cosine, tokens

    texts = [SENTENCES[i] for i in range(0, 240, 8)]  # 30 texts of mixed lengths, one over 256 tokens
    texts += [" ".join(SENTENCES[i : i + 8]) for i in range(1, 65, 8)]  # and passages of like length
    service = InferenceService.from_manifest(DEMO_MANIFEST)
    budget = TokenBudget.of(service.registry.resolve("minilm-l6"))
    assert budget == TokenBudget(tokens=1024, attention=32768)  # the demo's
    array = rows(*texts)
    got = service.infer("minilm-embed", {"text": array}, outputs=["embedding", TOKENS])
    executions = service.registry.get("minilm-l6").executions
    counts = sorted(len(tokens(t)) for t in texts)
    assert got.outputs[TOKENS].tolist() == [len(tokens(t)) for t in texts]  # in the request's order
    assert executions.rows == len(texts) and executions.runs > 1

    def cut(budget: TokenBudget) -> list[int]:
        """Every chunk within the budget and MIN_FILL real tokens: the sorted counts cut greedily."""
        sizes, start = [], 0
        while start < len(counts):
            end, real = start + 1, counts[start]
            while end < len(counts) and budget.holds(end + 1 - start, counts[end]):
                if real + counts[end] < MIN_FILL * counts[end] * (end + 1 - start):
                    break
                real += counts[end]
                end += 1
            sizes.append(end - start)
            start = end
        return sizes

    assert sorted(executions.batches) == sorted(set(cut(budget))), executions.batches
    assert cut(budget) != cut(TokenBudget(tokens=budget.tokens))  # the attention bound cut some of these runs
    alone = np.concatenate([service.predict("minilm-embed", {"text": rows(t)})["embedding"] for t in texts])
    assert cosine(got.outputs["embedding"], alone).min() > 0.98  # each row its own text's embedding


def test_texts_that_arrive_together_without_a_budget_run_by_length_not_padded_to_the_longest(tmp_path: Path) -> None:
    """A text model without adaptive batching: the requests a server's turn stacks, or a job batch, are not padded
    to their longest text (a query would cost a passage's run) but cut where padding would pass MIN_FILL."""
    import re

    from fnserve.core.execution.service import InferenceService
    from tests.embeddings import SENTENCES, cosine, tokens

    text = DEMO_MANIFEST.read_text().replace('"minilm-l6/', f'"{DEMO_MANIFEST.parent}/minilm-l6/')
    text = re.sub(r"\n(max_batch_time_ms|length_buckets|max_batch_\w+|pad_inputs) = [^\n]*", "", text)
    (tmp_path / "manifest.toml").write_text(text)
    service = InferenceService.from_manifest(tmp_path / "manifest.toml")
    assert TokenBudget.of(service.registry.resolve("minilm-l6")) is None
    short = [t for t in SENTENCES if len(tokens(t)) == 12][:3]  # three of one length
    passage = " ".join(SENTENCES[:12])
    texts = [short[0], passage, short[1], short[2]]
    assert len(tokens(passage)) > 4 * max(len(tokens(t)) for t in short)
    got = service.infer_many("minilm-embed", [{"text": rows(t)} for t in texts])
    executions = service.registry.get("minilm-l6").executions
    assert executions.runs == 2 and sorted(executions.batches) == [1, 3], executions.batches
    alone = np.concatenate([service.predict("minilm-embed", {"text": rows(t)})["embedding"] for t in texts])
    stacked = np.concatenate([result.outputs["embedding"] for result in got])  # type: ignore[union-attr]
    assert cosine(stacked, alone).min() > 0.98  # int8 with dynamic quantization: a run's scale is its batch's


def test_texts_become_jobs_of_rows_per_job_texts(tmp_path: Path) -> None:
    from fnserve.core.jobs.messages import parse_job
    from fnserve.stores import job_client

    def jobs(name: str, content: str, rows_per_job: int = 2) -> list[dict[str, object]]:
        path = tmp_path / name
        path.write_text(content)
        found = job_client.jobs_from_file(
            path, "minilm-embed", input_name=None, rows_per_job=rows_per_job, version=None, prefix="t"
        )
        return list(found)

    def texts_of_jobs(found: list[dict[str, object]]) -> list[list[str]]:
        return [[t.decode() for t in parse_job(json.dumps(job)).inputs["text"]] for job in found]

    plain = jobs("corpus.txt", "first text\n\nsecond, longer text\nthird\n")
    assert [job["id"] for job in plain] == ["t-000000", "t-000001"]
    assert texts_of_jobs(plain) == [["first text", "second, longer text"], ["third"]]
    lines = jobs("corpus.jsonl", '"first text"\n{"text": "second"}\n\n"third"\n', rows_per_job=3)
    assert texts_of_jobs(lines) == [["first text", "second", "third"]]
    v2 = jobs("requests.jsonl", '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}\n')
    assert v2[0]["model"] == "minilm-embed" and "inputs" in v2[0]
    with pytest.raises(InvalidInput, match="a file holds V2 requests or texts, not both"):
        jobs("mixed.jsonl", '"a text"\n{"inputs": []}\n')
    with pytest.raises(InvalidInput, match="no rows"):
        jobs("empty.txt", "\n\n")
