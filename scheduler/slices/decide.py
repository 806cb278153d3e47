"""What the slice controller does for one namespace (pure): write, keep or remove its record,
and which Events say so.

The record and its status are annotations of one of the namespace's ResourceQuotas (the
controller hands in that quota's annotations and writes the patch back to it). Who wrote
the record decides: the controller's own (its status's `written` equals the record) is
recomputed from where it is (`placement.place`); an administrator's (any other value, or a
record with no status) is respected as it is, and only its status says so (or that it
cannot be read, and that the namespace's pods are then admitted nowhere); a record removed
by hand is computed again from nothing. Without a quota the controller's record is removed
and an administrator's is not read (its status says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from scheduler.slices.placement import Placement, place, record_of_placement, slice_for
from scheduler.slices.record import Status, controller_wrote, format_status, parse_status
from tensile.contracts.quotaslices import (
    ADMINISTRATOR,
    IGNORED,
    INVALID,
    PLACED,
    SLICES_ANNOTATION,
    STATUS_ANNOTATION,
    UNPLACEABLE,
)
from tensile.kube.quantity import format_quantity
from tensile.placement.slices import Holding, RecordError, format_record, parse_record, show

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True, kw_only=True)
class Event:
    """An Event to record on the Namespace."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The outcome for one namespace."""

    patch: dict[str, str | None] | None
    """Annotations to set (None value: remove); None: write nothing."""
    events: tuple[Event, ...] = ()
    outcome: str | None = None
    """The metric's outcome label: placed, redistributed, recomputed, unplaceable,
    administrator, invalid, ignored, removed (None: nothing new)."""
    held: Mapping[str, Holding] | None = None
    """The record in force after the decision (None: unconstrained)."""
    unplaced: int = 0


def decide(
    *,
    annotations: Mapping[str, Any],
    quota: Mapping[str, int],
    cpu: Fraction,
    memory: int,
    headroom: Fraction,
    rooms: Mapping[str, Mapping[str, int]],
    unusable: Mapping[str, str],
    conflict: str | None = None,
) -> Decision:
    """Decide for one namespace with `annotations` (the metadata.annotations of the
    ResourceQuota that carries its record, or of the one that is to) and `quota`
    (`tensile.placement.slices.quota_of`, `Units`); `cpu` (cores) and `memory` (bytes) size
    a slice, `headroom` is the share of each node kept free (for messages: `rooms` already
    leave it out), `rooms`/`unusable` as `placement.place` takes them; `conflict`: why the
    records of the namespace's quotas cannot be taken together (several differing ones),
    reported as Invalid. Raises nothing."""
    value = annotations.get(SLICES_ANNOTATION)
    status = parse_status(annotations.get(STATUS_ANNOTATION))
    ours = controller_wrote(annotations)
    if not quota:
        return _without_quota(value, status, ours)
    if conflict is not None:
        return _invalid(conflict, status)
    if isinstance(value, str) and not ours:
        return _administrators(value, status, quota)
    size = slice_for(quota, cpu=cpu, memory=memory)
    previous = _ours(value)
    placement = place(quota=quota, size=size, rooms=rooms, previous=previous, unusable=unusable)
    record = record_of_placement(placement, size)
    new_value = format_record(record)
    cleared = value is None and status is not None and status.written is not None
    if placement.unplaced:
        condition, reason = UNPLACEABLE, "QuotaSlicesUnplaceable"
        message = _unplaceable_message(placement, size, quota, headroom, new_value)
    else:
        condition = PLACED
        reason = "QuotaSlicesRecomputed" if cleared else "QuotaSlicesPlaced"
        message = f"{placement.wanted} slices of {size} for {_quota_text(quota)}: {new_value}"
    if (
        value == new_value
        and status is not None
        and status.condition == condition
        and status.message == message
    ):
        return Decision(patch=None, held=record, unplaced=placement.unplaced)
    new_status = Status(written=new_value, condition=condition, reason=reason, message=message)
    events = []
    if previous is not None and previous != record:
        why = "; ".join(f"{node} {text}" for node, text in sorted(placement.dropped.items()))
        events.append(
            Event(
                type=NORMAL,
                reason="QuotaSlicesRedistributed",
                message=f"slices for new pods now {new_value} (was {value}): "
                f"{why or 'the quota changed'}; running pods stay where they are",
            )
        )
        outcome = "redistributed"
    else:
        outcome = "recomputed" if cleared else "placed"
    if condition == UNPLACEABLE:
        events.append(Event(type=WARNING, reason=reason, message=message))
        outcome = "unplaceable"
    elif previous is None:
        events.append(Event(type=NORMAL, reason=reason, message=message))
    return Decision(
        patch={SLICES_ANNOTATION: new_value, STATUS_ANNOTATION: format_status(new_status)},
        events=tuple(events),
        outcome=outcome,
        held=record,
        unplaced=placement.unplaced,
    )


