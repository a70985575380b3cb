"""Every reference to a document in the repository resolves, so a moved or renamed section fails here.

Docs, docstrings and comments point into docs/*.md three ways: a Markdown link (``[x](deploy.md#anchor)``),
a plain path with an anchor (``docs/deploy.md#anchor``) and a path with a quoted section name
(``docs/BENCHMARKS.md, "Speaking rate"``). The first two must name an existing file and one of its
headings (GitHub's anchor of it); the quoted name must occur in that file, so a reader who searches for
it finds it. Restructuring BENCHMARKS.md (issue 21) broke none of them; this keeps it so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", ".venv", "out", "node_modules", "__pycache__", "shared", "streamvox.egg-info"}
SUFFIXES = {".md", ".py", ".js", ".html", ".sh", ".yaml", ".yml", ".toml", ".txt"}

LINK = re.compile(r"\]\(([^)\s]+?\.md)(#[^)\s]*)?\)")
PLAIN = re.compile(r"(?<![\w/.(-])((?:docs/)?[\w-]+\.md)(#[\w-]+)")
QUOTED = re.compile(r"((?:docs/)?[\w-]+\.md)\)?[,:]?\s*\(?[\"“']([^\"”'\n]{2,80})[\"”']")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (not of ``#`` lines inside code fences)."""
    found: set[str] = set()
    fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.*)", line)):
            base = anchor = slug(m.group(1))
            n = 1
            while anchor in found:  # GitHub numbers repeated headings
                anchor, n = f"{base}-{n}", n + 1
            found.add(anchor)
    return found


def source_files() -> list[Path]:
    out = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        out += [Path(folder) / n for n in names if Path(n).suffix in SUFFIXES or n == "Makefile"]
    return [p for p in out if p != Path(__file__).resolve()]  # this file's examples are not references


def _resolve(source: Path, target: str) -> Path | None:
    for candidate in (source.parent / target, ROOT / target, ROOT / "docs" / target):
        if candidate.is_file():
            return candidate
    return None


def test_every_document_reference_resolves() -> None:
    cache: dict[Path, tuple[str, set[str]]] = {}
    bad = []
    for source in source_files():
        for n, line in enumerate(source.read_text(errors="replace").splitlines(), 1):
            where = f"{source.relative_to(ROOT)}:{n}"
            for rx in (LINK, PLAIN, QUOTED):
                for m in rx.finditer(line):
                    target = m.group(1)
                    if "://" in target:
                        continue
                    path = _resolve(source, target)
                    if path is None:
                        bad.append(f"{where}: {target} does not exist")
                        continue
                    if path not in cache:
                        cache[path] = (path.read_text().lower(), anchors(path))
                    text, heads = cache[path]
                    if rx is QUOTED:
                        if m.group(2).lower() not in text:
                            bad.append(f"{where}: {m.group(2)!r} is not in {target}")
                    elif m.group(2) and m.group(2)[1:] not in heads:
                        bad.append(f"{where}: {target}{m.group(2)} is no heading of {target}")
    assert not bad, "\n".join(bad)


def test_the_anchor_rule_matches_githubs() -> None:
    assert slug("Engine v2: before → after (issue 13's bursts)") == "engine-v2-before--after-issue-13s-bursts"
    assert slug("Replicas: placement, drain (issue 14)") == "replicas-placement-drain-issue-14"
