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
from typing import Any, Final, NamedTuple

from tensile.contracts.labels import HOSTNAME_LABEL
from tensile.contracts.objects import as_list, as_mapping
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


class _Row(NamedTuple):
    """One lower node of a summary (a tuple: a summary of thousands of nodes is parsed on
    every change of the annotation, on the extender's event loop)."""

    name: str
    free: dict[str, int]
    ports: frozenset[HostPort]


class _Class(NamedTuple):
    """Nodes of equal labels (but for their hostname), taints and state (a tuple, like
    `_Row`: one per node where each node has a label of its own)."""

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
    state: bytes
    """Its readiness, schedulability and taints, encoded: classes equal in these and in the
    labels a pod asks about are judged alike (`_Group`)."""


@dataclass(frozen=True)
class _Group:
    """The classes of equal state and taints and equal values of the labels a pod's
    placement reads (its nodeSelector's and required node affinity's keys; not node names),
    which its placement therefore judges alike: once for them all, then their rows in one
    list by free cpu. A cluster whose nodes each carry a label of their own (a node index,
    an instance ID) has a class per node but, for most pods, a group or two."""

    template: NodeRoom
    """The state and taints of its classes, and the labels of the first (those the pod
    reads are its classes' own)."""
    cpus: list[int]
    """Free cpu of every row of its classes, ascending (for bisect)."""
    rows: list[_Row]
    """In the order of `cpus` (within a class, in the class's own order)."""
    kinds: list[int]
    """The class index of each row."""
    most: dict[str, int]
    """As `_Class.most`, over all its rows."""
    memories: list[int]
    """Free memory of each row (as `cpus`: read without a dict per row on the hot path)."""
    pods: list[int]
    """Free pod slots of each row."""
    members: list[int]
    """The indexes of its classes."""
    filled: int
    """How many of its classes have nodes."""


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

    def __init__(self, raw: Mapping[str, Any], *, previous: Summary | None = None) -> None:
        """Index `raw` (as `summarize` returns or JSON gives). Raises SummaryError.
        `previous`: the summary this one replaces, whose classes are taken over where they
        are equal (a new summary usually differs from the last in free room only)."""
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
        self._kinds: list[Any] = kinds
        """The classes as given (what a next summary compares its own with)."""
        taken: list[_Class] = previous._classes if previous is not None else []
        before: list[Any] = previous._kinds if previous is not None else []
        equal = [i < len(before) and before[i] == kind for i, kind in enumerate(kinds)]
        self._classes: list[_Class] = [
            self._same_class(taken[i], grouped[i]) if equal[i] else self._class(i, kind, grouped[i])
            for i, kind in enumerate(kinds)
        ]
        self._grouped: dict[frozenset[str], list[_Group]] = {}
        """`_groups` by the label keys a pod's placement reads: made when first asked, or
        here for the keys of the groupings `previous` made last (`_PREPARED`; off the
        extender's call path: a new summary comes with a Node event), from its membership
        when the classes are the same."""
        if previous is not None:
            same = len(before) == len(kinds) and all(equal)  # the classes compared once
            for keys, groups in list(previous._grouped.items())[-_PREPARED:]:
                self._grouped[keys] = _groups(self._classes, keys, like=groups if same else None)
        self.alloc = self._vector("alloc", raw.get("alloc"))
        """Allocatable over the Ready schedulable nodes, per resource (units)."""
        self.free = self._vector("free", raw.get("free"))
        """Free over the same nodes, per resource (units; each node counted at least 0)."""

    def _row(self, index: int, row: object, *, classes: int) -> tuple[int, _Row]:
        # Checked by exact type, in plain loops: the cost of a parse is per row.
        if type(row) is not list or len(row) not in (3, 4):
            raise SummaryError(f"nodes[{index}] must be [name, class, free, ports?]")
        name, kind, free = row[0], row[1], row[2]
        if type(name) is not str or type(kind) is not int or not 0 <= kind < classes:
            raise SummaryError(f"nodes[{index}]: bad name or class")
        if not self._integers(free):
            raise SummaryError(f"nodes[{index}]: expected {len(self.columns)} integers")
        ports: frozenset[HostPort] = _NO_PORTS
        if len(row) == 4 and isinstance(row[3], list) and row[3]:
            ports = frozenset(_host_port(index, port) for port in row[3])
        # `_integers` checked the length.
        return kind, _Row(name, dict(zip(self.columns, free, strict=False)), ports)

    def _integers(self, values: object) -> bool:
        """Whether `values` is a list of one integer (not a bool) per column."""
        if type(values) is not list or len(values) != len(self.columns):
            return False
        for value in values:  # noqa: SIM110 - a plain loop: no generator made per row
            if type(value) is not int:
                return False
        return True

    def _vector(self, where: str, values: object) -> dict[str, int]:
        if not self._integers(values):
            raise SummaryError(f"{where}: expected {len(self.columns)} integers")
        return dict(zip(self.columns, values, strict=False))  # type: ignore[call-overload]

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
        return Summary._same_class(
            _Class(
                template=template,
                hostname=bool(kind.get("hostname")),
                cpus=[],
                rows=[],
                most={},
                state=codec.canonical(
                    [template.ready, template.unschedulable, list(template.taints)]
                ),
            ),
            rows,
        )

    @staticmethod
    def _same_class(kind: _Class, rows: list[_Row]) -> _Class:
        """`kind` (its labels, taints and state) with `rows` instead of its own."""
        if len(rows) > 1:
            rows = sorted(rows, key=_free_cpu)
        most: dict[str, int] = {}
        for row in rows:
            for name, amount in row.free.items():
                if amount > most.get(name, 0):
                    most[name] = amount
        return _Class(
            template=kind.template,
            hostname=kind.hostname,
            cpus=[_free_cpu(r) for r in rows],
            rows=rows,
            most=most,
            state=kind.state,
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
        greatest `fit.tightness` (cpu and memory), the first class on a tie. A pod that
        names no nodes is judged by group (`_Group`), with the same answer."""
        wanted = [(n, a) for n, a in need.requests.items() if a > 0 and n != "pods"]
        keys = _label_keys(need)
        if keys is None:
            best = self._best_by_class(need, wanted)
        else:
            best = self._best_by_group(need, wanted, self._groups(keys))
        if best is not None:
            return Choice(node=best[2], tightness=best[0], reasons={}, nodes=self.node_count)
        reasons = self.reasons(need) if explain else {}
        return Choice(node=None, tightness=0.0, reasons=reasons, nodes=self.node_count)

    def _best_by_class(
        self, need: PodNeed, wanted: list[tuple[str, int]]
    ) -> tuple[float, int, str] | None:
        """(tightness, class index, node name) of the best fit, class by class."""
        best: tuple[float, int, str] | None = None
        names_node = need.names_node
        for index, kind in enumerate(self._classes):
            if _too_large(kind.most, wanted):
                continue  # no row of the class has the room (a pod too large: no scan)
            if names_node:
                candidates = [
                    r for r in kind.rows if unfit_placement(need, self._room(kind, r)) is None
                ]
            elif unfit_placement(need, kind.template) is None:
                candidates = kind.rows[_first_row(kind.cpus, need.requests.get("cpu", 0)) :]
            else:
                continue
            for row in candidates:
                if _room_fits(wanted, need, row):
                    share = tightness(need, row.free)
                    if best is None or share > best[0]:
                        best = (share, index, row.name)
                    break
        return best

    def _groups(self, keys: frozenset[str]) -> list[_Group]:
        """The classes grouped for a pod whose placement reads the labels `keys`."""
        groups = self._grouped.get(keys)
        if groups is None:
            if len(self._grouped) >= _GROUPINGS:
                self._grouped.clear()  # pods of many different selectors: bounded memory
            groups = self._grouped[keys] = _groups(self._classes, keys)
        return groups

    @staticmethod
    def _best_by_group(
        need: PodNeed, wanted: list[tuple[str, int]], groups: list[_Group]
    ) -> tuple[float, int, str] | None:
        """`_best_by_class`'s answer for a pod that names no nodes: per group, the rows in
        ascending free cpu, each class's first fit, and no further than a row whose free
        cpu already bounds its tightness below the best found."""
        best: tuple[float, int, str] | None = None
        cpu, memory = need.requests.get("cpu", 0), need.requests.get("memory", 0)
        # Most pods ask for cpu and memory alone: their rows are judged on the group's
        # lists, with `_room_fits` and `tightness` written out (the same arithmetic).
        plain = not need.host_ports and all(name in ("cpu", "memory") for name, _ in wanted)
        for group in groups:
            if _too_large(group.most, wanted) or unfit_placement(need, group.template):
                continue
            cpus, memories, pods, kinds = group.cpus, group.memories, group.pods, group.kinds
            seen: set[int] = set()
            for i in range(_first_row(cpus, cpu), len(cpus)):  # cpu fits from here
                if best is not None and cpu > 0:
                    # A fitting row takes cpu/free of its cpu and at most all its memory:
                    # rows further on (more free cpu) cannot be tighter than this bound.
                    share_of_cpu = cpu / cpus[i]
                    bound = (share_of_cpu + 1) / 2 if memory > 0 else share_of_cpu
                    if min(1.0, bound) < best[0]:
                        break
                kind = kinds[i]
                if kind in seen:
                    continue
                if plain:
                    if pods[i] < 1 or (memory > 0 and memories[i] < memory):
                        continue  # (free memory may be below 0: checked only if asked for)
                    share = _plain_tightness(cpu, memory, cpus[i], memories[i])
                elif _room_fits(wanted, need, group.rows[i]):
                    share = tightness(need, group.rows[i].free)
                else:
                    continue
                seen.add(kind)  # the class's first fit: its later rows are not its answer
                if best is None or share > best[0] or (share == best[0] and kind < best[1]):
                    best = (share, kind, group.rows[i].name)
                if len(seen) == group.filled:
                    break  # every class of the group with nodes has its answer
        return best

    def reasons(self, need: PodNeed) -> dict[str, int]:
        """Return reason -> number of lower nodes that refuse `need` for it (every node)."""
        counted: Counter[str] = Counter()
        keys = _label_keys(need)
        units: list[tuple[NodeRoom, list[_Row], _Class | None]]
        if keys is None:
            units = [(kind.template, kind.rows, kind) for kind in self._classes]
        else:  # the placement judged once per group
            units = [(group.template, group.rows, None) for group in self._groups(keys)]
        names_node = keys is None
        for template, rows, kind in units:
            if not rows:
                continue  # a class without nodes refuses none
            shared = None if names_node else unfit_placement(need, template)
            if shared is not None:
                counted[shared] += len(rows)
                continue
            if names_node:
                assert kind is not None
                for row in rows:
                    room = self._room(kind, row)
                    placement = unfit_placement(need, room)
                    counted.update((placement,) if placement else unfit_room(need, room))
                continue
            # The placement passed: a row is judged on its room alone, and rows of equal
            # room give equal reasons (a cluster of few node sizes has few).
            seen: dict[tuple[tuple[int, ...], frozenset[HostPort]], tuple[str, ...]] = {}
            for row in rows:
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


_NO_PORTS: Final[frozenset[HostPort]] = frozenset()


def _plain_tightness(cpu: int, memory: int, free_cpu: int, free_memory: int) -> float:
    """`fit.tightness` of a pod asking for `cpu` and `memory` alone on a row it fits (so
    each free amount asked for is at least the request, and above 0)."""
    if cpu > 0:
        share = cpu / free_cpu
        return min(1.0, (share + memory / free_memory) / 2 if memory > 0 else share)
    return min(1.0, memory / free_memory) if memory > 0 else 0.0


def _first_row(cpus: list[int], cpu: int) -> int:
    """The first of rows in ascending free `cpus` that has the `cpu` a pod asks for: a pod
    that asks for none is not held to it (free cpu may be below 0), as fit.go's check is
    made only for a request above 0."""
    return bisect.bisect_left(cpus, cpu) if cpu > 0 else 0


def _free_cpu(row: _Row) -> int:
    return row.free.get("cpu", 0)


def _too_large(most: Mapping[str, int], wanted: list[tuple[str, int]]) -> bool:
    """Whether no row under `most` (the largest free amounts) can take a pod: no pod slot,
    or more of a resource than any row has free."""
    if most.get("pods", 0) < 1:
        return True
    for name, amount in wanted:  # noqa: SIM110 - a plain loop: no generator per class
        if amount > most.get(name, 0):
            return True
    return False


_GROUPINGS: Final = 32
"""Groupings a summary keeps (one per set of label keys that pods' placements read)."""
_PREPARED: Final = 4
"""Groupings of the summary it replaces that a new summary makes at once (the latest made):
pods of many different selectors cost their calls a grouping each, not every Node event
many."""


def _label_keys(need: PodNeed) -> frozenset[str] | None:
    """The node label keys `fit.unfit_placement` reads for `need` (its nodeSelector's and
    its required node affinity's matchExpressions'), or None when it reads node names
    (`PodNeed.names_node`: then each row is judged)."""
    if need.names_node:
        return None
    keys = set(need.node_selector)
    for term in as_list((need.required or {}).get("nodeSelectorTerms")):
        for expression in as_list(as_mapping(term).get("matchExpressions")):
            key = as_mapping(expression).get("key")
            if isinstance(key, str):
                keys.add(key)
    return frozenset(keys)


def _groups(
    classes: list[_Class], keys: frozenset[str], *, like: list[_Group] | None = None
) -> list[_Group]:
    """The classes of equal state, taints and values of the labels `keys`, as `_Group`s
    (in the order of their first class). `like`: groups of the same classes (equal labels,
    taints and state; their rows may differ), whose membership is taken over."""
    if like is not None:
        membership = [group.members for group in like]
    else:
        ordered = sorted(keys)
        found: dict[tuple[bytes, tuple[str | None, ...]], list[int]] = {}
        for index, kind in enumerate(classes):
            labels = kind.template.labels
            found.setdefault((kind.state, tuple(labels.get(k) for k in ordered)), []).append(index)
        membership = list(found.values())
    groups = []
    for indexes in membership:
        flat = [(row.free.get("cpu", 0), row, i) for i in indexes for row in classes[i].rows]
        flat.sort(key=lambda entry: entry[0])  # stable: a class's rows keep their order
        most: dict[str, int] = {}
        for i in indexes:
            for name, amount in classes[i].most.items():
                if amount > most.get(name, 0):
                    most[name] = amount
        groups.append(
            _Group(
                template=classes[indexes[0]].template,
                cpus=[entry[0] for entry in flat],
                rows=[entry[1] for entry in flat],
                kinds=[entry[2] for entry in flat],
                most=most,
                memories=[entry[1].free.get("memory", 0) for entry in flat],
                pods=[entry[1].free.get("pods", 0) for entry in flat],
                members=indexes,
                filled=sum(1 for i in indexes if classes[i].rows),
            )
        )
    return groups


def _host_port(index: int, port: object) -> HostPort:
    """Parse a row's "ip/protocol/port". Raises SummaryError."""
    ip, _, rest = str(port).partition("/")
    protocol, _, number = rest.partition("/")
    if not (number.isascii() and number.isdigit()):
        raise SummaryError(f"nodes[{index}]: bad host port {port!r}")
    return ip, protocol, int(number)


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


def parse(text: str, *, previous: Summary | None = None) -> Summary:
    """Parse an annotation value (`previous`: the summary it replaces, see `Summary`).
    Raises SummaryError (not JSON, or not the shape)."""
    try:
        raw = codec.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SummaryError(f"not JSON: {exc}") from exc
    return Summary(raw, previous=previous)
