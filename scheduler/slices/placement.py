"""Namespace quota slices: the placement decisions (pure).

The super-cluster pool's namespace scheduler, on virtual nodes: a namespace's ResourceQuota
on requests (cpu, memory) is cut into slices of a fixed size (`--slice-cpu`,
`--slice-memory`), and the slices are spread over the virtual nodes in proportion to the
room each has for them. The extender then admits the namespace's pods to a virtual node
only within the slices it holds there (`admission`).

Which quota is read: `tensile.placement.slices.quota_of` (the requests bound of the
namespace's unscoped ResourceQuotas, the smallest when several).

The room of a virtual node for a namespace (`rooms`): its `status.allocatable` (already
the lower cluster's free room as the virtual node counts it) minus `headroom` of the lower
cluster's allocatable (`headroom_base`), minus
what the others commit there: for each other namespace holding slices on the node the
larger of its slices' budget (capped at its quota: `InForce.budget`) and its pods'
requests, and the requests of the other pods bound there. The namespace's own pods are
inside its slices, so not subtracted.

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

from tensile.contracts.objects import annotations_of, as_list, as_mapping
from tensile.kube.quantity import parse_quantity
from tensile.placement import summary
from tensile.placement.slices import RESOURCES, Holding, Record, Slice, Units

MAX_SLICES: Final = 100_000
"""Most slices one namespace's quota may make: past it the slice size is surely a
mistake (and spreading would take long), so the quota is reported unplaceable."""


@dataclass(frozen=True, kw_only=True)
class PodUse:
    """A pod bound to a node: its namespace, node and requests (`Units`)."""

    namespace: str
    node: str
    requests: Mapping[str, int]


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


def slice_for(quota: Mapping[str, int], *, cpu: Fraction, memory: int) -> Slice:
    """The slice of a namespace with `quota`: the configured size for the resources the
    quota bounds, unbounded (None) for the others."""
    return Slice(
        cpu=cpu if "cpu" in quota else None,
        memory=memory if "memory" in quota else None,
    )


def wanted(quota: Mapping[str, int], size: Slice) -> int:
    """How many slices of `size` cover `quota` (`Units`): enough for every bounded resource
    (the last slice may be partly unused)."""
    amounts = size.amounts()
    return max((-(-quota[name] // amounts[name]) for name in amounts if name in quota), default=0)


def usable(node: Mapping[str, Any]) -> str | None:
    """None when new pods may go to `node` (a Node object), else why not ("is not Ready",
    "is cordoned")."""
    if as_mapping(node.get("spec")).get("unschedulable"):
        return "is cordoned"
    for condition in as_list(as_mapping(node.get("status")).get("conditions")):
        if as_mapping(condition).get("type") == "Ready":
            return None if as_mapping(condition).get("status") == "True" else "is not Ready"
    return "is not Ready"


def allocatable(node: Mapping[str, Any]) -> Units:
    """The node's `status.allocatable` cpu and memory (`Units`, rounded down); a missing or
    malformed amount counts as 0."""
    raw = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    out: Units = {}
    for name in RESOURCES:
        try:
            amount = parse_quantity(raw[name]) if name in raw else Fraction(0)
        except (ValueError, TypeError):
            amount = Fraction(0)
        out[name] = math.floor(amount * 1000) if name == "cpu" else math.floor(amount)
    return out


def usage_by_place(pods: Iterable[PodUse]) -> dict[tuple[str, str], Units]:
    """Sum pods' requests by (namespace, node) -- what `rooms` takes; the controller keeps
    these sums up to date pod by pod instead of summing every time."""
    usage: dict[tuple[str, str], Units] = {}
    for pod in pods:
        used = usage.setdefault((pod.namespace, pod.node), {})
        for name in RESOURCES:
            used[name] = used.get(name, 0) + pod.requests.get(name, 0)
    return usage


@dataclass(frozen=True, kw_only=True)
class Commitments:
    """What each namespace commits on each usable virtual node (`commitments`), and the sum
    per node: worked out once for every namespace decided while nothing changes."""

    by_place: dict[tuple[str, str], Units]
    """(namespace, node) -> for a namespace holding slices there, the larger of its slices'
    budget and its pods' requests; for any other, its pods' requests."""
    by_node: dict[str, Units]
    """Node -> the sum of `by_place` over the namespaces."""


def commitments(
    *,
    nodes: Mapping[str, Mapping[str, int]],
    usage: Mapping[tuple[str, str], Mapping[str, int]],
    budgets: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> Commitments:
    """Work out the commitments on `nodes` (usable virtual node -> allocatable) from `usage`
    ((namespace, node) -> the requests of the pods bound there, `usage_by_place`) and the
    namespaces' slice `budgets` (namespace -> node -> budget: `InForce.budgets`, capped at
    the quota). Amounts in `Units`."""
    by_place: dict[tuple[str, str], Units] = {
        key: dict(used) for key, used in usage.items() if key[1] in nodes
    }
    for namespace, held in budgets.items():
        for node, budget in held.items():
            if node in nodes:
                used = by_place.setdefault((namespace, node), {})
                for name, amount in budget.items():
                    used[name] = max(used.get(name, 0), amount)
    by_node: dict[str, Units] = {node: {} for node in nodes}
    for (_, node), used in by_place.items():
        total = by_node[node]
        for name, amount in used.items():
            total[name] = total.get(name, 0) + amount
    return Commitments(by_place=by_place, by_node=by_node)


def headroom_base(node: Mapping[str, Any]) -> Units:
    """What `--headroom` is a share of on a virtual node (a Node object): its lower
    cluster's allocatable cpu and memory over the Ready schedulable lower nodes, from the
    placement summary the virtual node publishes (`tensile.placement.summary`, the same base
    the extender keeps headroom of); the virtual node's own allocatable when it publishes
    none, or one that cannot be read. `Units`."""
    annotations = annotations_of(node)
    text = annotations.get(summary.ANNOTATION)
    if isinstance(text, str):
        try:
            alloc = summary.parse(text).alloc
        except summary.SummaryError:
            pass
        else:
            return {name: alloc.get(name, 0) for name in RESOURCES}
    return allocatable(node)


def kept_free(base: Mapping[str, int], headroom: Fraction) -> Units:
    """`headroom` (a share, 0..1) of `base` (`headroom_base`), rounded up: the room of a
    virtual node its slices leave free for lower host failures."""
    return {name: math.ceil(amount * headroom) for name, amount in base.items()}


def rooms(
    *,
    namespace: str,
    nodes: Mapping[str, Mapping[str, int]],
    committed: Commitments,
    kept: Mapping[str, Mapping[str, int]],
) -> dict[str, Units]:
    """The room of each usable virtual node for `namespace`'s slices (see the module): its
    allocatable (`nodes`) minus what is `kept` free there (`kept_free`) minus what the
    other namespaces commit there (`committed`, made from the same `nodes`). Amounts in
    `Units`; negative when full."""
    out: dict[str, Units] = {}
    for node, alloc in nodes.items():
        total = committed.by_node.get(node, {})
        own = committed.by_place.get((namespace, node), {})
        free = kept.get(node, {})
        out[node] = {
            name: amount - free.get(name, 0) - total.get(name, 0) + own.get(name, 0)
            for name, amount in alloc.items()
        }
    return out


def fits(room: Mapping[str, int], size: Slice) -> int:
    """How many slices of `size` fit in `room` (`Units`; 0 when full)."""
    counts = [room.get(name, 0) // amount for name, amount in size.amounts().items()]
    return max(0, min(counts, default=0))


def place(
    *,
    quota: Mapping[str, int],
    size: Slice,
    rooms: Mapping[str, Mapping[str, int]],
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
        node = max(counts, key=lambda v: (counts[v] / max(room[v], 1), v))
        counts[node] -= 1
        dropped.setdefault(node, "the quota makes fewer slices")
        if not counts[node]:
            del counts[node]


def _fill(counts: dict[str, int], room: Mapping[str, int], left: int) -> None:
    """Add `left` slices by the D'Hondt rule: each to the node with the highest
    room / (held + 1), ties by name, within each node's room. The quotients are floats:
    a division of integers is correctly rounded, so equal quotients tie exactly, and the
    result is the same on every run (Fractions made this 20x slower)."""
    heap = [
        (-room[node] / (counts.get(node, 0) + 1), node)
        for node in room
        if counts.get(node, 0) < room[node]
    ]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, node = heapq.heappop(heap)
        counts[node] = counts.get(node, 0) + 1
        left -= 1
        if counts[node] < room[node]:
            heapq.heappush(heap, (-room[node] / (counts[node] + 1), node))


def record_of_placement(placement: Placement, size: Slice) -> dict[str, Holding]:
    """The record of `placement`: node -> its count of slices of `size`."""
    return {node: Holding(count=c, size=size) for node, c in placement.counts.items()}
