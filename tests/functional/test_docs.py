"""The docs site builds with mkdocs --strict (a broken link or anchor fails it), the README stays a short way in (a
working curl and "your own model" on its first screen, every page linked), and the reference pages say what the
code does: the CLI's options, the HTTP routes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


# What a user page must not tell: which commit a figure was measured on, or the story of the runs behind it. Those
# belong to the commit log and to docs/design/, where the figures that decided a design are kept.
COMMIT = re.compile(r"(?<![=\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|\d+(?:st|nd|rd|th))"
)
DIARY = re.compile(
    rf"\b(?:(?:the|a|an) {ORDINAL} (?:session|run|machine|H100|round)s?\b|(?:in |session )run [1-9]\b|session \d+\b|"
    r"by mistake|this session|device time|a slow hour|\(code of|the run on|the run before it)",
    re.IGNORECASE,
)


def test_no_user_page_names_a_commit_or_tells_a_run_diary() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # docs/design/ is where history may go
    found = [
        f"{page.relative_to(REPO)}:{number}: {match.group(0)!r}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in [*COMMIT.finditer(line), *DIARY.finditer(line)]
    ]
    assert not found, "\n".join(found)
    assert COMMIT.search("measured on 9bbf657") and DIARY.search("the eighth session") and DIARY.search("in run 2")
