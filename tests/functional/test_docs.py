"""The docs site builds with mkdocs --strict (a broken link or anchor fails it), the README stays a short way in (a
working curl and "your own model" on its first screen, every page linked), and the reference pages say what the
code does: the CLI's options, the HTTP routes."""

from __future__ import annotations

import bisect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, load_module

README = (REPO / "README.md").read_text()


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_the_readme_is_a_short_way_in() -> None:
    lines = README.splitlines()
    assert len(lines) <= 200, len(lines)
    first_screen = "\n".join(lines[:80])
    assert "curl -s localhost:8080/v2/models/digits-accurate/infer" in first_screen
    assert "fnserve manifest add" in first_screen
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert all(not link.startswith(("http:", "https:", "../")) for link in links), links  # no way out of the repo
    for link in links:
        assert (REPO / link.split("#")[0]).exists(), link
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    linked = {Path(link.split("#")[0]).name for link in links}
    assert pages <= linked, f"pages the README does not lead to: {sorted(pages - linked)}"


def test_the_cli_reference_is_what_the_commands_print() -> None:
    module = load_module(REPO / "infra" / "docs" / "cli_reference.py", "cli_reference")
    written = (REPO / "docs" / "cli.md").read_text()
    assert written == module.reference(), "docs/cli.md is stale: run python infra/docs/cli_reference.py"
    assert "<bool>" not in written  # flags read as flags, not as typed values
    assert "## `fnserve manifest add`" in written and "--max-batch-size" in written


def expanded(route: str) -> set[str]:
    """A route as api.md writes it, optional parts in brackets, as the paths it stands for (parameters as ``{}``)."""
    inner = re.search(r"\[([^\[\]]*)\]", route)
    if inner is None:
        return {re.sub(r"\{[^}]*\}", "{}", route)}
    return expanded(route[: inner.start()] + route[inner.end() :]) | expanded(
        route[: inner.start()] + inner.group(1) + route[inner.end() :]
    )


def test_the_api_pages_route_table_is_the_apps_routes() -> None:
    from fnserve.adapters.http.app import create_app
    from fnserve.bootstrap import build_dataplane
    from fnserve.settings import Settings

    table = (REPO / "docs" / "api.md").read_text().split("| route | answer |", 1)[1].split("\n\n", 1)[0]
    documented = {
        (method, path)
        for row in table.splitlines()[2:]
        for method, route in re.findall(r"`(GET|POST|PUT|DELETE) ([^`]+)`", row.split("|")[1])
        for path in expanded(route)
    }
    settings = Settings(manifest=str(REPO / "layers" / "models" / "models" / "manifest.toml"))
    app = create_app(build_dataplane(settings), settings, metrics=lambda: b"").fastapi()
    served = {
        (method, re.sub(r"\{[^}]*\}", "{}", route.path.rstrip("/") or "/"))
        for route in getattr(app, "routes", [])
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    assert documented, "no routes found in docs/api.md's table"
    assert served - documented == set(), "routes the app serves that docs/api.md's table leaves out"
    assert documented - served == set(), "routes docs/api.md's table names that the app does not serve"


# What a user page must not tell: which commit a figure was measured on, the story of the runs behind it, or the
# machine it ran on. Those belong to the commit log and to docs/design/, where the figures that decided a design are
# kept with the command that measures them; a user page says what a reader can do, why, and the limits.
COMMIT = re.compile(r"(?<![=\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")  # a sha256 is too long
ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|\d+(?:st|nd|rd|th))"
)
DIARY = re.compile(
    "|".join(
        [
            rf"\b(?:the|a|an) {ORDINAL} (?:session|run|machine|H100|round)s?\b",  # "in the first run", "the sixth H100"
            r"\b(?:in |session )run [1-9]\b|\b(?:run|round) #\d+",  # run numbers ("run 889" is a count)
            r"\bsession \d+\b|\bthis session\b|device time|\blent\b",  # the machinery that ran it
            r"\bacross \w+ runs\b|\bthe run on\b|the run before it|\ba slow hour\b|by mistake|\(code of",
            r"\b(?:verified|checked|measured|tested|timed|built|ran|runs?) here\b|\bwas checked\b",  # "verified here"
            r"(?-i:\(Once )|\blast restructuring\b|\bbefore this change\b|\bpreviously\b|\bformerly\b",  # what it was
            r"\bbefore and after (?:the|this|it)\b",  # a before/after table of a change, not what quantize reports
            r"\b(?:it|they|we|fnserve|this|which|and) used to\b",  # "it used to", not "a field used to pick"
            r"(?<![\w.~-])/(?:work|home|root)/|/tmp/pytest",  # a machine's absolute paths
            r"\bin (?:this|an earlier|the last|that) run\b|\b(?:two|three|four|five|\d+) runs gave\b",  # a run's story
            r"\bmeasured on one\b|\bno figures yet\b|\bkept busy by\b",  # "measured on one H100", a sample session
        ]
    ),
    re.IGNORECASE,
)


