"""Reading a SAM/CloudFormation template for the local emulator: parameters, conditions, references.

The template is read as cfn-lint reads it (YAML or JSON, short-form tags such as ``!Ref`` made into
their long forms), and each resource's properties get its Globals as SAM's own translator merges
them (maps merged, lists such as ``Layers`` prepended to the resource's): the semantics come from
the libraries that define them, not from a parser of the emulator's own.
"""

from __future__ import annotations

import copy
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fnserve.aws.events import ACCOUNT_ID, REGION

PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT_ID,
    "AWS::StackName": "fnserve-local",
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}
NO_VALUE = object()  # AWS::NoValue: the property disappears


@dataclass
class Template:
    path: Path
    parameters: dict[str, Any]
    conditions: dict[str, Any]
    resources: dict[str, dict[str, Any]]  # as SAM's plugins leave them: Globals merged in, implicit APIs added
    document: dict[str, Any] = field(default_factory=dict)  # the template as written, Globals included

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: r for name, r in self.resources.items() if r.get("Type") == kind}

    def properties(self, name: str) -> dict[str, Any]:
        """A resource's properties, the template's Globals merged in by SAM's own plugin."""
        return dict(self.resources[name].get("Properties") or {})


def load_template(path: Path) -> Template:
    """Read a template as ``sam local`` reads it: cfn-lint's decoder (short-form tags included), then SAM's
    translator's own parser and plugins (Globals merged, implicit APIs added, policy templates expanded);
    a Globals section SAM would refuse is refused with SAM's message."""
    from cfnlint.decode import decode_str

    doc, errors = decode_str(path.read_text())
    if errors or not isinstance(doc, dict):
        reason = errors[0].message if errors else "it is not a mapping"
        raise ValueError(f"{path} is not a template the emulator can read: {reason}")
    processed = _sam_plugins_applied(doc, path) if "Transform" in doc else doc
    return Template(
        path=path,
        parameters=doc.get("Parameters") or {},
        conditions=doc.get("Conditions") or {},
        resources=processed.get("Resources") or {},
        document=doc,
    )


def _sam_plugins_applied(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """What SAM CLI's local commands run on a template before they read it (its ``SamTranslatorWrapper``):
    samtranslator's parser with the plugins of a translation, on a copy."""
    from samtranslator.model.exceptions import InvalidDocumentException
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import prepare_plugins

    template = copy.deepcopy(doc)
    defaults = {name: spec["Default"] for name, spec in (doc.get("Parameters") or {}).items() if "Default" in spec}
    try:
        Parser().parse(template, defaults, prepare_plugins([], parameters=defaults))
    except InvalidDocumentException as exc:
        causes = "; ".join(str(getattr(cause, "message", cause)) for cause in exc.causes)
        raise ValueError(f"{path} is not a valid SAM template: {causes}") from None
    return template


class Resolver:
    """Evaluates intrinsic functions against parameter defaults (or overrides) and local resources."""

    def __init__(
        self,
        template: Template,
        physical: Mapping[str, str],
        attributes: Mapping[tuple[str, str], str],
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.template = template
        self.physical = physical
        self.attributes = attributes
        self.values = {name: spec.get("Default", "") for name, spec in template.parameters.items()}
        self.values.update(overrides or {})
        self._secret = secrets.token_hex(24)

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template.conditions[name]))

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.resolve(item) for item in node) if v is not NO_VALUE]
        if isinstance(node, str):
            # Dynamic references ({{resolve:secretsmanager:...}}) are deploy-time secrets: one per local run.
            return re.sub(r"\{\{resolve:[^}]*\}\}", self._secret, node)
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, value),) = node.items()
            handler = getattr(self, "_" + key.replace("Fn::", "").lower(), None)
            if key == "Ref" or key.startswith("Fn::") or key == "Condition":
                if handler is None:
                    raise ValueError(f"{self.template.path}: {key} is not supported by the local emulator")
                return handler(value)
        out = {}
        for key, value in node.items():
            resolved = self.resolve(value)
            if resolved is not NO_VALUE:
                out[key] = resolved
        return out

    def _ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in PSEUDO:
            return PSEUDO[name]
        if name in self.values:
            return self.values[name]
        return self.physical.get(name.split(".")[0], name)

    def _getatt(self, value: list[str]) -> str:
        resource, attribute = self.resolve(value[0]), self.resolve(value[1])
        return self.attributes.get((resource, attribute), f"{resource}.{attribute}")

    def _sub(self, value: Any) -> str:
        text, variables = (value, {}) if isinstance(value, str) else (value[0], self.resolve(value[1]))

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return str(variables[name])
            if "." in name and name.split(".")[0] in self.template.resources:
                return str(self._getatt(name.split(".", 1)))
            return str(self._ref(name))

        return self.resolve(re.sub(r"\$\{([^}!]+)\}", replace, text))  # type: ignore[no-any-return]

    def _if(self, value: list[Any]) -> Any:
        return self.resolve(value[1] if self.condition(value[0]) else value[2])

    def _equals(self, value: list[Any]) -> bool:
        a, b = (self.resolve(v) for v in value)
        return str(a) == str(b)

    def _not(self, value: list[Any]) -> bool:
        return not self.resolve(value[0])

    def _and(self, value: list[Any]) -> bool:
        return all(self.resolve(v) for v in value)

    def _or(self, value: list[Any]) -> bool:
        return any(self.resolve(v) for v in value)

    def _condition(self, name: str) -> bool:
        return self.condition(name)

    def _join(self, value: list[Any]) -> str:
        return str(value[0]).join(str(v) for v in self.resolve(value[1]))
