"""`kubectl tensile status` as data (pure): per virtual node, its lower cluster's health as the
upper cluster sees it, capacity used and free, pods, and the descheduler's pending moves.

Health comes from what the virtual node publishes: its Ready condition, its
LowerControlPlaneReachable condition (False while its lower apiserver does not answer its
ping: `tensile.contracts.lowerhealth`) and its node Lease (kube-node-lease). A heartbeat
older than the Lease's duration means the virtual node stopped answering (or, under
--lower-outage-policy=evict, its lower cluster) before the node lifecycle controller has
said so. When the lower cluster was also read directly (`--lower`), its /readyz answer is
reported beside that.

Used is what kube-scheduler counts: the requests of the pods bound to the node that are
not terminal (tensile.placement.requests.pod_requests); free is allocatable minus used.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from tensile.contracts import avoidance, descheduling, lowerhealth
from tensile.contracts.objects import as_list, as_mapping, meta_of, name_of
from tensile.kube.quantity import format_quantity, parse_quantity
from tensile.kube.resources import pod_is_terminal
from tensile.placement.requests import pod_requests

RESOURCES = ("cpu", "memory", "pods")
DEFAULT_LEASE_SECONDS = 40
"""The kubelet's nodeLeaseDurationSeconds, when a Lease does not say."""


def age_seconds(timestamp: object, *, now: dt.datetime) -> float | None:
    """Return how many seconds before `now` an RFC 3339 `timestamp` was (None: not one)."""
    if not isinstance(timestamp, str) or not timestamp:
        return None
    try:
        moment = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return max(0.0, (now - moment).total_seconds())


def short_duration(seconds: float) -> str:
    """Return kubectl's short age of `seconds` ("45s", "3m", "2h", "4d")."""
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 7200:
        return f"{int(seconds // 60)}m"
    if seconds < 172800:
        return f"{int(seconds // 3600)}h"
    return f"{int(seconds // 86400)}d"


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """Return the status condition of type `kind` ({} when absent)."""
    for item in as_list(as_mapping(obj.get("status")).get("conditions")):
        if as_mapping(item).get("type") == kind:
            return as_mapping(item)
    return {}


def health(
    node: Mapping[str, Any], lease: Mapping[str, Any] | None, *, now: dt.datetime
) -> dict[str, Any]:
    """Return the lower cluster's health as the virtual node reports it: `ready` (the Ready
    condition's status, "Unknown" when absent), `reason`, `heartbeatAgeSeconds` (None: no
    Lease) and `state`: "ok", "stale" (heartbeat older than the Lease duration), "down"
    (Ready is not True), "unreachable" (Ready, its lower apiserver not answering: pods kept
    as last seen; `reason` and `message` are then that condition's)."""
    ready = condition(node, "Ready")
    status = str(ready.get("status") or "Unknown")
    spec = as_mapping((lease or {}).get("spec"))
    age = age_seconds(spec.get("renewTime"), now=now)
    duration = spec.get("leaseDurationSeconds")
    limit = duration if isinstance(duration, int) and duration > 0 else DEFAULT_LEASE_SECONDS
    if status != "True":
        state = "down"
    elif lowerhealth.lower_unreachable(node):
        state = "unreachable"
        ready = condition(node, lowerhealth.LOWER_REACHABLE_CONDITION)
    elif age is None or age > limit:
        state = "stale"
    else:
        state = "ok"
    return {
        "ready": status,
        "reason": str(ready.get("reason") or ""),
        "message": str(ready.get("message") or ""),
        "heartbeatAgeSeconds": None if age is None else round(age, 1),
        "state": state,
    }


def _amounts(source: Mapping[str, Any]) -> dict[str, Fraction]:
    found: dict[str, Fraction] = {}
    for name in RESOURCES:
        value = source.get(name)
        if isinstance(value, (str, int)):
            try:
                found[name] = parse_quantity(value)
            except ValueError:
                continue
    return found


def _quantities(amounts: Mapping[str, Fraction]) -> dict[str, str]:
    return {
        name: format_quantity(amounts.get(name, Fraction(0)), binary=name == "memory")
        for name in RESOURCES
    }


