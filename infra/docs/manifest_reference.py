"""Write docs/manifest.md's tables: every table and field a manifest may hold, from the manifest's msgspec structs
(their fields, types, defaults and descriptions), as settings_reference.py writes docs/settings.md; and the record of
every field, type and default that a manifest written today may rely on (docs/upgrading.md's promise).

python infra/docs/manifest_reference.py           (rewrites the page between its markers; a test fails when stale)
python infra/docs/manifest_reference.py --fields  (records a field added: tests/data/manifest-fields.txt)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

from fnserve.core.models.manifest.loading import Manifest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "manifest.md"
FIELDS = Path(__file__).resolve().parents[2] / "tests" / "data" / "manifest-fields.txt"
BEGIN = "<!-- written by infra/docs/manifest_reference.py from here -->"
END = "<!-- to here -->"
TOP = "The file"  # the root struct's section


def structs() -> dict[type, tuple[mi.StructType, str]]:
    """Every struct a manifest may hold, with where in the file it is written (``[[models]]``), the file first,
    then in the order the fields reach them."""
    found: dict[type, tuple[mi.StructType, str]] = {}
    pending: list[tuple[mi.Type, str]] = [(mi.type_info(Manifest), "")]
    while pending:
        node, where = pending.pop(0)
        if isinstance(node, mi.StructType):
            if node.cls in found:
                continue
            found[node.cls] = (node, where)
            base = where.strip("[]").replace(".NAME", "")
            pending += [(field.type, f"{base}.{field.encode_name}".lstrip(".")) for field in node.fields]
        elif isinstance(node, mi.ListType):
            pending.append((node.item_type, f"[[{where}]]"))
        elif isinstance(node, mi.DictType):
            pending.append((node.value_type, f"[{where}.NAME]"))
        else:
            pending += [(child, where) for child in _children(node)]
    return {
        cls: (node, where if where.startswith("[") else f"[{where}]" if where else "")
        for cls, (node, where) in found.items()
    }


def _children(node: mi.Type) -> list[mi.Type]:
    if isinstance(node, mi.Metadata):
        return [node.type]
    if isinstance(node, mi.UnionType):
        return list(node.types)
    if isinstance(node, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        return [node.item_type]
    if isinstance(node, mi.DictType):
        return [node.key_type, node.value_type]
    return []


def anchor(cls: type) -> str:
    return cls.__name__.lower().lstrip("_")


def type_name(node: mi.Type) -> str:
    """A field's type as a reader writes it in TOML."""
    if isinstance(node, mi.Metadata):
        return type_name(node.type)
    if isinstance(node, mi.UnionType):
        parts = [type_name(t) for t in node.types if not isinstance(t, mi.NoneType)]
        return " or ".join(dict.fromkeys(parts))
    if isinstance(node, mi.ListType):
        return f"list of {type_name(node.item_type)}"
    if isinstance(node, mi.DictType):
        return f"table of {type_name(node.value_type)}"
    if isinstance(node, mi.LiteralType):
        return "one of " + ", ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v}`" for v in node.values)
    if isinstance(node, mi.StructType):
        tag = f' (`{node.tag_field} = "{node.tag}"`)' if node.tag_field else ""
        return f"[{node.cls.__name__}](#{anchor(node.cls)}){tag}"
    simple = {mi.StrType: "string", mi.IntType: "integer", mi.FloatType: "number", mi.BoolType: "boolean"}
    for kind, name in simple.items():
        if isinstance(node, kind):
            bounds = [
                f"{sign} {value:g}"
                for attribute, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"))
                if (value := getattr(node, attribute, None)) is not None
            ]
            return " ".join([name, ", ".join(bounds)]).strip()
    if isinstance(node, mi.AnyType):
        return "any"
    if isinstance(node, mi.CustomType) and issubclass(node.cls, Path):
        return "path"
    return type(node).__name__.removesuffix("Type").lower()


def description(node: mi.Type) -> str:
    """A field's description: its Meta's, or (``X | None``) its member's."""
    if isinstance(node, mi.UnionType):
        return next((found for t in node.types if (found := description(t))), "")
    found = ""
    while isinstance(node, mi.Metadata):
        found = (node.extra_json_schema or {}).get("description", found)
        node = node.type
    return found


def default(field: mi.Field) -> str:
    if field.required:
        return "required"
    if field.default_factory is not msgspec.NODEFAULT:
        value: Any = field.default_factory()
    else:
        value = field.default
    if value is None or value == [] or value == {}:
        return "unset" if value is None else "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, msgspec.Struct):
        return "its defaults"
    if isinstance(value, (list, dict)):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def tables() -> str:
    parts = []
    for cls, (node, where) in structs().items():
        where = where.replace("[[pipelines.pre]]", "[[pipelines.pre]]` or `[[pipelines.post]]")  # steps go in both
        title = TOP if cls is Manifest else f"`{where}`: {cls.__name__}"
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        tag = f' Chosen by `{node.tag_field} = "{node.tag}"`.' if node.tag_field else ""
        rows = [
            f"### {title} {{#{anchor(cls)}}}\n",
            f"{doc}{tag}\n",
            "| field | type | default | what it is |",
            "|" + "---|" * 4,
        ]
        for field in node.fields:
            if field.encode_name == node.tag_field:
                continue
            rows.append(
                f"| `{field.encode_name}` | {_cell(type_name(field.type))} | {default(field)} | "
                f"{_cell(description(field.type))} |"
            )
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def field_lines() -> list[str]:
    """Every field a manifest may hold, a line each: where it is written (a step's table with its tag), its name,
    then after ``: `` its type and default, in the order the page shows them."""
    lines = []
    for _, (node, where) in structs().items():
        place = (where or "(the file)") + (f' {node.tag_field} = "{node.tag}"' if node.tag_field else "")
        for field in node.fields:
            if field.encode_name != node.tag_field:
                lines.append(f"{place} | {field.encode_name}: {type_name(field.type)}; {default(field)}")
    return lines


def reference() -> str:
    """What goes between the page's markers."""
    return f"{BEGIN}\n\n{tables()}\n{END}"


def generated(page: str) -> str:
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[start:end]


if __name__ == "__main__":
    if sys.argv[1:] == ["--fields"]:
        FIELDS.write_text("\n".join(field_lines()) + "\n")
        sys.stdout.write(f"wrote {FIELDS}\n")
        sys.exit(0)
    text = PAGE.read_text() if PAGE.exists() else f"{BEGIN}\n{END}\n"
    PAGE.write_text(text.replace(generated(text), reference()))
    sys.stdout.write(f"wrote {PAGE}\n")
