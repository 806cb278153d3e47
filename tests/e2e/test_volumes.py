"""Persistent volumes across the boundary (PVControllers), with the real volume machinery
of both clusters doing the binding: upstairs the kube-scheduler's volume binding and the
PV controller bind pods and claims to the virtual node and the PVs it provisions; below, a
WaitForFirstConsumer StorageClass with local PVs pinned to particular kwok nodes makes the
lower scheduler and the lower PV controller put each pod where its volume is.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import Storage, delete_if_present, get, phase, wait_for
from vnode.providers.k2k import volumes

MERGE = "application/merge-patch+json"
TOLERATE = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]


def create_claim(upper: RestClient, namespace: str, name: str, *, storage_class: str) -> None:
    """Create a 1Gi ReadWriteOnce claim of `storage_class` upstairs."""
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": storage_class,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )


def create_pod_with_claim(
    upper: RestClient, namespace: str, name: str, *, claim: str, node: str
) -> None:
    """Create a pod upstairs that mounts `claim`, pinned to virtual node `node`."""
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "tolerations": TOLERATE,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        },
    )


def storage_node(fleet: Fleet, storage: Storage, tmp_path: Path) -> VirtualNodeProcess:
    """A virtual node over `lower` mapping every upper class of `storage` to its lower one,
    with PVControllers only (no Service mirrors)."""
    return VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[
            "--enable-controllers=PVControllers",
            f"--lower-storage-class={storage.upper_class}={storage.lower_class},"
            f"{storage.retain_class}={storage.lower_class},"
            f"{storage.legacy_class}={storage.lower_class}",
        ],
    )


@pytest.fixture
def node(
    fleet: Fleet, storage: Storage, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> VirtualNodeProcess:
    started = storage_node(fleet, storage, tmp_path)
    nodes.append(started)
    return started.start()


def claim(client: RestClient, namespace: str, name: str) -> dict[str, Any] | None:
    return get(client, f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")


def bound(client: RestClient, namespace: str, name: str) -> dict[str, Any] | None:
    found = claim(client, namespace, name)
    return found if (found or {}).get("status", {}).get("phase") == "Bound" else None


def affinity_node(volume: dict[str, Any]) -> str:
    [term] = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    return str(expression["values"][0])


def test_a_stateful_set_gets_volumes_on_the_virtual_node_and_keeps_them(
    fleet: Fleet,
    node: VirtualNodeProcess,
    storage: Storage,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
    namespace: str,
) -> None:
    """Nothing pins the pods to a node but their volumes: when db-0 is replaced, a second
    virtual node is available and emptier (the scheduler's spreading prefers it), and the
    replacement still goes to the node its volume's affinity names. The node runs
    PVControllers only: the StatefulSet's Service is not mirrored."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    code, readiness = node.get("/readyz?verbose")
    assert code == 200
    assert "volume-provisioner" in readiness
    assert "claims_to_lower" in readiness
    assert "services_to_lower" not in readiness
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "db"},
            "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]},
        },
    )
    upper.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
        body={
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db"},
            "spec": {
                "replicas": 2,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {
                        "tolerations": TOLERATE,
                        "containers": [
                            {
                                "name": "db",
                                "image": "postgres:17",
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            }
                        ],
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": storage.upper_class,
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            },
        },
    )
    placement: dict[str, tuple[str, str, str]] = {}
    for index in (0, 1):
        pod, data = f"db-{index}", f"data-db-{index}"
        wait_for(
            f"{pod} Running", lambda pod=pod: phase(upper, namespace, pod) == "Running", timeout=90
        )
        above = wait_for(f"{data} Bound upstairs", lambda data=data: bound(upper, namespace, data))
        below = wait_for(f"{data} Bound below", lambda data=data: bound(lower, namespace, data))
        pv = upper.request("GET", f"/api/v1/persistentvolumes/{above['spec']['volumeName']}")
        assert pv["metadata"]["name"] == volumes.volume_name(above)
        assert affinity_node(pv) == node.name
        assert pv["metadata"]["annotations"][volumes.PROVISIONED_BY] == volumes.PROVISIONER
        assert above["metadata"]["annotations"][volumes.SELECTED_NODE] == node.name
        assert ownership.is_owned(below, owner=node.owner)
        assert below["spec"]["storageClassName"] == storage.lower_class
        assert volumes.SELECTED_NODE not in (below["metadata"].get("annotations") or {}) or (
            below["metadata"]["annotations"][volumes.SELECTED_NODE] != node.name
        )
        lower_pv = below["spec"]["volumeName"]
        assert lower_pv in storage.volumes
        lower_pod = get(lower, f"/api/v1/namespaces/{namespace}/pods/{pod}")
        assert lower_pod is not None
        assert lower_pod["spec"]["nodeName"] == storage.volumes[lower_pv]
        wait_for(
            f"{data} shows its lower claim",
            lambda data=data: (
                (claim(upper, namespace, data) or {})
                .get("metadata", {})
                .get("annotations", {})
                .get(volumes.LOWER_PHASE_ANNOTATION)
                == "Bound"
            ),
        )
        # The lower claim's capacity flows back: the lower volume is 5Gi, 1Gi was asked.
        wait_for(
            f"{data} shows the lower capacity",
            lambda data=data: (
                (claim(upper, namespace, data) or {}).get("status", {}).get("capacity", {})
                == {"storage": "5Gi"}
            ),
        )
        pv = upper.request("GET", f"/api/v1/persistentvolumes/{above['spec']['volumeName']}")
        assert pv["spec"]["capacity"] == {"storage": "5Gi"}
        placement[pod] = (below["metadata"]["uid"], lower_pv, lower_pod["spec"]["nodeName"])
    assert len({lower_pv for _, lower_pv, _ in placement.values()}) == 2
    assert (
        upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/db-0")["spec"]["nodeName"]
        == node.name
    )

    # A replacement comes back to the same volume and node, though another virtual node,
    # with no pod of the StatefulSet on it, is there now.
    other = storage_node(fleet, storage, tmp_path)
    nodes.append(other)
    other.start()
    old = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/db-0")["metadata"]["uid"]
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/db-0")

    def replaced() -> bool:
        found = get(upper, f"/api/v1/namespaces/{namespace}/pods/db-0")
        return bool(
            found
            and found["metadata"]["uid"] != old
            and found.get("status", {}).get("phase") == "Running"
        )

    wait_for("db-0 replaced and Running", replaced, timeout=90)
    assert (
        upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/db-0")["spec"]["nodeName"]
        == node.name
    )
    lower_pod = get(lower, f"/api/v1/namespaces/{namespace}/pods/db-0")
    assert lower_pod is not None
    below = bound(lower, namespace, "data-db-0")
    assert below is not None
    assert (
        below["metadata"]["uid"],
        below["spec"]["volumeName"],
        lower_pod["spec"]["nodeName"],
    ) == placement["db-0"]

    # A resize upstairs reaches the lower claim.
    upper.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data-db-1",
        body={"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
        content_type=MERGE,
    )
    wait_for(
        "the resize below",
        lambda: (
            (claim(lower, namespace, "data-db-1") or {})
            .get("spec", {})
            .get("resources", {})
            .get("requests", {})
            .get("storage")
            == "2Gi"
        ),
    )

    # Without ServiceControllers the StatefulSet's Service stayed upstairs.
    assert get(lower, f"/api/v1/namespaces/{namespace}/services/db") is None

    # Reclaim policy Delete: the claims go, then their lower claims and upper volumes.
    upper.request("DELETE", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/db")
    for index in (0, 1):
        wait_for(
            f"db-{index} gone below",
            lambda index=index: (
                get(lower, f"/api/v1/namespaces/{namespace}/pods/db-{index}") is None
            ),
            timeout=60,
        )
    volumes_above = [
        upper.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data-db-{i}")[
            "spec"
        ]["volumeName"]
        for i in (0, 1)
    ]
    for index in (0, 1):
        upper.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data-db-{index}"
        )
    for index, pv in enumerate(volumes_above):
        wait_for(
            f"data-db-{index} gone below",
            lambda index=index: claim(lower, namespace, f"data-db-{index}") is None,
            timeout=60,
        )
        wait_for(
            f"{pv} deleted upstairs",
            lambda pv=pv: get(upper, f"/api/v1/persistentvolumes/{pv}") is None,
            timeout=60,
        )


