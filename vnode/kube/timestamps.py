"""Kubernetes' wire form of a point in time (pure)."""

from __future__ import annotations

import datetime as dt


def rfc3339(moment: dt.datetime) -> str:
    """Return `moment` (an aware datetime; a naive one is taken as local time) as a
    `metav1.Time`: RFC 3339 in UTC, whole seconds (the fraction is dropped, not rounded),
    `Z` suffix, e.g. `2026-03-01T12:00:00Z`. Raises nothing."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
