"""Write docs/cli.md, the command line's reference, from the commands' own help (what ``--help`` prints).

python infra/docs/cli_reference.py            (make docs runs it; a test fails when the page is stale)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from fnserve.cli import app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
WIDTH = 100


def reference() -> str:
    """The page: every command and subcommand, in the order ``fnserve --help`` lists them, with its help."""
    root = typer.main.get_command(app)
    parts = [
        "# The command line: `fnserve`\n",
        "Every command's `--help`, as it prints it (written by `infra/docs/cli_reference.py`; a test keeps this "
        "page and the commands in step).\n",
    ]

    def visit(command: Any, path: list[str], parent: Any) -> None:
        # typer's commands and contexts (its own click), built as typer builds them
        ctx = command.context_class(command, info_name=path[-1], parent=parent, max_content_width=WIDTH)
        ctx.terminal_width = WIDTH
        if len(path) > 1:
            parts.append(f"## `{' '.join(path)}`\n")
        parts.append(f"```text\n{command.get_help(ctx).rstrip()}\n```\n")
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    visit(sub, [*path, name], ctx)

    visit(root, ["fnserve"], None)
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(reference())
    sys.stdout.write(f"wrote {PAGE}\n")
