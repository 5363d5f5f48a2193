"""The ``fnserve`` command line: a module per command group, each command its options parsed and a library function
called. Importing this package registers every command on :data:`app`."""

import importlib

from fnserve.cli.root import app, explain, main

# In the order --help lists them: each module registers its commands as it is imported.
for _group in ("models", "prepare", "serve", "jobs", "bench", "local"):
    importlib.import_module(f"fnserve.cli.{_group}")

__all__ = ["app", "explain", "main"]
