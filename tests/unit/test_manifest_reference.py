"""docs/manifest.md is the manifest's code: every table and field the structs declare, once, with its type, default
and description, so no field (a model's ``outputs`` override, say) is known to the code and to no page."""

from __future__ import annotations

import importlib
import pkgutil
import re

import msgspec

from fnserve.core.models import manifest
from fnserve.core.models.manifest.entries import Entry
from tests.helpers import REPO, load_module

TOOL = load_module(REPO / "infra" / "docs" / "manifest_reference.py", "manifest_reference")
PAGE = REPO / "docs" / "manifest.md"


def test_the_page_is_what_the_structs_say() -> None:
    stale = "docs/manifest.md is stale: run python infra/docs/manifest_reference.py"
    assert TOOL.generated(PAGE.read_text()) == TOOL.reference(), stale


def test_every_struct_of_the_manifest_package_and_every_field_is_on_the_page_once() -> None:
    parts = pkgutil.iter_modules(manifest.__path__)
    modules = [importlib.import_module(f"{manifest.__name__}.{part.name}") for part in parts]
    declared = {
        cls
        for module in modules
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct) and not cls.__name__.startswith("_")
    } - {Entry}  # the base of the tables, no table itself
    found = TOOL.structs()
    assert set(found) == declared, "structs a manifest can hold that the walk misses, or the other way round"
    page = PAGE.read_text()
    for cls, (node, _) in found.items():
        section = page.split(f"{{#{TOOL.anchor(cls)}}}", 1)[1].split("\n### ", 1)[0]
        rows = re.findall(r"^\| `([a-z_0-9]+)` \|", section, re.MULTILINE)
        fields = [f.encode_name for f in node.fields if f.encode_name != node.tag_field]
        assert rows == fields, cls.__name__
        assert all(not row.endswith("|  |") for row in section.splitlines()), f"{cls.__name__}: a field undescribed"
    assert "| `outputs` | table of [TensorOverride](#tensoroverride) |" in page


def test_the_walk_fails_on_a_field_the_page_does_not_show() -> None:
    page = PAGE.read_text()
    assert TOOL.generated(page.replace("| `pad_value` |", "| `pad_values` |")) != TOOL.reference()
