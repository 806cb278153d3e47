"""The slice controller's status of a record (pure): read and written beside the record on
its ResourceQuota.

The record itself, its format and which one is in force are `tensile.placement.slices`
(the virtual node reads them too); the two annotations are described in
`tensile.contracts.quotaslices`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts.quotaslices import SLICES_ANNOTATION, STATUS_ANNOTATION, WRITER


@dataclass(frozen=True, kw_only=True)
class Status:
    """The slice controller's status annotation."""

    written: str | None
    """The exact record value the controller last wrote (None: none)."""
    condition: str
    """`tensile.contracts.quotaslices` PLACED, UNPLACEABLE, ADMINISTRATOR, INVALID or
    IGNORED."""
    reason: str
    """One CamelCase word (the Event's reason)."""
    message: str
    """What was decided and why, for people."""


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
    """Tell whether the record in a ResourceQuota's `annotations` is exactly what the
    controller last wrote; False for an administrator's record (or none)."""
    value = annotations.get(SLICES_ANNOTATION)
    status = parse_status(annotations.get(STATUS_ANNOTATION))
    return isinstance(value, str) and status is not None and status.written == value
