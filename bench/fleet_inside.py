"""Where the latency round's time goes inside the virtual nodes (pure): their work queues'
wait and work, and their API requests' durations, from the metrics every virtual node
serves, scraped before and after the round (so only the round's keys and requests count),
summed over the nodes and read as quantiles of the histograms (`histogram_quantile`, as
PromQL's: interpolated inside a bucket, so as coarse as the buckets).

A stage of the objectives (`fleet_slo`) is the virtual node's queue wait and work plus
what the control planes take; these figures say how much of a stage's p99 is the virtual
node's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import fleet_plan as plan
import fleet_slo as slo
import harness

SERIES: tuple[tuple[str, str, Mapping[str, str]], ...] = (
    (
        "upper pod queued -> a worker took it",
        "tensile_workqueue_queue_duration_seconds",
        {"queue": "pods_from_upper"},
    ),
    (
        "its worker's handling (dependencies, the create below)",
        "tensile_workqueue_work_duration_seconds",
        {"queue": "pods_from_upper"},
    ),
    (
        "lower status queued -> a worker took it",
        "tensile_workqueue_queue_duration_seconds",
        {"queue": "status_from_lower"},
    ),
    (
        "its worker's handling (the status written upstairs)",
        "tensile_workqueue_work_duration_seconds",
        {"queue": "status_from_lower"},
    ),
    (
        "lower POST (a request's own duration)",
        "tensile_api_request_duration_seconds",
        {"cluster": "lower", "verb": "POST"},
    ),
    (
        "upper PATCH (a request's own duration)",
        "tensile_api_request_duration_seconds",
        {"cluster": "upper", "verb": "PATCH"},
    ),
)
"""(title, histogram, labels a sample must have) of each line of the report."""


def round_buckets(
    before: Sequence[str], after: Sequence[str], histogram: str, labels: Mapping[str, str]
) -> dict[float, float]:
    """Cumulative count by upper bound `le` (+Inf as infinity) of `histogram`'s samples
    carrying `labels`, counted between the `before` and `after` scrapes of each node (the
    two sequences are the same nodes in the same order), summed over the nodes."""
    total: dict[float, float] = {}
    for text_before, text_after in zip(before, after, strict=True):
        earlier = harness.samples(text_before, histogram + "_bucket")
        for key, value in harness.samples(text_after, histogram + "_bucket").items():
            got = dict(key)
            if any(got.get(k) != v for k, v in labels.items()):
                continue
            bound = math.inf if got["le"] == "+Inf" else float(got["le"])
            total[bound] = total.get(bound, 0.0) + value - earlier.get(key, 0.0)
    return total


def report(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """The lines: per `SERIES`, how many were counted and their p50/p99 (ms)."""
    rows = [("inside the virtual nodes meanwhile", "count", "p50 ms", "p99 ms")]
    for title, histogram, labels in SERIES:
        buckets = round_buckets(before, after, histogram, labels)
        count = buckets.get(math.inf, 0.0)
        p50 = plan.histogram_quantile(0.5, buckets)
        p99 = plan.histogram_quantile(0.99, buckets)
        rows.append((title, f"{count:.0f}", slo.ms(p50), slo.ms(p99)))
    return slo.columns(rows, left=1)
