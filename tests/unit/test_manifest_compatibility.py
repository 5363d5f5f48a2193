"""A manifest written today is read tomorrow (docs/upgrading.md): every field a manifest may hold, its type and its
default, is recorded in tests/data/manifest-fields.txt, and the code must still declare each. A field removed or
renamed breaks the promise; a type or default changed is a change users must read of; a field added is recorded."""

from __future__ import annotations

import tomllib

from fnserve.core.models.manifest.loading import load_manifest
from tests.helpers import DEMO_MANIFEST, REPO, load_module

TOOL = load_module(REPO / "infra" / "docs" / "manifest_reference.py", "manifest_reference")
RECORD = "python infra/docs/manifest_reference.py --fields"


def key(line: str) -> str:
    """Where a field is written and its name: what a manifest names it by."""
    return line.split(": ", 1)[0]


def differences(recorded: list[str], declared: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Fields gone (by where and name), lines changed (type or default), lines added."""
    gone = sorted({key(line) for line in recorded} - {key(line) for line in declared})
    changed = sorted(line for line in set(recorded) - set(declared) if key(line) not in gone)
    return gone, changed, sorted(set(declared) - set(recorded))


def test_every_field_a_manifest_may_hold_today_is_still_read() -> None:
    gone, changed, added = differences(TOOL.FIELDS.read_text().splitlines(), TOOL.field_lines())
    assert not gone, (
        f"fields a manifest written today may hold, no longer declared: {gone}. Keep reading the old name (with a "
        "warning naming the new one) for a minor release, as docs/upgrading.md promises"
    )
    assert not changed, (
        f"a field's type or default changed: {changed}. Say so in docs/changelog.md under Changed, then: {RECORD}"
    )
    assert not added, f"fields added: {added}. Record them, so that they are kept too: {RECORD}"


def test_a_field_renamed_or_a_default_changed_is_found() -> None:
    declared = TOOL.field_lines()
    version = next(line for line in declared if line.startswith("[[models]] | version: "))
    renamed = [line.replace("| version:", "| revision:") if line == version else line for line in declared]
    assert differences(declared, renamed)[0] == ["[[models]] | version"]
    defaulted = [line.replace('`"1"`', '`"0"`') if line == version else line for line in declared]
    assert differences(declared, defaulted)[:2] == ([], [version])


def test_the_key_of_a_line_is_where_and_what() -> None:
    assert key('[[models]] | version: string; `"1"`') == "[[models]] | version"
    lines = TOOL.field_lines()
    assert '[[pipelines.pre]] step = "tokenize" | max_length: integer ≥ 2; `512`' in lines
    assert len({key(line) for line in lines}) == len(lines), "two fields a manifest names alike"


def test_the_demo_and_the_examples_manifests_load() -> None:
    """The manifests users copy from: each one in the repository, loaded as a server loads it."""
    found = [DEMO_MANIFEST, *sorted((REPO / "examples").rglob("manifest.toml"))]
    for path in found:
        assert tomllib.loads(path.read_text()), path
        load_manifest(path)
