"""A bare ``fnserve serve`` (the images' command) reads its options from the environment as the command line does,
without typer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fnserve import cli
from fnserve.server import command
from fnserve.server.command import ServeOptions, options_from_environment

ENVIRONMENTS = [
    {},
    {"PORT": "8085"},
    {"FNSERVE_PORT": "9000", "PORT": "8085"},
    {"FNSERVE_PORT": "", "PORT": "8085"},
    {"FNSERVE_HOST": "0.0.0.0", "FNSERVE_MANIFEST": "/models/manifest.toml"},
    {"FNSERVE_MANIFEST": "", "FNSERVE_HOST": ""},
]


def parsed(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ServeOptions:
    """What the command line's ``fnserve serve`` gives the server, with ``environ`` its whole environment."""
    got: list[ServeOptions] = []
    monkeypatch.setattr(command, "serve", lambda options, echo=print: got.append(options))
    env = {name: None for name in (*command.MANIFEST_ENV, *command.HOST_ENV, *command.PORT_ENV)} | environ
    result = CliRunner().invoke(cli.app, ["serve"], env=env)
    assert result.exit_code == 0, result.output
    return got[0]


@pytest.mark.parametrize("environ", ENVIRONMENTS)
def test_a_bare_serve_reads_its_options_as_the_command_line_does(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert options_from_environment(environ) == parsed(environ, monkeypatch)


def test_a_port_the_command_line_would_refuse_is_left_to_it() -> None:
    assert options_from_environment({"PORT": "http"}) is None
    assert options_from_environment({"FNSERVE_PORT": "-1"}) is None


def test_the_script_starts_a_bare_serve_without_typer_or_pydantic(tmp_path: Path) -> None:
    """The images' command imports neither typer nor pydantic before the server starts; the script's other
    commands are the command line's."""
    program = (
        "import json, sys\n"
        "from fnserve.server import command\n"
        "command.serve = lambda options, echo=print: print(json.dumps([str(options.manifest), options.port, "
        "'typer' in sys.modules, 'pydantic' in sys.modules]))\n"
        "from fnserve.entry import main\n"
        "sys.argv = ['fnserve', *sys.argv[1:]]\n"
        "main()\n"
    )
    env = {"PATH": "/usr/bin:/bin", "FNSERVE_MANIFEST": "/m.toml", "PORT": "8123"}
    bare = subprocess.run([sys.executable, "-c", program, "serve"], capture_output=True, text=True, env=env)
    assert json.loads(bare.stdout) == ["/m.toml", 8123, False, False], bare.stderr
    other = subprocess.run([sys.executable, "-c", program, "serve", "--port", "8124"], text=True, env=env)
    assert other.returncode == 0  # through typer: the command line's parse
    refused = subprocess.run(
        [sys.executable, "-c", program, "serve"], capture_output=True, text=True, env={**env, "PORT": "http"}
    )
    assert refused.returncode == 2 and "PORT" in refused.stderr  # the command line's own words
