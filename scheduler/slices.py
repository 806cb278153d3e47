"""Namespace quota slices: the placement decisions (pure).

The super-cluster pool's namespace scheduler, on virtual nodes: a namespace's ResourceQuota
on requests (cpu, memory) is cut into slices of a fixed size (`--slice-cpu`,
`--slice-memory`), and the slices are spread over the virtual nodes in proportion to the
room each has for them. The extender then admits the namespace's pods to a virtual node
only within the slices it holds there (`slices_admission`).

Which quota is read: `spec.hard` of the namespace's unscoped ResourceQuotas, keys
`requests.cpu` / `cpu` and `requests.memory` / `memory` (Kubernetes treats the bare name as
the requests one). These bound what the namespace's pods *request*, which is what every
scheduler places by. `limits.*` bounds what pods may burst to, which no node reserves:
it is not read. Several quotas all hold, so the smallest hard amount wins. Scoped quotas
(`scopes`, `scopeSelector`) bound only some pods, and are not read.

The room of a virtual node for a namespace (`rooms`): its `status.allocatable` (already
the lower cluster's free room as the virtual node counts it) minus `headroom` of it, minus
what the others commit there: for each other namespace holding slices on the node the
larger of its slices' budget and its pods' requests, and the requests of the other pods
bound there. The namespace's own pods are inside its slices, so not subtracted.

How slices are spread (`place`): slices still valid where they are (same size, the node
still usable, still room for them) stay; the quota's remaining slices go one at a time to
the node with the highest `room / (held + 1)` (the D'Hondt rule: in proportion to room;
ties by node name), never beyond a node's room. So a run with unchanged inputs changes
nothing, and a node that leaves or shrinks loses only the slices it cannot hold; running
pods are never moved (slices bound new pods only).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from scheduler.slices_record import Holding, Record, Slice
from vnode.contracts.objects import as_list, as_mapping
from vnode.kube.quantity import parse_quantity

RESOURCES: Final = ("cpu", "memory")
"""The resources slices bound (cpu in cores, memory in bytes)."""
QUOTA_KEYS: Final = {"cpu": ("requests.cpu", "cpu"), "memory": ("requests.memory", "memory")}
"""ResourceQuota `spec.hard` keys read per resource (see the module docstring)."""
MAX_SLICES: Final = 100_000
"""Most slices one namespace's quota may make: past it the slice size is surely a
mistake (and spreading would take long), so the quota is reported unplaceable."""


@dataclass(frozen=True, kw_only=True)
class PodUse:
    """A pod bound to a node: its namespace, node and requests (cores, bytes)."""

    namespace: str
    node: str
    requests: Mapping[str, Fraction]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a namespace's slices go (`place`)."""

    counts: dict[str, int]
    """Virtual node -> slices held (nodes with none left out)."""
    wanted: int
    """Slices the quota makes."""
    unplaced: int
    """Slices that found no room anywhere."""
    dropped: dict[str, str] = field(default_factory=dict)
    """Virtual node -> why it holds fewer slices than before."""


def quota_of(quotas: Iterable[Mapping[str, Any]]) -> dict[str, Fraction]:
    """Return the namespace's bound on requests per resource ("cpu" cores, "memory" bytes)
    from its ResourceQuota objects; resources no unscoped quota bounds are left out.
    Malformed amounts (the apiserver validates, so only a hand-made object) are skipped."""
    bound: dict[str, Fraction] = {}
    for quota in quotas:
        spec = as_mapping(quota.get("spec"))
        if as_list(spec.get("scopes")) or spec.get("scopeSelector"):
            continue
        hard = as_mapping(spec.get("hard"))
        for resource, keys in QUOTA_KEYS.items():
            for key in keys:
                try:
                    amount = parse_quantity(hard[key]) if key in hard else None
                except (ValueError, TypeError):
                    amount = None
                if amount is not None and amount >= 0:
                    bound[resource] = min(bound.get(resource, amount), amount)
    return bound


def slice_for(quota: Mapping[str, Fraction], *, cpu: Fraction, memory: int) -> Slice:
    """The slice of a namespace with `quota`: the configured size for the resources the
    quota bounds, unbounded (None) for the others."""
    return Slice(
        cpu=cpu if "cpu" in quota else None,
        memory=memory if "memory" in quota else None,
    )


def wanted(quota: Mapping[str, Fraction], size: Slice) -> int:
    """How many slices of `size` cover `quota`: enough for every bounded resource (the last
    slice may be partly unused)."""
    amounts = size.amounts()
    return max(
        (math.ceil(quota[name] / amounts[name]) for name in amounts if name in quota),
        default=0,
    )


def usable(node: Mapping[str, Any]) -> str | None:
    """None when new pods may go to `node` (a Node object), else why not ("is not Ready",
    "is cordoned")."""
    if as_mapping(node.get("spec")).get("unschedulable"):
        return "is cordoned"
    for condition in as_list(as_mapping(node.get("status")).get("conditions")):
        if as_mapping(condition).get("type") == "Ready":
            return None if as_mapping(condition).get("status") == "True" else "is not Ready"
    return "is not Ready"


