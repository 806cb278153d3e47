"""Lower Events as the mirror caches them: what reaches the upper cluster is unchanged."""

from __future__ import annotations

from typing import Any

from tensile.contracts import ownership
from tensile.kube import codec
from vnode.providers.k2k.events import slim_event, upper_event

LOWER_POD = {
    "metadata": {
        "name": "web-1",
        "namespace": "team-a",
        "annotations": {
            ownership.UPPER_UID_ANNOTATION: "upper-uid-1",
            ownership.UPPER_NAMESPACE_ANNOTATION: "team-a",
        },
    }
}


def event(reason: str, type_: str = "Normal", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"web-1.{reason.lower()}",
            "namespace": "team-a",
            "uid": "lower-event-uid",
            "resourceVersion": "42",
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:count": {}}}],
        },
        "involvedObject": {
            "kind": "Pod",
            "namespace": "team-a",
            "name": "web-1",
            "uid": "lower-pod-uid",
            "apiVersion": "v1",
            "resourceVersion": "7",
            "fieldPath": "spec.containers{main}",
        },
        "reason": reason,
        "message": f"{reason} happened",
        "type": type_,
        "count": 3,
        "firstTimestamp": "2026-11-20T10:00:00Z",
        "lastTimestamp": "2026-11-20T10:00:09Z",
        "source": {"component": "kubelet", "host": "lower-node-1"},
        "reportingComponent": "kubelet",
        "reportingInstance": "lower-node-1",
        **extra,
    }


def test_a_slim_event_mirrors_exactly_as_the_full_one() -> None:
    full = event("BackOff", "Warning")
    slim = slim_event(full)
    assert upper_event(slim, lower_pod=LOWER_POD) == upper_event(full, lower_pod=LOWER_POD)
    assert len(codec.dumps(slim)) < 0.7 * len(codec.dumps(full))
    assert "managedFields" not in slim["metadata"]


def test_a_routine_event_keeps_only_what_says_it_is_routine() -> None:
    slim = slim_event(event("Scheduled"))
    assert set(slim) == {"metadata", "involvedObject", "reason", "type"}
    assert slim["metadata"] == {
        "name": "web-1.scheduled",
        "namespace": "team-a",
        "resourceVersion": "42",
    }


def test_slim_event_leaves_its_input_alone() -> None:
    full = event("Pulled")
    before = codec.deep_copy(full)
    slim_event(full)
    assert full == before
