"""The virtual node in a real fleet: registration, pods down, status up, dependencies, deletion."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tensile.contracts.labels import VIRTUAL_POD_LABEL
from tensile.placement import summary
from tests.e2e.helpers import (
    create,
    events_for,
    get,
    kubelet_request,
    phase,
    pod,
    pod_manifest,
    wait_for,
)
from vnode.providers.k2k import naming


def _node(fleet: Fleet, name: str) -> dict[str, Any]:
    found = get(fleet.upper.rest(), f"/api/v1/nodes/{name}")
    assert found is not None
    return found


def test_the_node_registers_like_a_kubelet(fleet: Fleet, virtual_node: VirtualNodeProcess) -> None:
    node = _node(fleet, virtual_node.name)
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet"
    assert labels["kubernetes.io/role"] == "agent"
    assert labels["kubernetes.io/hostname"] == virtual_node.name
    assert labels["kubernetes.io/os"] == "linux"
    ours = {"key": "virtual-kubelet.io/provider", "value": "k8s", "effect": "NoSchedule"}
    assert ours in node["spec"]["taints"]
    # The upper node lifecycle controller taints a new node not-ready until it is Ready.
    wait_for(
        "only our taint",
        lambda: _node(fleet, virtual_node.name)["spec"]["taints"] == [ours],
        timeout=20,
    )
    status = node["status"]
    assert status["addresses"] == [{"type": "InternalIP", "address": fleet.node_ip}]
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == virtual_node.kubelet_port
    lower_version = fleet.lower.rest().request("GET", "/version")["gitVersion"]
    assert status["nodeInfo"]["kubeletVersion"] == lower_version
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "Ready": "True",
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
        # Tensile's own, beside the kubelet's (docs/operations/partitions.md).
        "LowerControlPlaneReachable": "True",
    }
    # Three kwok nodes of 32 CPU / 256Gi / 110 pods each, minus what other pods hold.
    assert 0 < int(status["allocatable"]["pods"]) <= 330
    assert status["capacity"] == status["allocatable"]
    for streaming in ("kubelet.kubernetes.io/streaming-protocols",):
        assert streaming not in (node["metadata"].get("annotations") or {})
    # /readyz names every component of the node, each ready once registered.
    with urllib.request.urlopen(
        f"http://127.0.0.1:{virtual_node.metrics_port}/readyz?verbose", timeout=5
    ) as response:
        readyz = response.read().decode()
    for component in (
        "k2k-provider",
        "configmaps_to_lower",
        "services_to_lower",
        "endpointslices_to_lower",
        "volume-provisioner",
        "claims_to_lower",
        "pod-controller",
        "kubelet-api",
        "node-controller",
        "patrol",
        "placement-summary",
    ):
        assert f"[+]{component} ok" in readyz, readyz
    # The lower nodes as tensile-scheduler reads them: one row per lower node, free room.
    text = wait_for(
        "the placement summary",
        lambda: (_node(fleet, virtual_node.name)["metadata"].get("annotations") or {}).get(
            summary.ANNOTATION
        ),
    )
    lower = summary.parse(text)
    assert sorted(r.name for r in lower.rows()) == sorted(fleet.lower.nodes)
    assert all(0 < r.free["cpu"] <= 32000 for r in lower.rows())


def test_the_lease_is_renewed_and_owned_by_the_node(
    fleet: Fleet, virtual_node: VirtualNodeProcess
) -> None:
    client = fleet.upper.rest()
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{virtual_node.name}"
    first = wait_for("the lease", lambda: get(client, path), timeout=20)
    assert first["spec"]["holderIdentity"] == virtual_node.name
    assert first["spec"]["leaseDurationSeconds"] == 40
    owner = first["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", virtual_node.name)
    assert owner["uid"] == _node(fleet, virtual_node.name)["metadata"]["uid"]
    wait_for(
        "a renewal",
        lambda: (
            (get(client, path) or {}).get("spec", {}).get("renewTime") != first["spec"]["renewTime"]
        ),
        timeout=25,
    )


def test_a_deleted_node_is_registered_again(fleet: Fleet, virtual_node: VirtualNodeProcess) -> None:
    old_uid = _node(fleet, virtual_node.name)["metadata"]["uid"]
    virtual_node.delete_node()
    wait_for(
        "the node back",
        lambda: (
            (get(fleet.upper.rest(), f"/api/v1/nodes/{virtual_node.name}") or {})
            .get("metadata", {})
            .get("uid", old_uid)
            != old_uid
        ),
        timeout=20,
    )
    virtual_node.wait_ready(timeout=20)


def test_pods_run_below_with_their_config_maps_and_secrets(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(
        upper,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg"},
            "data": {"greeting": "hello"},
        },
    )
    create(
        upper,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sec"},
            "stringData": {"token": "t0"},
        },
    )
    manifest = pod_manifest("web", node=virtual_node.name)
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/s"}]
    manifest["spec"]["volumes"] = [{"name": "s", "secret": {"secretName": "sec"}}]
    create(upper, namespace, {"apiVersion": "v1", "kind": "ServiceAccount",
                              "metadata": {"name": "runner"}})  # fmt: skip
    manifest["spec"]["serviceAccountName"] = "runner"
    started = time.monotonic()
    create(upper, namespace, manifest)
    wait_for("Running upstairs", lambda: phase(upper, namespace, "web") == "Running")
    elapsed = time.monotonic() - started

    up = pod(upper, namespace, "web")
    below = pod(lower, namespace, "web")
    assert up is not None
    assert below is not None
    meta = below["metadata"]
    assert meta["labels"][VIRTUAL_POD_LABEL] == "true"
    assert ownership.is_owned(below, owner=virtual_node.owner)
    assert meta["annotations"][ownership.UPPER_UID_ANNOTATION] == up["metadata"]["uid"]
    assert below["spec"]["nodeName"].startswith("lower-node-")
    assert up["status"]["podIP"] == below["status"]["podIP"]
    assert up["status"]["hostIP"] == fleet.node_ip
    assert {c["type"]: c["status"] for c in up["status"]["conditions"]}["Ready"] == "True"
    env = {e["name"]: e for e in below["spec"]["containers"][0]["env"]}
    assert env["NODE"] == {"name": "NODE", "value": virtual_node.name}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # The ServiceAccount is mirrored, and the upper token volume replaced by the one the
    # lower cluster's admission projects for its own copy of the ServiceAccount.
    assert below["spec"]["serviceAccountName"] == "runner"
    sa = get(lower, f"/api/v1/namespaces/{namespace}/serviceaccounts/runner")
    assert sa is not None
    assert ownership.is_owned(sa, owner=virtual_node.owner)
    upper_token = next(v["name"] for v in up["spec"]["volumes"] if v["name"] != "s")
    lower_token = next(v["name"] for v in below["spec"]["volumes"] if v["name"] != "s")
    assert lower_token.startswith("kube-api-access-")
    assert lower_token != upper_token
    copies = {
        kind: get(lower, f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        for kind, name in (("configmaps", "cfg"), ("secrets", "sec"))
    }
    assert copies["configmaps"] is not None
    assert copies["configmaps"]["data"] == {"greeting": "hello"}
    assert copies["secrets"] is not None
    assert ownership.is_owned(copies["secrets"], owner=virtual_node.owner)
    assert elapsed < 20


def test_a_pod_that_runs_at_once_costs_one_upper_write(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """What the node writes upstairs per pod (README: "What it writes upstairs, per pod"): a
    pod that goes straight to Running below costs one write on the upper pod path, its
    status; no label or annotation patches, no creates, no deletes. (Events go through their
    own client and are not counted here.)"""
    upper = fleet.upper.rest()
    verbs = ("POST", "PUT", "PATCH", "DELETE")

    def writes() -> dict[str, float]:
        return {
            verb: virtual_node.metric("tensile_api_requests_total", cluster="upper", verb=verb)
            for verb in verbs
        }

    pods = 5
    before = writes()
    for i in range(pods):
        create(upper, namespace, pod_manifest(f"p{i}", node=virtual_node.name))
    wait_for(
        "every pod Running upstairs",
        lambda: all(phase(upper, namespace, f"p{i}") == "Running" for i in range(pods)),
    )
    time.sleep(1.0)  # status writes are coalesced per pod for 0.1 s: let stragglers land
    after = writes()
    assert {verb: after[verb] - before[verb] for verb in verbs} == {
        "POST": 0,
        "PUT": 0,
        "PATCH": pods,
        "DELETE": 0,
    }


def test_a_config_map_update_reaches_the_copy_and_unused_copies_are_collected(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    copy_path = _running_with_config_map(upper, namespace=namespace, node=virtual_node.name)
    upper.request(
        "PATCH", copy_path, body={"data": {"v": "2"}}, content_type="application/merge-patch+json"
    )
    wait_for("the update below", lambda: (get(lower, copy_path) or {}).get("data") == {"v": "2"})

    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web")
    wait_for("the pod gone below", lambda: pod(lower, namespace, "web") is None)
    wait_for("the copy collected", lambda: get(lower, copy_path) is None, timeout=20)
    assert get(upper, copy_path) is not None


def test_a_copy_deleted_below_is_made_again_while_a_pod_uses_it(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    # Without it, the next start of a container of the pod fails for good.
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    copy_path = _running_with_config_map(upper, namespace=namespace, node=virtual_node.name)
    made = get(lower, copy_path)
    assert made is not None
    made_uid = made["metadata"]["uid"]

    lower.request("DELETE", copy_path)  # someone below deletes the copy the pod uses

    def made_again() -> dict[str, Any] | None:
        copy = get(lower, copy_path)
        return copy if copy and copy["metadata"]["uid"] != made_uid else None

    again = wait_for("the copy made again below", made_again, timeout=5)
    assert again["data"] == {"v": "1"}
    assert ownership.is_owned(again, owner=virtual_node.owner)


def test_graceful_deletion_goes_down_then_finishes_upstairs(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    lower_uid = (pod(lower, namespace, "web") or {})["metadata"]["uid"]
    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/web",
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 30},
    )
    wait_for(
        "the lower pod gone",
        lambda: (pod(lower, namespace, "web") or {}).get("metadata", {}).get("uid") != lower_uid,
    )
    # kwok ends the lower pod at once, so the upper pod goes long before its 30 s grace.
    wait_for("the upper pod gone", lambda: pod(upper, namespace, "web") is None, timeout=15)


def test_a_lower_pod_deleted_by_someone_else_fails_the_upper_pod(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    lower.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web")
    wait_for("Failed", lambda: phase(upper, namespace, "web") == "Failed")
    status = (pod(upper, namespace, "web") or {})["status"]
    assert status["reason"] == "LowerPodDeleted"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 137
    time.sleep(1.0)
    assert pod(lower, namespace, "web") is None, "a vanished pod must not be re-created"


def test_a_pod_put_below_with_the_nodes_marks_is_never_taken_for_the_upper_pod(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """Someone who may create pods in the lower namespace deletes the node's lower pod and
    puts one of their own at its name, with the node's marks and the upper UID copied: the
    upper pod fails as its pod vanished, and its logs are not the impostor's."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    logs = f"/containerLogs/{namespace}/web/main"
    status, _body = kubelet_request(fleet, virtual_node.kubelet_port, logs, cert=True)
    assert status == 200
    own = pod(lower, namespace, "web")
    assert own is not None
    lower.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/web",
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
    )
    wait_for("the node's lower pod gone", lambda: pod(lower, namespace, "web") is None)
    spec = dict(own["spec"])
    spec["containers"] = [{**c, "image": "impostor:1"} for c in spec["containers"]]
    impostor = create(
        lower,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "labels": own["metadata"].get("labels", {}),
                "annotations": own["metadata"].get("annotations", {}),
            },
            "spec": spec,
        },
    )
    wait_for("Failed", lambda: phase(upper, namespace, "web") == "Failed")
    wait_for("the impostor Running", lambda: phase(lower, namespace, "web") == "Running")
    time.sleep(2.0)  # the node's informer has shown it
    status_up = (pod(upper, namespace, "web") or {})["status"]
    assert status_up["reason"] == "LowerPodDeleted"
    assert all(c.get("image") != "impostor:1" for c in status_up.get("containerStatuses", []))
    status, body = kubelet_request(fleet, virtual_node.kubelet_port, logs, cert=True)
    assert status == 404, f"the impostor's logs were served for the upper pod: {status} {body}"
    # The impostor is not the node's to delete while its upper pod is kept.
    kept = pod(lower, namespace, "web")
    assert kept is not None
    assert kept["metadata"]["uid"] == impostor["metadata"]["uid"]


