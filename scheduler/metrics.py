"""Prometheus metrics of the extender (served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CALLS = Counter(
    "tensile_scheduler_extender_requests",
    "Extender calls answered, by verb (filter, prioritize) and result: ok, bad_request (not "
    "an ExtenderArgs: 400), error (a bug: every node passed, score 0).",
    ["verb", "result"],
)
REFUSED = Counter(
    "tensile_scheduler_extender_refused_requests",
    "Requests refused before being read, by reason: unauthenticated (no client certificate: "
    "401), too_many_requests (beyond --max-requests-inflight: 429).",
    ["reason"],
)
LATENCY = Histogram(
    "tensile_scheduler_extender_duration_seconds",
    "Time from receiving an extender call to answering it (the body read included).",
    ["verb"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
NODES = Counter(
    "tensile_scheduler_filtered_nodes",
    "Candidate nodes of filter calls, by verdict: fit (a virtual node whose lower cluster "
    "has a node for the pod), unfit (filtered out), passed (not a virtual node, untouched).",
    ["verdict"],
)
VIRTUAL_NODES = Gauge(
    "tensile_scheduler_virtual_nodes",
    "Virtual nodes with a readable placement summary, by state: readable, unreadable "
    "(a summary that cannot be parsed: the node passes untouched).",
    ["state"],
)