def test_lower_provisioning_problems_show_on_the_upper_claim(
    fleet: Fleet, storage: Storage, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    upper = fleet.upper.rest()
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--lower-storage-class={storage.upper_class}=no-such-class"],
    )
    nodes.append(node.start())
    create_claim(upper, namespace, "data", storage_class=storage.upper_class)
    create_pod_with_claim(upper, namespace, "app", claim="data", node=node.name)

    def lower_warning() -> dict[str, Any] | None:
        events = upper.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={
                "fieldSelector": (
                    "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=data"
                )
            },
        )
        # The provisioner's own Normal ProvisioningSucceeded names the lower class too:
        # only a Warning says what went wrong below.
        return next(
            (
                e
                for e in events.get("items") or []
                if e.get("type") == "Warning" and "no-such-class" in e.get("message", "")
            ),
            None,
        )

    event = wait_for("the lower claim's problem on the upper claim", lower_warning, timeout=60)
    above = claim(upper, namespace, "data")
    assert above is not None
    assert event["involvedObject"]["uid"] == above["metadata"]["uid"]
    wait_for(
        "the lower phase shown upstairs",
        lambda: (
            (claim(upper, namespace, "data") or {})
            .get("metadata", {})
            .get("annotations", {})
            .get(volumes.LOWER_PHASE_ANNOTATION)
            == "Pending"
        ),
    )


