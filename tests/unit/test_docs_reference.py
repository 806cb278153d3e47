"""The generated pages (docs/reference/, docs/layout.md) match the code: hack/gen-docs.py
--check renders them from the programs' parsers, metric registries, contracts, docstrings
and import graph, and compares."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _generator() -> ModuleType:
    # hack/gen-docs.py is a script (its name has a dash): loaded from its file, registered
    # under a module name so its dataclasses resolve.
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "hack" / "gen-docs.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_are_current() -> None:
    generator = _generator()
    stale = generator.stale_pages()
    names = ", ".join(path.relative_to(ROOT).as_posix() for path in stale)
    assert not names, (
        f"stale generated documentation: {names}; regenerate with: {generator.REGENERATE}"
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('env.get("KUBELET_PORT", "10250")', ("KUBELET_PORT", "10250")),
        ('env.get("VKUBELET_POD_IP")', ("VKUBELET_POD_IP", "")),
        ('os.environ.get("POD_NAMESPACE", "")', ("POD_NAMESPACE", "")),
        ('os.environ["HOME"]', ("HOME", "")),
        ('os.getenv("MASTER_URI")', ("MASTER_URI", "")),
        ('settings.get("KUBELET_PORT")', ("", "")),  # not the environment
        ("env.get(name)", ("", "")),  # not a literal: cannot be documented
    ],
)
def test_environment_reads_are_found_in_the_source(source: str, expected: tuple[str, str]) -> None:
    node = ast.parse(source, mode="eval").body
    assert _generator()._env_access(node) == expected


@pytest.mark.parametrize(
    ("constant", "kind"),
    [
        ("NODE_LABEL", "label"),
        ("UPPER_UID_ANNOTATION", "annotation"),
        ("ANNOTATION", "annotation"),
        ("COPIED_ANNOTATIONS", "annotation"),
        ("CLUSTER_IP_ANNOTATION_PREFIX", "annotation prefix"),
        ("DEFAULT_TAINT_KEY", "taint"),
        ("NOT_READY_TAINT", "taint"),
        ("SCHEDULING_GATE", "scheduling gate"),
    ],
)
def test_marks_are_named_by_their_constant(constant: str, kind: str) -> None:
    generator = _generator()
    assert generator._MARK_NAME.search(constant if constant != "ANNOTATION" else "_ANNOTATION")
    assert generator._kind(constant) == kind


def test_a_mark_carries_the_docstring_under_its_constant(tmp_path: Path) -> None:
    module = tmp_path / "marks.py"
    module.write_text(
        'A_LABEL = "example.io/a"\n"""Who writes it."""\nB_ANNOTATION = "example.io/b"\n'
        'OTHER = "not a mark"\n"""Skipped."""\n'
    )
    marks = _generator()._marks(module)
    assert [(m.value, m.kind, m.doc) for m in marks] == [
        ("example.io/a", "label", "Who writes it."),
        ("example.io/b", "annotation", ""),
    ]


def test_docstring_text_stays_literal_in_the_layout_page() -> None:
    plain = _generator()._plain
    text = "up|down `a|b <c>` <upper>-x"
    assert plain(text) == "up|down `a|b <c>` &lt;upper>-x"
    assert plain(text, in_table=True) == "up\\|down `a|b <c>` &lt;upper>-x"


def test_a_generated_section_is_rendered_between_its_markers_only() -> None:
    generator = _generator()
    begin, end = generator._BEGIN.format(name="s"), generator._END.format(name="s")
    page = f"# Page\n\nhand-written\n\n{begin}\nstale\n{end}\nafter\n"
    rendered = generator.with_sections(page, {"s": lambda: "| fresh |"}, page="p.md")
    assert rendered == f"# Page\n\nhand-written\n\n{begin}\n\n| fresh |\n\n{end}\nafter\n"
    assert generator.with_sections(rendered, {"s": lambda: "| fresh |"}, page="p.md") == rendered
    with pytest.raises(ValueError, match=r"docs/p\.md: no generated section 's'"):
        generator.with_sections("# Page\n", {"s": lambda: ""}, page="p.md")


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        # What Go's time.Duration.String() prints for these (time.Second * 300 -> "5m0s").
        (0, "0s"),
        (0.0000005, "500ns"),
        (0.0000015, "1.5\u00b5s"),
        (0.3, "300ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (60.0, "1m0s"),
        (90.0, "1m30s"),
        (300.0, "5m0s"),
        (3600.0, "1h0m0s"),
        (14400.0, "4h0m0s"),
        (3723.25, "1h2m3.25s"),
        (-2.0, "-2s"),
    ],
)
def test_durations_are_written_as_go_writes_them(seconds: float, expected: str) -> None:
    assert _generator().go_duration(seconds) == expected


def test_the_flag_reference_writes_duration_defaults_as_go_does() -> None:
    flags = (ROOT / "docs" / "reference" / "flags.md").read_text()
    assert "| `--patrol-period` | `5m0s` | duration |" in flags
    assert "| `--streaming-connection-idle-timeout` | `4h0m0s` | duration |" in flags


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A long name breaks only after the punctuation between its parts.
        ("`pod-group.scheduling.sigs.k8s.io`",
         "<code>pod-group.<wbr>scheduling.<wbr>sigs.<wbr>k8s.<wbr>io</code>"),
        ("`tensile_workqueue_depth`", "<code>tensile_<wbr>workqueue_<wbr>depth</code>"),
        ("`short.name`", "`short.name`"),
        ("without A_CERT_LOCATION/A_KEY_LOCATION, e.g. this",
         "without A_CERT_LOCATION/<wbr>A_KEY_LOCATION, e.<wbr>g. this"),
        ("a | b", "a \\| b"),
        ("an `unpaired.backtick.in.text", "an `unpaired.backtick.in.text"),
        ("`<&>` in code", "`<&>` in code"),
        ("`a.very.long.name<with>&angles`",
         "<code>a.<wbr>very.<wbr>long.<wbr>name&lt;with&gt;&amp;angles</code>"),
    ],
)  # fmt: skip
def test_table_cells_let_long_names_break_only_between_their_parts(
    text: str, expected: str
) -> None:
    assert _generator()._cell(text) == expected


def _metric_labels() -> dict[str, set[str]]:
    """Every metric of docs/reference/metrics.md and its labels."""
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text().replace("<wbr>", "")
    found: dict[str, set[str]] = {}
    for name, labels in re.findall(
        r"^\| (?:<code>|`)(\w+)(?:</code>|`) \| \w+ \| ([^|]*) \|", text, re.M
    ):
        found.setdefault(name, set()).update(re.findall(r"`(\w+)`", labels))
    return found
