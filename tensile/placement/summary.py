"""The placement summary: a lower cluster's nodes, compact, as a virtual node publishes it
on its upper Node (annotation `ANNOTATION`) and `tensile-scheduler` reads it (pure).

Shape (JSON, version 1):

    {"v": 1,
     "res": ["cpu", "memory", "pods", "ephemeral-storage", ...],
     "classes": [{"labels": {...}, "hostname": true, "taints": [...],
                  "ready": true, "unschedulable": false}, ...],
     "nodes": [[name, class, [free per "res"], ["ip/protocol/port", ...]?], ...],
     "alloc": [allocatable per "res", over Ready schedulable nodes],
     "free": [free per "res", over Ready schedulable nodes, each node at least 0]}

Units: cpu millicores, all else whole units (bytes, counts), as `fit.units`. Nodes whose
labels (but for `kubernetes.io/hostname` equal to the node's name, `"hostname": true`),
taints and state are equal share a class, so labels are written once per kind of node and
a pod's selector is judged once per class. About 40 bytes a node: 1,000 nodes ~ 40 KB,
within the 256 KiB annotations of an object may hold up to about 5,000 nodes.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tensile.contracts.labels import HOSTNAME_LABEL
from tensile.kube import codec
from tensile.placement.fit import (
    HostPort,
    NodeRoom,
    PodNeed,
    tightness,
    unfit_free,
    unfit_placement,
    unfit_room,
)

ANNOTATION: Final = "tensile.io/placement-summary"
"""The upper Node's annotation that carries its lower cluster's summary."""
VERSION: Final = 1
_LEADING: Final = ("cpu", "memory", "pods", "ephemeral-storage")


class SummaryError(ValueError):
    """A summary that is not of the shape above; the message says which part."""


def summarize(rooms: Iterable[NodeRoom]) -> dict[str, Any]:
    """Return the summary (shape above) of the lower nodes `rooms`, in name order."""
    ordered = sorted(rooms, key=lambda r: r.name)
    names = {name for room in ordered for name in room.free}
    columns: list[str] = [n for n in _LEADING if n in names or n in ("cpu", "memory", "pods")]
    columns += sorted(names - set(columns))
    classes: dict[str, int] = {}
    class_list: list[dict[str, Any]] = []
    rows: list[list[Any]] = []
    alloc = [0] * len(columns)
    free_total = [0] * len(columns)
    for room in ordered:
        labels = dict(room.labels)
        hostname = labels.get(HOSTNAME_LABEL) == room.name
        if hostname:
            del labels[HOSTNAME_LABEL]
        kind = {
            "labels": labels,
            "hostname": hostname,
            "taints": [dict(t) for t in room.taints],
            "ready": room.ready,
            "unschedulable": room.unschedulable,
        }
        key = json.dumps(kind, sort_keys=True)
        if key not in classes:
            classes[key] = len(class_list)
            class_list.append(kind)
        free = [room.free.get(name, 0) for name in columns]
        row: list[Any] = [room.name, classes[key], free]
        if room.host_ports:
            row.append(sorted(f"{ip}/{protocol}/{port}" for ip, protocol, port in room.host_ports))
        rows.append(row)
        if room.ready and not room.unschedulable:
            free_total = [a + max(0, f) for a, f in zip(free_total, free, strict=True)]
            alloc = [a + room.allocatable.get(n, 0) for a, n in zip(alloc, columns, strict=True)]
    return {
        "v": VERSION,
        "res": columns,
        "classes": class_list,
        "nodes": rows,
        "alloc": alloc,
        "free": free_total,
    }


def render(summary: Mapping[str, Any]) -> str:
    """Return the annotation value of `summary` (compact JSON, keys in a fixed order)."""
    return json.dumps(summary, separators=(",", ":"))


@dataclass(frozen=True)
class _Row:
    name: str
    free: dict[str, int]
    ports: frozenset[HostPort]


@dataclass(frozen=True)
class _Class:
    template: NodeRoom
    """Its labels (no hostname), taints and state; name "" and no room."""
    hostname: bool
    cpus: list[int]
    """Free cpu of its rows, ascending (for bisect)."""
    rows: list[_Row]
    """In the order of `cpus`."""
    most: dict[str, int]
    """The largest free amount of each resource over its rows (0 without rows): a need
    above one of them fits none of its rows, whichever the room."""


@dataclass(frozen=True, kw_only=True)
class Choice:
    """The answer for one pod on one lower cluster."""

    node: str | None
    """The best-fitting lower node, None when none fits."""
    tightness: float
    """`fit.tightness` on that node (0..1; 0 when none fits)."""
    reasons: Mapping[str, int]
    """When none fits: reason -> how many lower nodes gave it (empty otherwise)."""
    nodes: int
    """How many lower nodes the summary holds."""

    def message(self) -> str:
        """The scheduler's own FitError wording: "0/3 nodes are available: 2 Insufficient
        cpu, 1 node(s) were unschedulable." (reasons sorted by text, as the scheduler)."""
        parts = ", ".join(f"{count} {reason}" for reason, count in sorted(self.reasons.items()))
        return f"0/{self.nodes} nodes are available: {parts or 'no nodes'}."


