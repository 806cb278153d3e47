"""Namespace quota slices as the extender and the virtual node both read them (pure): the
record's format, which record is in force for a namespace (`record_in_force`), and whether a
pod may go to a virtual node within it (`admit`).

The record and its place are described in `tensile.contracts.quotaslices`: it is an
annotation of one of the namespace's ResourceQuotas, an object only those who set the
namespace's quota can write. `tensile-scheduler` keeps it (and holds pods to it before they
are bound); the virtual node holds pods bound to it by `spec.nodeName`, which no scheduler
saw, to the same record through the same `admit`.

A slice keeps its cpu in cores (`Fraction`) and its memory in bytes, as written; the
arithmetic of the decisions is done in `Units`: whole millicores and bytes (`int`), which
every amount Kubernetes accepts is (cpu quantities are rounded to millicores), and which are
50x faster than `Fraction`s on the extender's path.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from tensile.contracts.objects import (
    annotations_of,
    as_list,
    as_mapping,
    name_of,
    resource_version_of,
)
from tensile.contracts.quotaslices import NONE, SLICES_ANNOTATION, UNBOUNDED
from tensile.kube.quantity import format_quantity, parse_quantity

_ENTRY = re.compile(
    r"(?P<node>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)=(?P<count>[0-9]{1,9})x"
    r"\((?P<cpu>[^,()\s]+),(?P<memory>[^,()\s]+)\)",
    re.ASCII,
)

RESOURCES: Final = ("cpu", "memory")
"""The resources slices bound; amounts in `Units` (millicores, bytes)."""
QUOTA_KEYS: Final = {"cpu": ("requests.cpu", "cpu"), "memory": ("requests.memory", "memory")}
"""ResourceQuota `spec.hard` keys read per resource (see `quota_of`)."""

Units = dict[str, int]
"""Amounts by resource: "cpu" in millicores, "memory" in bytes."""


def units(amounts: Mapping[str, Fraction]) -> Units:
    """`amounts` ("cpu" cores, "memory" bytes, as `pod_requests` and `parse_quantity` give
    them) in `Units`, rounded up; other resources left out."""
    out: Units = {}
    if "cpu" in amounts:
        out["cpu"] = math.ceil(amounts["cpu"] * 1000)
    if "memory" in amounts:
        out["memory"] = math.ceil(amounts["memory"])
    return out


def show(name: str, amount: int) -> str:
    """An amount in `Units` as a Kubernetes quantity ("500m", "1Gi")."""
    if name == "cpu":
        return format_quantity(Fraction(amount, 1000))
    return format_quantity(amount, binary=True)


def quota_of(quotas: Iterable[Mapping[str, Any]]) -> Units:
    """Return the namespace's bound on requests per resource (`Units`) from its
    ResourceQuota objects; resources no unscoped quota bounds are left out.

    `spec.hard` keys `requests.cpu` / `cpu` and `requests.memory` / `memory` (Kubernetes
    treats the bare name as the requests one): these bound what the namespace's pods
    request, which is what every scheduler places by; `limits.*` bounds bursting, which no
    node reserves, and is not read. Several quotas all hold, so the smallest hard amount
    wins. Scoped quotas (`scopes`, `scopeSelector`) bound only some pods and are not read.
    Malformed amounts (the apiserver validates, so only a hand-made object) are skipped."""
    bound: Units = {}
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
                    value = units({resource: amount})[resource]
                    bound[resource] = min(bound.get(resource, value), value)
    return bound


class RecordError(ValueError):
    """A record not in the annotation's format; the message says which entry and why."""


@dataclass(frozen=True, kw_only=True)
class Slice:
    """One slice: cpu in cores, memory in bytes; None: the quota does not bound it."""

    cpu: Fraction | None
    memory: int | None

    def amounts(self) -> Units:
        """The bounded amounts, in `Units` (a new dict)."""
        return dict(self._units)

    @functools.cached_property
    def _units(self) -> Units:
        # Worked out once: the extender asks for every pod and candidate node.
        out: Units = {}
        if self.cpu is not None:
            out["cpu"] = math.ceil(self.cpu * 1000)
        if self.memory is not None:
            out["memory"] = self.memory
        return out

    def __str__(self) -> str:
        cpu = UNBOUNDED if self.cpu is None else format_quantity(self.cpu)
        memory = UNBOUNDED if self.memory is None else format_quantity(self.memory, binary=True)
        return f"({cpu},{memory})"


