"""The docs by reader (issue 33 §6): a short README that links every doc, links that lead somewhere, and every
command and option of the CLI documented in a doc the README links to."""

from __future__ import annotations

import re
from pathlib import Path

import typer

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 250
READER_DOCS = ("docs/USING.md", "docs/DEPLOYING.md", "docs/DEVELOPING.md", "docs/SIMULATING.md", "docs/MIGRATING.md",
               "docs/ARCHITECTURE.md", "benchmarks/RESULTS.md")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """Markdown without its code blocks: a `#` line in a shell block is no heading, a `](` in code no link."""
    return FENCE.sub("", text)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6} (.+)$", prose(path.read_text()), re.M):
        slug = github_anchor(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    text = INLINE_CODE.sub("", prose(path.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def test_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to a doc under docs/"


def test_readme_links_each_doc_by_reader_and_keeps_the_test_command():
    text = README.read_text()
    for doc in READER_DOCS:
        assert f"]({doc})" in text, doc
    assert re.search(r"^make test\b", text, re.M)  # CI (.ci/run) runs `make test`; the README shows it as is


def test_every_relative_link_in_the_readme_and_docs_leads_to_a_file_and_heading():
    broken = []
    for path in [README, *DOCS]:
        for target in relative_links(path):
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}: {target}"
            if not dest.exists():
                broken.append(f"{where}: no file {dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_matches_githubs_on_headings_with_code_and_punctuation():
    assert github_anchor("What happened to a message: `tpuq dead-letters`") == "what-happened-to-a-message-tpuq-dead-letters"
    assert github_anchor("Brakes: pause, drain, a daily budget, the grant's end") == (
        "brakes-pause-drain-a-daily-budget-the-grants-end")
    assert github_anchor("`--compare F1 F2`") == "--compare-f1-f2"
    assert github_anchor("Writing jobs: `job.yaml`") == "writing-jobs-jobyaml"


def test_every_cli_command_and_option_is_documented_where_the_readme_links():
    from tpuq.cli.app import app

    text = "\n".join(p.read_text() for p in [README, *DOCS])

    def walk(command, path: list[str]):  # typer may vendor its own click: read groups and options by their shape
        yield " ".join(path), command
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, [*path, name])

    walked, missing = [], []
    for name, command in walk(typer.main.get_command(app), ["tpuq"]):
        walked.append(name)
        if name not in text:
            missing.append(name)
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                missing += [f"{name} {o}" for o in param.opts if o.startswith("--") and o != "--help" and o not in text]
    assert {"tpuq submit", "tpuq fleet pause", "tpuq dev up"} <= set(walked), walked  # the walk reaches subcommands
    assert not missing, missing