def _ours(value: object) -> dict[str, Holding] | None:
    """The controller's own record, read; None when there is none, or when it cannot be
    read (written by a version with another format): then it is placed afresh."""
    if not isinstance(value, str):
        return None
    try:
        return parse_record(value)
    except RecordError:
        return None


def _without_quota(value: object, status: Status | None, ours: bool) -> Decision:
    if ours:
        return Decision(
            patch={SLICES_ANNOTATION: None, STATUS_ANNOTATION: None},
            events=(
                Event(
                    type=NORMAL,
                    reason="QuotaSlicesRemoved",
                    message="no ResourceQuota bounds requests.cpu or requests.memory any more: "
                    "the namespace's pods may go to any virtual node",
                ),
            ),
            outcome="removed",
        )
    if isinstance(value, str):
        # Slices divide a quota: without one, a record would only take room from the
        # other namespaces. It is not read, and its status says so.
        written = status.written if status is not None else None
        message = (
            "no ResourceQuota of the namespace bounds requests.cpu or requests.memory: the "
            f"record {value} is not read and the namespace's pods may go to any virtual node"
        )
        if status is not None and status.condition == IGNORED and status.message == message:
            return Decision(patch=None)
        new_status = Status(
            written=written, condition=IGNORED, reason="QuotaSlicesIgnored", message=message
        )
        return Decision(
            patch={STATUS_ANNOTATION: format_status(new_status)},
            events=(Event(type=WARNING, reason="QuotaSlicesIgnored", message=message),),
            outcome="ignored",
        )
    if status is not None:
        return Decision(patch={STATUS_ANNOTATION: None})
    return Decision(patch=None)


def _administrators(value: str, status: Status | None, quota: Mapping[str, int]) -> Decision:
    try:
        record = parse_record(value)
    except RecordError as exc:
        return _invalid(f"the record set by hand cannot be read: {exc}", status)
    capped = sorted(node for node, holding in record.items() if _beyond(holding, quota))
    beyond = (
        f"; on {', '.join(capped)} it counts as the quota ({_quota_text(quota)}), no more"
        if capped
        else ""
    )
    message = (
        f"the record {value} was set by hand and is kept as it is{beyond} "
        f"(remove {SLICES_ANNOTATION} to have it computed again)"
    )
    return _judged(
        status,
        condition=ADMINISTRATOR,
        reason="QuotaSlicesSetByAdministrator",
        kind=NORMAL,
        message=message,
        held=record,
    )


def _invalid(why: str, status: Status | None) -> Decision:
    """A record that cannot be read: the namespace's pods are admitted to no virtual node
    (the extender and the virtual nodes read it so: `tensile.placement.slices`)."""
    message = f"{why}; no virtual node admits the namespace's pods until it is fixed or removed"
    return _judged(
        status,
        condition=INVALID,
        reason="QuotaSlicesInvalid",
        kind=WARNING,
        message=message,
        held=None,
    )


def _judged(
    status: Status | None,
    *,
    condition: str,
    reason: str,
    kind: str,
    message: str,
    held: Mapping[str, Holding] | None,
) -> Decision:
    """The status of a record the controller did not write (kept, or not readable)."""
    if status is not None and status.condition == condition and status.message == message:
        return Decision(patch=None, held=held)
    written = status.written if status is not None else None
    new_status = Status(written=written, condition=condition, reason=reason, message=message)
    return Decision(
        patch={STATUS_ANNOTATION: format_status(new_status)},
        events=(Event(type=kind, reason=reason, message=message),),
        outcome="administrator" if condition == ADMINISTRATOR else "invalid",
        held=held,
    )


def _beyond(holding: Holding, quota: Mapping[str, int]) -> bool:
    """Whether `holding` allows more of a resource than the quota (or leaves unbounded
    one the quota bounds)."""
    budget = holding.budget()
    return holding.count > 0 and any(
        budget.get(name, bound + 1) > bound for name, bound in quota.items()
    )


def _quota_text(quota: Mapping[str, int]) -> str:
    return ", ".join(f"requests.{name}={show(name, quota[name])}" for name in sorted(quota))


def _unplaceable_message(
    placement: Placement,
    size: Any,
    quota: Mapping[str, int],
    headroom: Fraction,
    value: str,
) -> str:
    placed = placement.wanted - placement.unplaced
    return (
        f"only {placed} of {placement.wanted} slices of {size} for {_quota_text(quota)} "
        f"have room on the virtual nodes (keeping {format_quantity(headroom * 100)}% of each "
        f"free): {value}; pods beyond these slices are not admitted"
    )
