"""The marks the descheduler leaves on upper pods, and the condition it moves them on: what
the descheduler writes and judges by, and kubectl tensile reads to tell why a pod is where
it is. Pure: no I/O, inputs never mutated.

A bare pod (no controller) that moves is re-created by the descheduler behind its
scheduling gate (`SCHEDULING_GATE`), naming the pod it replaces (`REPLACES_ANNOTATION`,
`REPLACES_UID_ANNOTATION`); every moved pod counts its moves (`DESCHEDULE_COUNT_ANNOTATION`);
a pod found with no virtual node left is marked and never judged again
(`LEFT_ALONE_ANNOTATION`). A pod is a candidate while the lower scheduler's verdict, mirrored
upstairs by its virtual node, says it cannot be placed (`unplaceable_condition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensile.contracts.objects import annotations_of, as_list, as_mapping, meta_of

DESCHEDULE_COUNT_ANNOTATION = "sigs.k8s.io/deschedule-count"
"""How many times the descheduler moved a pod (a decimal string), tensile-kube's name."""
SCHEDULING_GATE = "tensile.io/descheduler"
"""Holds a bare pod's replacement back from the scheduler until the old pod is gone."""
REPLACES_ANNOTATION = "tensile.io/replaces"
"""On a bare pod's replacement: the name of the pod it replaces."""
REPLACES_UID_ANNOTATION = "tensile.io/replaces-uid"
"""On a bare pod's replacement: the UID of the pod it replaces."""
LEFT_ALONE_ANNOTATION = "tensile.io/no-virtual-node-left"
"""On an upper pod the descheduler found with no virtual node left to go to: when it found
so (RFC 3339). Whatever its value, the descheduler never judges that pod again: kept on the
pod, the verdict outlives restarts and leader changes, and unlike an avoidance it never
expires -- which is what stops an owner's pods from cycling between full lower clusters.
Removing it has the pod judged again."""
UNPLACEABLE_REASONS = frozenset({"Unschedulable", "SchedulerError"})
"""The PodScheduled reasons that say the lower cluster cannot place a pod."""


def deschedule_count(pod: Mapping[str, Any]) -> int:
    """Return the pod's `sigs.k8s.io/deschedule-count` (0 when absent or not a number)."""
    annotations = annotations_of(pod)
    value = annotations.get(DESCHEDULE_COUNT_ANNOTATION)
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def is_left_alone(pod: Mapping[str, Any]) -> bool:
    """Tell whether `pod` carries LEFT_ALONE_ANNOTATION (any value)."""
    return LEFT_ALONE_ANNOTATION in annotations_of(pod)


def replaces(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (name, UID) of the pod that `pod` replaces; None unless it is a replacement."""
    annotations = annotations_of(pod)
    name = annotations.get(REPLACES_ANNOTATION)
    uid = annotations.get(REPLACES_UID_ANNOTATION)
    if isinstance(name, str) and isinstance(uid, str) and name and uid:
        return name, uid
    return None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Tell whether `pod` still carries the descheduler's scheduling gate."""
    gates = as_list(as_mapping(pod.get("spec")).get("schedulingGates"))
    return any(as_mapping(g).get("name") == SCHEDULING_GATE for g in gates)


def unplaceable_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Return the PodScheduled condition of `pod` when it says the lower cluster cannot
    place it (False, reason Unschedulable or SchedulerError) and the pod is Pending and not
    going away; else None."""
    status = as_mapping(pod.get("status"))
    meta = meta_of(pod)
    if status.get("phase") != "Pending" or meta.get("deletionTimestamp"):
        return None
    scheduled = next(
        (
            as_mapping(c)
            for c in as_list(status.get("conditions"))
            if as_mapping(c).get("type") == "PodScheduled"
        ),
        {},
    )
    if scheduled.get("status") == "False" and scheduled.get("reason") in UNPLACEABLE_REASONS:
        return scheduled
    return None
