"""Services and EndpointSlices across the boundary (ServiceControllers), on the real fleet:
the upper cluster's Deployment, Service and EndpointSlice controllers make the objects, the
virtual nodes mirror them into their lower clusters, the lower controllers leave them alone.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import get, wait_for
from vnode.providers.k2k import naming, services
from vnode.testing.fleet import Fleet
from vnode.testing.rest import ApiStatusError, RestClient
from vnode.testing.vnodes import VirtualNodeProcess

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
MERGE = "application/merge-patch+json"


def deployment(name: str, *, replicas: int, nodes: list[str]) -> dict[str, Any]:
    """A Deployment whose pods the upper scheduler may place only on `nodes`, spread evenly
    over them."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": {"app": name}},
                        }
                    ],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": nodes,
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "containers": [
                        {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 8080}]}
                    ],
                },
            },
        },
    }


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"tier": "front"}},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            **spec,
        },
    }


def scale(client: RestClient, namespace: str, name: str, replicas: int) -> None:
    client.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        body={"spec": {"replicas": replicas}},
        content_type=MERGE,
    )


def ready_pod_ips(client: RestClient, namespace: str, app: str) -> set[str]:
    pods = client.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"app={app}"}
    )
    result = set()
    for pod in pods.get("items") or []:
        status = pod.get("status") or {}
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []
        )
        if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            result.add(status["podIP"])
    return result


def slices_of(client: RestClient, namespace: str, name: str) -> list[dict[str, Any]]:
    found = client.request(
        "GET",
        SLICES.format(ns=namespace),
        query={"labelSelector": f"{services.SERVICE_NAME_LABEL}={name}"},
    )
    return list(found.get("items") or [])


def endpoint_ips(slices: list[dict[str, Any]]) -> set[str]:
    return {
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e.get("addresses") or []
    }


def mirrored_ips(lower: RestClient, namespace: str, name: str) -> set[str]:
    return endpoint_ips(
        [
            s
            for s in slices_of(lower, namespace, name)
            if s["metadata"]["labels"].get(services.MANAGED_BY_LABEL) == services.MANAGED_BY
        ]
    )


@pytest.fixture
def lower_2_namespace(fleet: Fleet, namespace: str) -> Iterator[str]:
    """`namespace`, removed from lower-2 afterwards (a virtual node over lower-2 makes it)."""
    try:
        yield namespace
    finally:
        try:
            fleet.cluster("lower-2").rest().request("DELETE", f"/api/v1/namespaces/{namespace}")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise


def test_a_service_reaches_below_without_a_selector_and_its_endpoints_follow_scaling(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    # Someone else's objects in the same lower namespace: never touched.
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "theirs"},
        "spec": {"ports": [{"port": 1}]},
    }
    lower.request("POST", f"/api/v1/namespaces/{namespace}/services", body=theirs)
    upper.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        body=deployment("web", replicas=3, nodes=[virtual_node.name]),
    )
    upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body=service("web"))
    ips = wait_for(
        "3 ready pods",
        lambda: (s := ready_pod_ips(upper, namespace, "web")) and len(s) == 3 and s,
        timeout=60,
    )

    path = f"/api/v1/namespaces/{namespace}/services/web"
    below = wait_for("the Service below", lambda: get(lower, path))
    assert "selector" not in below["spec"]
    assert below["spec"]["ports"][0]["port"] == 80
    assert below["spec"]["ports"][0]["name"] == "http"
    assert below["spec"]["type"] == "ClusterIP"
    assert below["metadata"]["labels"]["tier"] == "front"
    assert naming.is_owned(below, owner=virtual_node.owner)
    above = upper.request("GET", path)
    assert below["spec"]["clusterIP"] != above["spec"]["clusterIP"]
    key = services.cluster_ip_annotation(virtual_node.name)
    wait_for(
        "the lower ClusterIP recorded upstairs",
        lambda: (
            (upper.request("GET", path)["metadata"].get("annotations") or {}).get(key)
            == below["spec"]["clusterIP"]
        ),
    )
    wait_for("the 3 endpoints below", lambda: mirrored_ips(lower, namespace, "web") == ips)
    mirrored = [
        s
        for s in slices_of(lower, namespace, "web")
        if s["metadata"]["labels"].get(services.MANAGED_BY_LABEL) == services.MANAGED_BY
    ]
    assert all(naming.is_owned(s, owner=virtual_node.owner) for s in mirrored)
    assert all(not e.get("nodeName") for s in mirrored for e in s.get("endpoints") or [])

    scale(upper, namespace, "web", 5)
    ips = wait_for(
        "5 ready pods",
        lambda: (s := ready_pod_ips(upper, namespace, "web")) and len(s) == 5 and s,
        timeout=60,
    )
    wait_for("5 endpoints below", lambda: mirrored_ips(lower, namespace, "web") == ips, timeout=10)

    # A port change upstairs reaches the copy.
    upper.request(
        "PATCH",
        path,
        body={"spec": {"ports": [{"name": "http", "port": 81, "targetPort": 8080}]}},
        content_type=MERGE,
    )
    wait_for(
        "the port change below",
        lambda: (
            [p["port"] for p in (get(lower, path) or {}).get("spec", {}).get("ports", [])] == [81]
        ),
    )

    upper.request("DELETE", path)
    wait_for("the Service gone below", lambda: get(lower, path) is None)
    wait_for(
        "its slices gone below",
        lambda: (
            not mirrored_ips(lower, namespace, "web")
            and not [
                s
                for s in slices_of(lower, namespace, "web")
                if s["metadata"]["labels"].get(services.MANAGED_BY_LABEL) == services.MANAGED_BY
            ]
        ),
    )
    kept = get(lower, f"/api/v1/namespaces/{namespace}/services/theirs")
    assert kept is not None
    assert not naming.is_owned(kept, owner=virtual_node.owner)


