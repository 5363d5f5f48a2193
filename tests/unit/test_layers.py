"""The package's import graph is a tree of layers: no two packages (or modules beside each other) import each other,
and fnserve's top level has no cycle at all. Every import counts: inside functions and under ``TYPE_CHECKING`` too,
since an import deferred into a function still ties the two packages together."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "layers" / "fnserve" / "fnserve"
GENERATED = PACKAGE / "adapters" / "grpc" / "proto"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(tree: ast.AST, package: list[str]) -> Iterator[tuple[str, int]]:
    """Every module (or name in one) that a module of ``package`` imports, wherever the import is, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module, node.lineno
            yield from ((f"{module}.{alias.name}", node.lineno) for alias in node.names)


def edges() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> where, for every pair of sibling units: the children of one package (its modules
    and subpackages), at every depth."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        me = module_name(path).split(".")
        package = me if path.name == "__init__.py" else me[:-1]
        for target, line in imports(ast.parse(path.read_text(), str(path)), package):
            other = target.split(".")
            if other[0] != "fnserve":
                continue
            # The first level where the two names part: each side's unit there, when both are below a shared package.
            depth = next((i for i, (a, b) in enumerate(zip(me, other, strict=False)) if a != b), None)
            if depth is None or depth >= len(me) or depth >= len(other):
                continue
            a, b = ".".join(me[: depth + 1]), ".".join(other[: depth + 1])
            found[(a, b)].add(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return found


def test_no_two_packages_or_modules_import_each_other() -> None:
    graph = edges()
    assert graph, "the walk found no imports at all"
    both_ways = sorted({tuple(sorted(pair)) for pair in graph if (pair[1], pair[0]) in graph})
    described = [f"{a} <-> {b}: {sorted(graph[(a, b)])[:3]} / {sorted(graph[(b, a)])[:3]}" for a, b in both_ways]
    assert not both_ways, "packages that import each other:\n" + "\n".join(described)


def core_rooms() -> list[str]:
    """core's rooms, the highest first, as docs/architecture.md draws them."""
    page = (REPO / "docs" / "architecture.md").read_text()
    block = page.split("Inside `core/` the rooms form layers", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return block.split()


def upward(rooms: list[str], graph: dict[tuple[str, str], set[str]]) -> list[str]:
    """The imports of a core room from a room above it (``rooms``, the highest first) in ``graph``."""
    rank = {f"fnserve.core.{room}": len(rooms) - i for i, room in enumerate(rooms)}
    return sorted(
        f"{a} imports {b}: {sorted(where)[:2]}"
        for (a, b), where in graph.items()
        if a in rank and b in rank and rank[b] > rank[a]
    )


def test_cores_rooms_import_only_the_rooms_below_them() -> None:
    rooms, graph = core_rooms(), edges()
    packages = sorted(p.parent.name for p in (PACKAGE / "core").glob("*/__init__.py"))
    assert sorted(rooms) == packages, "docs/architecture.md's rooms of core are not its packages"
    assert not upward(rooms, graph), "core rooms that import a room above them:\n" + "\n".join(upward(rooms, graph))
    # Beneath every room, core's own modules: the errors, the extras and the host, which import no room.
    base = {f"fnserve.core.{p.stem}" for p in (PACKAGE / "core").glob("*.py") if p.stem != "__init__"}
    assert base == {"fnserve.core.errors", "fnserve.core.extras", "fnserve.core.host"}
    rooms_imported = sorted(f"{a} imports {b}" for a, b in graph if a in base and b.startswith("fnserve.core."))
    assert not rooms_imported, rooms_imported
    # The check sees an order that does not hold: the same rooms the other way up.
    assert upward(rooms[::-1], graph)


def test_the_top_level_has_no_cycle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges():
        if a.count(".") == 1 and b.count(".") == 1:
            graph[a].add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (found := cycle_from(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := cycle_from(node, [node])):
            raise AssertionError("an import cycle among fnserve's packages: " + " -> ".join(found))


def test_the_walk_sees_imports_inside_functions_type_checking_blocks_and_relative_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fnserve.core import errors\n"
        "def f():\n    from fnserve.workers.pool import WorkerPool\n"
        "from ..stores import redis\n"
    )
    found = {target for target, _ in imports(ast.parse(source), ["fnserve", "adapters"])}
    assert {"fnserve.core.errors", "fnserve.workers.pool", "fnserve.stores.redis"} <= found


def test_the_architecture_page_names_every_package_and_only_packages_that_exist() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    block = page.split("## Packages", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    named, parents = set(), []
    for line in block.splitlines()[1:]:  # below the package itself
        indent, name = len(line) - len(line.lstrip()), line.split()[0] if line.strip() else ""
        if not name.endswith("/"):
            continue  # a role's continued line
        depth = indent // 2 - 1
        parents[depth:] = [name.rstrip("/")]
        named.add("/".join(parents))
    packages = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert named, "no package list under docs/architecture.md's 'Packages'"
    assert named - packages == set(), "docs/architecture.md names packages that do not exist"
    assert packages - named == set(), "packages that docs/architecture.md does not name"


def test_the_architecture_page_names_every_make_target() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    line = next(line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith(".PHONY:"))
    entry = page.split("\nMakefile ", 1)[1].split("\ntemplate.yaml", 1)[0]
    named = set(re.findall(r"[a-z][a-z0-9-]*", entry))
    assert set(line.split(":", 1)[1].split()) - named == set(), "make targets docs/architecture.md does not name"


def is_test_module(path: Path) -> bool:
    """What pytest collects or loads as a test module: ``test_*.py``, ``*_test.py``, ``conftest.py``."""
    return path.suffix == ".py" and (
        path.stem.startswith("test_") or path.stem.endswith("_test") or path.stem == "conftest"
    )


def module_file(root: Path, target: str) -> Path | None:
    """The file under ``root`` that an import of ``target`` (a module, or a name in one) loads, if it is there."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:end])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
    return None


def is_benchmark(path: Path) -> bool:
    """A benchmark: ``tests/bench/bench_*.py``, run as ``python -m tests.bench.bench_NAME``."""
    return path.suffix == ".py" and path.stem.startswith("bench_") and path.parent.parts[-2:] == ("tests", "bench")


def imports_of(root: Path, kind: Callable[[Path], bool]) -> set[tuple[str, str]]:
    """(importer:line, imported module) for every import of a module of ``kind`` by any module under ``root``/tests:
    every tier, tests/helpers and tests/*.py alike, wherever in the module the import is."""
    found = set()
    for path in sorted((root / "tests").rglob("*.py")):
        me = list(path.relative_to(root).with_suffix("").parts)
        package = me[:-1]  # what a relative import starts from: the module's folder, an __init__.py's too
        for target, line in imports(ast.parse(path.read_text(), str(path)), package):
            imported = module_file(root, target)
            if imported is not None and kind(imported):
                found.add((f"{path.relative_to(root)}:{line}", str(imported.relative_to(root))))
    return found


def test_tests_share_helpers_through_tests_helpers_not_test_modules() -> None:
    """A helper two test modules share lives in tests/helpers: a test module imported by another runs its module-level
    set-up there too, and its tests read as helpers. Every module under tests/ is held to it, the bench's too (its
    bench_*.py modules are no test modules: a test of their own keeps them apart)."""
    found = sorted(f"{where} imports {module}" for where, module in imports_of(REPO, is_test_module))
    assert not found, "test modules imported as libraries:\n" + "\n".join(found)


def test_benchmarks_share_code_through_modules_of_their_own_not_each_other() -> None:
    """What two benchmarks share lives in a private module of tests/bench (``_timing.py``, ``_servers.py``, ...): a
    benchmark imported by another runs its module-level set-up there too (its knobs read, its data loaded), and what
    is shared hides among one benchmark's own code. Every module under tests/ is held to it, servers and tests too."""
    found = sorted(f"{where} imports {module}" for where, module in imports_of(REPO, is_benchmark))
    assert not found, "benchmarks imported as libraries:\n" + "\n".join(found)


def scratch_imports(root: Path, files: dict[str, str], kind: Callable[[Path], bool]) -> set[tuple[str, str]]:
    """What :func:`imports_of` finds among ``files`` written to a scratch tests/ folder under ``root``; their paths are
    given without it, so that this file names no test file that is not there."""
    for name, text in files.items():
        (root / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "tests" / name).write_text(text)
    return {(where.removeprefix("tests/"), module.removeprefix("tests/")) for where, module in imports_of(root, kind)}


def test_the_test_module_check_sees_every_tier_and_spares_modules_that_are_not_tests(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "servers.py": "",
        "helpers/__init__.py": "",
        "helpers/asgi.py": "from tests.helpers import REPO\n",
        "functional/__init__.py": "",
        "functional/conftest.py": "from tests.helpers.asgi import Get\nfrom tests.servers import wait_for\n",
        "functional/test_a.py": "from tests.functional.conftest import Aws\n",
        "functional/test_b.py": "def f():\n    from .test_a import thing\n",
        "functional/gated.py": "",
        "functional/test_c.py": "from tests.functional import gated\n",
        "e2e/test_d.py": "import tests.functional.test_a\n",
        "image/test_e.py": "from tests.functional import test_b\n",
        "bench/__init__.py": "",
        "bench/bench_x.py": "from tests.bench import bench_y\nfrom tests.bench._timing import clock\n",
        "bench/bench_y.py": "from tests.functional.test_a import CORRECTED\n",
    }
    found = scratch_imports(tmp_path, files, is_test_module)
    assert found == {
        ("functional/test_a.py:1", "functional/conftest.py"),
        ("functional/test_b.py:2", "functional/test_a.py"),
        ("e2e/test_d.py:1", "functional/test_a.py"),
        ("image/test_e.py:1", "functional/test_b.py"),
        ("bench/bench_y.py:1", "functional/test_a.py"),
    }


def test_the_benchmark_check_sees_every_import_of_a_benchmark_and_spares_the_shared_modules(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "bench/__init__.py": "",
        "bench/_shared.py": "",
        "bench/bench_a.py": "from tests.bench.bench_b import run\nfrom tests.bench._shared import clock\n",
        "bench/bench_b.py": "def main():\n    from . import bench_c\n",
        "bench/bench_c.py": "from ._shared import clock\nimport tests.bench.bench_a\n",
        "bench/bench_d.py": "def main():\n    from .bench_a import run\n",
        "bench/bench_e.py": "from tests.bench import _shared, plain_server\n",
        "bench/plain_server.py": "from tests.bench import bench_e\n",
        "helpers/__init__.py": "",
        "helpers/bench_notes.py": "",
        "unit/test_f.py": "from tests.bench._shared import clock\nfrom tests.helpers import bench_notes\n",
        "functional/test_g.py": "def test_it():\n    from tests.bench.bench_a import run\n",
    }
    found = scratch_imports(tmp_path, files, is_benchmark)
    assert found == {
        ("bench/bench_a.py:1", "bench/bench_b.py"),
        ("bench/bench_b.py:2", "bench/bench_c.py"),
        ("bench/bench_c.py:2", "bench/bench_a.py"),
        ("bench/bench_d.py:2", "bench/bench_a.py"),
        ("bench/plain_server.py:1", "bench/bench_e.py"),
        ("functional/test_g.py:2", "bench/bench_a.py"),
    }