def test_a_pod_the_lower_cluster_refuses_fails_with_the_reason_and_leaves_nothing(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(
        lower,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "none"},
            "spec": {"hard": {"pods": "0", "secrets": "0"}},
        },
    )
    create(
        upper,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"v": "1"}},
    )
    manifest = pod_manifest("web", node=virtual_node.name)
    manifest["spec"]["volumes"] = [{"name": "c", "configMap": {"name": "cfg"}}]
    create(upper, namespace, manifest)

    def failed_status() -> dict[str, Any] | None:
        status = (pod(upper, namespace, "web") or {}).get("status", {})
        return status if status.get("reason") == "ProviderFailed" else None

    status = wait_for("ProviderFailed", failed_status)
    assert status["phase"] == "Pending"
    assert "exceeded quota" in status["message"]
    reasons = {e["reason"] for e in events_for(upper, namespace, "web")}
    assert "ProviderCreateFailed" in reasons
    assert get(lower, f"/api/v1/namespaces/{namespace}/configmaps/cfg") is None
    # Retries back off: a few attempts in several seconds, not a storm.
    before = _attempts(virtual_node)
    time.sleep(4.0)
    assert _attempts(virtual_node) - before <= 4

    # A copy the lower cluster refuses (its Secret over the quota) is the pod's failure
    # too, naming the object, and the copies made before it are removed again.
    create(upper, namespace, {"apiVersion": "v1", "kind": "Secret",
                              "metadata": {"name": "sec"}, "stringData": {"k": "v"}})  # fmt: skip
    manifest = pod_manifest("app", node=virtual_node.name, spec={"restartPolicy": "Never"})
    manifest["spec"]["volumes"] = [
        {"name": "c", "configMap": {"name": "cfg"}},
        {"name": "s", "secret": {"secretName": "sec"}},
    ]
    create(upper, namespace, manifest)
    wait_for("app Failed", lambda: phase(upper, namespace, "app") == "Failed")
    status = (pod(upper, namespace, "app") or {})["status"]
    assert status["reason"] == "ProviderFailed"
    assert f"copy of Secret {namespace}/sec" in status["message"]
    assert "exceeded quota" in status["message"]
    assert get(lower, f"/api/v1/namespaces/{namespace}/configmaps/cfg") is None
    assert get(lower, f"/api/v1/namespaces/{namespace}/secrets/sec") is None


