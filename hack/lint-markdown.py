#!/usr/bin/env python3
"""Check the documentation's Markdown for what Python-Markdown (the parser of mkdocs) reads
differently from CommonMark, which the usual linters follow and which GitHub shows, so the
page looks right in an editor's preview and breaks on the site:

- `list-indent`: inside a list item, a block after a blank line (a fenced code block, a
  paragraph, a table) must be indented 4 spaces past the item's marker; indented 1 to 3
  (CommonMark's "to the item's text") it ends the list there, and the next item starts a
  new list numbered from 1 again (a numbered guide renders as 1, 1, 2, 1).
- `nested-indent`: a nested list item must be indented 4 spaces past its parent's marker;
  1 to 3 make it a sibling, not a child.
- `list-start`: a numbered list whose first item is not 1 renders as 1 (Python-Markdown
  ignores the number), which is almost always a list broken above it.
- `table-pipe`: in a table row, `\\|` inside a code span keeps its backslash on the page
  (CommonMark drops it), so a PromQL or regex copied from there is wrong; put such code in
  a code block below the table.

`hack/lint-markdown.py [FILE...]` (default: every page under docs/) prints one line per
problem, `path:line: [rule] message`, and exits 1 if there is any; `make lint` runs it.
Pure line scanning, no parsing library: it reads the lines as Python-Markdown's list and
fence processors do (tab length 4), and tests/unit/test_lint_markdown.py checks each rule
against what Python-Markdown really renders.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAB = 4
"""Python-Markdown's tab_length: the indentation that continues a list item."""

_ITEM = re.compile(r"^( *)([-*+]|(\d+)[.)])( +|$)")
_FENCE = re.compile(r"^( *)(`{3,}|~{3,})")


@dataclass(frozen=True)
class Problem:
    """One place Python-Markdown will render otherwise than the text reads."""

    line: int
    """1-based line number."""
    rule: str
    message: str


@dataclass
class _Item:
    column: int
    """Column of the item's marker."""
    ordered: bool


def _indent(line: str) -> int:
    expanded = line.expandtabs(TAB)
    return len(expanded) - len(expanded.lstrip(" "))


def problems(text: str) -> list[Problem]:
    """The problems of one page's Markdown `text`, in line order."""
    found: list[Problem] = []
    items: list[_Item] = []  # the open list items, outermost first
    fence: tuple[str, int] | None = None  # the open fence's character and length
    blank_before = True
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.expandtabs(TAB)
        if fence is not None:
            closing = re.match(r"^ *(`{3,}|~{3,}) *$", line)
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= fence[1]:
                fence = None
            continue
        if not line.strip():
            blank_before = True
            continue
        indent = _indent(line)
        item = _ITEM.match(line)
        opens = _FENCE.match(line)
        if not items and indent >= TAB and blank_before:
            blank_before = False  # an indented code block: nothing of a list in it
            continue
        if line.lstrip().startswith("|") and any("\\|" in c for c in _code_spans(line)):
            found.append(
                Problem(
                    number,
                    "table-pipe",
                    "a code span in a table row holds \\|: Python-Markdown (mkdocs) shows the "
                    "backslash, so what a reader copies is not what was meant; move the code "
                    "into a code block below the table",
                )
            )
        if item:
            _list_item(found, items, number, indent, item)
        elif items:
            _inside_item(found, items, number, indent, blank_before=blank_before)
        if opens:
            fence = (opens.group(2)[0], len(opens.group(2)))
        blank_before = False
    return found


def _code_spans(line: str) -> list[str]:
    """The contents of the code spans of one line (single or double backticks)."""
    return [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", line)]


def _list_item(
    found: list[Problem], items: list[_Item], number: int, indent: int, match: re.Match[str]
) -> None:
    ordered = match.group(3) is not None
    while items and indent < items[-1].column:
        items.pop()
    new_list = True
    if items:
        parent = items[-1]
        if indent == parent.column:
            items.pop()
            new_list = False
        elif indent < parent.column + TAB:
            found.append(
                Problem(
                    number,
                    "nested-indent",
                    f"a list item indented {indent - parent.column} spaces past the item "
                    f"above it is its sibling, not its child, in Python-Markdown (mkdocs): "
                    f"indent it {TAB} spaces past that item's marker (column "
                    f"{parent.column + TAB}) to nest it, or level with it",
                )
            )
            items.pop()
            new_list = False
    if new_list and ordered and int(match.group(3)) != 1:
        found.append(
            Problem(
                number,
                "list-start",
                f"a numbered list starting at {match.group(3)} renders as 1 in Python-Markdown "
                "(mkdocs), which ignores the number: the list above it was probably ended by "
                f"a block indented less than {TAB} spaces past its items' markers",
            )
        )
    items.append(_Item(column=indent, ordered=ordered))


def _inside_item(
    found: list[Problem], items: list[_Item], number: int, indent: int, *, blank_before: bool
) -> None:
    if not blank_before:
        return  # a lazy continuation of the item's paragraph
    while items and indent < items[-1].column + TAB:
        inner = items.pop()
        if not items and inner.column < indent:
            found.append(
                Problem(
                    number,
                    "list-indent",
                    f"this block is indented {indent - inner.column} spaces past the list "
                    f"item's marker: in Python-Markdown (mkdocs) that ends the list here (the "
                    f"next item starts a new list, numbered from 1); indent it {TAB} spaces "
                    f"past the marker (column {inner.column + TAB})",
                )
            )


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "docs").rglob("*.md"))
    count = 0
    for path in paths:
        shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        for problem in problems(path.read_text()):
            print(f"{shown}:{problem.line}: [{problem.rule}] {problem.message}")
            count += 1
    if count:
        print(f"{count} Markdown problem(s); see hack/lint-markdown.py for the rules")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
