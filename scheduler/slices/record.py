"""Reading and writing the quota slices record and its status (pure).

The format and the two annotations are described in `tensile.contracts.quotaslices`. A slice
keeps its cpu in cores (`Fraction`) and its memory in bytes, as written; the arithmetic of
the decisions is done in `Units`: whole millicores and bytes (`int`), which every amount
Kubernetes accepts is (cpu quantities are rounded to millicores), and which are 50x faster
than `Fraction`s on the extender's path.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tensile.contracts.quotaslices import (
    NONE,
    SLICES_ANNOTATION,
    STATUS_ANNOTATION,
    UNBOUNDED,
    WRITER,
)
from tensile.kube.quantity import format_quantity, parse_quantity

_ENTRY = re.compile(
    r"(?P<node>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)=(?P<count>[0-9]{1,9})x"
    r"\((?P<cpu>[^,()\s]+),(?P<memory>[^,()\s]+)\)",
    re.ASCII,
)


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
        """What the namespace's pods on that node may request in all, by bounded resource."""
        return {name: amount * self.count for name, amount in self.size.amounts().items()}


Record = Mapping[str, Holding]
"""Virtual node name -> what it holds."""


@dataclass(frozen=True, kw_only=True)
class Status:
    """The slice controller's status annotation."""

    written: str | None
    """The exact record value the controller last wrote (None: none)."""
    condition: str
    """`tensile.contracts.quotaslices` PLACED, UNPLACEABLE, ADMINISTRATOR or INVALID."""
    reason: str
    """One CamelCase word (the Event's reason)."""
    message: str
    """What was decided and why, for people."""


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


def format_status(status: Status) -> str:
    """Write the status annotation: compact JSON, keys in a fixed order."""
    return json.dumps(
        {
            "writer": WRITER,
            "written": status.written,
            "condition": status.condition,
            "reason": status.reason,
            "message": status.message,
        },
        separators=(",", ":"),
    )


def parse_status(text: object) -> Status | None:
    """Read the status annotation; None when absent, not JSON, or not the controller's."""
    if not isinstance(text, str) or not text:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("writer") != WRITER:
        return None
    written = raw.get("written")
    return Status(
        written=written if isinstance(written, str) else None,
        condition=str(raw.get("condition") or ""),
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or ""),
    )


def controller_wrote(annotations: Mapping[str, Any]) -> bool:
    """Tell whether the record in a Namespace's `annotations` is exactly what the controller
    last wrote; False for an administrator's record (or none)."""
    value = annotations.get(SLICES_ANNOTATION)
    status = parse_status(annotations.get(STATUS_ANNOTATION))
    return isinstance(value, str) and status is not None and status.written == value


def record_of(annotations: Mapping[str, Any]) -> dict[str, Holding] | None:
    """The record a Namespace's `annotations` hold: None when there is none or it cannot
    be read (the namespace is then unconstrained: the extender is `ignorable`, a typo must
    not stop a tenant; the controller reports it as Invalid)."""
    value = annotations.get(SLICES_ANNOTATION)
    if not isinstance(value, str):
        return None
    try:
        return parse_record(value)
    except RecordError:
        return None