def _attempts(node: VirtualNodeProcess) -> float:
    total = 0.0
    for line in node.metrics().splitlines():
        if line.startswith('tensile_api_requests_total{cluster="lower",code="403",verb="POST"}'):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_kube_system_and_daemon_set_pods_are_refused_clearly(
    fleet: Fleet, virtual_node: VirtualNodeProcess
) -> None:
    upper = fleet.upper.rest()
    manifest = pod_manifest(f"addon-{virtual_node.name}", node=virtual_node.name)
    create(upper, "kube-system", manifest)
    name = manifest["metadata"]["name"]
    try:
        wait_for("Failed", lambda: phase(upper, "kube-system", name) == "Failed")
        status = (pod(upper, "kube-system", name) or {})["status"]
        assert status["reason"] == "UnsupportedPod"
        assert "kube-system" in status["message"]
        assert pod(fleet.lower.rest(), "kube-system", name) is None
    finally:
        upper.request("DELETE", f"/api/v1/namespaces/kube-system/pods/{name}")


def test_image_and_label_changes_reach_the_lower_pod(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    patch = {
        "metadata": {"labels": {"tier": "front"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.28"}]},
    }
    upper.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/web",
        body=patch,
        content_type="application/strategic-merge-patch+json",
    )

    def updated() -> bool:
        below = pod(lower, namespace, "web") or {}
        return bool(
            below.get("metadata", {}).get("labels", {}).get("tier") == "front"
            and below["spec"]["containers"][0]["image"] == "nginx:1.28"
        )

    wait_for("the update below", updated)


def test_ignored_labels_stay_upstairs_and_are_restored(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    manifest = pod_manifest(
        "web", node=virtual_node.name, labels={"pod-group.scheduling.sigs.k8s.io": "g1"}
    )
    create(upper, namespace, manifest)
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    below = pod(lower, namespace, "web") or {}
    assert "pod-group.scheduling.sigs.k8s.io" not in below["metadata"]["labels"]
    tripped = json.loads(below["metadata"]["annotations"][naming.TRIPPED_LABELS_ANNOTATION])
    assert tripped == {"pod-group.scheduling.sigs.k8s.io": "g1"}
    assert (pod(upper, namespace, "web") or {})["metadata"]["labels"][
        "pod-group.scheduling.sigs.k8s.io"
    ] == "g1"


def test_lower_events_are_mirrored_onto_the_upper_pod(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper = fleet.upper.rest()
    # More CPU than any one lower node has, but less than the virtual node's total: the
    # upper scheduler places it, the lower one cannot.
    create(upper, namespace, pod_manifest("big", node=virtual_node.name, requests={"cpu": "40"}))

    def scheduling_failure() -> list[dict[str, Any]]:
        # The lower scheduler's verdict (the upper one found room on the virtual node).
        return [
            e
            for e in events_for(upper, namespace, "big")
            if e["reason"] == "FailedScheduling" and "Insufficient cpu" in e["message"]
        ]

    events = wait_for("FailedScheduling upstairs", scheduling_failure)
    big = pod(upper, namespace, "big") or {}
    assert events[0]["involvedObject"]["uid"] == big["metadata"]["uid"]
    assert "Insufficient cpu" in events[0]["message"]
    wait_for(
        "PodScheduled=False mirrored",
        lambda: any(
            c["type"] == "PodScheduled" and c["status"] == "False"
            for c in (
                (pod(upper, namespace, "big") or {}).get("status", {}).get("conditions") or []
            )
        ),
    )


def _running_with_config_map(upper: RestClient, *, namespace: str, node: str) -> str:
    """Create ConfigMap `cfg` ({"v": "1"}) and pod `web` mounting it on `node`, wait until
    the pod is Running, and return the ConfigMap's path (the same in both clusters)."""
    create(
        upper,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"v": "1"}},
    )
    manifest = pod_manifest("web", node=node)
    manifest["spec"]["volumes"] = [{"name": "c", "configMap": {"name": "cfg"}}]
    create(upper, namespace, manifest)
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    return f"/api/v1/namespaces/{namespace}/configmaps/cfg"


def _resize(client: RestClient, namespace: str, name: str, requests: dict[str, str]) -> None:
    """What `kubectl patch pod NAME --subresource resize` sends."""
    client.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/resize",
        body={"spec": {"containers": [{"name": "main", "resources": {"requests": requests}}]}},
        content_type="application/strategic-merge-patch+json",
    )


def _resources(found: dict[str, Any] | None) -> dict[str, Any]:
    statuses = ((found or {}).get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0].get("resources") or {})


