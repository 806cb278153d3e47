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
from tests.e2e.helpers import create, get, pod_manifest, token_kubeconfig, wait_for
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
            # Only test.example's slices are considered; intruder.example's (below) are not.
            "--endpointslice-managers=endpointslice-controller.k8s.io,test.example",
        ],
    )
    nodes.append(node.start())
    # Ready at start; on a loaded machine a check may flip for a moment (a lower ping late).
    readiness = _ready(node)
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
    # A slice written by hand by a manager the node does not consider: its Service goes
    # below, the slice never does.
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
        # The foreign Service was met (a Warning on the upper one), and left as it was; the
        # upper slice of that Service does not cross at all (its Service below is not ours).
        event = wait_for(
            "the conflict about Service theirs",
            lambda: warnings_about(upper, namespace, "Service", "theirs", node=node.name),
        )[0]
        assert "exists in the target cluster" in event["message"]
        assert not warnings_about(upper, namespace, "EndpointSlice", "theirs-1", node=node.name)
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
    # Pods came and went while their slices changed: every endpoint was verified, none
    # told dropped (a pod the node's cache shows a moment after its slice is no drop).
    dropped = upper.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={"fieldSelector": "reason=EndpointsDropped"},
    )
    assert not dropped.get("items")


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


# -- what crosses with a Service's endpoints (issue 31) -----------------------------------

FORGED_IP = "10.99.0.1"
"""An address no upper pod has (a hand-written endpoint's choice)."""
DROPPED = "EndpointsDropped"
"""Reason of the Event telling which endpoints of an upper EndpointSlice stayed upstairs."""


def selectorless(name: str) -> dict[str, Any]:
    """A Service without a selector: its endpoints are whatever slices name it."""
    body = service(name)
    del body["spec"]["selector"]
    return body


