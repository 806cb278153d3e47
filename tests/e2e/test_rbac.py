"""The RBAC manifests are enough: a virtual node with only those permissions does its job."""

from __future__ import annotations

import secrets
from pathlib import Path

from tests.e2e.helpers import (
    create,
    get,
    phase,
    pod,
    pod_manifest,
    token_kubeconfig,
    wait_for,
)
from vnode.testing.fleet import Fleet
from vnode.testing.vnodes import VirtualNodeProcess

MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"


def test_a_node_with_only_the_manifests_permissions_forwards_pods(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-rbac-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        upper_kubeconfig=token_kubeconfig(
            fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig"
        ),
        lower_kubeconfig=token_kubeconfig(
            fleet.lower, MANIFESTS / "lower-rbac.yaml", tmp_path / "lower-sa.kubeconfig"
        ),
    )
    node.start()
    try:
        create(
            upper,
            namespace,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cfg"},
                "data": {"v": "1"},
            },
        )
        create(
            upper,
            namespace,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runner"}},
        )
        manifest = pod_manifest("web", node=node.name)
        manifest["spec"]["serviceAccountName"] = "runner"
        manifest["spec"]["volumes"] = [{"name": "c", "configMap": {"name": "cfg"}}]
        create(upper, namespace, manifest)
        wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
        lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node.name}"
        wait_for("the lease", lambda: get(upper, lease), timeout=20)
        upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web")
        wait_for("gone upstairs", lambda: pod(upper, namespace, "web") is None)
        wait_for(
            "copies collected",
            lambda: get(lower, f"/api/v1/namespaces/{namespace}/configmaps/cfg") is None,
            timeout=20,
        )
        forbidden = [
            line
            for line in node.metrics().splitlines()
            if line.startswith("tensile_api_requests_total") and 'code="403"' in line
        ]
        assert forbidden == []
    finally:
        assert node.stop() == 0
        node.delete_node()
