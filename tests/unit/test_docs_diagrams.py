"""The documentation's diagrams (docs/assets/*.svg, drawn by hack/diagrams.py): each file
is well-formed SVG whose references resolve (an arrowhead's marker named without `url(#)`
is silently not drawn), each is shown on a page, and drawing refuses a picture that would
not read: text wider than its box, a box outside its frame or overlapping another, a label
over a box, an arrow ending on nothing. That the files are what hack/diagrams.py draws now
is checked with the other generated pages (tests/unit/test_docs_reference.py)."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "docs" / "assets"
SVG = "{http://www.w3.org/2000/svg}"


@functools.cache
def _diagrams() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diagrams", ROOT / "hack" / "diagrams.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def reference_problems(svg: str) -> list[str]:
    """What in an SVG text points at nothing: `url(#id)` and `href="#id"` without an element
    of that id, and marker attributes that are not `url(#id)` at all."""
    root = ET.fromstring(svg)
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    problems = []
    for element in root.iter():
        for name, value in element.attrib.items():
            if name in ("marker-start", "marker-mid", "marker-end") and not re.fullmatch(
                r"url\(#[^)]+\)", value
            ):
                problems.append(f"{name}={value!r} is not url(#id)")
            for target in re.findall(r"url\(#([^)]+)\)", value):
                if target not in ids:
                    problems.append(f"{name} refers to missing #{target}")
            if name.endswith("href") and value.startswith("#") and value[1:] not in ids:
                problems.append(f"{name} refers to missing {value}")
    return problems


SVGS = sorted(ASSETS.glob("*.svg"))


def test_every_diagram_is_a_file_and_every_file_a_diagram() -> None:
    assert {p.name for p in SVGS} == set(_diagrams().DIAGRAMS)


@pytest.mark.parametrize("path", SVGS, ids=lambda p: p.name)
def test_a_diagram_is_svg_whose_references_resolve(path: Path) -> None:
    text = path.read_text()
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg"
    assert root.find(f"{SVG}title") is not None, "an accessible title"
    assert reference_problems(text) == []
    arrows = [e for e in root.iter() if e.get("marker-end")]
    assert arrows, "arrows with heads"


def test_references_to_nothing_are_found() -> None:
    # The arrowheads of the architecture picture once named their marker bare.
    bad = (
        '<svg xmlns="http://www.w3.org/2000/svg"><defs><marker id="arrow"/></defs>'
        '<line marker-end="arrow"/><line marker-start="url(#arow)"/></svg>'
    )
    assert reference_problems(bad) == [
        "marker-end='arrow' is not url(#id)",
        "marker-start refers to missing #arow",
    ]


@pytest.mark.parametrize("path", SVGS, ids=lambda p: p.name)
def test_a_diagram_is_shown_on_a_page(path: Path) -> None:
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert f"assets/{path.name})" in pages


def _small() -> object:
    d = _diagrams()
    return d.Diagram(
        name="small.svg",
        title="t",
        width=400,
        height=200,
        frames=(d.Frame(key="f", x=10, y=10, w=380, h=180, title="cluster", style="upper"),),
        boxes=(
            d.Box(key="a", x=30, y=50, w=120, h=50, inside="f", lines=("one", "two")),
            d.Box(key="b", x=250, y=50, w=120, h=50, inside="f", lines=("three",)),
        ),
        arrows=(
            d.Arrow(points=((150, 75), (250, 75)), label=d.Label(x=200, y=120, lines=("calls",))),
        ),
    )


def test_a_small_diagram_draws() -> None:
    svg = _diagrams().render(_small())
    assert reference_problems(svg) == []
    assert 'marker-end="url(#arrow)"' in svg


def _with_box(diagram: object, key: str, **changes: object) -> object:
    boxes = tuple(
        dataclasses.replace(b, **changes) if b.key == key else b
        for b in diagram.boxes  # type: ignore[attr-defined]
    )
    return dataclasses.replace(diagram, boxes=boxes)  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: _with_box(d, "a", lines=("a title far too long for it",)), "does not fit box a"),
        (lambda d: _with_box(d, "a", lines=("1", "2", "3", "4")), "lines of box a do not fit"),
        (lambda d: _with_box(d, "b", x=275), "box b is not inside frame f"),
        (lambda d: _with_box(d, "b", x=100), "boxes a and b overlap"),
        (lambda d: _with_box(d, "a", y=170, h=40), "leaves the picture"),
        (lambda d: _with_box(d, "a", inside="g"), "inside no frame 'g'"),
        (
            lambda d: dataclasses.replace(
                d,
                arrows=(
                    _diagrams().Arrow(
                        points=((150, 75), (250, 75)),
                        label=_diagrams().Label(x=200, y=75, lines=("a label over both boxes",)),
                    ),
                ),
            ),
            "covers box",
        ),
        (
            lambda d: dataclasses.replace(
                d, arrows=(_diagrams().Arrow(points=((150, 75), (200, 75))),)
            ),
            "arrow 1 ends at (200, 75), on no box",
        ),
    ],
)
def test_a_diagram_that_would_not_read_is_refused(change: object, message: str) -> None:
    broken = change(_small())  # type: ignore[operator]
    with pytest.raises(_diagrams().DiagramError, match=re.escape(message)):
        _diagrams().render(broken)


def test_a_sequence_label_wider_than_its_gap_is_refused() -> None:
    d = _diagrams()
    lanes = (d.Lane(key="a", x=80, lines=("a",)), d.Lane(key="b", x=230, lines=("b",)))
    steps = (d.Step(source="a", target="b", lines=("a message far wider than the gap",)),)
    with pytest.raises(d.DiagramError, match="wider than the gap between a and b"):
        d.sequence(name="s.svg", title="t", width=320, lanes=lanes, steps=steps)


def test_text_is_measured_with_the_widest_font() -> None:
    d = _diagrams()
    assert d.text_width("mmmm", size=10) > d.text_width("iiii", size=10)
    assert d.text_width("kube", size=13, bold=True) > d.text_width("kube", size=13)
    with pytest.raises(d.DiagramError, match="no width known"):
        d.text_width("\u4e2d", size=10)