@dataclass(frozen=True, kw_only=True)
class Holding:
    """What one virtual node holds of a namespace's quota: `count` slices of `size`."""

    count: int
    size: Slice

    def budget(self) -> Units:
        """What the namespace's pods on that node may request in all, by bounded resource
        (uncapped: `InForce.budget` caps it at the quota)."""
        return {name: amount * self.count for name, amount in self.size.amounts().items()}


Record = Mapping[str, Holding]
"""Virtual node name -> what it holds."""


def format_record(record: Record) -> str:
    """Write `record` in the annotation's format, nodes in name order and empty holdings
    left out (`none` when nothing is left), so equal records give equal strings."""
    entries = [
        f"{node}={holding.count}x{holding.size}"
        for node, holding in sorted(record.items())
        if holding.count > 0
    ]
    return ",".join(entries) if entries else NONE


def parse_record(text: str) -> dict[str, Holding]:
    """Read a record annotation into {virtual node: holding}.

    Raises RecordError saying what is wrong: an entry not in the format, a node named
    twice, an amount that is no Kubernetes quantity or not above 0, fractional bytes.
    """
    stripped = text.strip()
    if stripped == NONE:
        return {}
    if not stripped:
        raise RecordError("the record is empty (write 'none' for no slices)")
    record: dict[str, Holding] = {}
    for raw in _split(stripped):
        part = raw.strip()
        match = _ENTRY.fullmatch(part)
        if match is None:
            raise RecordError(
                f"entry {part!r} is not <virtual node>=<count>x(<cpu>,<memory>), "
                "e.g. vnode-a=4x(500m,1Gi)"
            )
        node = match["node"]
        if node in record:
            raise RecordError(f"virtual node {node} is named twice")
        cpu = _amount(match["cpu"], node)
        memory = _amount(match["memory"], node)
        if cpu is not None and (cpu * 1000).denominator != 1:
            raise RecordError(f"{node}: cpu {match['cpu']} is finer than a millicore")
        if memory is not None and memory.denominator != 1:
            raise RecordError(f"{node}: memory {match['memory']} is not a whole number of bytes")
        record[node] = Holding(
            count=int(match["count"]),
            size=Slice(cpu=cpu, memory=None if memory is None else int(memory)),
        )
    return record


def _split(text: str) -> list[str]:
    """Split at the commas outside parentheses."""
    parts: list[str] = []
    depth = start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _amount(text: str, node: str) -> Fraction | None:
    if text == UNBOUNDED:
        return None
    try:
        value = parse_quantity(text)
    except ValueError as exc:
        raise RecordError(f"{node}: {exc}") from None
    if value <= 0:
        raise RecordError(f"{node}: the amount {text} must be greater than 0")
    return value


