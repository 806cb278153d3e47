"""Prometheus metrics of the namespace quota slices (served on tensile-scheduler's `/metrics`,
to callers with a client certificate, and on `--metrics-addr`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SLICES_HELD = Gauge(
    "tensile_scheduler_quota_slices",
    "Quota slices a namespace holds on a virtual node (its record, computed or set by hand).",
    ["namespace", "node"],
)
SLICES_UNPLACED = Gauge(
    "tensile_scheduler_quota_slices_unplaced",
    "Slices of a namespace's quota that found no room on any virtual node (0: all placed).",
    ["namespace"],
)
DECISIONS = Counter(
    "tensile_scheduler_quota_slice_decisions",
    "Records written or judged, by outcome: placed, recomputed (after the record was "
    "cleared), redistributed, unplaceable, administrator (a record set by hand, kept), "
    "invalid (one set by hand that cannot be read, or differing records: the namespace's "
    "pods are admitted nowhere), ignored (a record where no quota bounds requests), "
    "removed (no quota any more).",
    ["outcome"],
)
ADMISSIONS = Counter(
    "tensile_scheduler_quota_slice_admissions",
    "Extender filter answers on quota slices: admitted and refused (outside the "
    "namespace's slices, or its record cannot be read) per pod and virtual node; "
    "unconstrained per pod (its namespace has no quota or no record).",
    ["outcome"],
)
