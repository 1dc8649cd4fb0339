"""The docs cannot rot apart: every relative link in README.md, SECURITY.md, docs/*.md and
tests/README.md points to a file of the repository that exists, and a link to a heading of our own
markdown (``runs.md#into-the-run``, ``#metrics``) to a heading that exists, named as GitHub names
its anchors. Links inside code (fenced blocks, `spans`) are text, not links, and are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def our_docs(root: Path = ROOT) -> list[Path]:
    """The markdown a newcomer reads, whose links this test holds."""
    return [
        root / "README.md",
        root / "SECURITY.md",
        *sorted((root / "docs").glob("*.md")),
        root / "tests" / "README.md",
    ]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower-cased, without
    punctuation, spaces as hyphens (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = "".join(c for c in text.lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a markdown file has: its headings' (a repeated one gets -1, -2...) and the
    explicit ``<a id=...>`` ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(path.read_text()):
        if m := HEADING.match(line):
            base = slug(m[2])
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(path: Path) -> list[str]:
    """The targets of the links and images of a markdown file, outside code."""
    out: list[str] = []
    for line in prose_lines(path.read_text()):
        line = CODE_SPAN.sub("", line)
        out += INLINE_LINK.findall(line)
        if m := REFERENCE.match(line):
            out.append(m[1])
    return out


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    """One line per link that points nowhere: ``docs/runs.md: images/x.png (no such file)``."""
    problems: list[str] = []
    cache: dict[Path, set[str]] = {}
    for doc in files:
        name = doc.relative_to(root)
        for target in links(doc):
            if SCHEME.match(target):  # https:, mailto: ...: not ours to check
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.is_relative_to(root):
                problems.append(f"{name}: {target} (outside the repository)")
            elif not dest.exists():
                problems.append(f"{name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                have = cache.setdefault(dest, anchors(dest))
                if anchor not in have:
                    problems.append(f"{name}: {target} (no heading #{anchor} there)")
    return problems


def test_every_relative_link_of_our_docs_points_to_a_file_and_heading_that_exist() -> None:
    files = our_docs()
    missing = [str(f.relative_to(ROOT)) for f in files if not f.exists()]
    assert not missing, f"docs this test holds are gone: {missing}"
    problems = broken_links(files)
    assert not problems, "links that point nowhere:\n" + "\n".join(problems)


def test_the_readme_links_every_docs_page() -> None:
    """The README's "where to read on" reaches every page of docs/ (a page no one links is a page
    no one finds)."""
    linked = {
        (ROOT / t.partition("#")[0]).resolve()
        for t in links(ROOT / "README.md")
        if not SCHEME.match(t)
    }
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


# the checker itself, on files made for it


def test_a_missing_file_a_missing_heading_and_a_link_out_of_the_repository_are_found(
    tmp_path: Path,
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "images").mkdir()
    (tmp_path / "docs" / "images" / "a.png").write_bytes(b"")
    (tmp_path / "docs" / "runs.md").write_text(
        "# Runs and snapshots\n\n## Into the run\n\n### `tether exec`, `shell` and more!\n"
        '\n## Logs\n\n## Logs\n\n<a id="kept"></a>\n'
    )
    (tmp_path / "README.md").write_text(
        "![ok](docs/images/a.png) ![gone](docs/images/b.png)\n"
        "[ok](docs/runs.md#into-the-run) [ok](docs/runs.md#tether-exec-shell-and-more)\n"
        "[ok](docs/runs.md#logs-1) [ok](docs/runs.md#kept) [ok](#readme)\n"
        "[stale](docs/runs.md#unattended-stops) [gone](docs/cli.md) [out](../elsewhere.md)\n"
        "[web](https://example.com/x.md#nothing) `[code](nowhere.md)`\n"
        "\n# Readme\n\n```md\n[in a fence](nowhere.md)\n```\n"
    )
    problems = broken_links([tmp_path / "README.md"], root=tmp_path)
    assert problems == [
        "README.md: docs/images/b.png (no such file)",
        "README.md: docs/runs.md#unattended-stops (no heading #unattended-stops there)",
        "README.md: docs/cli.md (no such file)",
        "README.md: ../elsewhere.md (outside the repository)",
    ]


def test_anchors_are_named_as_github_names_them() -> None:
    assert slug("Post-mortem: a crash waits for you") == "post-mortem-a-crash-waits-for-you"
    assert (
        slug("Where tether's adapter behaves differently from debugpy's, on purpose")
        == "where-tethers-adapter-behaves-differently-from-debugpys-on-purpose"
    )
    assert (
        slug(
            "Commands, shells and forwarded ports in the run (`tether exec`, `shell`, `port-forward`)"
        )
        == "commands-shells-and-forwarded-ports-in-the-run-tether-exec-shell-port-forward"
    )
    assert slug("A worker's disk") == "a-workers-disk"
    assert slug("Runs: **queued** → [paused](x.md)") == "runs-queued--paused"