def notebook_lines(pages: list[Path]) -> list[str]:
    """Every place in ``pages`` that names a commit in prose (outside a fenced code block) or tells a run diary, as
    page:line: what matched, in: the line. A phrase may run over a line break, as "in the\\n  first run" does."""
    found: list[str] = []
    for page in pages:
        name = page.relative_to(REPO) if page.is_relative_to(REPO) else page
        lines = page.read_text().splitlines()
        starts: list[int] = []
        flowed, fenced = "", False
        for line in lines:
            starts.append(len(flowed))
            flowed += line.strip() + " "
        for number, line in enumerate(lines, 1):
            fenced ^= line.lstrip().startswith(("```", "~~~"))
            if not fenced:
                found += [f"{name}:{number}: {m.group(0)!r} in: {line.strip()}" for m in COMMIT.finditer(line)]
        for match in DIARY.finditer(flowed):
            number = bisect.bisect_right(starts, match.start())
            found.append(f"{name}:{number}: {match.group(0)!r} in: {lines[number - 1].strip()}")
    return found


def test_no_user_page_names_a_commit_or_tells_a_run_diary() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # docs/design/ is where history may go
    found = notebook_lines(pages)
    assert not found, "user pages that read as a notebook:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "measured on 9bbf657",
        "the eighth session",
        "in run 2",
        "**Verified here, without Docker or an AWS account** (`make sam-check`):",
        "- **TensorRT has not run here.** The lent GPU machine has no TensorRT libraries (`libnvinfer`).",
        "  session across six runs; pick it for a CNN whose batch sizes change",
        "  0.99x for fp16 and 1.01x for ResNet-50 (0.81x to 1.03x in the\n  first run); with outputs bound to the host",
        "0.1 s may be missing from a scrape. (Once a second made the",
        "bounds both. Before and after the package was sorted by kind and the data plane given one entry:",
        "a figure from before the last restructuring",
        "the server answers 200 where it used to answer 500",
        "figures: /root/out/bench_gpu.json",
        "repository's MLP (2-core machine; three runs gave the same decision):",
        "## Measured on one H100",
        "- **TensorRT has no figures yet.** Its libraries",
        "On an H100, kept busy by a torch bf16 matmul loop, the scrape read",
        "prints that bound: the naive server's CPU over the drawn floor, 1.14x in this run).",
        "to 488 ms, and the floor's from 281 to 271 ms (423 ms in an earlier run the same day).",
    ],
)
def test_the_notebook_check_finds_what_it_is_for(line: str, tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("A user page.\n\n" + line + "\n")
    found = notebook_lines([page])
    assert found and all(f"{page}:3: " in place for place in found), found


@pytest.mark.parametrize(
    "line",
    [
        'sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"',
        "a field used to pick the model, which is used to route (once per process)",
        "a separate wrk run 889, -3.9%",
        "a test fails when they no longer match",
        "report size, latency and accuracy before and after.",
        "the demo models layer (`/opt/models`), and `/tmp` for downloads",
    ],
)
def test_the_notebook_check_leaves_plain_prose_alone(line: str) -> None:
    assert not COMMIT.search(line) and not DIARY.search(line), line


def test_every_page_names_the_region_variable_boto3_reads() -> None:
    """botocore takes the region from AWS_DEFAULT_REGION (AWS_REGION is what Lambda sets, for the SDKs of other
    languages): a page telling the reader to set AWS_REGION leaves fnserve, SAM and boto3 without one."""
    from botocore.configprovider import BOTOCORE_DEFAUT_SESSION_VARIABLES as variables

    assert variables["region"][1] == "AWS_DEFAULT_REGION"
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    told = [
        f"{page.name}:{n}"
        for page in pages
        if page.name != "settings.md"  # its table of what Lambda sets, read on Lambda for traces
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\bAWS_REGION\b", line)
    ]
    assert not told, told


def test_the_extras_page_lists_every_extra_once_and_no_page_installs_a_package_never_published() -> None:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = re.findall(r"^\| `([a-z]+)` \|", (REPO / "docs" / "install.md").read_text(), re.MULTILINE)
    assert sorted(rows) == sorted(extras) and len(rows) == len(set(rows)), "docs/install.md's table is not pyproject's"
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    published = [
        f"{p.name}:{n}"
        for p in pages
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"pip install ['\"]?fnserve\[", line)
    ]
    assert not published, f"no fnserve package is published: install from the checkout or its wheel: {published}"


def test_no_page_runs_two_tables_together() -> None:
    """A table pasted onto the end of another renders as one: a separator row (| --- |) only right under a header."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    joined = []
    for page in pages:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines[2:], 2):
            if re.fullmatch(r"\|(?:\s*:?-{3,}:?\s*\|)+", line.strip()) and lines[n - 2].lstrip().startswith("|"):
                joined.append(f"{page.relative_to(REPO)}:{n + 1}")
    assert not joined, f"a table's header inside another table: {joined}"
