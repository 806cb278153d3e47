"""The extender's settings: frozen, every field documented with its unit and default."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.extender import Policy
from scheduler.server import MAX_REQUEST_BYTES, Callers
from scheduler.slices.settings import SliceSettings
from tensile.contracts.labels import VIRTUAL_NODE_SELECTOR
from tensile.serving.https import ServerSettings

DEFAULT_SERVER = ServerSettings(
    port=8443,
    max_request_bytes=MAX_REQUEST_BYTES,
    require_client_certificate=False,
    shutdown_delay=2.0,
    shutdown_timeout=5.0,
)
"""Where and how the extender serves by default (flags in parentheses): --address 0.0.0.0,
--port 8443; the certificate from --tls-cert-file and --tls-private-key-file (required),
reloaded when they change; callers' certificates verified against --client-ca-file
(required) when presented, and required on every route but /healthz and /readyz
(`scheduler.server.Callers`: kube-scheduler's extender tlsConfig names certFile/keyFile,
kubelet probes present none); --max-request-bytes; --metrics-addr (plain HTTP, no client
certificate asked); after SIGTERM it answers, not ready, for --shutdown-delay (2s), then
calls in flight get --shutdown-timeout (5s)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `tensile-scheduler` runs with."""

    server: ServerSettings = DEFAULT_SERVER
    callers: Callers = field(default_factory=Callers)
    """Who may call and how many calls at once (--max-requests-inflight)."""
    policy: Policy = field(default_factory=Policy)
    kubeconfig: str | None = None
    """Upper cluster kubeconfig (--kubeconfig; then $KUBECONFIG, ~/.kube/config, in-cluster)."""
    virtual_node_selector: str = VIRTUAL_NODE_SELECTOR
    """Label selector of the Nodes watched for placement summaries (--virtual-node-selector)."""
    slices: SliceSettings = field(default_factory=SliceSettings)
    """The namespace quota slices (--slice-cpu, --slice-memory, --slice-sync-delay, and
    --headroom)."""
    log_level: str = "info"
    log_format: str = "text"
    notes: tuple[str, ...] = ()
    """Flags given that are accepted but ignored, one sentence each (logged at start)."""