def allocatable(node: Mapping[str, Any]) -> dict[str, Fraction]:
    """The node's `status.allocatable` cpu (cores) and memory (bytes); a missing or
    malformed amount counts as 0."""
    raw = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    out: dict[str, Fraction] = {}
    for name in RESOURCES:
        try:
            out[name] = parse_quantity(raw[name]) if name in raw else Fraction(0)
        except (ValueError, TypeError):
            out[name] = Fraction(0)
    return out


def rooms(
    *,
    namespace: str,
    nodes: Mapping[str, Mapping[str, Fraction]],
    pods: Iterable[PodUse],
    records: Mapping[str, Record],
    headroom: Fraction,
) -> dict[str, dict[str, Fraction]]:
    """The room of each usable virtual node for `namespace`'s slices (see the module).

    `nodes`: usable virtual node -> allocatable; `pods`: the pods bound to them (any
    namespace); `records`: the other namespaces' records; `headroom`: the share (0..1) of
    each node kept free. Returns node -> resource -> amount (may be negative: full).
    """
    usage: dict[tuple[str, str], dict[str, Fraction]] = {}
    for pod in pods:
        if pod.node in nodes and pod.namespace != namespace:
            used = usage.setdefault((pod.namespace, pod.node), {})
            for name in RESOURCES:
                used[name] = used.get(name, Fraction(0)) + pod.requests.get(name, Fraction(0))
    for other, record in records.items():
        if other == namespace:
            continue
        for node, holding in record.items():
            if node in nodes:
                used = usage.setdefault((other, node), {})
                for name, amount in holding.budget().items():
                    used[name] = max(used.get(name, Fraction(0)), amount)
    out = {
        node: {name: amount * (1 - headroom) for name, amount in alloc.items()}
        for node, alloc in nodes.items()
    }
    for (_, node), used in usage.items():
        for name, amount in used.items():
            out[node][name] -= amount
    return out


def fits(room: Mapping[str, Fraction], size: Slice) -> int:
    """How many slices of `size` fit in `room` (0 when full)."""
    amounts = size.amounts()
    counts = [math.floor(room.get(name, Fraction(0)) / amount) for name, amount in amounts.items()]
    return max(0, min(counts, default=0))


def place(
    *,
    quota: Mapping[str, Fraction],
    size: Slice,
    rooms: Mapping[str, Mapping[str, Fraction]],
    previous: Record | None,
    unusable: Mapping[str, str] | None = None,
) -> Placement:
    """Spread the slices of `quota` over the nodes of `rooms`, keeping what `previous`
    placed where still valid (see the module docstring).

    `unusable`: virtual nodes present but not taking pods -> why (for `dropped`). Raises
    nothing; a quota making more than `MAX_SLICES` slices places none.
    """
    n = wanted(quota, size)
    if n > MAX_SLICES:
        return Placement(counts={}, wanted=n, unplaced=n)
    room = {node: fits(r, size) for node, r in rooms.items()}
    counts: dict[str, int] = {}
    dropped: dict[str, str] = {}
    for node, holding in sorted((previous or {}).items()):
        if holding.count <= 0:
            continue
        if holding.size != size:
            dropped[node] = f"the slice size changed from {holding.size} to {size}"
        elif node not in room:
            dropped[node] = (unusable or {}).get(node, "is gone")
        elif room[node] < holding.count:
            dropped[node] = f"has room for {room[node]} slices, held {holding.count}"
            if room[node]:
                counts[node] = room[node]
        else:
            counts[node] = holding.count
    _trim(counts, room, n, dropped)
    _fill(counts, room, n - sum(counts.values()))
    return Placement(
        counts={node: c for node, c in sorted(counts.items()) if c > 0},
        wanted=n,
        unplaced=n - sum(counts.values()),
        dropped=dropped,
    )


def _trim(counts: dict[str, int], room: Mapping[str, int], n: int, dropped: dict[str, str]) -> None:
    """Give back slices beyond `n` (the quota shrank): from the nodes fullest for their
    room first, ties by the last name."""
    while sum(counts.values()) > n:
        node = max(counts, key=lambda v: (Fraction(counts[v], max(room[v], 1)), v))
        counts[node] -= 1
        dropped.setdefault(node, "the quota makes fewer slices")
        if not counts[node]:
            del counts[node]


def _fill(counts: dict[str, int], room: Mapping[str, int], left: int) -> None:
    """Add `left` slices by the D'Hondt rule: each to the node with the highest
    room / (held + 1), ties by name, within each node's room."""
    heap = [
        (-Fraction(room[node], counts.get(node, 0) + 1), node)
        for node in room
        if counts.get(node, 0) < room[node]
    ]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, node = heapq.heappop(heap)
        counts[node] = counts.get(node, 0) + 1
        left -= 1
        if counts[node] < room[node]:
            heapq.heappush(heap, (-Fraction(room[node], counts[node] + 1), node))


def record_of_placement(placement: Placement, size: Slice) -> dict[str, Holding]:
    """The record of `placement`: node -> its count of slices of `size`."""
    return {node: Holding(count=c, size=size) for node, c in placement.counts.items()}
