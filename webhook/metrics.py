"""Prometheus metrics of the webhook (served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ADMISSIONS = Counter(
    "tensile_webhook_admission_requests",
    "AdmissionReviews answered, by operation and result: mutated (a patch), unchanged "
    "(converted already, nothing to do), skipped (not selected), timeout (answered "
    "allowed without a patch before the apiserver's deadline), error (a bug: allowed "
    "without a patch), rejected (not an AdmissionReview: 4xx).",
    ["operation", "result"],
)
LATENCY = Histogram(
    "tensile_webhook_admission_duration_seconds",
    "Time from receiving an AdmissionReview to answering it.",
    ["operation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CERTIFICATE_EXPIRY = Gauge(
    "tensile_webhook_serving_certificate_expiry_timestamp_seconds",
    "When the serving certificate in use expires (Unix time; bootstrapped certificates).",
)
