"""The reference pages say what the code does: docs/settings.md's tables are the settings classes' fields and the
variables fnserve really reads, and every example in docs/cli.md is an invocation the command line accepts."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

from fnserve.cli import app
from fnserve.settings import Settings
from tests.helpers import REPO, load_module

PACKAGE = REPO / "layers" / "fnserve" / "fnserve"
TOOL = load_module(REPO / "infra" / "docs" / "settings_reference.py", "settings_reference")
CLI_PAGE = REPO / "docs" / "cli.md"


@cache
def package_trees() -> list[ast.Module]:
    return [ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))]


def package_strings() -> set[str]:
    """Every string literal in fnserve's code (docstrings and comments say nothing of what it reads)."""
    return {
        node.value
        for tree in package_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def package_imports() -> set[str]:
    found: set[str] = set()
    for tree in package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
    return found


def test_the_settings_page_is_what_the_settings_say() -> None:
    page = (REPO / "docs" / "settings.md").read_text()
    stale = "docs/settings.md is stale: run python infra/docs/settings_reference.py"
    assert TOOL.generated(page) == TOOL.reference(), stale
    assert "| `FNSERVE_PARALLEL_WORKERS` | int ≥ 0 | `1` |" in page


def test_every_setting_is_in_a_table_once() -> None:
    tabled = [name for cls in TOOL.setting_classes() for name in TOOL.own_fields(cls)]
    assert sorted(tabled) == sorted(Settings.field_names()), "settings the tables leave out, or show twice"
    assert all(TOOL.fields()[name].description for name in tabled), "a setting without a description"


def test_every_other_variable_listed_is_read() -> None:
    """Read by fnserve: its name is a string in fnserve's code. Left to a library: the library's code names it, and
    fnserve imports that library."""
    strings, imports = package_strings(), package_imports()
    for group in TOOL.OTHERS.values():
        for variable in group:
            if variable.reader == "fnserve":
                named = variable.name in strings
                assert named, f"{variable.name}: fnserve's code never names it"
                continue
            assert any(i == variable.reader or i.startswith(variable.reader + ".") for i in imports), variable
            spec = importlib.util.find_spec(variable.reader)
            assert spec is not None and spec.submodule_search_locations, variable.reader
            source = "".join(p.read_text() for d in spec.submodule_search_locations for p in Path(d).rglob("*.py"))
            named = variable.name in source
            assert named, f"{variable.name}: {variable.reader} never names it"


def test_every_fnserve_variable_the_code_names_is_in_a_table() -> None:
    named = {s for s in package_strings() if re.fullmatch(r"FNSERVE_[A-Z0-9_]+", s)}
    tabled = {f"FNSERVE_{name.upper()}" for name in Settings.field_names()}
    tabled |= {v.name for group in TOOL.OTHERS.values() for v in group}
    assert named, "no FNSERVE_ variable found in fnserve's code"
    assert named - tabled == set(), "FNSERVE_ variables fnserve reads that docs/settings.md does not show"


# --- docs/cli.md's examples ------------------------------------------------------------------------------------------


def examples() -> dict[str, list[str]]:
    """Each heading's command (the page's top: ``fnserve``) -> the invocations in its ```text blocks."""
    found: dict[str, list[str]] = {}
    for section in re.split(r"^(?=## `)", CLI_PAGE.read_text(), flags=re.MULTILINE):
        heading = re.match(r"## `([^`]+)`", section)
        blocks = re.findall(r"```text\n(fnserve .*?)\n```", section, re.DOTALL)
        found[heading[1] if heading else "fnserve"] = blocks
    return found


def commands() -> dict[str, Any]:
    """Every command of the CLI by its path, groups too."""
    found: dict[str, Any] = {}

    def visit(command: Any, path: str) -> None:
        found[path] = command
        for name in command.list_commands(None) if hasattr(command, "list_commands") else []:
            visit(command.get_command(None, name), f"{path} {name}")

    visit(typer.main.get_command(app), "fnserve")
    return found


def runs_something(command: Any) -> bool:
    """A command, or a group that runs without a subcommand or has options of its own (not one that only groups)."""
    return not hasattr(command, "list_commands") or command.invoke_without_command or bool(command.params)


def parse(argv: list[str]) -> str:
    """The command ``fnserve argv`` runs, parsed as the command line parses it (options, their values' types, required
    ones, extra arguments), without running it: anything wrong raises click's UsageError."""
    command = typer.main.get_command(app)
    ctx = command.make_context("fnserve", list(argv))
    path = ["fnserve"]
    while hasattr(command, "resolve_command") and (rest := [*ctx._protected_args, *ctx.args]):
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
        path.append(name)
    assert runs_something(command), f"fnserve {shlex.join(argv)} names a group alone: it only prints its help"
    return " ".join(path)


def test_every_command_that_runs_something_has_one_example() -> None:
    found, cli = examples(), commands()
    assert set(found) == set(cli), "docs/cli.md's headings are not the commands: run python infra/docs/cli_reference.py"
    wanted = {path for path, command in cli.items() if runs_something(command)}
    one = {path for path, blocks in found.items() if len(blocks) == 1}
    assert wanted - one == set(), "commands without one example (infra/docs/cli_reference.py's EXAMPLES)"
    assert {path for path, blocks in found.items() if blocks} - wanted == set(), "examples of groups that only group"


@pytest.mark.parametrize(
    "heading,invocation", [pytest.param(h, i, id=h) for h, blocks in examples().items() for i in blocks]
)
def test_each_example_is_an_invocation_the_cli_accepts(
    heading: str, invocation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from the repository's root, as the examples are written: the repository's files must exist, and the files
    a reader brings (``my-model.onnx``) are made, empty, for the parse's existence checks."""
    argv = shlex.split(invocation)
    assert argv[0] == "fnserve" and "--help" not in argv and len(invocation.splitlines()) == 1, invocation
    for entry in REPO.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    for arg in argv[1:]:
        path = tmp_path / arg
        if not arg.startswith("-") and "://" not in arg and "." in arg and not (tmp_path / Path(arg).parts[0]).exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    monkeypatch.chdir(tmp_path)
    for variable in [v for v in os.environ if v.startswith("FNSERVE_")]:  # -m's default, --queue's...
        monkeypatch.delenv(variable)
    command = parse(argv[1:])
    assert command == heading or (heading == "fnserve" and command.startswith("fnserve ")), (
        f"an example of `{command}` under `{heading}`"
    )
