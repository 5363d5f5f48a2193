"""``python -m fnserve``: the command line."""

from fnserve.cli import main

main()