def test_an_upper_resize_resizes_the_lower_pod_and_its_resources_come_up(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """An in-place resize upstairs (the resize subresource) resizes the lower pod; the
    lower node's actuation (kwok's resize stages) comes back up: the container's resources
    and allocatedResources, and observedGeneration in the upper pod's own generations."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    requests = {"cpu": "100m", "memory": "64Mi"}
    create(upper, namespace, pod_manifest("web", node=virtual_node.name, requests=requests))
    # The upper apiserver takes a resize only once the running container reports resources.
    wait_for("resources upstairs", lambda: _resources(pod(upper, namespace, "web")))
    _resize(upper, namespace, "web", {"cpu": "500m", "memory": "128Mi"})
    wanted = {"cpu": "500m", "memory": "128Mi"}

    def resized_below() -> bool:
        below = pod(lower, namespace, "web") or {}
        return bool(below["spec"]["containers"][0]["resources"]["requests"] == wanted)

    wait_for("the resize below", resized_below)

    def resized_upstairs() -> dict[str, Any] | None:
        found = pod(upper, namespace, "web") or {}
        status = found.get("status") or {}
        container = (status.get("containerStatuses") or [{}])[0]
        done = (
            _resources(found).get("requests") == wanted
            and container.get("allocatedResources") == wanted
            and status.get("observedGeneration") == found["metadata"]["generation"]
        )
        return found if done else None

    found = wait_for("the new resources upstairs", resized_upstairs)
    types = {c["type"] for c in found["status"]["conditions"]}
    assert not types & {"PodResizePending", "PodResizeInProgress"}


def test_a_resize_the_lower_cluster_refuses_shows_upstairs_as_infeasible(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    """More cpu than a lower node has (32) but less than the virtual node's sum: the upper
    apiserver takes the resize, the lower one refuses it (its PodResizeValidator admission
    compares with the lower node's allocatable). Upstairs the pod says so as a kubelet
    would: PodResizePending, reason Infeasible, the lower message; its resources stay. A
    resize back within the node then goes through and the condition goes."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    requests = {"cpu": "100m", "memory": "64Mi"}
    create(upper, namespace, pod_manifest("big", node=virtual_node.name, requests=requests))
    wait_for("resources upstairs", lambda: _resources(pod(upper, namespace, "big")))
    _resize(upper, namespace, "big", {"cpu": "40"})

    def pending() -> dict[str, Any] | None:
        conditions = ((pod(upper, namespace, "big") or {}).get("status") or {}).get(
            "conditions"
        ) or []
        return next((c for c in conditions if c["type"] == "PodResizePending"), None)

    condition = wait_for("Infeasible upstairs", pending)
    assert condition["reason"] == "Infeasible"
    assert (
        "node didn't have enough allocatable resources: cpu, requested: 40000"
        in (condition["message"])
    )
    found = pod(upper, namespace, "big") or {}
    assert condition["observedGeneration"] == found["metadata"]["generation"]
    assert found["status"]["observedGeneration"] == found["metadata"]["generation"]
    assert _resources(found)["requests"]["cpu"] == "100m"
    below = pod(lower, namespace, "big") or {}
    assert below["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"

    _resize(upper, namespace, "big", {"cpu": "200m"})

    def resized() -> bool:
        found = pod(upper, namespace, "big") or {}
        return _resources(found).get("requests", {}).get("cpu") == "200m" and pending() is None

    wait_for("the resize within the node upstairs", resized)
