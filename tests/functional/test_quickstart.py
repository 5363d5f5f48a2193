"""docs/quickstart.md runs as written, block after block, in a fresh directory: its servers started as a reader
starts them, its curls answering what the page shows, its own model quantized, added and served. The blocks that
need an AWS account do not run here, nor the install: tests/install/test_installs.py installs exactly the
page's extras in a fresh virtualenv and runs the page (and the README) from it; here the project's virtualenv stands
in for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.helpers import REPO, documented
from tests.helpers.docs import INSTALL, QUICKSTART, install_extras, reader_dir, run_quickstart, sh_blocks, starts

# Pushing to a bucket and deploying need an account: tests/functional/test_publish.py pushes to moto, and make test's
# sam-check builds what make deploy deploys.
NEEDS_AN_ACCOUNT = ".venv/bin/fnserve models push"


def needs_an_account(block: str) -> bool:
    return NEEDS_AN_ACCOUNT in block


def test_the_quickstart_has_its_steps() -> None:
    blocks = sh_blocks(QUICKSTART)
    steps = [INSTALL, ".venv/bin/fnserve serve", "curl", ".venv/bin/fnserve quantize"]
    assert [starts(block, command) for block, command in zip(blocks, steps, strict=False)] == [True] * len(steps)
    assert install_extras() == {"server", "quantize", "bench"}
    assert install_extras() in documented(), "tests/install must install the page's extras"


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    reader = reader_dir(tmp_path, Path(sys.prefix), REPO)
    skipped = run_quickstart(reader, dict(os.environ), needs_an_account)
    assert (reader / "my-models" / "my-model" / "1" / "model.onnx").is_file()
    assert skipped == [len(sh_blocks(QUICKSTART))], f"only the last block, the deploy, may need an account: {skipped}"
