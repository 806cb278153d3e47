"""What manifests/scheduler says: RBAC verb by verb (least privilege: any added right fails
here), Deployment flags the command accepts, and a kube-scheduler configuration whose
extender entry is the one the local fleet runs with (devcluster.components). That the
program needs nothing more than this RBAC is tests/e2e/test_scheduler.py (it runs with
this account's token)."""

from __future__ import annotations

from pathlib import Path

import yaml

from devcluster import components
from scheduler.cli import parse as scheduler_flags
from tests.unit.test_manifests import documents, grants, one, verbs

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"


def test_the_extender_may_only_list_and_watch_nodes_and_keep_the_quota_slices() -> None:
    role = one("scheduler", "ClusterRole", "tensile-scheduler")
    assert grants(role) == verbs(
        "/nodes: list watch",
        "/resourcequotas: list watch",  # the quota slices (docs/slices.md)
        "/pods: list watch",
        "/namespaces: list watch patch",
        "/events: create patch",
    )
    assert not [d for d in documents("scheduler") if d["kind"] in ("Role", "RoleBinding")]


def test_the_deployment_flags_parse() -> None:
    deployment = one("scheduler", "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    settings = scheduler_flags(container["args"])
    assert settings.server.port == 8443
    assert settings.policy.headroom == 0.1


def test_the_kube_scheduler_configuration_matches_the_fleets() -> None:
    shipped = yaml.safe_load((MANIFESTS / "kube-scheduler-config.yaml").read_text())
    fleet = yaml.safe_load(
        components.scheduler_configuration(
            kubeconfig=Path("/k"), url="https://127.0.0.1:1", ca=Path("/ca")
        )
    )
    [ours], [theirs] = shipped["extenders"], fleet["extenders"]
    for key in ("filterVerb", "prioritizeVerb", "nodeCacheCapable", "ignorable", "weight"):
        assert ours[key] == theirs[key], key
    assert ours["ignorable"] is True
    assert ours["nodeCacheCapable"] is True
