"""template.yaml as SAM translates it for CloudFormation: what the checks of its scaling, its defaults and the
deployer's policies read."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from tests.helpers import REPO

SAM_PATH = REPO / "template.yaml"


@functools.cache
def _template() -> dict[str, Any]:
    from cfnlint.decode.cfn_yaml import load

    document: dict[str, Any] = json.loads(json.dumps(load(str(SAM_PATH))))  # plain dicts and strings, to copy
    return document


def translated(code_uri: Callable[[str], str] = "s3://bucket/{}".format, **parameters: str) -> dict[str, Any]:
    """template.yaml translated with ``parameters`` as its defaults, each local code path at ``code_uri`` of it (SAM
    translates only S3 locations; it needs a region, AWS_DEFAULT_REGION)."""
    from samtranslator.translator.transform import transform

    document = json.loads(json.dumps(_template()))
    for resource in document["Resources"].values():
        props = resource.get("Properties") or {}
        for key in ("CodeUri", "ContentUri"):
            if isinstance(props.get(key), str):
                props[key] = code_uri(props[key])
    for name, value in parameters.items():
        document["Parameters"][name]["Default"] = value

    class NoManagedPolicies:
        def load(self) -> dict[str, str]:
            return {}

    return transform(document, parameters, NoManagedPolicies())  # type: ignore[no-any-return]
