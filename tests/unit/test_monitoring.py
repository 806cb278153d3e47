"""The alerts (charts/tensile/files/alerts.yaml) and the Grafana dashboards
(charts/tensile/files/dashboards/) name only metrics that exist, with labels they have; every
expression parses; every alert has its runbook and its promtool unit tests; the generated
monitoring files are current (hack/gen-monitoring.py).

Expressions are parsed with promql-parser (a maintained PromQL parser, pinned in
pyproject.toml); `make lint` also runs Prometheus's own promtool on them (hack/promtool-check.sh),
and so does the last test here when promtool is built.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import promql_parser
import pytest
import yaml

from devcluster import binaries

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts" / "tensile" / "files" / "alerts.yaml"
DASHBOARDS = ROOT / "charts" / "tensile" / "files" / "dashboards"
RUNBOOKS = ROOT / "docs" / "operations" / "alerts.md"
ALERT_TESTS = ROOT / "tests" / "alerts"

# Metrics of other programs the alerts and dashboards read, each from where it is defined.
FOREIGN = {
    # kube-state-metrics (docs/metrics/cluster/node-metrics.md, pod-metrics.md).
    "kube_node_info": {"node", "container_runtime_version"},
    "kube_node_status_condition": {"node", "condition", "status"},
    "kube_node_status_allocatable": {"node", "resource", "unit"},
    "kube_pod_info": {"namespace", "pod", "node"},
    "kube_pod_container_resource_requests": {"namespace", "pod", "node", "resource", "unit"},
    # The upper kube-apiserver (staging/src/k8s.io/apiserver/pkg/admission/metrics).
    "apiserver_admission_webhook_fail_open_count": {"name", "type"},
    "apiserver_admission_webhook_rejection_count": {"name", "type", "operation", "error_type"},
    # kube-scheduler (pkg/scheduler/metrics/metrics.go).
    "scheduler_schedule_attempts_total": {"result", "profile"},
}
# What a scrape adds to every series (Prometheus's instance and job, and the Prometheus
# Operator's target labels).
TARGET_LABELS = {"instance", "job", "namespace", "pod", "service", "container", "endpoint"}
# Which program serves the metrics of an alert group (the groups not named here hold the
# metrics every program has).
GROUP_PROGRAM = {
    "tensile-virtual-node": "virtual-node",
    "tensile-webhook": "tensile-webhook",
    "tensile-descheduler": "tensile-descheduler",
    "tensile-scheduler": "tensile-scheduler",
}


@functools.cache
def _load(script: str) -> ModuleType:
    # hack/*.py are scripts (their names have a dash): loaded from their files.
    name = script.replace("-", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / script)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def _exposed() -> dict[str, dict[str, set[str]]]:
    """Program -> metric name as scraped (a histogram's _bucket, _sum, _count) -> labels."""
    out: dict[str, dict[str, set[str]]] = {}
    for program, rows in _load("gen-docs.py")._metrics_by_program().items():
        names: dict[str, set[str]] = {}
        for row in rows:
            labels = set(row["labels"])
            if row["type"] == "histogram":
                names[f"{row['name']}_bucket"] = labels | {"le"}
                names[f"{row['name']}_sum"] = labels
                names[f"{row['name']}_count"] = labels
            else:
                names[str(row["name"])] = labels
        out[program] = names
    return out


def _alert_rules() -> Iterator[tuple[str, dict[str, Any]]]:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            yield group["name"], rule


def _dashboard_exprs() -> Iterator[tuple[str, str]]:
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                # Grafana's label_values(<selector>, <label>): the selector is PromQL.
                match = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"])
                assert match, variable["query"]
                yield f"{path.stem}: variable {variable['name']}", match.group(1)
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.stem}: {panel['title']}", target["expr"]


def _for_parsing(expr: str) -> str:
    # Grafana's variables: $__rate_interval stands where a duration goes; $node only inside
    # label values.
    return expr.replace("$__rate_interval", "5m")


