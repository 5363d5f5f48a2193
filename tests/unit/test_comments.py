"""The package's comments and docstrings carry no measured figures and no stale references.

A figure in a comment is stale the day the code or the machine changes: the why stays in the code, the figure,
its history and the command that measures it go to ``docs/design/`` (STYLE.md). What counts as a measurement here:

- a duration under a second with its unit ("14 µs", "2 us", "0.16 ms", "3.4-3.6 ms"), unless a word before it
  makes it a setting or a limit (a default, timeout, budget, window, deadline, wait, interval, TTL, limit,
  bucket; "every", "within", "at most", "up to", "after", "reused for");
- a longer duration written as a measurement: with a fraction ("0.55 s"), a range ("17-29 minutes"), "~" or
  "about" ("about 3 s"), or after a verb of spending ("took 40 s", "costs 2 us", "stopped for ~15 ms");
- a rate: a figure before "/s" ("req/s", "rows/s", "40k requests/s"), or before "a second" / "per second"
  ("850 rows a second"; "10 times a second", how often the code does something, is not a rate);
- a percentage of something ("15% fewer", "87% of", "5% CPU"); a bare one ("the 95% confidence interval",
  "the smallest slow-down worth refusing (2%)") is a setting;
- a ratio or a multiple: "3x", "2.5×", "0.52-0.87x", "four times as much", "x faster", "a third of", "half as
  much", "half the throughput" ("a quarter of a second" is a duration, judged as one);
- "~" before a figure ("~500 requests"): an approximation is something measured;
- an arrow between two figures ("1.2 s -> 0.55 s", "66 -> 78 us");
- a word that marks a measurement followed by a figure in the same clause: measured, median, p50/p90/p95/p99,
  benchmark, ``bench_*``, profiled.

What does not count: what a constant or a platform fixes, stated as such (Lambda's 6 MB payload, SQS's 256 KiB,
a 30 s timeout by default, a 2 s ping budget, polling "every 0.1 s", backing off from 50 ms): such a figure
changes only with the code or the platform, and a reader needs it beside the code that depends on it. Nor does
a literal block of a docstring (after ``::``: an example of what a program prints), nor what a function makes of
a literal (```5 minutes`` -> 300.0 seconds`).

Comments are read with ``tokenize`` (consecutive full-line comments as one block, so a figure split over two lines
is still seen) and docstrings with ``ast`` (those of modules, classes and functions, and the string that documents
an attribute), on every module of the package but the generated gRPC stubs.

Stale references: every dotted ``fnserve.`` path named in a comment or docstring must name a module or a package
that exists; after a package, the next name is a submodule or a name its ``__init__`` binds; after a module, the
next name is one it binds at its top level (what comes after that is not checked). The same holds for such a
path without its ``fnserve.`` (``core.pooled``). A path like ``core/serving/turns.py`` or ``docs/design/codec.md`` must
name a file of the package or of the repository."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "layers" / "fnserve" / "fnserve"
GENERATED = PACKAGE / "adapters" / "grpc" / "proto"

# A figure: 3, 2,700, 0.55, ~14, 40k (not a digit inside a name like bench_v2 or utf8, not a version like 2.39.0).
NUM = r"(?<![\w.~-])~?\d+(?:,\d{3})*(?:\.\d+)?(?![\d.]\d)k?"
# A figure or a range of figures: 3.4-3.6, 0.52-0.87.
FIG = rf"{NUM}(?:\s*(?:-|–|to)\s*~?\d+(?:,\d{{3}})*(?:\.\d+)?k?)?"
UNIT = r"(?:ns|µs|μs|us|ms|s|sec|seconds?|min|minutes?|hours?)"

# Words before a duration that make it a setting or a limit, not a measurement.
SETTING = re.compile(
    r"(?:default|defaults to|timeout|budget|window|deadline|wait|waits|every|within|at most|up to|after|"
    r"doubling to|backs? off|poll|polls|interval|ttl|limit|buckets?|reused for|kept for|cached for)\W*(?:\w+\W+){0,3}$",
    re.IGNORECASE,
)

PATTERNS: dict[str, re.Pattern[str]] = {
    "duration": re.compile(rf"{FIG}\s?(?:ns|µs|μs|us|ms)\b"),
    "seconds": re.compile(
        rf"(?:(?:~|\babout\s|\bsome\s)\s*{FIG}|{NUM}\s*(?:-|–)\s*{NUM}|(?<![\w.~-])\d+\.\d+)\s?"
        rf"(?:s|sec|seconds?|min|minutes?|hours?)\b"
    ),
    "rate": re.compile(
        rf"{FIG}\s?(?:[\w-]+\s)?[\w-]*/s\b|{FIG}\s+(?:(?!times\b)[\w-]+\s+){{0,2}}(?:a|per)\s+second\b",
        re.IGNORECASE,
    ),
    "percentage": re.compile(
        rf"{FIG}\s?%\s*(?:of|fewer|more|less|longer|shorter|faster|slower|lower|higher|better|worse|cheaper|"
        rf"smaller|larger|cpu|busy|utili[sz]ation|overhead)\b|{FIG}\s?percent\b",
        re.IGNORECASE,
    ),
    "ratio": re.compile(
        rf"{FIG}\s?[x×](?![\w-])|\b(?:\d+(?:\.\d+)?|two|three|four|five|six|ten)\s+times\s+(?:as|more|less|faster|"
        rf"slower|longer|shorter|the)\b|\bx\s+(?:faster|slower)\b|\b(?:a|one)\s+(?:third|quarter|fifth|tenth|hundredth)\s+of\b"
        rf"(?!\s+an?\s+(?:second|minute|hour)\b)|"
        rf"\bhalf\s+(?:as\s+(?:much|many|fast|long)|the\s+(?:throughput|cost|time|cpu|latency))\b",
        re.IGNORECASE,
    ),
    "took": re.compile(
        rf"\b(?:took|takes|ran|runs in|cost|costs|spent|stopped for|fell from|rose from)\s+(?:[\w-]+\s+){{0,2}}"
        rf"(?P<figure>{FIG})\s?{UNIT}\b",
        re.IGNORECASE,
    ),
    "approximate": re.compile(r"~\s?\d"),
    "arrow": re.compile(rf"{FIG}\s?(?:{UNIT}|%|x|×)?\s*(?:->|→|=>)\s*{NUM}"),
    "measured": re.compile(
        rf"\b(?:measured|measures|median|medians|p50|p90|p95|p99|p99\.9|benchmark(?:ed|s)?|bench_\w+|profiled)"
        rf"\b[^.;()]{{0,60}}?{NUM}",
        re.IGNORECASE,
    ),
}

# What a function computes from a literal argument: ``5 minutes`` -> 300.0 seconds.
CONVERSION = re.compile(r"``\s*(?:->|→)\s*$")

DOTTED = re.compile(r"(?<![\w.])fnserve(?:\.\w+)+")
# The same path without its ``fnserve.``: core.pooled, adapters.tracing.
SUBPACKAGES = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
RELATIVE = re.compile(rf"(?<![\w./-])(?:{'|'.join(SUBPACKAGES)})(?:\.[a-z_]\w*)+")
# A file name, not a module: bench.json, fnserve.toml.
FILE_NAME = re.compile(r"\.(?:py|json|toml|ya?ml|txt|md|csv|png|npz|npy|onnx|log)$")
# A path to a Python file or a page of the package or the repository: core/serving/turns.py, docs/design/codec.md.
FILE_PATH = re.compile(r"(?<![\w./-])(?:[\w-]+/)+[\w.-]+\.(?:py|md)\b")


@dataclass(frozen=True)
class Text:
    """A comment block or a docstring: its text, with the line each of its lines comes from."""

    path: Path
    lines: list[tuple[int, str]]

    def joined(self) -> tuple[str, list[int]]:
        """The text as one string, and the offset where each line starts."""
        starts, parts, at = [], [], 0
        for _, line in self.lines:
            starts.append(at)
            parts.append(line)
            at += len(line) + 1
        return "\n".join(parts), starts

    def line_of(self, starts: list[int], offset: int) -> tuple[int, str]:
        index = max(i for i, start in enumerate(starts) if start <= offset)
        return self.lines[index]


def modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if GENERATED not in path.parents]


def comments(path: Path, source: str) -> Iterator[Text]:
    """Every comment; consecutive full-line comments as one block."""
    block: list[tuple[int, str]] = []
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        row, column = token.start
        text = token.string.lstrip("#").strip()
        if lines[row - 1][:column].strip():  # after code on its line: a comment of its own
            yield Text(path, [(row, text)])
            continue
        if block and block[-1][0] != row - 1:
            yield Text(path, block)
            block = []
        block.append((row, text))
    if block:
        yield Text(path, block)


def docstrings(path: Path, source: str) -> Iterator[Text]:
    """The docstrings of the module, its classes and functions, and strings that document an attribute."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for index, statement in enumerate(node.body):
            documents = index == 0 or isinstance(node.body[index - 1], ast.Assign | ast.AnnAssign)
            if (
                documents
                and isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                end = statement.end_lineno or statement.lineno
                yield Text(path, prose([(row, lines[row - 1]) for row in range(statement.lineno, end + 1)]))


def prose(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """A docstring's lines without its literal blocks (after a line ending in ``::``, what is indented more):
    an example of what a program prints is not a claim about it."""
    kept: list[tuple[int, str]] = []
    block_indent: int | None = None
    for row, line in lines:
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and (not line.strip() or indent > block_indent):
            continue
        block_indent = indent if line.rstrip().endswith("::") else None
        kept.append((row, line))
    return kept


def texts() -> Iterator[Text]:
    for path in modules():
        source = path.read_text()
        yield from comments(path, source)
        yield from docstrings(path, source)


def where(text: Text, line: int) -> str:
    return f"{text.path.relative_to(PACKAGE)}:{line}"


def measurements(text: str) -> Iterator[tuple[int, str, str]]:
    """The measured figures in ``text``: (offset, kind, figure), one for each figure however many patterns see it."""
    seen: list[tuple[int, int]] = []
    for kind, pattern in PATTERNS.items():
        for match in pattern.finditer(text):
            if any(match.start() < end and start < match.end() for start, end in seen):
                continue  # the same figure, seen by another pattern
            figure_at = match.start("figure") if "figure" in pattern.groupindex else match.start()
            before = text[:figure_at].replace("\n", " ")
            if kind in ("duration", "seconds", "took") and SETTING.search(before[-60:]):
                continue  # a setting's or a limit's value
            if CONVERSION.search(before):
                continue
            seen.append(match.span())
            yield match.start(), kind, " ".join(match.group().split())


def figures() -> list[str]:
    """Every measured figure, as ``file:line: [kind] 'figure' in: the line``."""
    found = []
    for text in texts():
        joined, starts = text.joined()
        for offset, kind, figure in measurements(joined):
            line, content = text.line_of(starts, offset)
            found.append(f"{where(text, line)}: [{kind}] {figure!r} in: {content.strip()}")
    return sorted(found, key=_order)


def _order(hit: str) -> tuple[str, int, str]:
    path, line, rest = hit.split(":", 2)
    return path, int(line), rest


def bound_names(path: Path) -> set[str]:
    """The names a module binds at its top level (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try):
            names.update(_bound_in(node))
    return names


def _bound_in(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in child.names)
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(child.name)
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
    return names


def resolves(dotted: str) -> bool:
    """Whether ``fnserve.a.b...`` names an existing package or module (and, after it, a name it binds)."""
    here = PACKAGE
    names = dotted.split(".")[1:]
    for index, name in enumerate(names):
        if (here / name / "__init__.py").is_file():
            here = here / name
        elif (here / f"{name}.py").is_file():
            after = names[index + 1 : index + 2]
            return not after or after[0] in bound_names(here / f"{name}.py")
        else:
            return name in bound_names(here / "__init__.py")
    return True


def stale_references() -> list[str]:
    found = []
    for text in texts():
        joined, starts = text.joined()
        for match in [*DOTTED.finditer(joined), *RELATIVE.finditer(joined)]:
            dotted = match.group()
            if FILE_NAME.search(dotted):
                continue
            dotted = dotted if dotted.startswith("fnserve.") else f"fnserve.{dotted}"
            if not resolves(dotted):
                line, content = text.line_of(starts, match.start())
                found.append(f"{where(text, line)}: {dotted!r} in: {content.strip()}")
        for match in FILE_PATH.finditer(joined):
            named = match.group()
            if not any((base / named).is_file() for base in (PACKAGE, PACKAGE.parent, REPO)):
                line, content = text.line_of(starts, match.start())
                found.append(f"{where(text, line)}: {named!r} in: {content.strip()}")
    return sorted(set(found), key=_order)


def test_no_measured_figures_in_comments_or_docstrings() -> None:
    hits = figures()
    assert not hits, (
        f"{len(hits)} measured figures in comments or docstrings (the why stays, the figure goes to docs/design/):\n"
        + "\n".join(hits)
    )


def test_every_fnserve_path_named_in_comments_exists() -> None:
    hits = stale_references()
    assert not hits, f"{len(hits)} references to modules or files that do not exist:\n" + "\n".join(hits)


def test_the_patterns_see_measurements_and_pass_settings() -> None:
    measured = [
        "histogram observations cost ~14 µs in isolation",
        "it went 1.2 s -> 0.55 s",
        "66 -> 78 us of CPU a request",
        "served 10,600 requests/s against 12,600",
        "at 5,000 requests a second",
        "batches of 4.3 rows, and 15% fewer",
        "87% of the server's time",
        "about 3x less CPU a level",
        "2.5× the throughput",
        "a frozen dataclass costs four times as much to build",
        "a third of the loop's time",
        "one front process and half the throughput",
        "refusals p50 0.85-0.91 ms",
        "measured on digits at concurrency 16",
        "one worker reached 0.52-0.87x raw ORT capacity",
        "took 0.55 s",
        "10,000 jobs took 17-29 minutes to drain",
        "stopped for 15 ms",
        "past ~500 requests",
        "about 40k requests/s from one process",
    ]
    not_measured = [
        "Lambda's 6 MB payload limit",
        "SQS's 256 KiB message",
        "a 30 s timeout by default",
        "a 2 s ping budget",
        "polls every 0.1 s",
        "reads back off (50 ms doubling to 1 s)",
        "the counts are reused for 100 ms while no message comes",
        "a batch takes up to 2 s",
        "replaced 10 times a second",
        "the 95% confidence interval of their median",
        "the smallest slow-down worth refusing a model for (2%)",
        "ships in tritonclient's wheels up to 2.39",
        "float64 -> float32",
        "``5 minutes`` -> 300.0 seconds",
        "a heavy model adds about a quarter of a second to the start",
        "batches of 8 rows, 16 tokens a request",
    ]
    for sentence in measured:
        assert list(measurements(sentence)), sentence
    for sentence in not_measured:
        assert not list(measurements(sentence)), sentence


def test_a_literal_block_is_an_example_not_a_claim() -> None:
    lines = ["Shown as::", "", "    REPORT Duration: 41.20 ms", "", "After it, 3 ms measured."]
    kept = [line for _, line in prose(list(enumerate(lines)))]
    assert kept == ["Shown as::", "After it, 3 ms measured."]


def test_a_stale_module_path_is_seen() -> None:
    assert resolves("fnserve.core.codec.tensors.pack_arrays")
    assert resolves("fnserve.server.serve.serve")
    assert resolves("fnserve.observability")
    assert not resolves("fnserve.adapters.tracing")
    assert not resolves("fnserve.core.pooled")
    assert not resolves("fnserve.core.codec.tensors.no_such_name")


BACKTICKED = re.compile(r"``([a-z_][a-z0-9_]*)``")


def stale_package_docstrings() -> list[str]:
    """Each ``name`` a package's docstring shows alone: a module or package in it, or a name one of them binds
    (a package docstring is where a reader looks for what is in it)."""
    found = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        modules = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
        bound = set().union(*(bound_names(p) for p in package.glob("*.py")))
        for name in BACKTICKED.findall(doc):
            if name not in modules | bound | {package.name, "fnserve"}:
                found.append(f"{init.relative_to(PACKAGE.parent)}: ``{name}`` is not in the package")
    return found


def test_a_package_docstring_names_only_what_is_in_it() -> None:
    hits = stale_package_docstrings()
    assert not hits, "\n".join(hits)


TEST_FILE = re.compile(r"\btests/[\w/]+\.py\b")


def test_every_test_file_named_in_the_tests_exists() -> None:
    """A docstring or comment in the tests that points at another test file points at one that is there."""
    hits = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for named in TEST_FILE.findall(line):
                if not (REPO / named).is_file():
                    hits.append(f"{path.relative_to(REPO)}:{number}: {named}")
    assert not hits, "test files named that do not exist:\n" + "\n".join(hits)


def test_the_docstring_checks_see_what_is_gone() -> None:
    assert BACKTICKED.findall("``logs`` and ``lines`` (structured), ``fnserve serve``") == ["logs", "lines"]
    gone = "tests/functional/" + "test_no_such_file.py"  # spelled apart, so this file names no missing one
    assert TEST_FILE.findall(f"(the processes: {gone}).") == [gone]
