"""`kubectl tensile why POD` as data (pure): where a pod runs or why it does not, from what the
upper cluster (and, when read, the lower one) holds.

What it reads and who wrote it:
- `spec.nodeName`, the PodScheduled condition: the upper scheduler, or the virtual node
  mirroring the lower scheduler's verdict (reason Unschedulable/SchedulerError on a pod
  bound to a virtual node: `tensile.contracts.descheduling.unplaceable_condition`);
- annotation `clusterSelector`: the webhook's conversion (placement moved for the lower
  scheduler; `tensile.contracts.clusterselector`), `tensile.io/avoided-nodes`: the virtual
  nodes the webhook kept it off (`tensile.contracts.avoidance`);
- the descheduler's marks (`tensile.contracts.descheduling`): its scheduling gate, `tensile.io/
  replaces`, `sigs.k8s.io/deschedule-count`, `tensile.io/no-virtual-node-left`, and its
  avoidance record's entry for the pod's controller;
- the pod's Events upstairs (the virtual node copies the lower pod's there) and, with the
  lower cluster read, the lower pod (found by the virtual node's ownership marks,
  `tensile.contracts.ownership`), its node and its Events.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from kubectl_tensile.status import age_seconds, condition, short_duration
from tensile.contracts import avoidance, clusterselector, descheduling
from tensile.contracts.labels import NODE_TYPE_LABEL, VIRTUAL_NODE_TYPE
from tensile.contracts.objects import annotations_of, as_list, as_mapping, labels_of, meta_of

MAX_EVENTS = 8
"""Events shown per cluster, the latest."""


def _name(obj: Mapping[str, Any]) -> str:
    meta = meta_of(obj)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def placement(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, *, now: dt.datetime
) -> dict[str, Any]:
    """Return where `pod` is: `state` (one of "deleting", "re-creating", "unscheduled",
    "not-virtual", "unplaceable-below", "on-virtual-node"), `node`, `phase` and `reason`
    (one sentence). `node` is the Node object it is bound to (None: unbound or not found)."""
    meta = meta_of(pod)
    spec = as_mapping(pod.get("spec"))
    phase = str(as_mapping(pod.get("status")).get("phase") or "Unknown")
    bound = str(spec.get("nodeName") or "")
    result: dict[str, Any] = {"node": bound, "phase": phase}
    if meta.get("deletionTimestamp"):
        return {**result, "state": "deleting", "reason": "the pod is being deleted"}
    if descheduling.is_gated(pod):
        replaced = descheduling.replaces(pod)
        what = f" of {replaced[0]}" if replaced else ""
        return {
            **result,
            "state": "re-creating",
            "reason": f"held back by the descheduler's scheduling gate: it is the replacement"
            f"{what}, released once the old pod is gone",
        }
    if not bound:
        scheduled = condition(pod, "PodScheduled")
        told = ": ".join(str(scheduled.get(k)) for k in ("reason", "message") if scheduled.get(k))
        return {
            **result,
            "state": "unscheduled",
            "reason": f"not scheduled upstairs ({told or 'no scheduling decision yet'})",
        }
    labels = labels_of(node or {})
    if node is not None and labels.get(NODE_TYPE_LABEL) != VIRTUAL_NODE_TYPE:
        return {
            **result,
            "state": "not-virtual",
            "reason": f"runs on {bound}, an ordinary node: tensile plays no part",
        }
    below = descheduling.unplaceable_condition(pod)
    if below is not None:
        age = age_seconds(below.get("lastTransitionTime"), now=now)
        since = "" if age is None else f" for {short_duration(age)}"
        return {
            **result,
            "state": "unplaceable-below",
            "reason": f"bound to virtual node {bound}, whose lower cluster cannot place it"
            f"{since}: {below.get('message') or below.get('reason')}; the descheduler moves "
            "it once --unschedulable-timeout has passed",
        }
    return {
        **result,
        "state": "on-virtual-node",
        "reason": f"runs on virtual node {bound} (phase {phase})",
    }


def webhook_changes(pod: Mapping[str, Any]) -> list[str]:
    """Return one sentence per change the webhook made to `pod` (none: not converted)."""
    annotations = annotations_of(pod)
    raw = annotations.get(clusterselector.ANNOTATION)
    if raw is None:
        return []
    parsed = clusterselector.parse(raw)
    if parsed is None:
        return [f"annotation {clusterselector.ANNOTATION} is not readable: {str(raw)[:60]}"]
    changes = []
    selector = as_mapping(parsed.get("nodeSelector"))
    if selector:
        pairs = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
        changes.append(f"nodeSelector moved below (for the lower scheduler): {pairs}")
    terms = clusterselector.required_terms(parsed.get("affinity"))
    if terms:
        changes.append(f"{len(terms)} required node-affinity term(s) moved below")
    tolerations = as_list(parsed.get("tolerations"))
    if tolerations:
        changes.append(
            f"{len(tolerations)} toleration(s) kept for below; the virtual nodes' taint "
            "tolerated upstairs"
        )
    avoided = sorted(avoidance.added_nodes(pod))
    if avoided:
        changes.append(
            "kept off virtual node(s) "
            + ", ".join(avoided)
            + " (the descheduler's avoidance record)"
        )
    return changes or ["converted by the webhook; nothing needed moving"]


def descheduler_marks(pod: Mapping[str, Any]) -> list[str]:
    """Return one sentence per mark the descheduler left on `pod`."""
    annotations = annotations_of(pod)
    marks = []
    replaced = descheduling.replaces(pod)
    if replaced:
        marks.append(f"replaces pod {replaced[0]} (re-created by the descheduler)")
    count = descheduling.deschedule_count(pod)
    if count:
        marks.append(f"moved {count} time(s) by the descheduler")
    if descheduling.is_left_alone(pod):
        since = annotations.get(descheduling.LEFT_ALONE_ANNOTATION)
        marks.append(f"no virtual node left to move it to (since {since}); left where it is")
    return marks


def owner_avoidances(
    pod: Mapping[str, Any], record: Mapping[str, str] | None, *, now: dt.datetime
) -> list[str]:
    """Return the virtual nodes the record keeps the pod's controller off, with until when."""
    owner = avoidance.controller_of(pod)
    if owner is None or record is None or owner.uid not in record:
        return []
    entry = avoidance.parse_entry(owner.uid, record[owner.uid])
    if entry is None:
        return []
    return [
        f"{owner.kind} {owner.name} avoids {node} until "
        f"{entry.nodes[node].strftime('%Y-%m-%dT%H:%M:%SZ')}"
        for node in sorted(entry.live_nodes(now=now))
    ]


