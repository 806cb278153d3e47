"""The lower-pod cache's form of a pod: references remembered per pod, never stale."""

from __future__ import annotations

from typing import Any

from tensile.contracts import ownership
from vnode.providers.k2k.slim import REFS, SlimLowerPods, slim_lower_pod

OWNER = ownership.NodeIdentity(node_name="vn-1", cluster_id="c-1")


def lower_pod(uid: str = "u-1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "team-a", "uid": uid, "resourceVersion": "1"},
        "spec": {
            "nodeName": "lower-node-1",
            "containers": [
                {"name": "main", "image": "nginx", "envFrom": [{"configMapRef": {"name": "cfg"}}]}
            ],
            **spec,
        },
        "status": {"phase": "Running"},
    }


def test_the_transform_gives_what_slim_lower_pod_gives() -> None:
    slimmer = SlimLowerPods(owner=OWNER)
    pod = lower_pod()
    assert slimmer(pod) == slim_lower_pod(pod, owner=OWNER)
    assert slimmer(pod)[REFS] == [["ConfigMap", "cfg"], ["ServiceAccount", "default"]]


def test_references_added_with_an_ephemeral_container_are_seen() -> None:
    slimmer = SlimLowerPods(owner=OWNER)
    assert ["Secret", "debug"] not in slimmer(lower_pod())[REFS]
    debug = {"name": "debug", "image": "busybox", "env": [
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "debug", "key": "t"}}}]}  # fmt: skip
    assert ["Secret", "debug"] in slimmer(lower_pod(ephemeralContainers=[debug]))[REFS]


def test_a_new_pod_of_the_same_name_is_not_taken_for_the_old_one() -> None:
    slimmer = SlimLowerPods(owner=OWNER, remembered=2)
    slimmer(lower_pod(uid="u-1"))
    other = lower_pod(uid="u-2")
    other["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "other"}}]
    assert slimmer(other)[REFS] == [["Secret", "other"], ["ServiceAccount", "default"]]
    for i in range(5):  # bounded: the oldest are forgotten, and worked out again if seen
        slimmer(lower_pod(uid=f"u-{10 + i}"))
    assert len(slimmer._refs) == 2
    assert slimmer(lower_pod(uid="u-1"))[REFS] == [
        ["ConfigMap", "cfg"],
        ["ServiceAccount", "default"],
    ]
