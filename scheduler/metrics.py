"""Prometheus metrics of the extender (served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FINE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01,
    0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
)  # fmt: skip
"""Seconds: fine below 10 ms, where kube-scheduler's budget is counted."""

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
    buckets=FINE_BUCKETS,
)
CPU = Histogram(
    "tensile_scheduler_extender_cpu_seconds",
    "CPU time the process spent on an extender call, from receiving it to answering it "
    "(its duration less this is time it waited: for other work on the event loop, or for "
    "a CPU).",
    ["verb"],
    buckets=FINE_BUCKETS,
)
LOOP_LAG = Histogram(
    "tensile_scheduler_event_loop_lag_seconds",
    "How much later than asked a timer of the event loop ran, sampled ten times a second: "
    "what a call arriving then waits before it is read.",
    buckets=FINE_BUCKETS,
)
GC_PAUSES = Histogram(
    "tensile_scheduler_gc_pause_seconds",
    "Pauses of Python's garbage collector, by generation collected (everything stops "
    "meanwhile, calls too).",
    ["generation"],
    buckets=FINE_BUCKETS,
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
