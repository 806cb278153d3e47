"""The objects a move writes (pure): the Eviction, the deschedule-count patch, a bare pod's
replacement, and the mark on a pod left where it is because no virtual node is left for it.

A bare pod (no controller) cannot be evicted and replaced by its owner: the descheduler
re-creates it. The replacement is the same pod -- labels, annotations, spec -- plus label
`create-by-descheduler=true`, the deschedule count, the name and UID of the pod it replaces, and
`kubernetes.io/hostname NotIn [...]` for the virtual nodes it must avoid. Its name is the
original's with `-d<count>` (`web` -> `web-d1` -> `web-d2`): the two exist side by side
for a moment, and a name derived from the count makes a retried step find the replacement
it already made. It is created behind a scheduling gate, so it cannot be scheduled, let alone
run, until the old pod is gone: never two of them running. The marks themselves, which
kubectl tensile reads too, are `tensile.contracts.descheduling`.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Iterable, Mapping
from typing import Any

from tensile.contracts import avoidance, labels
from tensile.contracts.descheduling import (
    DESCHEDULE_COUNT_ANNOTATION,
    LEFT_ALONE_ANNOTATION,
    REPLACES_ANNOTATION,
    REPLACES_UID_ANNOTATION,
    SCHEDULING_GATE,
    deschedule_count,
)
from tensile.contracts.objects import as_list, as_mapping, meta_of, name_of, uid_of
from tensile.kube.timestamps import rfc3339

_DROPPED_META = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                 "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink",
                 "generateName", "finalizers")  # fmt: skip
# Set on creation by the scheduler or admission (priority, overhead from the classes), or
# not settable on create (ephemeral containers): left for the apiserver to fill in again.
_DROPPED_SPEC = ("nodeName", "priority", "preemptionPolicy", "overhead", "ephemeralContainers")
_SUFFIX = re.compile(r"-d[0-9]+$")
MAX_NAME = 253


def count_patch(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Return the JSON merge patch that increments the deschedule count of `pod` (as it was
    judged): it names that one annotation only (every other annotation stays as it is) and
    the pod's UID, so another pod that took its name meanwhile (a StatefulSet's next one) is
    not touched -- the apiserver refuses to change a UID. No resourceVersion: it is written
    once the pod is evicted, when the eviction has changed it already."""
    meta = meta_of(pod)
    return {
        "metadata": {
            "uid": meta.get("uid"),
            "annotations": {DESCHEDULE_COUNT_ANNOTATION: str(deschedule_count(pod) + 1)},
        }
    }


def left_alone_patch(pod: Mapping[str, Any], *, now: dt.datetime) -> dict[str, Any]:
    """Return the JSON merge patch that marks `pod` as left alone (LEFT_ALONE_ANNOTATION,
    `now` as its value): that one annotation and the pod's UID, as `count_patch` (another
    pod that took its name meanwhile is refused by the apiserver, not marked)."""
    meta = meta_of(pod)
    return {
        "metadata": {"uid": meta.get("uid"), "annotations": {LEFT_ALONE_ANNOTATION: rfc3339(now)}}
    }


def eviction(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Return the policy/v1 Eviction of `pod`, with preconditions on its UID and
    resourceVersion: the eviction applies to the pod as judged, or fails with 409."""
    meta = meta_of(pod)
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "deleteOptions": {
            "preconditions": {
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            }
        },
    }


def replacement_name(pod: Mapping[str, Any]) -> str:
    """Return the name of the replacement of bare pod `pod`: its original name (a previous
    replacement's `-d<n>` removed) with `-d<count+1>`."""
    meta = meta_of(pod)
    name = str(meta.get("name") or "")
    if as_mapping(meta.get("labels")).get(labels.CREATED_BY_DESCHEDULER_LABEL) == "true":
        name = _SUFFIX.sub("", name)
    suffix = f"-d{deschedule_count(pod) + 1}"
    return name[: MAX_NAME - len(suffix)] + suffix


def replacement(pod: Mapping[str, Any], *, avoid: Iterable[str]) -> dict[str, Any]:
    """Return the replacement of bare pod `pod` (see the module docstring), gated."""
    meta = {k: copy.deepcopy(v) for k, v in meta_of(pod).items()}
    for key in _DROPPED_META:
        meta.pop(key, None)
    meta["name"] = replacement_name(pod)
    meta["labels"] = {
        **as_mapping(meta.get("labels")),
        labels.CREATED_BY_DESCHEDULER_LABEL: "true",
    }
    meta["annotations"] = {
        **as_mapping(meta.get("annotations")),
        DESCHEDULE_COUNT_ANNOTATION: str(deschedule_count(pod) + 1),
        REPLACES_ANNOTATION: name_of(pod),
        REPLACES_UID_ANNOTATION: uid_of(pod),
    }
    spec = {k: copy.deepcopy(v) for k, v in as_mapping(pod.get("spec")).items()}
    for key in _DROPPED_SPEC:
        spec.pop(key, None)
    affinity = avoidance.avoiding(as_mapping(spec.get("affinity")) or None, avoid)
    if affinity is not None:
        spec["affinity"] = affinity
    gates = [
        g
        for g in as_list(spec.get("schedulingGates"))
        if as_mapping(g).get("name") != SCHEDULING_GATE
    ]
    spec["schedulingGates"] = [*gates, {"name": SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def ungate_patch() -> dict[str, Any]:
    """Return the strategic merge patch that removes the descheduler's scheduling gate (and
    only it: schedulingGates merge by name)."""
    return {"spec": {"schedulingGates": [{"$patch": "delete", "name": SCHEDULING_GATE}]}}
