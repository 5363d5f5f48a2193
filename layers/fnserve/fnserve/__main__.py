"""``python -m fnserve``: the command line."""

from fnserve.entry import main

main()
