"""Prometheus metrics of the descheduler (served on `--metrics-addr`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

PODS_CONSIDERED = Counter(
    "tensile_descheduler_pods_considered",
    "Pending pods on considered virtual nodes examined, per round.",
)
PODS_EVICTED = Counter(
    "tensile_descheduler_pods_evicted",
    "Pods evicted through the Eviction API (dry runs not counted).",
)
PODS_RECREATED = Counter(
    "tensile_descheduler_pods_recreated",
    "Bare pods re-created on another virtual node (dry runs not counted).",
)
BLOCKED_BY_PDB = Counter(
    "tensile_descheduler_pods_blocked_by_pdb",
    "Moves a PodDisruptionBudget did not allow (checked by the descheduler, or refused by "
    "the Eviction API with 429).",
)
MOVES = Counter(
    "tensile_descheduler_moves",
    "Moves by kind (evict, recreate) and outcome: moved, dry_run, blocked, refused (429), "
    "exhausted (no virtual node left), conflict (the pod changed), gone, rate_limited, "
    "record_full, failed.",
    ["kind", "outcome"],
)
ROUNDS = Counter("tensile_descheduler_rounds", "Descheduling rounds run while leading.")
ROUND_DURATION = Histogram(
    "tensile_descheduler_round_duration_seconds",
    "Time one round took, its moves included.",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)
