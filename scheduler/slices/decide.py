"""What the slice controller does for one namespace (pure): write, keep or remove its record,
and which Events say so.

Who wrote the record decides: the controller's own (its status's `written` equals the
record) is recomputed from where it is (`placement.place`); an administrator's (any other
value, or a record with no status) is respected as it is, and only its status says so (or
that it cannot be read); a record removed by hand is computed again from nothing. Without
a quota the controller's record is removed and an administrator's left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from scheduler.slices.placement import Placement, place, record_of_placement, slice_for
from scheduler.slices.record import (
    Holding,
    RecordError,
    Status,
    controller_wrote,
    format_record,
    format_status,
    parse_record,
    parse_status,
    show,
)
from tensile.contracts.quotaslices import (
    ADMINISTRATOR,
    INVALID,
    PLACED,
    SLICES_ANNOTATION,
    STATUS_ANNOTATION,
    UNPLACEABLE,
)
from tensile.kube.quantity import format_quantity

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
    administrator, invalid, removed (None: nothing new)."""
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
) -> Decision:
    """Decide for one namespace with `annotations` (its metadata.annotations) and `quota`
    (`placement.quota_of`, `Units`); `cpu` (cores) and `memory` (bytes) size a slice, `headroom` is
    the share of each node kept free (for messages: `rooms` already leave it out),
    `rooms`/`unusable` as `placement.place` takes them. Raises nothing."""
    value = annotations.get(SLICES_ANNOTATION)
    status = parse_status(annotations.get(STATUS_ANNOTATION))
    ours = controller_wrote(annotations)
    if not quota:
        return _without_quota(value, status, ours)
    if isinstance(value, str) and not ours:
        return _administrators(value, status)
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
        # An administrator's record stands even without a quota: it is theirs to remove.
        try:
            return Decision(patch=None, held=parse_record(value))
        except RecordError:
            return Decision(patch=None)
    if status is not None:
        return Decision(patch={STATUS_ANNOTATION: None})
    return Decision(patch=None)


def _administrators(value: str, status: Status | None) -> Decision:
    written = status.written if status is not None else None
    try:
        record = parse_record(value)
    except RecordError as exc:
        condition, reason, kind, held = INVALID, "QuotaSlicesInvalid", WARNING, None
        message = (
            f"the record set by hand cannot be read: {exc}; the namespace is unconstrained "
            "until it is fixed or removed"
        )
    else:
        condition, reason, kind, held = (
            ADMINISTRATOR,
            "QuotaSlicesSetByAdministrator",
            NORMAL,
            record,
        )
        message = (
            f"the record {value} was set by hand and is kept as it is "
            f"(remove {SLICES_ANNOTATION} to have it computed again)"
        )
    if status is not None and status.condition == condition and status.message == message:
        return Decision(patch=None, held=held)
    new_status = Status(written=written, condition=condition, reason=reason, message=message)
    return Decision(
        patch={STATUS_ANNOTATION: format_status(new_status)},
        events=(Event(type=kind, reason=reason, message=message),),
        outcome="administrator" if condition == ADMINISTRATOR else "invalid",
        held=held,
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
