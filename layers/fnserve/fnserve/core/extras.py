"""Which of fnserve's extras brings a module, so that an error for a missing one says what to install.

Read from fnserve's own metadata (the extras pyproject declares), so a new requirement is named with no list to
keep. No package named fnserve is published: the hint installs from the checkout, as docs/install.md does.
"""

from __future__ import annotations

import re
from importlib import metadata

# Modules imported under another name than their distribution's.
DISTRIBUTIONS = {
    "cfnlint": "cfn-lint",
    "grpc": "grpcio",
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "google": "google-cloud-storage",
    "functions_framework": "functions-framework",
    "samtranslator": "aws-sam-translator",
    "PIL": "pillow",
    "opentelemetry": "opentelemetry-sdk",
    "prometheus_client": "prometheus-client",
    "aws_lambda_powertools": "aws-lambda-powertools",
    "tomli_w": "tomli-w",
}
_LINE = re.compile(r"^([A-Za-z0-9._-]+)(?:\[([^\]]*)\])?[^;]*;\s*extra\s*==\s*[\"']([^\"']+)[\"']")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_of(module: str) -> list[str]:
    """The extras that install ``module`` (a top-level import name), the ones naming it first, then those that
    include one of them; the development set last. Empty where fnserve's metadata is not installed."""
    top = module.split(".")[0]
    wanted = _normal(DISTRIBUTIONS.get(top, top))
    try:
        lines = metadata.requires("fnserve") or []
    except metadata.PackageNotFoundError:
        return []
    direct: list[str] = []
    includes: dict[str, set[str]] = {}  # extra -> the extras it pulls in (fnserve[server] in bench's)
    for line in lines:
        found = _LINE.match(line)
        if found is None:
            continue
        name, inner, extra = found.groups()
        if _normal(name) == "fnserve":
            includes.setdefault(extra, set()).update(part.strip() for part in (inner or "").split(",") if part.strip())
        elif _normal(name) == wanted:
            direct.append(extra)
    order = list(dict.fromkeys(e for e in direct if e != "dev"))
    grew = True
    while grew:
        grew = False
        for extra, pulled in includes.items():
            if extra not in order and extra != "dev" and pulled & set(order):
                order.append(extra)
                grew = True
    return order + (["dev"] if order or "dev" in direct else [])


def install_hint(extra: str) -> str:
    """How to install ``extra``: from the checkout, or the wheel ``make dist`` builds."""
    return f'.venv/bin/pip install ".[{extra}]" in the checkout, or the wheel with [{extra}] (docs/install.md)'


def missing(module: str) -> str:
    """The sentence for a module that is not installed: the extra that brings it, and how to install it."""
    extras = extras_of(module)
    if not extras:
        return f"{module} is not installed"
    also = [e for e in extras[1:] if e != "dev"]
    more = f" ({', '.join(also)} include{'s' if len(also) == 1 else ''} it too)" if also else ""
    return f"{module} is not installed: the {extras[0]} extra brings it{more}; {install_hint(extras[0])}"
