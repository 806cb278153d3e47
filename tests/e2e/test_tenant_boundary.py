"""What a tenant may do below (issue 22, sections 1 to 3), on real clusters: Service exposure
(copies are ClusterIP unless --lower-service-types allows more), priority classes (mapped or
dropped, never `system-*`), and the lower cluster's own admission on the namespaces tensile
makes (--lower-namespace-labels/-annotations with PodTolerationRestriction and
PodNodeSelector enabled on the session fleet's lower-2).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, delete_if_present, get, phase, pod, pod_manifest, wait_for
from tests.fixtures import create_namespace, delete_namespace
from vnode.providers.k2k import services

WIDE = "--lower-service-types=ClusterIP,NodePort,LoadBalancer"
INTERNAL = "networking.example.com/load-balancer-internal"
PINNED = "metallb.universe.tf/loadBalancerIPs"
"""A tenant's annotation pinning an address of the lower network: never copied unless named."""
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def _events(client: RestClient, namespace: str, kind: str, name: str, reason: str) -> list[Any]:
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


def _restart_with(node: VirtualNodeProcess, *args: str) -> None:
    """Stop `node` and start it again with `args` in place of the ones it had."""
    assert node.stop() == 0, f"virtual-node exited non-zero; log {node.log}"
    base = [
        a
        for a in node.argv
        if not a.startswith(("--lower-service-types", "--lower-service-annotations"))
    ]
    node.argv = [*base, *args]
    node.start()  # a new process of the new command line (`restart` runs the old one)