class Summary:
    """A parsed summary, indexed to answer `best_fit` for many pods."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        """Index `raw` (as `summarize` returns or JSON gives). Raises SummaryError."""
        if not isinstance(raw, Mapping) or raw.get("v") != VERSION:
            raise SummaryError(f"not a version {VERSION} placement summary")
        columns = raw.get("res")
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise SummaryError('"res" must be a list of resource names')
        self.columns: tuple[str, ...] = tuple(columns)
        kinds = raw.get("classes")
        if not isinstance(kinds, list):
            raise SummaryError('"classes" must be a list')
        grouped: list[list[_Row]] = [[] for _ in kinds]
        rows = raw.get("nodes")
        if not isinstance(rows, list):
            raise SummaryError('"nodes" must be a list')
        for index, row in enumerate(rows):
            kind, entry = self._row(index, row, classes=len(kinds))
            grouped[kind].append(entry)
        self.node_count = len(rows)
        self._classes = [self._class(i, kind, grouped[i]) for i, kind in enumerate(kinds)]
        self.alloc = self._vector("alloc", raw.get("alloc"))
        """Allocatable over the Ready schedulable nodes, per resource (units)."""
        self.free = self._vector("free", raw.get("free"))
        """Free over the same nodes, per resource (units; each node counted at least 0)."""

    def _row(self, index: int, row: object, *, classes: int) -> tuple[int, _Row]:
        if not isinstance(row, list) or len(row) not in (3, 4):
            raise SummaryError(f"nodes[{index}] must be [name, class, free, ports?]")
        name, kind, free = row[0], row[1], row[2]
        if not isinstance(name, str) or not isinstance(kind, int) or not 0 <= kind < classes:
            raise SummaryError(f"nodes[{index}]: bad name or class")
        ports: set[HostPort] = set()
        for port in row[3] if len(row) == 4 and isinstance(row[3], list) else ():
            ip, _, rest = str(port).partition("/")
            protocol, _, number = rest.partition("/")
            if not number.isdigit():
                raise SummaryError(f"nodes[{index}]: bad host port {port!r}")
            ports.add((ip, protocol, int(number)))
        return kind, _Row(name, self._vector(f"nodes[{index}]", free), frozenset(ports))

    def _vector(self, where: str, values: object) -> dict[str, int]:
        if (
            not isinstance(values, list)
            or len(values) != len(self.columns)
            or not all(isinstance(v, int) for v in values)
        ):
            raise SummaryError(f"{where}: expected {len(self.columns)} integers")
        return dict(zip(self.columns, values, strict=True))

    @staticmethod
    def _class(index: int, kind: object, rows: list[_Row]) -> _Class:
        if not isinstance(kind, Mapping):
            raise SummaryError(f"classes[{index}] must be an object")
        labels, taints = kind.get("labels") or {}, kind.get("taints") or []
        if not isinstance(labels, Mapping) or not isinstance(taints, list):
            raise SummaryError(f"classes[{index}]: bad labels or taints")
        template = NodeRoom(
            name="",
            labels={str(k): str(v) for k, v in labels.items()},
            taints=tuple(t for t in taints if isinstance(t, Mapping)),
            ready=bool(kind.get("ready", True)),
            unschedulable=bool(kind.get("unschedulable", False)),
            free={},
        )
        rows = sorted(rows, key=lambda r: r.free.get("cpu", 0))
        most: dict[str, int] = {}
        for row in rows:
            for name, amount in row.free.items():
                if amount > most.get(name, 0):
                    most[name] = amount
        return _Class(
            template=template,
            hostname=bool(kind.get("hostname")),
            cpus=[r.free.get("cpu", 0) for r in rows],
            rows=rows,
            most=most,
        )

    def rows(self) -> list[NodeRoom]:
        """Every lower node of the summary, as the filters see it (for people and tests)."""
        return [self._room(kind, row) for kind in self._classes for row in kind.rows]

    def keeps_headroom(self, need: PodNeed, *, headroom: float) -> bool:
        """Tell whether the cluster keeps `headroom` (a share, 0..1) of its allocatable cpu
        and memory free once `need` is placed (the room kept for a lower node's failure)."""
        return all(
            self.free.get(name, 0) - need.requests.get(name, 0)
            >= headroom * self.alloc.get(name, 0)
            for name in ("cpu", "memory")
        )

    def best_fit(self, need: PodNeed, *, explain: bool = True) -> Choice:
        """Return the lower node that fits `need` most tightly, or, when none fits and
        `explain`, how many nodes refused it for which reason (`fit.unfit`; without
        `explain` the reasons are left empty: prioritize needs none).

        Within a class of nodes the tightest is the first that fits in ascending free cpu
        (a bisect to the first with enough cpu, then a scan); between classes, the one of
        greatest `fit.tightness` (cpu and memory)."""
        best: tuple[float, str] | None = None
        wanted = [(n, a) for n, a in need.requests.items() if a > 0 and n != "pods"]
        for kind in self._classes:
            if kind.most.get("pods", 0) < 1 or any(a > kind.most.get(n, 0) for n, a in wanted):
                continue  # no row of the class has the room (a pod too large: no scan)
            if need.names_node:
                candidates = [
                    r for r in kind.rows if unfit_placement(need, self._room(kind, r)) is None
                ]
            elif unfit_placement(need, kind.template) is None:
                start = bisect.bisect_left(kind.cpus, need.requests.get("cpu", 0))
                candidates = kind.rows[start:]
            else:
                continue
            for row in candidates:
                if _room_fits(wanted, need, row):
                    share = tightness(need, row.free)
                    if best is None or share > best[0]:
                        best = (share, row.name)
                    break
        if best is not None:
            return Choice(node=best[1], tightness=best[0], reasons={}, nodes=self.node_count)
        reasons = self.reasons(need) if explain else {}
        return Choice(node=None, tightness=0.0, reasons=reasons, nodes=self.node_count)

    def reasons(self, need: PodNeed) -> dict[str, int]:
        """Return reason -> number of lower nodes that refuse `need` for it (every node)."""
        counted: Counter[str] = Counter()
        for kind in self._classes:
            shared = None if need.names_node else unfit_placement(need, kind.template)
            if shared is not None:
                counted[shared] += len(kind.rows)
                continue
            if need.names_node:
                for row in kind.rows:
                    room = self._room(kind, row)
                    placement = unfit_placement(need, room)
                    counted.update((placement,) if placement else unfit_room(need, room))
                continue
            # The class passed the placement: a row is judged on its room alone, and rows
            # of equal room give equal reasons (a cluster of few node sizes has few).
            seen: dict[tuple[tuple[int, ...], frozenset[HostPort]], tuple[str, ...]] = {}
            for row in kind.rows:
                key = (tuple(row.free.values()), row.ports)
                found = seen.get(key)
                if found is None:
                    found = seen[key] = unfit_free(need, free=row.free, host_ports=row.ports)
                counted.update(found)
        return dict(counted)

    @staticmethod
    def _room(kind: _Class, row: _Row) -> NodeRoom:
        template = kind.template
        labels = {**template.labels, HOSTNAME_LABEL: row.name} if kind.hostname else template.labels
        return NodeRoom(
            name=row.name,
            labels=labels,
            taints=template.taints,
            ready=template.ready,
            unschedulable=template.unschedulable,
            free=row.free,
            host_ports=row.ports,
        )


def _room_fits(wanted: list[tuple[str, int]], need: PodNeed, row: _Row) -> bool:
    """`fit.unfit_room(...) == ()` for one row, without building its NodeRoom (the hot
    path: `wanted` is need.requests without "pods" and zeros)."""
    free = row.free
    if free.get("pods", 0) < 1:
        return False
    for name, amount in wanted:
        if free.get(name, 0) < amount:
            return False
    if need.host_ports and row.ports:
        room = NodeRoom(name=row.name, labels={}, free=free, host_ports=row.ports)
        return not unfit_room(need, room)
    return True


def parse(text: str) -> Summary:
    """Parse an annotation value. Raises SummaryError (not JSON, or not the shape)."""
    try:
        raw = codec.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SummaryError(f"not JSON: {exc}") from exc
    return Summary(raw)
