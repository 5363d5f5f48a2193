"""The ``fnserve`` script. A bare ``fnserve serve``, the command images run, starts the server with its options
read from the environment and no command-line parser built (:mod:`fnserve.server.command`); anything else is the
command line's (:mod:`fnserve.cli`)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        from fnserve.server.command import options_from_environment, serve

        options = options_from_environment(os.environ)
        if options is not None:
            try:
                serve(options)
            except Exception as exc:  # noqa: BLE001 - one line, as the command line says every error
                from fnserve.cli import explain

                print(f"error: {explain(exc)}", file=sys.stderr)
                raise SystemExit(1) from None
            return
    from fnserve.cli import main as command_line

    command_line()
