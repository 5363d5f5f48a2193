"""The README's Python examples run as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)


def test_readme_has_python_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("code", BLOCKS)
def test_readme_python_example_runs(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    cwd = Path.cwd()
    os.chdir(REPO)
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out
