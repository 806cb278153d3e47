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

from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import get, wait_for
from vnode.providers.k2k import services

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


def warnings_about(
    client: RestClient, namespace: str, kind: str, name: str, *, node: str
) -> list[dict[str, Any]]:
    """The mirror's Warning Events (MirrorFailed) on upper object `kind` `name` from `node`."""
    events = client.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={
            "fieldSelector": (
                f"involvedObject.name={name},involvedObject.kind={kind},reason=MirrorFailed"
            )
        },
    )
    return [
        e
        for e in events.get("items") or []
        if (e.get("source") or {}).get("component") == f"{node}/service-mirror"
    ]


def provider_failure(client: RestClient, namespace: str, name: str) -> str | None:
    """The message of a pod the node refused (reason ProviderFailed), else None."""
    status = (get(client, f"/api/v1/namespaces/{namespace}/pods/{name}") or {}).get("status")
    status = status or {}
    return str(status.get("message")) if status.get("reason") == "ProviderFailed" else None


def endpoint_slice(name: str, *, service: str, managed_by: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {
                services.SERVICE_NAME_LABEL: service,
                services.MANAGED_BY_LABEL: managed_by,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def follow(
    upper: RestClient, lower: RestClient, namespace: str, name: str, *, replicas: int
) -> None:
    """Wait for `replicas` ready pods, for the upper EndpointSlices to list exactly them, and
    then for the lower slices to list them too, within 3 s of the upper ones (the mirror
    takes about 0.1 s, see the README's Benchmarks: 3 s catches a regression, not noise)."""
    ips = wait_for(
        f"{replicas} ready pods",
        lambda: (s := ready_pod_ips(upper, namespace, name)) and len(s) == replicas and s,
        timeout=60,
    )
    wait_for(
        f"{replicas} endpoints upstairs",
        lambda: endpoint_ips(slices_of(upper, namespace, name)) == ips,
        timeout=30,
    )
    wait_for(
        f"{replicas} endpoints below within 3 s of the upper slices",
        lambda: mirrored_ips(lower, namespace, name) == ips,
        timeout=3.0,
    )


def test_a_service_reaches_below_without_a_selector_and_its_endpoints_follow_scaling(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    """A node with ServiceControllers only, for this test's namespace only: the Service and
    its endpoints below, following scale up and down, a port change and the deletion;
    same-named lower objects of someone else never touched; nothing of a namespace outside
    --service-namespaces mirrored; a pod with a claim refused (no PVControllers)."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    suffix = secrets.token_hex(3)
    outside = f"outside-{suffix}"
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{suffix}",
        log_dir=tmp_path,
        args=[
            "--enable-controllers=ServiceControllers",
            # Two namespaces, so the node watches all and its selection does the filtering.
            f"--service-namespaces={namespace},listed-{suffix}",
            # test.example's slices are taken; intruder.example's (below) are not.
            "--endpointslice-managers=endpointslice-controller.k8s.io,test.example",
        ],
    )
    nodes.append(node.start())
    code, readiness = node.get("/readyz?verbose")
    assert code == 200
    assert "services_to_lower" in readiness
    assert "endpointslices_to_lower" in readiness
    assert "volume-provisioner" not in readiness
    assert "claims_to_lower" not in readiness

    # Someone else's objects below, of the same names as upper ones: never touched.
    services_path = f"/api/v1/namespaces/{namespace}/services"
    slices_path = SLICES.format(ns=namespace)
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "theirs"},
        "spec": {"ports": [{"port": 1}]},
    }
    lower.request("POST", services_path, body=theirs)
    lower.request(
        "POST",
        slices_path,
        body=endpoint_slice("theirs-1", service="theirs", managed_by="else.example", ip="10.0.0.1"),
    )
    upper.request(
        "POST",
        services_path,
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "theirs"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        },
    )
    upper.request(
        "POST",
        slices_path,
        body=endpoint_slice("theirs-1", service="theirs", managed_by="test.example", ip="10.1.1.1"),
    )
    # A slice written by hand by a manager the node does not take: its Service goes
    # below, the addresses it names never do.
    upper.request(
        "POST",
        services_path,
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "byhand"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        },
    )
    upper.request(
        "POST",
        slices_path,
        body=endpoint_slice(
            "byhand-1", service="byhand", managed_by="intruder.example", ip="10.2.2.2"
        ),
    )
    # A namespace outside --service-namespaces (upstairs only).
    upper.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": outside}},
    )
    try:
        upper.request("POST", f"/api/v1/namespaces/{outside}/services", body=service("web"))
        # Without PVControllers a pod with a claim is refused with the reason.
        upper.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            body={
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "with-claim"},
                "spec": {
                    "nodeName": node.name,
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    "containers": [{"name": "app", "image": "busybox"}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                },
            },
        )
        _mirrors_a_service_through_scaling(fleet, node, namespace)

        refused = wait_for(
            "the pod with a claim refused",
            lambda: provider_failure(upper, namespace, "with-claim"),
        )
        assert "PVControllers" in refused
        assert get(lower, f"/api/v1/namespaces/{namespace}/pods/with-claim") is None
        # The foreign objects were met (a Warning on each upper object), and left as they were.
        for kind, name in (("Service", "theirs"), ("EndpointSlice", "theirs-1")):
            event = wait_for(
                f"the conflict about {kind} {name}",
                lambda kind=kind, name=name: warnings_about(
                    upper, namespace, kind, name, node=node.name
                ),
            )[0]
            assert "exists in the target cluster" in event["message"]
        upper.request("DELETE", f"{services_path}/theirs")
        upper.request("DELETE", f"{slices_path}/theirs-1")
        wait_for("theirs gone upstairs", lambda: get(upper, f"{services_path}/theirs") is None)
        kept = get(lower, f"{services_path}/theirs")
        assert kept is not None
        assert [p["port"] for p in kept["spec"]["ports"]] == [1]
        assert ownership.NODE_LABEL not in (kept["metadata"].get("labels") or {})
        kept_slice = get(lower, f"{slices_path}/theirs-1")
        assert kept_slice is not None
        assert kept_slice["metadata"]["labels"][services.MANAGED_BY_LABEL] == "else.example"
        assert endpoint_ips([kept_slice]) == {"10.0.0.1"}
        # The hand-written slice stayed upstairs: the scaling above took seconds, and its
        # Service came below long ago (a copy would have followed in about 0.1 s).
        assert get(lower, f"{services_path}/byhand") is not None
        assert get(lower, f"{slices_path}/byhand-1") is None
        assert not slices_of(lower, namespace, "byhand")
        # Nothing of the namespace outside the selection came below.
        assert get(lower, f"/api/v1/namespaces/{outside}") is None
        assert not warnings_about(upper, outside, "Service", "web", node=node.name)
    finally:
        upper.request("DELETE", f"/api/v1/namespaces/{outside}")


def _mirrors_a_service_through_scaling(
    fleet: Fleet, node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    upper.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        body=deployment("web", replicas=3, nodes=[node.name]),
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
    assert ownership.is_owned(below, owner=node.owner)
    above = upper.request("GET", path)
    assert below["spec"]["clusterIP"] != above["spec"]["clusterIP"]
    key = services.cluster_ip_annotation(node.name)
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
    assert all(ownership.is_owned(s, owner=node.owner) for s in mirrored)
    assert all(not e.get("nodeName") for s in mirrored for e in s.get("endpoints") or [])

    scale(upper, namespace, "web", 5)
    follow(upper, lower, namespace, "web", replicas=5)
    scale(upper, namespace, "web", 2)
    follow(upper, lower, namespace, "web", replicas=2)

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


def test_headless_stays_headless_external_name_is_copied_and_conflicts_are_reported(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """Also: with the default selection (every namespace), kube-system's Services and the
    upper apiserver's own `default/kubernetes` are never mirrored."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    probe_name = f"probe-{secrets.token_hex(3)}"
    probe = f"/api/v1/namespaces/kube-system/services/{probe_name}"
    upper.request("POST", "/api/v1/namespaces/kube-system/services", body=service(probe_name))
    try:
        _headless_external_name_and_conflicts(fleet, virtual_node, namespace)
        # The node listed every Service at its start, and the conflict above came after
        # this one was made: both were looked at long ago.
        assert get(lower, probe) is None
        assert not slices_of(lower, "kube-system", probe_name)
        assert not warnings_about(upper, "default", "Service", "kubernetes", node=virtual_node.name)
        assert services.cluster_ip_annotation(virtual_node.name) not in (
            upper.request("GET", "/api/v1/namespaces/default/services/kubernetes")["metadata"].get(
                "annotations"
            )
            or {}
        )
        assert not ownership.is_owned(
            lower.request("GET", "/api/v1/namespaces/default/services/kubernetes"),
            owner=virtual_node.owner,
        )
    finally:
        upper.request("DELETE", probe)


def _headless_external_name_and_conflicts(
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
