"""A corpus of texts embedded through `fnserve local`'s jobs queue, as a user runs it: `fnserve submit corpus.txt`
to `fnserve results -o embeddings.npy`, on the template's own function settings."""

from __future__ import annotations

import os
import random
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

# Lines of 3 to 220 words of the demo's prose, PER_JOB a job, each text's embedding checked in the file's order; the
# embeddings page's corpus at 10,000 with FNSERVE_CORPUS_TEXTS=10000 (some five minutes on two cores).
TEXTS = int(os.environ.get("FNSERVE_CORPUS_TEXTS", "300"))
PER_JOB = 10
WORDS = " ".join(SENTENCES).split()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`fnserve local` on its embedded moto, the template's batch size and timeouts, no batching window."""
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
    """Texts of 3 to 220 words, 10 a job: every text's embedding stored, in the corpus's order, every job done once,
    nothing pending, failed or dead-lettered, no batch out of time."""
    rng = random.Random(7)
    corpus = []
    for i in range(TEXTS):  # each text its own
        size = rng.randint(3, 220)
        start = rng.randrange(len(WORDS) - size)
        corpus.append(f"{' '.join(WORDS[start : start + size])} ({i})")
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

    wait_for(drained, 60 + TEXTS * 0.1, "every job taken off the queue")
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
    # Each row the embedding of its own text, as it is alone (per-token int8: a text's vector is its own).
    service = InferenceService.from_manifest(DEMO_MANIFEST)
    for i in (0, 1, TEXTS // 2, TEXTS - 1):
        alone = service.predict("minilm-embed", {"text": np.array([corpus[i].encode()], dtype=object)})["embedding"]
        np.testing.assert_allclose(embeddings[i], alone[0], atol=1e-5, err_msg=str(i))
    waiting = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
    assert waiting["Attributes"]["ApproximateNumberOfMessages"] == "0"
    # Once each: every batch the function ran reported its jobs done, none failed or retried.
    reports = [line for line in Path(local["log"]).read_text().splitlines() if "BatchFunction" in line]
    done = sum(int(line.split("done=")[1].split()[0]) for line in reports if "INFO    batch" in line)
    assert done == TEXTS // PER_JOB and not any("failed its batch" in line for line in reports)
    assert not any("timed out" in line or "out of time" in line for line in reports)
