"""Write docs/cli.md, the command line's reference, from the commands' own help (what ``--help`` prints), each
command with an example of its use.

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

# An invocation of each command that runs something, and what it is for (tests/functional/test_settings_reference.py
# parses each as the command line does, so an option that goes fails it).
EXAMPLES = {
    "fnserve": (
        "`--debug` goes before the command: an error then shows its traceback instead of one line.",
        "fnserve --debug serve -m my-models/manifest.toml",
    ),
    "fnserve predict": (
        "Check that a model loads and answers: the first five held-out digits, predicted beside their labels.",
        "fnserve predict digits-accurate layers/models/models/digits-holdout.npz "
        "-m layers/models/models/manifest.toml -n 5",
    ),
    "fnserve import": (
        "A Hugging Face embedder, cross-encoder reranker or text classifier made servable: what its folder declares "
        "read, its ONNX graph used or exported by optimum, int8 kept where it holds the printed bound, and its model "
        "and pipeline added to the manifest ([Your own model from Hugging Face](huggingface.md)).",
        "fnserve import ./bge-small-en-v1.5 --name bge-small -m manifest.toml --export-python .venv-export/bin/python",
    ),
    "fnserve quantize": (
        "An int8 copy of a model, with size, latency and accuracy on labelled data before and after; a copy that "
        "came out slower is written only with `--force`.",
        "fnserve quantize my-model.onnx -o my-model.int8.onnx --validation val.npz",
    ),
    "fnserve optimize": (
        "A copy of a model whose graph ONNX Runtime has optimised once, so that each start creates its session "
        "sooner; written only when it answers as the original on the validation inputs and runs no slower.",
        "fnserve optimize my-model.int8.onnx -o my-model.opt.onnx --validation val.npz",
    ),
    "fnserve serve": (
        "The demo's models on port 8080 with two inference worker processes (without `--workers` and "
        "`--processes` the layout is chosen from the models at start).",
        "fnserve serve -m layers/models/models/manifest.toml --port 8080 --workers 2",
    ),
    "fnserve submit": (
        "Each row of the demo's held-out digits as a job on the stack's queue (`$JobsQueueUrl` from "
        "`fnserve outputs`), the job ids written to `ids.txt` for `fnserve results`.",
        "fnserve submit layers/models/models/digits-holdout.npz --model digits-accurate "
        '--queue "$JobsQueueUrl" --ids ids.txt',
    ),
    "fnserve results": (
        "Those jobs' results in one file, with how many are done, failed or still pending.",
        'fnserve results ids.txt --table "$ResultsTableName" -o results.npz',
    ),
    "fnserve bench": (
        "The fastest server configuration for one model within a 5 ms p99 on this machine; the report, plots "
        "and settings go to `--out`.",
        "fnserve bench layers/models/models/manifest.toml --model digits-accurate --p99-ms 5 "
        "--out fnserve-bench/digits",
    ),
    "fnserve local": (
        "The SAM template's functions on this machine behind a gateway on port 3000, restarted when their code or "
        "models change: what `make run` runs.",
        "fnserve local --template template.yaml --port 3000 --reload",
    ),
    "fnserve cascade tune": (
        "Score the demo cascade's thresholds on held-out data, and recommend the one that reaches 97.7% accuracy.",
        "fnserve cascade tune digits -m layers/models/models/manifest.toml "
        "--data layers/models/models/digits-holdout.npz --target-accuracy 0.977",
    ),
    "fnserve models": (
        "What a manifest serves: each model's inputs and outputs, its pipelines and its cascades.",
        "fnserve models -m layers/models/models/manifest.toml",
    ),
    "fnserve models push": (
        "A manifest's files published to S3; serve them with `FNSERVE_MANIFEST` set to the URI it prints.",
        "fnserve models push s3://my-bucket/models -m my-models/manifest.toml",
    ),
    "fnserve outputs": (
        "A deployed stack's outputs as `export` lines of their own names, which the docs' commands use: "
        '`eval "$(fnserve outputs)"` sets them in your shell.',
        "fnserve outputs --stack-name fnserve",
    ),
    "fnserve manifest add": (
        "An ONNX file added to a manifest (created if missing) under a name, its sha256 computed and its inputs "
        "and outputs shown.",
        "fnserve manifest add my-model.onnx --name my-model -m my-models/manifest.toml",
    ),
}


def reference() -> str:
    """The page: every command and subcommand, in the order ``fnserve --help`` lists them, with its help."""
    root = typer.main.get_command(app)
    parts = [
        "# The command line: `fnserve`\n",
        "Every command's `--help`, as it prints it, after an example of its use (written by "
        "`infra/docs/cli_reference.py`; tests keep this page and the commands in step, and parse every example as the "
        "command line would).\n",
    ]

    def visit(command: Any, path: list[str], parent: Any) -> None:
        # typer's commands and contexts (its own click), built as typer builds them
        ctx = command.context_class(command, info_name=path[-1], parent=parent, max_content_width=WIDTH)
        ctx.terminal_width = WIDTH
        if len(path) > 1:
            parts.append(f"## `{' '.join(path)}`\n")
        if (example := EXAMPLES.get(" ".join(path))) is not None:
            what, invocation = example
            parts.append(f"{what}\n\n```text\n{invocation}\n```\n")
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