def _exposed(name: str) -> dict[str, Any]:
    """An internal, source-restricted LoadBalancer, as a tenant on a cloud writes one."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "annotations": {INTERNAL: "true", PINNED: "192.0.2.50"},
        },
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            "loadBalancerSourceRanges": ["10.0.0.0/8"],
            "loadBalancerClass": "example.com/internal",
            "externalTrafficPolicy": "Local",
            "allocateLoadBalancerNodePorts": True,
        },
    }


def test_service_copies_are_cluster_ip_unless_the_lower_cluster_takes_their_type(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    nodes.append(node)
    node.start()
    base = f"/api/v1/namespaces/{namespace}/services"
    upper.request("POST", base, body=_exposed("lb"))
    node_port = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "np"},
        "spec": {"type": "NodePort", "ports": [{"port": 81, "nodePort": 31081}]},
    }
    upper.request("POST", base, body=node_port)

    # Default: ClusterIP below, nothing of the exposure, one Warning upstairs.
    lb = wait_for("the LoadBalancer's copy below", lambda: get(lower, f"{base}/lb"))
    np = wait_for("the NodePort's copy below", lambda: get(lower, f"{base}/np"))
    for copy in (lb, np):
        assert copy["spec"]["type"] == "ClusterIP", copy["spec"]
        assert not any(p.get("nodePort") for p in copy["spec"]["ports"])
    assert "loadBalancerSourceRanges" not in lb["spec"]
    assert INTERNAL not in lb["metadata"]["annotations"]
    for name in ("lb", "np"):
        event = wait_for(
            f"the narrowing Warning on {name}",
            lambda n=name: _events(upper, namespace, "Service", n, "ServiceTypeNarrowed"),
        )[0]
        assert event["type"] == "Warning"
        assert "--lower-service-types=ClusterIP" in event["message"], event["message"]
    # An edit makes the mirror look again: still one Event, counted once.
    upper.request(
        "PATCH",
        f"{base}/lb",
        body={"metadata": {"labels": {"edited": "yes"}}},
        content_type="application/merge-patch+json",
    )
    wait_for(
        "the edit below",
        lambda: (get(lower, f"{base}/lb") or {})["metadata"]["labels"].get("edited") == "yes",
    )
    [event] = _events(upper, namespace, "Service", "lb", "ServiceTypeNarrowed")
    assert event.get("count", 1) == 1

    # The lower cluster takes every type: the same copies become them, in place, with
    # what restricts the exposure and the annotations it names (not the pinned address);
    # the node ports are the lower cluster's own.
    _restart_with(node, WIDE, f"--lower-service-annotations={INTERNAL}")

    def widened() -> dict[str, Any] | None:
        found = get(lower, f"{base}/lb")
        return found if found and found["spec"]["type"] == "LoadBalancer" else None

    lb_wide = wait_for("the LoadBalancer below", widened)
    assert lb_wide["metadata"]["uid"] == lb["metadata"]["uid"]
    spec = lb_wide["spec"]
    assert spec["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert spec["loadBalancerClass"] == "example.com/internal"
    assert spec["externalTrafficPolicy"] == "Local"
    annotations = lb_wide["metadata"]["annotations"]
    assert annotations[INTERNAL] == "true"
    assert PINNED not in annotations
    np_wide = wait_for(
        "the NodePort below",
        lambda: (f := get(lower, f"{base}/np")) and f["spec"]["type"] == "NodePort" and f,
    )
    assert np_wide["metadata"]["uid"] == np["metadata"]["uid"]
    assert all(p.get("nodePort") for p in np_wide["spec"]["ports"])

    # And back: narrowed in place, exposure fields and copied annotations gone.
    _restart_with(node)
    lb_back = wait_for(
        "the LoadBalancer narrowed again",
        lambda: (f := get(lower, f"{base}/lb")) and f["spec"]["type"] == "ClusterIP" and f,
    )
    assert lb_back["metadata"]["uid"] == lb["metadata"]["uid"]
    assert "loadBalancerSourceRanges" not in lb_back["spec"]
    assert "loadBalancerClass" not in lb_back["spec"]
    assert not any(p.get("nodePort") for p in lb_back["spec"]["ports"])
    kept = lb_back["metadata"]["annotations"]
    assert INTERNAL not in kept
    assert services.COPIED_ANNOTATIONS not in kept


@pytest.fixture
def priority_classes(fleet: Fleet) -> Iterator[Callable[[RestClient, str, int], str]]:
    """Make PriorityClasses (cluster-scoped; removed afterwards)."""
    made: list[tuple[RestClient, str]] = []

    def make(client: RestClient, name: str, value: int) -> str:
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        client.request("POST", PRIORITY_CLASSES, body=body)
        made.append((client, name))
        return name

    try:
        yield make
    finally:
        for client, name in made:
            delete_if_present(client, f"{PRIORITY_CLASSES}/{name}")


def test_priority_classes_go_below_only_when_mapped_and_never_system_ones(
    fleet: Fleet,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
    namespace: str,
    priority_classes: Callable[[RestClient, str, int], str],
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    tag = secrets.token_hex(3)
    high = priority_classes(upper, f"tenant-high-{tag}", 1000)
    low = priority_classes(upper, f"tenant-low-{tag}", 10)
    gold = priority_classes(lower, f"lower-gold-{tag}", 500)
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{tag}",
        log_dir=tmp_path,
        args=(f"--priority-class-map={high}={gold}",),
    )
    nodes.append(node)
    node.start()
    for name, cls in (("mapped", high), ("critical", "system-cluster-critical"), ("plain", low)):
        create(
            upper,
            namespace,
            pod_manifest(name, node=node.name, spec={"priorityClassName": cls}),
        )
    for name in ("mapped", "critical", "plain"):
        wait_for(f"{name} Running", lambda n=name: phase(upper, namespace, n) == "Running")
    below = {n: (pod(lower, namespace, n) or {})["spec"] for n in ("mapped", "critical", "plain")}
    assert below["mapped"]["priorityClassName"] == gold
    assert below["mapped"]["priority"] == 500
    for name in ("critical", "plain"):
        assert "priorityClassName" not in below[name], below[name]
        assert below[name].get("priority", 0) == 0
    for name, cls in (("critical", "system-cluster-critical"), ("plain", low)):
        [event] = _events(upper, namespace, "Pod", name, "PriorityClassNotMapped")
        assert cls in event["message"]
        assert "default priority" in event["message"]
    assert not _events(upper, namespace, "Pod", "mapped", "PriorityClassNotMapped")
    # An update below (a label) is a sync of its own: still one Event.
    upper.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/plain",
        body={"metadata": {"labels": {"edited": "yes"}}},
        content_type="application/merge-patch+json",
    )
    wait_for(
        "the label below",
        lambda: (
            ((pod(lower, namespace, "plain") or {}).get("metadata") or {})
            .get("labels", {})
            .get("edited")
            == "yes"
        ),
    )
    [event] = _events(upper, namespace, "Pod", "plain", "PriorityClassNotMapped")
    assert event.get("count", 1) == 1


# What the lower administrator allows tenants: the virtual node's own toleration, the
# NoExecute ones the apiserver adds (not-ready, unreachable), memory pressure (added by
# PodTolerationRestriction itself to pods that are not BestEffort), and their own taint.
WHITELIST = [
    {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
    {"operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "tenants", "effect": "NoSchedule"},
]
NODE_SELECTOR = "kubernetes.io/os=linux"
"""The namespace's node selector (PodNodeSelector): every kwok node has it, so pods still
run, and the lower pods show it merged in."""


def _tolerating(name: str, *, node: str, value: str) -> dict[str, Any]:
    manifest = pod_manifest(name, node=node)
    manifest["spec"]["tolerations"].append(
        {"key": "dedicated", "operator": "Equal", "value": value, "effect": "NoSchedule"}
    )
    return manifest


def test_the_lower_admission_governs_tenants_in_the_namespaces_tensile_makes(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    """On the session fleet's lower-2, whose apiserver runs PodTolerationRestriction and
    PodNodeSelector (tests/fixtures.py SESSION_FLEET), as a lower administrator confining
    tenants would; the lower namespace is made by the node, before the flags are given."""
    upper, lower = fleet.upper.rest(), fleet.cluster("lower-2").rest()
    namespace = create_namespace((fleet.upper,), prefix="admitted")
    node = VirtualNodeProcess(
        fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path, lower="lower-2"
    )
    nodes.append(node)
    node.start()
    try:
        # Made before the administrator's flags: the lower namespace lacks their marks.
        create(upper, namespace, pod_manifest("early", node=node.name))
        wait_for("early Running", lambda: phase(upper, namespace, "early") == "Running")
        assert node.stop() == 0
        node.argv += [
            "--lower-namespace-labels=tenancy.example.com/tier=tenants",
            "--lower-namespace-annotations="
            f"scheduler.alpha.kubernetes.io/tolerationsWhitelist={json.dumps(WHITELIST)},"
            f"scheduler.alpha.kubernetes.io/node-selector={NODE_SELECTOR}",
        ]
        node.start()  # a new process of the new command line (`restart` runs the old one)
        create(upper, namespace, _tolerating("allowed", node=node.name, value="tenants"))
        create(upper, namespace, _tolerating("outside", node=node.name, value="other-team"))

        def refusal() -> str | None:
            status = (pod(upper, namespace, "outside") or {}).get("status") or {}
            return str(status.get("message")) if status.get("reason") == "ProviderFailed" else None

        message = wait_for("the lower refusal on the upper pod", refusal)
        assert "conflict with its namespace whitelist" in message, message
        assert pod(lower, namespace, "outside") is None
        wait_for("allowed Running", lambda: phase(upper, namespace, "allowed") == "Running")
        allowed = pod(lower, namespace, "allowed") or {}
        # PodNodeSelector merged the namespace's selector into the tenant's pod.
        assert allowed["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}, allowed["spec"]
        marks = lower.request("GET", f"/api/v1/namespaces/{namespace}")["metadata"]
        assert marks["labels"]["tenancy.example.com/tier"] == "tenants"
        whitelist = marks["annotations"]["scheduler.alpha.kubernetes.io/tolerationsWhitelist"]
        assert json.loads(whitelist) == WHITELIST
    finally:
        delete_namespace((fleet.upper, fleet.cluster("lower-2")), namespace)


# -- the pod policy (issue 31, section 2) ---------------------------------------------------

POLICY_TAG = secrets.token_hex(3)
MAPPED_PROFILE = "mapped-profile"
LOWER_PROFILE = "lower-profile"
"""A scheduler of the lower administrator's (none runs on the local fleet)."""
SANDBOX = f"sandbox-{POLICY_TAG}"
"""An upper RuntimeClass mapped onto `LOWER_SANDBOX`."""
LOWER_SANDBOX = f"lower-sandbox-{POLICY_TAG}"
PLAIN = f"plain-{POLICY_TAG}"
"""An upper RuntimeClass not mapped."""
POLICY_ARGS = (
    f"--scheduler-name-map={MAPPED_PROFILE}={LOWER_PROFILE}",
    f"--runtime-class-map={SANDBOX}={LOWER_SANDBOX}",
)
RUNTIME_CLASSES = "/apis/node.k8s.io/v1/runtimeclasses"