def events(items: Iterable[Mapping[str, Any]], *, now: dt.datetime) -> list[dict[str, Any]]:
    """Return the latest `MAX_EVENTS` Events, oldest first: `age` (seconds), `type`,
    `reason`, `message`, `count`."""
    found: list[dict[str, Any]] = []
    for item in items:
        when = item.get("lastTimestamp") or item.get("eventTime") or item.get("firstTimestamp")
        series = as_mapping(item.get("series"))
        age = age_seconds(series.get("lastObservedTime") or when, now=now)
        found.append(
            {
                "age": age,
                "type": str(item.get("type") or ""),
                "reason": str(item.get("reason") or ""),
                "message": str(item.get("message") or ""),
                "count": int(item.get("count") or series.get("count") or 1),
            }
        )
    found.sort(key=lambda e: -float(e["age"] if e["age"] is not None else 0.0))
    return found[-MAX_EVENTS:]


def why(
    *,
    pod: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    pod_events: Iterable[Mapping[str, Any]],
    record: Mapping[str, str] | None,
    lower: Mapping[str, Any] | None,
    now: dt.datetime,
) -> dict[str, Any]:
    """Return the explanation of `pod`: `pod`, `placement`, `webhook`, `descheduler`,
    `avoidances`, `events` and `lower`. `lower` is what was read below ({"error": ...} when
    the lower cluster could not be read, None when it was not asked): `pod` (the lower pod
    or None), `events`."""
    explained: dict[str, Any] = {
        "pod": _name(pod),
        "placement": placement(pod, node, now=now),
        "webhook": webhook_changes(pod),
        "descheduler": descheduler_marks(pod),
        "avoidances": owner_avoidances(pod, record, now=now),
        "events": events(pod_events, now=now),
        "lower": None,
    }
    if lower is not None:
        lower_pod = lower.get("pod")
        if "error" in lower:
            explained["lower"] = {"error": lower["error"]}
        elif lower_pod is None:
            explained["lower"] = {"pod": None}
        else:
            explained["lower"] = {
                "pod": _name(lower_pod),
                "node": str(as_mapping(lower_pod.get("spec")).get("nodeName") or ""),
                "phase": str(as_mapping(lower_pod.get("status")).get("phase") or "Unknown"),
                "events": events(lower.get("events") or [], now=now),
            }
    return explained
