"""A corpus of texts embedded through `fnserve local`'s jobs queue, as a user runs it: `fnserve submit corpus.txt`
to `fnserve results -o embeddings.npy`, on the template's own function settings."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fnserve.aws import clients
from fnserve.core.execution.service import InferenceService
from tests.e2e.emulator import running_local
from tests.embeddings import SENTENCES
from tests.helpers import DEMO_MANIFEST
from tests.servers import wait_for

TEXTS = 4_000  # 400 jobs of PER_JOB texts, each text's embedding checked in the file's order
PER_JOB = 10


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`fnserve local` on its embedded moto, the template's function timeouts, no batching window."""
    log = tmp_path_factory.mktemp("corpus") / "local.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL") and k != "LOCALSTACK_HOST"}
    options = ["--workers", "2", "--parameter", "MaximumBatchingWindowInSeconds=0"]
    with running_local(options, log, env) as info, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", info["endpoint"])
        mp.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(key, "local")
        mp.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        clients.reset()
        yield info
    clients.reset()


def test_a_corpus_of_texts_is_embedded_once_each_through_the_jobs_queue(local: dict[str, Any], tmp_path: Path) -> None:
    """10,000 texts of mixed lengths, 10 a job: every text's embedding stored, in the corpus's order, every job
    done once, nothing pending, failed or dead-lettered."""
    corpus = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(TEXTS)]  # each text its own
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
    queue, dlq = local["queues"]["JobsQueue"], local["queues"]["JobsDeadLetterQueue"]
    table = local["tables"]["ResultsTable"]
    fnserve = [sys.executable, "-m", "fnserve"]
    submit = ["submit", "corpus.txt", "--model", "minilm-embed", "--queue", queue, "--rows-per-job", str(PER_JOB)]
    submitted = subprocess.run(
        [*fnserve, *submit, "--ids", "ids.txt"], cwd=tmp_path, capture_output=True, text=True, timeout=100
    )
    assert submitted.returncode == 0, submitted.stderr
    assert len((tmp_path / "ids.txt").read_text().split()) == TEXTS // PER_JOB
    sqs = clients.client("sqs")
    counts = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]

    def drained() -> bool:  # a message leaves the queue once its result is stored; cheap to ask, unlike the table
        attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=counts)["Attributes"]
        return all(attributes[name] == "0" for name in counts)

    wait_for(drained, 100, "every job taken off the queue")
    fetched = subprocess.run(
        [*fnserve, "results", "ids.txt", "--table", table, "-o", "embeddings.npy"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert fetched.returncode == 0, fetched.stderr
    assert f"done {TEXTS // PER_JOB}, failed 0, pending 0" in fetched.stdout
    embeddings = np.load(tmp_path / "embeddings.npy")
    assert embeddings.shape == (TEXTS, 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-4)
    # Each row the embedding of its own text (int8 scales by the batch: close, not equal).
    service = InferenceService.from_manifest(DEMO_MANIFEST)
    for i in (0, 1, 2_345, TEXTS - 1):
        alone = service.predict("minilm-embed", {"text": np.array([corpus[i].encode()], dtype=object)})["embedding"]
        assert float(alone[0] @ embeddings[i]) > 0.98, i
    waiting = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
    assert waiting["Attributes"]["ApproximateNumberOfMessages"] == "0"
    # Once each: every batch the function ran reported its jobs done, none failed or retried.
    reports = [line for line in Path(local["log"]).read_text().splitlines() if "BatchFunction" in line]
    done = sum(int(line.split("done=")[1].split()[0]) for line in reports if "INFO    batch" in line)
    assert done == TEXTS // PER_JOB and not any("failed its batch" in line for line in reports)
