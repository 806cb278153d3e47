"""Kubernetes' wire forms of a point in time (pure)."""

from __future__ import annotations

import datetime as dt


def rfc3339(moment: dt.datetime) -> str:
    """Return `moment` (an aware datetime; a naive one is taken as local time) as a
    `metav1.Time`: RFC 3339 in UTC, whole seconds (the fraction is dropped, not rounded),
    `Z` suffix, e.g. `2026-03-01T12:00:00Z`. Raises nothing."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: dt.datetime) -> str:
    """Return `moment` (aware; naive is local time) as a `metav1.MicroTime` (a Lease's
    acquireTime and renewTime, an Event's eventTime): RFC 3339 in UTC with exactly six
    fractional digits, e.g. `2026-03-01T12:00:00.250000Z`. Raises nothing."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: object) -> dt.datetime | None:
    """Return the aware UTC datetime of a `metav1.Time` or `MicroTime` string (any RFC 3339
    form: `Z` or a numeric offset, with or without a fraction), or None when `text` is not
    one (missing, null, malformed). Raises nothing."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None  # RFC 3339 always names its offset; a bare time is not one
    return moment.astimezone(dt.UTC)


def now_rfc3339(now: dt.datetime | None = None) -> str:
    """Return `now` (default: the current UTC time) as a `metav1.Time` (see `rfc3339`)."""
    return rfc3339(now or dt.datetime.now(dt.UTC))


def now_micro(now: dt.datetime | None = None) -> str:
    """Return `now` (default: the current UTC time) as a `metav1.MicroTime` (a Lease's
    renewTime; see `rfc3339_micro`)."""
    return rfc3339_micro(now or dt.datetime.now(dt.UTC))
