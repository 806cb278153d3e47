"""The RBAC manifests are enough: a virtual node with only those permissions does its job,
with both --enable-controllers (Services mirrored, claims provisioned) as by default."""

from __future__ import annotations

import secrets
from pathlib import Path

from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import (
    create,
    get,
    phase,
    pod,
    pod_manifest,
    token_kubeconfig,
    wait_for,
)
from vnode.providers.k2k import services, volumes

MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"


def test_a_node_with_only_the_manifests_permissions_forwards_pods(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    # The node mirrors every upper namespace's Services. While an earlier test's namespace
    # is still being deleted below, a copy made there is answered 403 by NamespaceLifecycle
    # (content in a terminating namespace; the mirror waits it out, logging nothing): a 403
    # that is no RBAC denial, so the count of 403s below starts once none is left.
    wait_for("no namespace terminating below", lambda: not _terminating(lower), timeout=90)
    name = f"vn-rbac-{secrets.token_hex(3)}"
    node = VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=tmp_path,
        upper_kubeconfig=token_kubeconfig(
            fleet.upper,
            MANIFESTS / "upper-rbac.yaml",
            tmp_path / "upper-sa.kubeconfig",
            node=name,
        ),
        lower_kubeconfig=token_kubeconfig(
            fleet.lower, MANIFESTS / "lower-rbac.yaml", tmp_path / "lower-sa.kubeconfig"
        ),
    )
    node.start()
    storage_class = f"rbac-{secrets.token_hex(3)}"
    upper.request(
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        body={
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": storage_class},
            "provisioner": volumes.PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
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
        # A Service: mirrored below, its lower ClusterIP recorded upstairs.
        upper.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/services",
            body={
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
            },
        )
        service_path = f"/api/v1/namespaces/{namespace}/services/web"
        below = wait_for("the Service below", lambda: get(lower, service_path))
        key = services.cluster_ip_annotation(node.name)
        wait_for(
            "the lower ClusterIP upstairs",
            lambda: (
                (get(upper, service_path) or {}).get("metadata", {}).get("annotations", {}).get(key)
                == below["spec"]["clusterIP"]
            ),
        )
        # A claim of a class of ours: provisioned (lower claim, upper PV), then reclaimed.
        claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
        upper.request(
            "POST",
            claims,
            body={
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        with_claim = pod_manifest("db", node=node.name)
        with_claim["spec"]["volumes"] = [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
        ]
        create(upper, namespace, with_claim)
        bound = wait_for(
            "the claim bound upstairs",
            lambda: (
                (c := get(upper, f"{claims}/data"))
                and c.get("status", {}).get("phase") == "Bound"
                and c
            ),
            timeout=60,
        )
        wait_for("the claim below", lambda: get(lower, f"{claims}/data"))
        wait_for("the pod below", lambda: pod(lower, namespace, "db"))
        upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/db")
        wait_for("db gone upstairs", lambda: pod(upper, namespace, "db") is None, timeout=60)
        upper.request("DELETE", f"{claims}/data")
        volume = f"/api/v1/persistentvolumes/{bound['spec']['volumeName']}"
        wait_for("the claim gone below", lambda: get(lower, f"{claims}/data") is None, timeout=60)
        wait_for("the volume reclaimed", lambda: get(upper, volume) is None, timeout=60)
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
        try:
            upper.request("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{storage_class}")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise


def _terminating(client: RestClient) -> list[str]:
    """The names of the namespaces being deleted in `client`'s cluster."""
    found = client.request("GET", "/api/v1/namespaces")
    return [
        ns["metadata"]["name"]
        for ns in found.get("items") or []
        if (ns.get("status") or {}).get("phase") == "Terminating"
    ]