def usage(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Return `allocatable`, `used` and `free` (quantity strings per resource of
    `RESOURCES`) of `node` given the pods bound to it, and `pods` (their count). Pods with
    malformed quantities count as one pod slot only."""
    allocatable = _amounts(as_mapping(as_mapping(node.get("status")).get("allocatable")))
    used: dict[str, Fraction] = dict.fromkeys(RESOURCES, Fraction(0))
    count = 0
    for pod in pods:
        if pod_is_terminal(pod):
            continue
        count += 1
        try:
            requests = pod_requests(pod)
        except ValueError:
            requests = {"pods": Fraction(1)}
        for name in RESOURCES:
            used[name] += requests.get(name, Fraction(0))
    free = {name: allocatable.get(name, Fraction(0)) - used[name] for name in RESOURCES}
    return {
        "allocatable": _quantities(allocatable),
        "used": _quantities(used),
        "free": _quantities(free),
        "pods": count,
    }


def avoidances(record: Mapping[str, str] | None, *, now: dt.datetime) -> list[dict[str, Any]]:
    """Return the avoidance record's live entries, one per (owner, virtual node): `owner`
    ("Kind namespace/name"), `node`, `until` (RFC 3339) and `remainingSeconds`, sorted by
    node then owner."""
    found = []
    for uid, value in (record or {}).items():
        entry = avoidance.parse_entry(uid, value)
        if entry is None:
            continue
        owner = entry.owner
        for node in sorted(entry.live_nodes(now=now)):
            found.append(
                {
                    "owner": f"{owner.kind} {owner.namespace}/{owner.name}",
                    "ownerUID": uid,
                    "node": node,
                    "until": entry.nodes[node].strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "remainingSeconds": round((entry.nodes[node] - now).total_seconds()),
                }
            )
    return sorted(found, key=lambda e: (e["node"], e["owner"]))


def re_creations(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return the descheduler's re-creations of bare pods still in progress (replacements
    that still carry its scheduling gate): `pod` ("namespace/name"), `replaces`."""
    found = []
    for pod in pods:
        if not descheduling.is_gated(pod):
            continue
        meta = meta_of(pod)
        replaced = descheduling.replaces(pod)
        found.append(
            {
                "pod": f"{meta.get('namespace')}/{meta.get('name')}",
                "replaces": replaced[0] if replaced else "",
            }
        )
    return sorted(found, key=lambda e: str(e["pod"]))


def unplaceable(pods: Iterable[Mapping[str, Any]], *, now: dt.datetime) -> list[dict[str, Any]]:
    """Return the pods bound to a node whose lower cluster cannot place them (the
    descheduler's candidates, `tensile.contracts.descheduling.unplaceable_condition`): `pod`,
    `node`, `forSeconds` (since the condition changed), `message` (the lower scheduler's)."""
    found = []
    for pod in pods:
        node = as_mapping(pod.get("spec")).get("nodeName")
        scheduled = descheduling.unplaceable_condition(pod)
        if scheduled is None or not node:
            continue
        meta = meta_of(pod)
        age = age_seconds(scheduled.get("lastTransitionTime"), now=now)
        found.append(
            {
                "pod": f"{meta.get('namespace')}/{meta.get('name')}",
                "node": node,
                "forSeconds": None if age is None else round(age),
                "message": str(scheduled.get("message") or ""),
            }
        )
    return sorted(found, key=lambda e: (str(e["node"]), str(e["pod"])))


def status(
    *,
    nodes: Iterable[Mapping[str, Any]],
    leases: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    record: Mapping[str, str] | None,
    lower_ready: Mapping[str, str],
    now: dt.datetime,
) -> dict[str, Any]:
    """Return the whole report: `nodes` (one entry per virtual node, by name; its
    `pendingMoves` counts its `unplaceable` pods) and `pendingMoves`: `unplaceable` (pods
    the descheduler will move), `avoidances` (owners moved off a node, kept off it until a
    time) and `reCreations` (bare pods being re-created elsewhere). `leases` are the node
    Leases by node name; `lower_ready` the /readyz answer of the lower clusters read
    directly, by virtual node ("ok" or what failed)."""
    pod_list = list(pods)
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pod_list:
        name = as_mapping(pod.get("spec")).get("nodeName")
        if isinstance(name, str) and name:
            by_node.setdefault(name, []).append(pod)
    waiting = unplaceable(pod_list, now=now)
    entries = []
    for node in sorted(nodes, key=name_of):
        name = name_of(node)
        lower = health(node, leases.get(name), now=now)
        if name in lower_ready:
            lower["readyz"] = lower_ready[name]
        entries.append(
            {
                "name": name,
                "lower": lower,
                **usage(node, by_node.get(name, [])),
                "pendingMoves": sum(1 for w in waiting if w["node"] == name),
            }
        )
    return {
        "nodes": entries,
        "pendingMoves": {
            "unplaceable": waiting,
            "avoidances": avoidances(record, now=now),
            "reCreations": re_creations(pod_list),
        },
    }
