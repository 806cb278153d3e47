"""What manifests/scheduler says: RBAC verb by verb (least privilege: any added right fails
here), Deployment flags the command accepts, and a kube-scheduler configuration whose
extender entry is the one the local fleet runs with (devcluster.components). That the
program needs nothing more than this RBAC is tests/e2e/test_scheduler.py (it runs with
this account's token)."""

from __future__ import annotations

from pathlib import Path

import yaml

from devcluster import components
from devcluster.pki import KeyPair
from scheduler.cli import parse as scheduler_flags
from tests.unit.test_manifests import documents, grants, one, verbs

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"


def test_the_extender_may_only_list_and_watch_nodes_and_keep_the_quota_slices() -> None:
    role = one("scheduler", "ClusterRole", "tensile-scheduler")
    assert grants(role) == verbs(
        "/nodes: list watch",
        "/resourcequotas: list watch patch",  # the quota slices' record (docs/slices.md)
        "/pods: list watch",
        "/events: create patch",
        # Who may read its /metrics.
        "authentication.k8s.io/tokenreviews: create",
        "authorization.k8s.io/subjectaccessreviews: create",
    )
    assert not [d for d in documents("scheduler") if d["kind"] in ("Role", "RoleBinding")]


def test_the_deployment_flags_parse() -> None:
    deployment = one("scheduler", "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    settings = scheduler_flags(container["args"])
    assert settings.server.port == 8443
    assert settings.policy.headroom == 0.1
    # callers present a client certificate; probes (none) reach /healthz and /readyz on the
    # HTTPS port, and nothing is served over plain HTTP
    assert settings.server.client_ca_file == "/etc/tensile/client-ca/ca.crt"
    assert settings.callers.client_certificates
    assert settings.server.metrics_addr == ""
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
        assert container[probe]["httpGet"]["port"] == "https"


def test_the_kube_scheduler_configuration_matches_the_fleets() -> None:
    shipped = yaml.safe_load((MANIFESTS / "kube-scheduler-config.yaml").read_text())
    fleet = yaml.safe_load(
        components.scheduler_configuration(
            kubeconfig=Path("/k"),
            url="https://127.0.0.1:1",
            ca=Path("/ca"),
            client=KeyPair(cert=Path("/c.crt"), key=Path("/c.key")),
        )
    )
    [ours], [theirs] = shipped["extenders"], fleet["extenders"]
    for key in ("filterVerb", "prioritizeVerb", "nodeCacheCapable", "ignorable", "weight"):
        assert ours[key] == theirs[key], key
    # kube-scheduler presents a client certificate in both
    assert set(ours["tlsConfig"]) == set(theirs["tlsConfig"]) == {"caFile", "certFile", "keyFile"}
    assert ours["ignorable"] is True
    assert ours["nodeCacheCapable"] is True