def test_headless_stays_headless_external_name_is_copied_and_conflicts_are_reported(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    base = f"/api/v1/namespaces/{namespace}/services"
    taken = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "taken"},
        "spec": {"ports": [{"port": 9}]},
    }
    lower.request("POST", base, body=taken)
    upper.request("POST", base, body=service("db", clusterIP="None"))
    upper.request(
        "POST",
        base,
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "ext"},
            "spec": {"type": "ExternalName", "externalName": "example.com"},
        },
    )
    upper.request("POST", base, body=service("taken"))
    headless = wait_for("the headless Service below", lambda: get(lower, f"{base}/db"))
    assert headless["spec"]["clusterIP"] == "None"
    external = wait_for("the ExternalName Service below", lambda: get(lower, f"{base}/ext"))
    assert external["spec"]["type"] == "ExternalName"
    assert external["spec"]["externalName"] == "example.com"

    def conflict_event() -> dict[str, Any] | None:
        events = upper.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": "involvedObject.name=taken,involvedObject.kind=Service"},
        )
        return next(iter(events.get("items") or []), None)

    event = wait_for("a Warning on the upper Service", conflict_event)
    assert event["type"] == "Warning"
    assert f"Service {namespace}/taken exists in the target cluster" in event["message"]
    kept = get(lower, f"{base}/taken")
    assert kept is not None
    assert kept["spec"]["ports"][0]["port"] == 9


def test_each_virtual_node_gives_its_lower_cluster_the_service_with_every_endpoint(
    fleet: Fleet, lower_2_namespace: str, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    # `nodes` after `lower_2_namespace`: the nodes stop before lower-2's namespace goes.
    namespace = lower_2_namespace
    suffix = secrets.token_hex(3)
    for lower in ("lower", "lower-2"):
        node = VirtualNodeProcess(fleet, name=f"vn-{lower}-{suffix}", log_dir=tmp_path, lower=lower)
        nodes.append(node.start())
    upper = fleet.upper.rest()
    upper.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        body=deployment("api", replicas=4, nodes=[n.name for n in nodes]),
    )
    upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body=service("api"))
    ips = wait_for(
        "4 ready pods",
        lambda: (s := ready_pod_ips(upper, namespace, "api")) and len(s) == 4 and s,
        timeout=90,
    )
    placed = upper.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": "app=api"}
    )
    assert {p["spec"]["nodeName"] for p in placed["items"]} == {n.name for n in nodes}
    for lower in ("lower", "lower-2"):
        client = fleet.cluster(lower).rest()
        wait_for(
            f"the Service and all 4 endpoints in {lower}",
            lambda client=client: (
                get(client, f"/api/v1/namespaces/{namespace}/services/api") is not None
                and mirrored_ips(client, namespace, "api") == ips
            ),
        )


def test_a_service_being_deleted_leaves_and_brings_no_namespace_back(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    base = f"/api/v1/namespaces/{namespace}/services"
    held = service("held")
    held["metadata"]["finalizers"] = ["test.tensile.io/hold"]
    upper.request("POST", base, body=held)
    wait_for("the Service below", lambda: get(lower, f"{base}/held"))
    # Deleting it upstairs only marks it (the finalizer holds it): it stops serving there,
    # and its copy goes.
    upper.request("DELETE", f"{base}/held")
    going = f"going-{secrets.token_hex(3)}"
    try:
        wait_for("the copy gone", lambda: get(lower, f"{base}/held") is None)
        # An upper namespace being deleted whose lower namespace is gone already: held
        # Services in it never bring the lower namespace back.
        upper.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": going}},
        )
        stuck = service("stuck")
        stuck["metadata"]["finalizers"] = ["test.tensile.io/hold"]
        wait_for(
            "the default ServiceAccount",
            lambda: get(upper, f"/api/v1/namespaces/{going}/serviceaccounts/default"),
        )
        upper.request("POST", f"/api/v1/namespaces/{going}/services", body=stuck)
        wait_for("its namespace made below", lambda: get(lower, f"/api/v1/namespaces/{going}"))
        upper.request("DELETE", f"/api/v1/namespaces/{going}")
        lower.request("DELETE", f"/api/v1/namespaces/{going}")
        wait_for(
            "the lower namespace gone",
            lambda: get(lower, f"/api/v1/namespaces/{going}") is None,
            timeout=60,
        )
        time.sleep(3.0)
        assert get(lower, f"/api/v1/namespaces/{going}") is None
    finally:
        for path in (f"{base}/held", f"/api/v1/namespaces/{going}/services/stuck"):
            try:
                upper.request(
                    "PATCH", path, body={"metadata": {"finalizers": None}}, content_type=MERGE
                )
            except ApiStatusError as exc:
                if exc.code != 404:
                    raise