def copies_of(lower: RestClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The lower EndpointSlices of Service `name` a virtual node made (its managed-by value)."""
    return [
        s
        for s in slices_of(lower, namespace, name)
        if (s["metadata"].get("labels") or {}).get(services.MANAGED_BY_LABEL) == services.MANAGED_BY
    ]


def all_ips(slices: list[dict[str, Any]]) -> set[str]:
    """Every address of `slices`, ready or not."""
    return {a for s in slices for e in s.get("endpoints") or [] for a in e.get("addresses") or []}


def events_of(
    client: RestClient, namespace: str, kind: str, name: str, reason: str
) -> list[dict[str, Any]]:
    found = client.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={
            "fieldSelector": (
                f"involvedObject.name={name},involvedObject.kind={kind},reason={reason}"
            )
        },
    )
    return list(found.get("items") or [])


def pod_ip(client: RestClient, namespace: str, name: str) -> str | None:
    status = (get(client, f"/api/v1/namespaces/{namespace}/pods/{name}") or {}).get("status")
    return (status or {}).get("podIP")


def test_the_lower_clusters_own_service_keeps_only_its_own_endpoints(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """Traffic hijack: the lower cluster has its own Service `payments` with its own
    endpoints; a tenant's upper Service `payments` selects the tenant's pod on the virtual
    node. The Service copy is refused (the name is taken below), and so are its slices:
    the lower Service keeps only the endpoints of the lower cluster."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    services_path = f"/api/v1/namespaces/{namespace}/services"
    own = pod_manifest("payments-own", node="unused")
    own["spec"].pop("nodeSelector")
    create(lower, namespace, own)
    lower.request("POST", services_path, body=service("payments", selector={"app": "payments-own"}))
    own_ips = wait_for(
        "the lower Service's own endpoints",
        lambda: endpoint_ips(slices_of(lower, namespace, "payments")),
        timeout=60,
    )

    create(upper, namespace, pod_manifest("payments", node=virtual_node.name))
    upper.request("POST", services_path, body=service("payments"))
    # The same pod behind a Service whose name is free below: its slice crossing shows the
    # node has handled the slices of this namespace.
    upper.request("POST", services_path, body=service("marker", selector={"app": "payments"}))
    ip = wait_for("the tenant's pod IP", lambda: pod_ip(upper, namespace, "payments"), timeout=60)
    wait_for(
        "the tenant's endpoint upstairs",
        lambda: endpoint_ips(slices_of(upper, namespace, "payments")) == {ip},
        timeout=60,
    )
    wait_for(
        "the marker's endpoint below", lambda: mirrored_ips(lower, namespace, "marker") == {ip}
    )
    wait_for(
        "the name taken reported on the upper Service",
        lambda: warnings_about(upper, namespace, "Service", "payments", node=virtual_node.name),
    )
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        below = slices_of(lower, namespace, "payments")
        made = [
            s["metadata"]["name"]
            for s in below
            if ownership.same_cluster(s, owner=virtual_node.owner)
        ]
        assert not made, f"the tenant's slices {made} were copied beside the lower Service's own"
        assert all_ips(below) == own_ips
        time.sleep(0.2)


def test_slice_copies_go_when_their_service_copy_is_no_longer_ours(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    """Copies already below are deleted once the Service copy is someone else's: here the
    lower administrator took the name while the node was stopped."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    nodes.append(node.start())
    services_path = f"/api/v1/namespaces/{namespace}/services"
    create(upper, namespace, pod_manifest("ledger", node=node.name))
    upper.request("POST", services_path, body=service("ledger"))
    ip = wait_for("the pod IP", lambda: pod_ip(upper, namespace, "ledger"), timeout=60)
    wait_for("the endpoint below", lambda: mirrored_ips(lower, namespace, "ledger") == {ip})

    assert node.stop() == 0, f"virtual-node exited non-zero; log {node.log}"
    lower.request("DELETE", f"{services_path}/ledger")
    wait_for("the copy gone", lambda: get(lower, f"{services_path}/ledger") is None)
    lower.request("POST", services_path, body=selectorless("ledger"))
    node.start()
    wait_for(
        "the name taken reported",
        lambda: warnings_about(upper, namespace, "Service", "ledger", node=node.name),
    )
    wait_for("the slice copies deleted", lambda: not copies_of(lower, namespace, "ledger"))
    theirs = get(lower, f"{services_path}/ledger")
    assert theirs is not None
    assert not ownership.same_cluster(theirs, owner=node.owner)


def test_a_forged_manager_label_carries_no_address_below(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """Forged slices: a hand-written EndpointSlice labelled as the EndpointSlice
    controller's, of a selector-less Service no administrator named, with an address of
    the writer's choice. The Service crosses; no address does, and the slice gets an
    Event saying why."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body=selectorless("forged"))
    upper.request(
        "POST",
        SLICES.format(ns=namespace),
        body=endpoint_slice(
            "forged-1", service="forged", managed_by="endpointslice-controller.k8s.io", ip=FORGED_IP
        ),
    )
    wait_for(
        "the Service copy",
        lambda: get(lower, f"/api/v1/namespaces/{namespace}/services/forged"),
    )
    copied = wait_for(
        "the slice copy", lambda: get(lower, f"{SLICES.format(ns=namespace)}/forged-1")
    )
    assert FORGED_IP not in all_ips([copied]), "the forged address crossed"
    [event] = wait_for(
        "the Event on the slice",
        lambda: events_of(upper, namespace, "EndpointSlice", "forged-1", DROPPED),
    )
    assert event["type"] == "Warning"
    assert FORGED_IP in event["message"]
    assert "--selectorless-services" in event["message"]
    assert FORGED_IP not in all_ips(copies_of(lower, namespace, "forged"))


def test_an_administrator_named_selectorless_service_crosses_as_written(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    """--selectorless-services names the selector-less Services whose hand-written
    endpoints the administrator vouches for: theirs cross as written, any other's do not."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--selectorless-services={namespace}/external"],
    )
    nodes.append(node.start())
    for name, ip in (("external", "10.99.0.7"), ("other", FORGED_IP)):
        upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body=selectorless(name))
        upper.request(
            "POST",
            SLICES.format(ns=namespace),
            body=endpoint_slice(f"{name}-1", service=name, managed_by="staff.example", ip=ip),
        )
    wait_for(
        "the named Service's endpoint below",
        lambda: mirrored_ips(lower, namespace, "external") == {"10.99.0.7"},
    )
    wait_for(
        "the Event on the other slice",
        lambda: events_of(upper, namespace, "EndpointSlice", "other-1", DROPPED),
    )
    assert not all_ips(copies_of(lower, namespace, "other"))
    assert not events_of(upper, namespace, "EndpointSlice", "external-1", DROPPED)


def test_a_selected_pods_address_crosses_and_an_unverified_endpoint_is_dropped(
    fleet: Fleet, virtual_node: VirtualNodeProcess, running_pod: str, namespace: str
) -> None:
    """The normal path: a Service selecting a forwarded pod gets its slice below with the
    pod's address. Endpoints of a hand-written slice of the same Service cross only where
    their targetRef is a pod the Service selects and the address is that pod's; the others
    are dropped, with one Event on the slice naming them."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body=service(running_pod))
    ip = wait_for("the pod IP", lambda: pod_ip(upper, namespace, running_pod))
    wait_for("the endpoint below", lambda: mirrored_ips(lower, namespace, running_pod) == {ip})
    uid = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/{running_pod}")["metadata"][
        "uid"
    ]
    ref = {"kind": "Pod", "name": running_pod, "namespace": namespace, "uid": uid}
    extra = endpoint_slice("extra", service=running_pod, managed_by="someone.example", ip=ip)
    extra["endpoints"] = [
        {"addresses": [ip], "conditions": {"ready": True}, "targetRef": ref},
        {"addresses": ["10.99.0.2"], "conditions": {"ready": True}, "targetRef": ref},
        {"addresses": ["10.99.0.3"], "conditions": {"ready": True}},
    ]
    upper.request("POST", SLICES.format(ns=namespace), body=extra)
    [event] = wait_for(
        "the Event on the slice",
        lambda: events_of(upper, namespace, "EndpointSlice", "extra", DROPPED),
    )
    assert event["type"] == "Warning"
    assert "10.99.0.2" in event["message"]
    assert "10.99.0.3" in event["message"]
    copied = get(lower, f"{SLICES.format(ns=namespace)}/extra")
    assert copied is not None
    assert all_ips([copied]) == {ip}


# -- Ingresses (--enable-ingress) ------------------------------------------------------------

INGRESSES = "/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses"
MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"


def ingress(
    name: str, *, klass: str, backends: tuple[str, ...], tls: str | None = None, **annotations: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "ingressClassName": klass,
        "rules": [
            {
                "host": f"{name}.example",
                "http": {
                    "paths": [
                        {
                            "path": f"/{b}",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": b, "port": {"number": 80}}},
                        }
                        for b in backends
                    ]
                },
            }
        ],
    }
    if tls is not None:
        spec["tls"] = [{"hosts": [f"{name}.example"], "secretName": tls}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


def test_an_ingress_is_copied_with_its_class_mapped_and_tls_secret_and_refused_otherwise(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    """--enable-ingress: an Ingress whose backend is the node's Service copy goes below with
    its class mapped, its TLS Secret and only the allowed annotations; the address the lower
    ingress controller writes in its status comes back up. The fleet runs no ingress
    controller: the test writes the lower Ingress's status.loadBalancer as one would. An
    unmapped class gets a Warning Event and no copy; an Ingress whose backend is the lower
    cluster's own Service of that name (the copy refused) is never copied, and a copy
    already below goes once its backends include such a Service. The node runs with the
    shipped grants: upper-rbac.yaml with upper-rbac-ingress.yaml, lower-rbac.yaml."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    name = f"vn-{secrets.token_hex(3)}"
    fleet.upper.kubectl("apply", "-f", str(MANIFESTS / "upper-rbac-ingress.yaml"))
    node = VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=tmp_path,
        upper_kubeconfig=token_kubeconfig(
            fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper.kubeconfig", node=name
        ),
        lower_kubeconfig=token_kubeconfig(
            fleet.lower, MANIFESTS / "lower-rbac.yaml", tmp_path / "lower.kubeconfig"
        ),
        args=[
            "--enable-controllers=ServiceControllers",
            f"--service-namespaces={namespace}",
            "--enable-ingress",
            "--ingress-class-map=public=tenants",
            "--lower-ingress-annotations=example.com/*",
        ],
    )
    nodes.append(node.start())
    # Ready at start; on a loaded machine a check may flip for a moment (a lower ping late).
    readiness = _ready(node)
    assert "ingresses_to_lower" in readiness
    services_path = f"/api/v1/namespaces/{namespace}/services"
    secrets_path = f"/api/v1/namespaces/{namespace}/secrets"
    ingresses_path = INGRESSES.format(ns=namespace)
    upper.request("POST", services_path, body=service("web"))
    upper.request(
        "POST",
        secrets_path,
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "web-tls"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
        },
    )
    upper.request(
        "POST",
        ingresses_path,
        body=ingress(
            "site",
            klass="public",
            backends=("web",),
            tls="web-tls",
            **{"example.com/rewrite": "/", "other.io/snippet": "deny all"},
        ),
    )
    copy = wait_for(
        "the Ingress copied below", lambda: get(lower, f"{ingresses_path}/site"), timeout=60
    )
    assert copy["spec"]["ingressClassName"] == "tenants"
    assert ownership.is_owned(copy, owner=node.owner)
    copied = copy["metadata"].get("annotations") or {}
    assert copied.get("example.com/rewrite") == "/"
    assert "other.io/snippet" not in copied
    assert copy["spec"]["tls"][0]["secretName"] == "web-tls"
    tls = get(lower, f"{secrets_path}/web-tls")
    assert tls is not None, "the TLS Secret was not copied below"
    assert ownership.is_owned(tls, owner=node.owner)
    assert tls["data"] == {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}

    # What a lower ingress controller would write (the fleet runs none).
    address = {"ip": "192.0.2.10", "ports": [{"port": 443, "protocol": "TCP"}]}
    lower.request(
        "PATCH",
        f"{ingresses_path}/site/status",
        body={"status": {"loadBalancer": {"ingress": [address]}}},
        content_type=MERGE,
    )
    wait_for(
        "the lower address upstairs",
        lambda: (
            ((get(upper, f"{ingresses_path}/site") or {}).get("status") or {})
            .get("loadBalancer", {})
            .get("ingress")
            == [address]
        ),
        timeout=30,
    )

    # An unmapped class: not copied, and told.
    upper.request(
        "POST", ingresses_path, body=ingress("internal", klass="internal", backends=("web",))
    )
    told = wait_for(
        "the unmapped class told",
        lambda: events_of(upper, namespace, "Ingress", "internal", "IngressNotCopied"),
        timeout=60,
    )
    assert "class internal is not mapped" in told[0]["message"]
    assert get(lower, f"{ingresses_path}/internal") is None

    # The lower cluster's own Service `payments`: the tenant's Service copy is refused, and
    # an Ingress naming it never crosses.
    lower.request("POST", services_path, body=service("payments"))
    upper.request("POST", services_path, body=service("payments"))
    upper.request(
        "POST", ingresses_path, body=ingress("pay", klass="public", backends=("payments",))
    )
    told = wait_for(
        "the foreign backend told",
        lambda: events_of(upper, namespace, "Ingress", "pay", "IngressNotCopied"),
        timeout=60,
    )
    assert "backend Service payments is not this tenant's copy below" in told[0]["message"]
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert get(lower, f"{ingresses_path}/pay") is None, "an Ingress routing to their Service"
        time.sleep(0.2)

    # The copied Ingress gains a path to `payments`: its copy goes, and its TLS Secret's.
    site = get(upper, f"{ingresses_path}/site")
    assert site is not None
    site["spec"]["rules"][0]["http"]["paths"].append(
        {
            "path": "/pay",
            "pathType": "Prefix",
            "backend": {"service": {"name": "payments", "port": {"number": 80}}},
        }
    )
    upper.request("PUT", f"{ingresses_path}/site", body=site)
    wait_for("the copy deleted", lambda: get(lower, f"{ingresses_path}/site") is None, timeout=30)
    wait_for(
        "the TLS Secret's copy collected",
        lambda: get(lower, f"{secrets_path}/web-tls") is None,
        timeout=30,
    )
    theirs = get(lower, f"{services_path}/payments")
    assert theirs is not None
    assert not ownership.same_cluster(theirs, owner=node.owner)


# -- which upper pods a node caches ----------------------------------------------------------

ENDPOINT_PODS = 'tensile_informer_cached_objects{informer="upper-endpoint-pods"}'


def _endpoint_pods_cached(node: VirtualNodeProcess) -> int:
    for line in node.metrics().splitlines():
        if line.startswith(ENDPOINT_PODS + " "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"{ENDPOINT_PODS} is not among the node's metrics")


def _steady(node: VirtualNodeProcess) -> int:
    """The cached count once it held for 2 s (earlier tests' namespaces may still be going)."""
    last, since = _endpoint_pods_cached(node), time.monotonic()
    deadline = since + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _endpoint_pods_cached(node)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 2:
            return last
    raise AssertionError("the node's upper endpoint pod cache never held still for 2 s")


def test_only_pods_of_namespaces_with_a_selecting_service_are_cached(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """The upper pods the EndpointSlice mirror verifies endpoints against are watched only in
    namespaces holding a Service with a selector: pods elsewhere cost the node nothing
    (the watch was cluster-wide: every node decoded every upper pod's every change). A
    namespace joins with its first such Service, whose endpoints then cross, and leaves with
    its last."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    # Pending pods (no node has their label): never terminal, so the cache would take them.
    parked = {"nodeSelector": {"tensile.io/no-such-node": "true"}}
    for i in range(3):
        create(upper, namespace, pod_manifest(f"idle-{i}", node=virtual_node.name, spec=parked))
    before = _steady(virtual_node)
    # A Service selecting nothing that exists yet brings the namespace's pods in.
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        body={**service("front"), "spec": {**service("front")["spec"], "selector": {"x": "y"}}},
    )
    wait_for(
        "the namespace's pods cached", lambda: _endpoint_pods_cached(virtual_node) >= before + 3
    )
    # Its endpoints cross as before.
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body=service("web"))
    ip = wait_for("the pod IP", lambda: pod_ip(upper, namespace, "web"))
    wait_for("the endpoint below", lambda: mirrored_ips(lower, namespace, "web") == {ip})
    # The last selecting Service gone, the namespace's pods leave the cache.
    cached = _endpoint_pods_cached(virtual_node)
    for name in ("front", "web"):
        upper.request("DELETE", f"/api/v1/namespaces/{namespace}/services/{name}")
    wait_for(
        "the pods gone from the cache", lambda: _endpoint_pods_cached(virtual_node) <= cached - 4
    )


def _ready(node: VirtualNodeProcess) -> str:
    """The node's verbose /readyz text, once it answers 200."""

    def answer() -> str | None:
        code, text = node.get("/readyz?verbose")
        return text if code == 200 else None

    return wait_for("the node's /readyz to answer 200", answer)
