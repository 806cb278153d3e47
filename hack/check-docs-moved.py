#!/usr/bin/env python3
"""Check that every fact-bearing paragraph of an old README lives somewhere under docs/.

    hack/check-docs-moved.py [--rev 5cdcb85] [--threshold 0.9]

The old README is read from git (`REV:README.md`) and cut into paragraphs (blank-line
blocks, each list item its own, code blocks whole); headings are skipped. A paragraph counts
as moved when at least `--threshold` of its 6-word shingles occur in the pages, after
Markdown is reduced to its words (links to their text, emphasis and line breaks dropped), so
a paragraph may be re-wrapped, split across headings, or have a "see X" turned into a link.
Prints each paragraph that is not found, with its coverage; exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHINGLE = 6
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_NOISE = re.compile(r"[*`#>|]")
DROPPED = {
    "What it does, and the choices made where tensile-kube went wrong:": (
        "the introduction of a list whose items are now pages and sections of their own"
    ),
}
"""Paragraphs left out on purpose, with the reason (printed, never counted as lost)."""


def words(markdown: str) -> list[str]:
    text = _LINK.sub(r"\1", markdown)
    text = _NOISE.sub(" ", text)
    tokens = (t.strip(".:,;()'\"") for t in re.findall(r"[\w./:=<>'\"()-]+", text.lower()))
    return [t for t in tokens if t]


def shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    if len(tokens) < SHINGLE:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + SHINGLE]) for i in range(len(tokens) - SHINGLE + 1)}


def paragraphs(markdown: str) -> list[str]:
    out: list[str] = []
    block: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            block.append(line)
            if not fenced:
                out.append("\n".join(block))
                block = []
            continue
        if fenced:
            block.append(line)
            continue
        starts_item = re.match(r"^\s*(- |\d+\. )", line) is not None
        if not line.strip() or line.startswith("#") or starts_item:
            if block:
                out.append("\n".join(block))
            block = [] if not starts_item else [line]
            continue
        block.append(line)
    if block:
        out.append("\n".join(block))
    return [p for p in out if len(words(p)) >= 4]


def main(argv: list[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    cli.add_argument("--rev", default="5cdcb85", help="the commit holding the old README")
    cli.add_argument("--threshold", type=float, default=0.9)
    args = cli.parse_args(argv)
    old = subprocess.run(
        ["git", "show", f"{args.rev}:README.md"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pages = sorted((ROOT / "docs").rglob("*.md"))
    corpus: set[tuple[str, ...]] = set()
    for page in pages:
        corpus |= shingles(words(page.read_text()))
    missing = 0
    checked = paragraphs(old)
    for paragraph in checked:
        if paragraph.strip() in DROPPED:
            print(f"--- left out on purpose ({DROPPED[paragraph.strip()]}):\n{paragraph}\n")
            continue
        mine = shingles(words(paragraph))
        coverage = len(mine & corpus) / len(mine)
        if coverage < args.threshold:
            missing += 1
            print(f"--- not found ({coverage:.0%} of it is on a page):\n{paragraph}\n")
    print(f"{len(checked) - missing} of {len(checked)} paragraphs of {args.rev}:README.md found")
    print(f"in {len(pages)} pages under docs/ (threshold {args.threshold:.0%})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
