"""Prometheus metrics of the client plumbing (one set per process, labelled by cluster/queue)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

API_REQUESTS = Counter(
    "tensile_api_requests",
    "Requests to a Kubernetes API server, by cluster, verb and HTTP code (0: no answer).",
    ["cluster", "verb", "code"],
)
FENCED_WRITES = Counter(
    "tensile_api_fenced_writes",
    "Writes refused before they were sent, by cluster and verb: this process did not hold "
    "its leader-election Lease within the renew deadline (fencing).",
    ["cluster", "verb"],
)
API_LATENCY = Histogram(
    "tensile_api_request_duration_seconds",
    "Latency of non-streaming Kubernetes API requests.",
    ["cluster", "verb"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_DEPTH = Gauge("tensile_workqueue_depth", "Keys waiting in a work queue.", ["queue"])
QUEUE_ADDS = Counter("tensile_workqueue_adds", "Keys added to a work queue.", ["queue"])
QUEUE_RETRIES = Counter("tensile_workqueue_retries", "Keys requeued after a failure.", ["queue"])
QUEUE_LATENCY = Histogram(
    "tensile_workqueue_queue_duration_seconds",
    "Time a key waits in a work queue before a worker takes it.",
    ["queue"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60),
)
QUEUE_WORK = Histogram(
    "tensile_workqueue_work_duration_seconds",
    "Time a worker spends on one key.",
    ["queue"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60),
)
CACHED_OBJECTS = Gauge(
    "tensile_informer_cached_objects", "Objects in an informer's store.", ["informer"]
)
RELISTS = Counter(
    "tensile_reflector_relists", "Full lists after a start, a 410 Gone or a failure.", ["informer"]
)
LEADER = Gauge(
    "tensile_leader_election_is_leader",
    "1 while this process holds the leader-election Lease (namespace/name), else 0.",
    ["lease"],
)