def carriers(quotas: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(name, record) of each of a namespace's `quotas` that carries a record annotation,
    by name."""
    found = []
    for quota in quotas:
        value = annotations_of(quota).get(SLICES_ANNOTATION)
        if isinstance(value, str):
            found.append((name_of(quota), value))
    return sorted(found)


@dataclass(frozen=True, kw_only=True)
class InForce:
    """What holds a namespace's pods on the virtual nodes (`record_in_force`)."""

    quota: Units
    """The namespace's bound on requests (`quota_of`); {}: none, the namespace is
    unconstrained."""
    record: Record | None = None
    """Its slices; None: no record (unconstrained, or refused: `error`)."""
    error: str | None = None
    """Why the record cannot be read: then no virtual node admits the namespace's pods."""
    carrier: str | None = None
    """The name of the ResourceQuota the record is read from."""
    _budgets: dict[str, Units] = field(default_factory=dict, init=False, compare=False, repr=False)
    """`budget` of each node asked about (worked out once)."""

    @property
    def constrained(self) -> bool:
        """Whether the namespace's pods are held to slices (a record, or one that cannot be
        read)."""
        return self.record is not None or self.error is not None

    def budget(self, node: str) -> Units:
        """What the namespace's pods on `node` may request in all (`Units`): the slices it
        holds there, capped at the quota for every resource the quota bounds (a slice
        amount `-` counts as the quota's), and nothing for the resources it does not. {}
        when the node holds none."""
        if node not in self._budgets:
            holding = (self.record or {}).get(node)
            if holding is None or holding.count <= 0:
                return {}
            amounts = holding.size.amounts()
            self._budgets[node] = {
                name: min(amounts[name] * holding.count, bound) if name in amounts else bound
                for name, bound in self.quota.items()
            }
        return self._budgets[node]

    def budgets(self) -> dict[str, Units]:
        """`budget` of every node holding slices (what the namespace commits there)."""
        return {node: self.budget(node) for node, h in (self.record or {}).items() if h.count}


UNCONSTRAINED: Final = InForce(quota={})
"""A namespace without a quota, or without a record."""


def record_in_force(quotas: Sequence[Mapping[str, Any]]) -> InForce:
    """Read what holds a namespace's pods from its ResourceQuota objects `quotas`.

    - No unscoped quota bounds requests.cpu or requests.memory: unconstrained, whatever
      record a quota carries (slices divide a quota: without one there is nothing to
      divide, and a record must not take room from other namespaces for nothing).
    - No quota carries a record: unconstrained (the slice controller has not placed it
      yet, or does not run).
    - Quotas carry different records, or the record is not in the format: `error`, and no
      virtual node admits the namespace's pods until it is fixed (fail closed: a record
      that cannot be read must not free a namespace of its slices).
    - Otherwise the record, each node's budget capped at the quota (`InForce.budget`).
    Raises nothing."""
    bound = quota_of(quotas)
    if not bound:
        return UNCONSTRAINED
    found = carriers(quotas)
    if not found:
        return InForce(quota=bound)
    carrier, value = found[0]
    if any(other != value for _, other in found):
        names = ", ".join(name for name, _ in found)
        return InForce(
            quota=bound,
            carrier=carrier,
            error=f"the ResourceQuotas {names} carry different {SLICES_ANNOTATION} records "
            "(keep one)",
        )
    try:
        record = parse_record(value)
    except RecordError as exc:
        return InForce(
            quota=bound,
            carrier=carrier,
            error=f"the {SLICES_ANNOTATION} record of ResourceQuota {carrier} cannot be read: "
            f"{exc}",
        )
    return InForce(quota=bound, record=record, carrier=carrier)


class InForceReader:
    """`record_in_force` per namespace, read again only when one of its quotas changed (the
    extender asks for every pod; records change seldom)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[tuple[str, str], ...], InForce]] = {}

    def read(self, namespace: str, quotas: Sequence[Mapping[str, Any]]) -> InForce:
        """What holds `namespace`'s pods, given its ResourceQuota objects `quotas`."""
        stamp = tuple(sorted((name_of(q), resource_version_of(q)) for q in quotas))
        known = self._known.get(namespace)
        if known is not None and known[0] == stamp and stamp:
            return known[1]
        if not quotas:
            self._known.pop(namespace, None)
            return UNCONSTRAINED
        in_force = record_in_force(quotas)
        self._known[namespace] = (stamp, in_force)
        return in_force


def admit(
    *,
    in_force: InForce,
    node: str,
    requests: Mapping[str, int],
    placed: Iterable[Mapping[str, int]],
) -> str | None:
    """Return None when a pod may go to virtual node `node`, else why not (one line, shown
    in the pod's FailedScheduling event, or in its status when the virtual node refuses it).

    `in_force`: its namespace's slices (`record_in_force`); `requests`: the pod's requests
    (`Units`: millicores, bytes; `units(pod_requests(pod))`); `placed`: the requests of the
    namespace's other pods on `node`, not finished (one by one, or summed). The pod is
    admitted when its namespace is unconstrained, or when the node holds slices of it and,
    for every resource they bound, what is placed plus the pod stays within their budget
    there (`InForce.budget`: capped at the quota).
    """
    if in_force.error is not None:
        return f"its namespace's quota slices are refused: {in_force.error}"
    record = in_force.record
    if record is None:
        return None
    holding = record.get(node)
    if holding is None or holding.count <= 0:
        return (
            f"its namespace holds no quota slices on {node} (its slices: {format_record(record)})"
        )
    budget = in_force.budget(node)
    used = dict.fromkeys(budget, 0)
    for pod in placed:
        for name in budget:
            used[name] += pod.get(name, 0)
    uncapped = holding.budget()
    for name, amount in budget.items():
        wanted = requests.get(name, 0)
        if used[name] + wanted > amount:
            capped = " (its quota)" if uncapped.get(name, amount + 1) > amount else ""
            return (
                f"its namespace's quota slices on {node} ({holding.count}x{holding.size}) "
                f"allow {show(name, amount)} {name}{capped}: {show(name, used[name])} in use, "
                f"the pod requests {show(name, wanted)}"
            )
    return None
