"""An error for a module that is not installed names the extra that brings it, from fnserve's own metadata."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fnserve.cli.root import explain
from fnserve.core.extras import extras_of, missing
from tests.helpers import PROJECT, REPO


def test_each_extras_requirements_are_found_under_their_import_names() -> None:
    assert extras_of("matplotlib")[:2] == ["tune", "bench"]  # bench brings it through tune
    assert extras_of("cfnlint")[0] == "local" and extras_of("grpc")[0] == "grpc"
    assert extras_of("onnx")[0] == "quantize" and extras_of("boto3")[0] == "aws"
    assert extras_of("no_such_module") == [] and extras_of("numpy") == []  # no extra: a base requirement
    assert extras_of("httpx")[0] == "bench" and "httpx>=0.27" in PROJECT["optional-dependencies"]["bench"]


def test_the_command_line_says_what_to_install_not_a_traceback() -> None:
    said = explain(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    assert said == missing("matplotlib")
    assert said.startswith("matplotlib is not installed: the tune extra brings it (bench includes it too);")
    assert '.venv/bin/pip install ".[tune]" in the checkout' in said and "docs/install.md" in said
    assert explain(ModuleNotFoundError("No module named 'zzz'", name="zzz")) == "zzz is not installed"


def test_a_command_whose_extra_is_missing_fails_with_that_sentence(tmp_path: Path) -> None:
    """fnserve quantize where onnx is not installed (its import blocked, as a venv without the extra has it)."""
    blocked = "import sys; sys.modules['onnx'] = None; sys.argv[0] = 'fnserve'; from fnserve.entry import main; main()"
    command = [sys.executable, "-c", blocked, "quantize", "examples/digits-mlp.onnx", "-o", str(tmp_path / "q.onnx")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: onnx is not installed: the quantize extra brings it" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