def _expressions() -> list[tuple[str, str | None, str]]:
    """(where, program that serves its metrics or None, PromQL)."""
    out: list[tuple[str, str | None, str]] = [
        (f"alert {rule['alert']}", GROUP_PROGRAM.get(group), rule["expr"])
        for group, rule in _alert_rules()
    ]
    out += [(f"dashboard {where}", None, expr) for where, expr in _dashboard_exprs()]
    return out


def _selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Each vector selector of `expr`: (metric name, label names it matches on)."""
    found: list[tuple[str, set[str]]] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers}
            names = [m.value for m in node.matchers.matchers if m.name == "__name__"]
            found.append((node.name or names[0], labels - {"__name__"}))

    promql_parser.walk(promql_parser.parse(_for_parsing(expr)), visit)
    return found


@pytest.mark.parametrize(
    ("where", "program", "expr"), _expressions(), ids=[e[0] for e in _expressions()]
)
def test_every_metric_named_exists_with_its_labels(
    where: str, program: str | None, expr: str
) -> None:
    exposed = _exposed()
    selectors = _selectors(expr)
    assert selectors, f"{where}: no metric in {expr!r}"
    for name, labels in selectors:
        if name in FOREIGN:
            known = FOREIGN[name]
        else:
            servers = [p for p, names in exposed.items() if name in names]
            assert servers, f"{where}: {name} is in no program's metric registry"
            if program is not None:
                assert program in servers, f"{where}: {program} does not serve {name}"
            known = set().union(*(exposed[p][name] for p in servers))
        unknown = labels - known - TARGET_LABELS
        assert not unknown, f"{where}: {name} has no label {sorted(unknown)}"


def test_a_misspelt_metric_is_caught() -> None:
    """The check above can fail: a metric no registry holds is reported."""
    [(name, labels)] = _selectors('rate(tensile_workqueue_add_total{queue="x"}[5m])')
    assert name == "tensile_workqueue_add_total"
    assert labels == {"queue"}
    assert not any(name in names for names in _exposed().values())
    assert "tensile_workqueue_adds_total" in _exposed()["virtual-node"]


def test_the_dashboards_are_whole() -> None:
    """Each dashboard: its own uid, panel ids unique, every panel on the 24-column grid with
    the datasource variable, every query with a ref id."""
    uids = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] not in uids
        uids.add(board["uid"])
        assert board["templating"]["list"][0]["name"] == "datasource"
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (path.name, panel["title"])
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", (path.name, panel["title"])
            assert panel["targets"], (path.name, panel["title"])
            assert all(t["refId"] for t in panel["targets"]), (path.name, panel["title"])


def test_the_generated_monitoring_files_are_current() -> None:
    assert _load("gen-monitoring.py").main(["--check"]) == 0, "run `make monitoring-gen`"


def _runbook_anchors() -> set[str]:
    return {
        line.removeprefix("## ").strip().lower()
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }


def _tested_alerts() -> dict[str, set[bool]]:
    """Alert name -> whether its unit tests expect it to fire (True), not to (False), or both."""
    out: dict[str, set[bool]] = {}
    for path in sorted(ALERT_TESTS.glob("*.yaml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                out.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    return out


@pytest.mark.parametrize("name", sorted({rule["alert"] for _, rule in _alert_rules()}))
def test_every_alert_has_a_runbook_and_unit_tests_both_ways(name: str) -> None:
    rules = [rule for _, rule in _alert_rules() if rule["alert"] == name]
    anchor = name.lower()
    assert anchor in _runbook_anchors(), f"docs/operations/alerts.md has no section {name}"
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url.endswith(f"docs/operations/alerts.md#{anchor}"), url
        assert re.fullmatch(r"(critical|warning|info)", rule["labels"]["severity"])
    assert _tested_alerts().get(name) == {True, False}, (
        f"tests/alerts/ must hold a case where {name} fires and one where it does not"
    )


def test_promtool_checks_and_unit_tests_pass(tmp_path: Path) -> None:
    """promtool (built from the pinned Prometheus module) checks the rules, checks each
    dashboard expression as a recording rule, and runs tests/alerts/; `make lint` runs the
    same script."""
    found, _ = binaries.locate()
    if "promtool" not in found:
        pytest.skip("promtool is not built (`make promtool`); `make lint` builds and runs it")
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "promtool-check.sh"), str(found["promtool"])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
