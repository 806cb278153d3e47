"""The descheduler's settings: frozen, built once from the command line (`cli.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from descheduler.mover import MoveSettings
from descheduler.policy import Criteria
from tensile.contracts import avoidance
from tensile.kube.leaderelection import LeaderElectionSettings
from tensile.serving.https import ServerSettings


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `tensile-descheduler` runs with; durations in seconds."""

    kubeconfig: str | None = None
    """The upper cluster's kubeconfig (None: $KUBECONFIG, ~/.kube/config, in-cluster)."""
    interval: float = 10.0
    """Time between rounds (--descheduling-interval); 0: one round, then exit."""
    criteria: Criteria = field(default_factory=Criteria)
    moves: MoveSettings = field(default_factory=MoveSettings)
    avoid_namespace: str = avoidance.DEFAULT_LOCATION[0]
    avoid_name: str = avoidance.DEFAULT_LOCATION[1]
    """The avoidance record's ConfigMap (--avoid-configmap NAMESPACE/NAME)."""
    eviction_rate: float = 2.0
    """Moves per second across all virtual nodes (0: no limit)."""
    eviction_burst: int = 10
    """Moves allowed at once above the rate."""
    leader_election: LeaderElectionSettings | None = None
    """None: act without a Lease (--leader-elect=false, a single replica)."""
    qps: float = 50.0
    """Upper cluster client requests per second (--kube-api-qps)."""
    burst: int = 100
    """Upper cluster client burst (--kube-api-burst)."""
    server: ServerSettings | None = None
    """The HTTPS port of /metrics (behind TokenReview and SubjectAccessReview), /healthz and
    /readyz (--secure-port, --bind-address, --tls-cert-file, --tls-private-key-file; no
    certificate files: a self-signed certificate); None: --secure-port=0, none."""
    metrics_addr: str = ""
    """host:port of /metrics, /healthz and /readyz ("" : not served; loopback unless
    --metrics-insecure: `tensile.serving.metrics_flags`)."""
    healthz_addr: str = ""
    """host:port of /healthz and /readyz only, for probes ("" : not served)."""
    log_level: str = "info"
    log_format: str = "text"
    notes: tuple[str, ...] = ()
    """Flags given that are accepted but ignored, and the policy file's warnings, one
    sentence each (logged at start)."""
