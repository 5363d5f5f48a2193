"""The Lambda functions of functions/ imported as Lambda imports them."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from tests.helpers import load_module


def load_function(path: Path) -> ModuleType:
    """Import a function's app.py as Lambda does: a fresh module, built at import."""
    return load_module(path, f"fn_{path.parent.name}")


# The functions-framework server of this interpreter's environment: Google Cloud's own, serving functions/gcp_*.
FUNCTIONS_FRAMEWORK = str(Path(sys.executable).parent / "functions-framework")
