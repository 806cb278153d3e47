"""hack/lint-markdown.py finds the Markdown that Python-Markdown (mkdocs) renders otherwise
than it reads, and nothing else: each case below is rendered by Python-Markdown with the
site's extensions, and what the linter says must match what the renderer did (a list
ended early, a child made a sibling, a list renumbered from 1). The pages under docs/ are
clean."""

from __future__ import annotations

import functools
import importlib.util
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import markdown
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _linter() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lint_markdown", ROOT / "hack" / "lint-markdown.py"
    )
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _extensions() -> list[str]:
    """The site's Markdown extensions, as mkdocs.yml names them (options dropped)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    names = [e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    return [n for n in names if n != "toc"]


def _top_level(text: str) -> list[str]:
    """The tags of the rendered page's top-level elements (code blocks as 'code')."""
    html = markdown.markdown(text, extensions=_extensions())
    root = ET.fromstring(f"<root>{html}</root>")
    return ["code" if e.get("class") == "highlight" else e.tag for e in root]


def _rules(text: str) -> list[str]:
    return [p.rule for p in _linter().problems(text)]


FENCE3 = "1. a\n\n   ```sh\n   x\n   ```\n\n2. b\n"
FENCE4 = "1. a\n\n    ```sh\n    x\n    ```\n\n2. b\n"


@pytest.mark.parametrize(
    ("text", "rules", "rendered"),
    [
        # The install guide's fault: a fence indented 3 spaces ends the numbered list.
        (FENCE3, ["list-indent", "list-start"], ["ol", "code", "ol"]),
        (FENCE4, [], ["ol"]),
        ("1. a\n    ```sh\n    x\n    ```\n2. b\n", [], ["ol"]),
        ("1. a\n\n   more text\n\n2. b\n", ["list-indent", "list-start"], ["ol", "p", "ol"]),
        ("1. a\n\n    more text\n\n2. b\n", [], ["ol"]),
        ("1. a\nmore text\n2. b\n", [], ["ol"]),
        ("- a\n\n  ```sh\n  x\n  ```\n\n- b\n", ["list-indent"], ["ul", "code", "ul"]),
        (
            "1. a\n\n   | x | y |\n   |---|---|\n   | 1 | 2 |\n\n2. b\n",
            ["list-indent", "list-start"],
            ["ol", "table", "ol"],
        ),
        ("1. a\n\n    !!! note\n        hi\n\n2. b\n", [], ["ol"]),
        # A block at the margin ends the list on purpose; numbering on from 2 then does not.
        ("1. a\n\n```sh\nx\n```\n\n2. b\n", ["list-start"], ["ol", "code", "ol"]),
        ("1. a\n\n```sh\nx\n```\n\n1. b\n", [], ["ol", "code", "ol"]),
        ("2. a\n3. b\n", ["list-start"], ["ol"]),
        ("1. a\n    - b\n\n        ```sh\n        x\n        ```\n\n2. c\n", [], ["ol"]),
        # A fence's content is not Markdown.
        ("```md\n2. not a list\n   - x\n```\n", [], ["code"]),
        ("text\n\n    2. an indented code block\n", [], ["p", "code"]),
    ],
)
def test_the_linter_says_what_python_markdown_does(
    text: str, rules: list[str], rendered: list[str]
) -> None:
    assert _top_level(text) == rendered
    assert _rules(text) == rules


def test_a_child_indented_2_spaces_is_a_sibling() -> None:
    two, four = "- a\n  - b\n- c\n", "- a\n    - b\n- c\n"
    assert "<ul>" not in markdown.markdown(two).split("<li>a", 1)[1].split("</li>", 1)[0]
    assert "<ul>" in markdown.markdown(four).split("<li>a", 1)[1].split("</li>", 1)[0]
    assert _rules(two) == ["nested-indent"]
    assert _rules(four) == []


def test_a_pipe_escaped_in_a_table_code_span_keeps_its_backslash() -> None:
    row = '| a | b |\n|---|---|\n| `up{code=~"5..\\|429"}` | `x \\| y` in prose: \\| |\n'
    html = markdown.markdown(row, extensions=_extensions())
    assert '<code>up{code=~"5..\\|429"}</code>' in html  # the backslash stays
    assert "in prose: |" in html  # outside code it is an escape
    assert _rules(row) == ["table-pipe"]
    assert _rules("```\n| `a\\|b` |\n```\n") == []  # a fence is not a table


def test_a_problem_names_its_line_and_the_column_to_use() -> None:
    [problem, _] = _linter().problems(FENCE3)
    assert problem.line == 3
    assert "indent it 4 spaces past the marker (column 4)" in problem.message


def test_the_pages_are_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert _linter().main([]) == 0, capsys.readouterr().out