@pytest.fixture(scope="module")
def policy_node(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VirtualNodeProcess]:
    """One virtual node over `lower` for the pod-policy tests (default flags but the maps),
    and the RuntimeClasses they name (upstairs `SANDBOX` and `PLAIN`, below
    `LOWER_SANDBOX`; all with a handler kwok ignores)."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    made = [(upper, SANDBOX), (upper, PLAIN), (lower, LOWER_SANDBOX)]
    for client, name in made:
        client.request(
            "POST",
            RUNTIME_CLASSES,
            body={
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": name},
                "handler": "runc",
            },
        )
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-policy-{POLICY_TAG}",
        log_dir=tmp_path_factory.mktemp("policy"),
        args=POLICY_ARGS,
    )
    try:
        node.start()
        try:
            yield node
        finally:
            code = node.stop()
            node.delete_node()
            assert code == 0, f"virtual-node exited {code}; log {node.log}"
    finally:
        for client, name in made:
            delete_if_present(client, f"{RUNTIME_CLASSES}/{name}")


def _bound_pod(name: str, *, node: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A pod bound to `node` by its creator (spec.nodeName): the upper scheduler, and so its
    volume checks and profiles, never see it. It tolerates the virtual node's taint, which
    the node's own admission asks of such a pod."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox"}],
            **spec,
        },
    }


def _refusal(client: RestClient, namespace: str, name: str) -> str | None:
    status = (pod(client, namespace, name) or {}).get("status") or {}
    return str(status.get("message")) if status.get("reason") == "ProviderFailed" else None


def test_an_ephemeral_claim_template_naming_a_lower_volume_never_gets_it(
    fleet: Fleet, policy_node: VirtualNodeProcess, namespace: str
) -> None:
    """A tenant's generic ephemeral volume names a static PersistentVolume of the lower
    cluster (someone else's data) in its claim template; bound by spec.nodeName, nothing
    upstairs looks at it. The pod is refused with a reason naming the field, and the lower
    volume stays Available: no claim of the tenant's is ever made for it below."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    volume = f"someone-elses-{POLICY_TAG}"
    volume_path = f"/api/v1/persistentvolumes/{volume}"
    lower.request(
        "POST",
        "/api/v1/persistentvolumes",
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": f"/srv/{volume}"},
            },
        },
    )
    try:
        wait_for(
            "the lower volume Available",
            lambda: (get(lower, volume_path) or {}).get("status", {}).get("phase") == "Available",
        )
        template = {
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            }
        }
        create(
            upper,
            namespace,
            _bound_pod(
                "grabber",
                node=policy_node.name,
                spec={
                    "volumes": [{"name": "data", "ephemeral": {"volumeClaimTemplate": template}}]
                },
            ),
        )

        def claimed() -> str | None:
            ref = (get(lower, volume_path) or {}).get("spec", {}).get("claimRef")
            return f"{ref.get('namespace')}/{ref.get('name')}" if ref else None

        wait_for(
            "the pod refused, or the lower volume claimed",
            lambda: _refusal(upper, namespace, "grabber") or claimed(),
            timeout=60,
        )
        assert claimed() is None, f"the lower volume {volume} was bound to claim {claimed()}"
        message = _refusal(upper, namespace, "grabber")
        assert message is not None
        assert "spec.volumeName" in message, message
        assert 'ephemeral volume "data"' in message, message
        # Nothing changes later: no lower pod, no lower claim, the volume still free.
        time.sleep(3)
        assert pod(lower, namespace, "grabber") is None
        assert (
            get(lower, f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/grabber-data")
            is None
        )
        assert (get(lower, volume_path) or {})["status"]["phase"] == "Available"
    finally:
        delete_if_present(upper, f"/api/v1/namespaces/{namespace}/pods/grabber")
        delete_if_present(lower, f"/api/v1/namespaces/{namespace}/pods/grabber")
        delete_if_present(
            lower, f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/grabber-data"
        )
        delete_if_present(lower, volume_path)


def test_a_scheduler_name_of_the_upper_cluster_is_dropped_below_unless_mapped(
    fleet: Fleet, policy_node: VirtualNodeProcess, namespace: str
) -> None:
    """A pod of an upper scheduler profile (bound by spec.nodeName: the upper cluster may run
    that profile, the lower one does not) runs below under the lower default scheduler, and
    is told so; a name the lower administrator maps gets the lower scheduler's name."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(
        upper,
        namespace,
        _bound_pod("profiled", node=policy_node.name, spec={"schedulerName": "my-upper-profile"}),
    )
    create(
        upper,
        namespace,
        _bound_pod("mapped", node=policy_node.name, spec={"schedulerName": MAPPED_PROFILE}),
    )
    wait_for(
        "profiled Running", lambda: phase(upper, namespace, "profiled") == "Running", timeout=60
    )
    below = (pod(lower, namespace, "profiled") or {})["spec"]
    assert below["schedulerName"] == "default-scheduler", below
    [event] = _events(upper, namespace, "Pod", "profiled", "SchedulerNameNotMapped")
    assert event["type"] == "Warning"
    assert "--scheduler-name-map" in event["message"], event["message"]
    # Mapped: the lower pod names the lower administrator's scheduler (none runs here, so it
    # waits for it below, as any pod of that scheduler would).
    mapped = wait_for("the mapped pod below", lambda: pod(lower, namespace, "mapped"))
    assert mapped["spec"]["schedulerName"] == LOWER_PROFILE
    assert not _events(upper, namespace, "Pod", "mapped", "SchedulerNameNotMapped")


def test_a_runtime_class_goes_below_only_mapped(
    fleet: Fleet, policy_node: VirtualNodeProcess, namespace: str
) -> None:
    """A RuntimeClass selects a runtime handler of the lower nodes: mapped, the lower pod
    names the lower administrator's class; not mapped, it is dropped and the tenant told."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    for name, runtime in (("sandboxed", SANDBOX), ("plain", PLAIN)):
        create(
            upper,
            namespace,
            _bound_pod(name, node=policy_node.name, spec={"runtimeClassName": runtime}),
        )
    for name in ("sandboxed", "plain"):
        wait_for(f"{name} Running", lambda n=name: phase(upper, namespace, n) == "Running")
    assert (pod(lower, namespace, "sandboxed") or {})["spec"]["runtimeClassName"] == LOWER_SANDBOX
    assert "runtimeClassName" not in (pod(lower, namespace, "plain") or {})["spec"]
    [event] = _events(upper, namespace, "Pod", "plain", "RuntimeClassNotMapped")
    assert PLAIN in event["message"]
    assert "--runtime-class-map" in event["message"]
    assert not _events(upper, namespace, "Pod", "sandboxed", "RuntimeClassNotMapped")


def test_volumes_that_reach_outside_the_pod_are_refused_unless_allowed(
    fleet: Fleet, policy_node: VirtualNodeProcess, namespace: str
) -> None:
    """An NFS volume names a server of the lower network: refused by default, saying which
    flag would allow it; nothing is made below."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    share = {"name": "share", "nfs": {"server": "192.0.2.10", "path": "/exports/other-tenant"}}
    create(
        upper, namespace, _bound_pod("mounter", node=policy_node.name, spec={"volumes": [share]})
    )
    message = wait_for("the refusal", lambda: _refusal(upper, namespace, "mounter"))
    assert 'nfs: volume "share"' in message, message
    assert "--allowed-volume-types allows none" in message, message
    assert pod(lower, namespace, "mounter") is None


# -- sibling virtual nodes agree (issue 31, section 3) --------------------------------------


def test_sibling_nodes_of_different_policies_leave_each_others_copies_alone(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    """Two virtual nodes of one upper cluster over one lower cluster, one taking NodePort
    Services below and one not: the copy of a NodePort Service is written by whichever made
    it and left alone by the other (a Warning upstairs says why), not turned back and forth
    between NodePort and ClusterIP."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    tag = secrets.token_hex(3)
    narrow = VirtualNodeProcess(fleet, name=f"vn-narrow-{tag}", log_dir=tmp_path)
    wide = VirtualNodeProcess(
        fleet,
        name=f"vn-wide-{tag}",
        log_dir=tmp_path,
        args=("--lower-service-types=ClusterIP,NodePort",),
    )
    nodes += [narrow, wide]
    narrow.start()
    wide.start()
    base = f"/api/v1/namespaces/{namespace}/services"
    upper.request(
        "POST",
        base,
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "shared"},
            "spec": {"type": "NodePort", "ports": [{"port": 80}]},
        },
    )
    wait_for("the copy below", lambda: get(lower, f"{base}/shared"), timeout=60)
    time.sleep(2)  # both nodes have seen it
    versions = []
    deadline = time.monotonic() + 12  # four times the siblings' grace (3 s)
    while time.monotonic() < deadline:
        copy = get(lower, f"{base}/shared") or {}
        versions.append((copy["metadata"]["resourceVersion"], copy["spec"]["type"]))
        time.sleep(0.2)
    changes = sorted(set(versions))
    assert len(changes) == 1, f"the copy was rewritten {len(changes) - 1} times: {changes}"
    assert copy["metadata"]["annotations"][services.POLICY_ANNOTATION]
    # Its maker may be any sibling (another test's node of this upper cluster too): the
    # node of the other policy is the one that leaves it alone.
    other = narrow.name if copy["spec"]["type"] == "NodePort" else wide.name
    warning = wait_for(
        "the other node's Warning",
        lambda: [
            e
            for e in _events(upper, namespace, "Service", "shared", "MirrorFailed")
            if other in str(e.get("source", {}).get("component", ""))
        ],
    )[0]
    assert "policy" in warning["message"], warning["message"]