def provisioning_failures(client: RestClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The ProvisioningFailed Events on upper claim `name` (repeats counted in `count`)."""
    events = client.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={
            "fieldSelector": (
                f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name},"
                "reason=ProvisioningFailed"
            )
        },
    )
    return list(events.get("items") or [])


def test_a_claim_the_lower_cluster_refuses_is_tried_again_and_a_retained_one_stays_below(
    fleet: Fleet, node: VirtualNodeProcess, storage: Storage, namespace: str
) -> None:
    """A lower ResourceQuota refuses the lower claim: the upper claim gets ProvisioningFailed
    and loses `selected-node`, so the upper scheduler schedules the pod again (another
    refusal, the same Event counted again) and, once the quota is gone, the claim is
    provisioned without anyone touching the pod. Its class has reclaimPolicy Retain:
    deleting the upper claim keeps the lower one."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    quotas = f"/api/v1/namespaces/{namespace}/resourcequotas"
    lower.request(
        "POST",
        quotas,
        body={
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-claims"},
            "spec": {"hard": {"persistentvolumeclaims": "0"}},
        },
    )
    wait_for(
        "the quota in force",
        lambda: (get(lower, f"{quotas}/no-claims") or {}).get("status", {}).get("hard"),
    )
    create_claim(upper, namespace, "data", storage_class=storage.retain_class)
    create_pod_with_claim(upper, namespace, "app", claim="data", node=node.name)
    failures = wait_for(
        "ProvisioningFailed twice (the scheduler tried again)",
        lambda: (
            (found := provisioning_failures(upper, namespace, "data"))
            and sum(int(e.get("count") or 1) for e in found) >= 2
            and found
        ),
        timeout=60,
    )
    assert all(e["type"] == "Warning" for e in failures)
    assert "exceeded quota" in failures[0]["message"]
    assert claim(lower, namespace, "data") is None
    assert phase(upper, namespace, "app") == "Pending"

    lower.request("DELETE", f"{quotas}/no-claims")
    wait_for("the pod Running", lambda: phase(upper, namespace, "app") == "Running", timeout=90)
    above = wait_for("the claim Bound upstairs", lambda: bound(upper, namespace, "data"))
    assert above["metadata"]["annotations"][volumes.SELECTED_NODE] == node.name
    below = wait_for("the claim Bound below", lambda: bound(lower, namespace, "data"))
    pv = upper.request("GET", f"/api/v1/persistentvolumes/{above['spec']['volumeName']}")
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    wait_for(
        "the policy recorded on the lower claim",
        lambda: (
            (claim(lower, namespace, "data") or {})
            .get("metadata", {})
            .get("annotations", {})
            .get(volumes.RECLAIM_ANNOTATION)
            == "Retain"
        ),
    )

    # Reclaim policy Retain: the upper claim goes, the lower claim and the upper PV stay.
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/app")
    wait_for(
        "the pod gone below",
        lambda: get(lower, f"/api/v1/namespaces/{namespace}/pods/app") is None,
        timeout=60,
    )
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data")
    pv_path = f"/api/v1/persistentvolumes/{pv['metadata']['name']}"
    wait_for(
        "the upper PV Released",
        lambda: (get(upper, pv_path) or {}).get("status", {}).get("phase") == "Released",
        timeout=60,
    )
    # A Delete policy removes the lower claim about a second after the PV is Released
    # (the StatefulSet test): 3 s of it still there is a wide margin.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        kept = claim(lower, namespace, "data")
        assert kept is not None
        assert kept["metadata"]["uid"] == below["metadata"]["uid"]
        time.sleep(0.2)
    assert get(upper, pv_path) is not None
    delete_if_present(upper, pv_path)


def test_claims_of_other_classes_follow_their_pod_down_as_tensile_kube_did(
    fleet: Fleet, node: VirtualNodeProcess, storage: Storage, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create_claim(upper, namespace, "legacy", storage_class=storage.legacy_class)
    # The upper scheduler cannot place a pod on a claim nothing provisions upstairs:
    # tensile-kube's users pinned such pods to the virtual node.
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "legacy"},
            "spec": {
                "nodeName": node.name,
                "tolerations": TOLERATE,
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "legacy"}}],
            },
        },
    )
    wait_for("the pod Running", lambda: phase(upper, namespace, "legacy") == "Running", timeout=60)
    below = wait_for("the claim bound below", lambda: bound(lower, namespace, "legacy"))
    above = wait_for(
        "the claim bound upstairs", lambda: bound(upper, namespace, "legacy"), timeout=60
    )
    pv = upper.request("GET", f"/api/v1/persistentvolumes/{above['spec']['volumeName']}")
    assert affinity_node(pv) == node.name
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"  # the lower PV's
    assert pv["spec"]["capacity"]["storage"] == "5Gi"
    assert below["spec"]["volumeName"] in storage.volumes
    wait_for(
        "selected-node = the virtual node",
        lambda: (
            (claim(upper, namespace, "legacy") or {})
            .get("metadata", {})
            .get("annotations", {})
            .get(volumes.SELECTED_NODE)
            == node.name
        ),
    )
    # Reclaim policy Retain: the claim goes upstairs, the lower claim stays.
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/legacy")
    wait_for(
        "the pod gone below",
        lambda: get(lower, f"/api/v1/namespaces/{namespace}/pods/legacy") is None,
        timeout=60,
    )
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/legacy")
    wait_for(
        "the claim gone upstairs", lambda: claim(upper, namespace, "legacy") is None, timeout=60
    )
    kept = claim(lower, namespace, "legacy")
    assert kept is not None
    assert kept["metadata"]["annotations"][volumes.RECLAIM_ANNOTATION] == "Retain"
    released = upper.request("GET", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
    assert released["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    delete_if_present(upper, f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


def test_retain_set_while_the_node_was_down_keeps_the_lower_claim(
    fleet: Fleet, node: VirtualNodeProcess, storage: Storage, namespace: str
) -> None:
    """Issue 21: the policy in force is the upper PV's when the decision is taken. A claim
    provisioned with policy Delete; while the node is down an administrator patches its PV
    to Retain and the claim is deleted upstairs; the node, started again, keeps the lower
    claim although the mark it made on it still says Delete."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create_claim(upper, namespace, "data", storage_class=storage.upper_class)
    create_pod_with_claim(upper, namespace, "app", claim="data", node=node.name)
    wait_for("the pod Running", lambda: phase(upper, namespace, "app") == "Running", timeout=60)
    above = wait_for("the claim Bound upstairs", lambda: bound(upper, namespace, "data"))
    below = wait_for("the claim Bound below", lambda: bound(lower, namespace, "data"))
    assert below["metadata"]["annotations"][volumes.RECLAIM_ANNOTATION] == "Delete"
    pv_path = f"/api/v1/persistentvolumes/{above['spec']['volumeName']}"

    assert node.stop() == 0
    upper.request(
        "PATCH",
        pv_path,
        body={"spec": {"persistentVolumeReclaimPolicy": "Retain"}},
        content_type=MERGE,
    )
    # No kubelet answers for the pod while the node is down: force it away, as
    # `kubectl delete --force --grace-period=0` does, so the claim can go too.
    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/app",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data")
    wait_for("the claim gone upstairs", lambda: claim(upper, namespace, "data") is None)

    node.restart()
    # The node deletes the lower pod of the deleted upper pod; the claims mirror looks at
    # every lower claim it owns once started (before the fix it deleted this one then).
    wait_for(
        "the pod gone below",
        lambda: get(lower, f"/api/v1/namespaces/{namespace}/pods/app") is None,
        timeout=60,
    )
    wait_for(
        "the claims mirror has looked at the claim",
        lambda: (
            node.metric("tensile_workqueue_work_duration_seconds_count", queue="claims_to_lower")
            >= 1
        ),
    )
    # The pod's deletion also asks for a collection of its claims 2 s later
    # (Mirror.collect_delay): 3 s of the claim still there covers it.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        kept = claim(lower, namespace, "data")
        assert kept is not None, "the lower claim of a Retain PV was deleted"
        assert kept["metadata"]["uid"] == below["metadata"]["uid"]
        assert not kept["metadata"].get("deletionTimestamp"), "the lower claim is being deleted"
        time.sleep(0.2)
    assert (get(upper, pv_path) or {}).get("spec", {}).get(
        "persistentVolumeReclaimPolicy"
    ) == "Retain"
    delete_if_present(upper, pv_path)


def test_a_generic_ephemeral_volume_of_the_virtual_nodes_class_runs_and_goes_with_its_pod(
    fleet: Fleet, node: VirtualNodeProcess, storage: Storage, namespace: str
) -> None:
    """Issue 22: the upper ephemeral volume controller makes claim `scratch-cache` for the
    pod; the node provisions it as any claim of its class, and the lower pod mounts the
    lower claim the node made (keeping the `ephemeral` source, the lower cluster refused a
    claim of that name it had not made for the lower pod, and the pod never started).
    Deleting the pod deletes the upper claim, and so (reclaim policy Delete) the lower one."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    template = {
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage.upper_class,
            "resources": {"requests": {"storage": "1Gi"}},
        }
    }
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "scratch"},
            "spec": {
                "tolerations": TOLERATE,
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "app",
                        "image": "busybox",
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    }
                ],
                "volumes": [{"name": "cache", "ephemeral": {"volumeClaimTemplate": template}}],
            },
        },
    )
    wait_for("the pod Running", lambda: phase(upper, namespace, "scratch") == "Running", timeout=90)
    above = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/scratch")
    upper_claim = bound(upper, namespace, "scratch-cache")
    assert upper_claim is not None
    assert upper_claim["metadata"]["ownerReferences"][0]["uid"] == above["metadata"]["uid"]
    below = wait_for("the lower claim Bound", lambda: bound(lower, namespace, "scratch-cache"))
    assert ownership.is_owned(below, owner=node.owner)
    lower_pod = lower.request("GET", f"/api/v1/namespaces/{namespace}/pods/scratch")
    assert lower_pod["status"]["phase"] == "Running"
    cache = [v for v in lower_pod["spec"]["volumes"] if v["name"] == "cache"]
    assert cache == [{"name": "cache", "persistentVolumeClaim": {"claimName": "scratch-cache"}}]
    pv_path = f"/api/v1/persistentvolumes/{upper_claim['spec']['volumeName']}"

    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/scratch")
    wait_for(
        "the lower claim gone with the pod",
        lambda: claim(lower, namespace, "scratch-cache") is None,
        timeout=60,
    )
    assert claim(upper, namespace, "scratch-cache") is None
    wait_for("the upper PV gone", lambda: get(upper, pv_path) is None, timeout=30)
