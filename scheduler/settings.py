"""The extender's settings: frozen, every field documented with its unit and default."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.extender import Policy
from scheduler.server import MAX_REQUEST_BYTES
from scheduler.slices_settings import SliceSettings


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Where and how the extender serves (flags in parentheses)."""

    address: str = "0.0.0.0"  # noqa: S104 - kube-scheduler calls it from wherever it runs
    """Listen address (--address)."""
    port: int = 8443
    """Listen port (--port)."""
    cert_file: str = ""
    """Serving certificate file, reloaded when it changes (--tls-cert-file; required)."""
    key_file: str = ""
    """Its private key (--tls-private-key-file; required)."""
    client_ca_file: str = ""
    """Require client certificates signed by this CA ("" : none) (--client-ca-file); the
    extender's tlsConfig in kube-scheduler's configuration then names certFile/keyFile."""
    max_request_bytes: int = MAX_REQUEST_BYTES
    """Largest body accepted (--max-request-bytes); larger gets 413."""
    metrics_addr: str = ""
    """host:port of a plain-HTTP /metrics, /healthz, /readyz as well ("" : only on the
    HTTPS port) (--metrics-addr)."""
    shutdown_delay: float = 2.0
    """Seconds it keeps answering after SIGTERM, not ready (--shutdown-delay)."""
    shutdown_timeout: float = 5.0
    """Seconds in-flight calls get to finish after that (--shutdown-timeout)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `tensile-scheduler` runs with."""

    server: ServerSettings = field(default_factory=ServerSettings)
    policy: Policy = field(default_factory=Policy)
    kubeconfig: str | None = None
    """Upper cluster kubeconfig (--kubeconfig; then $KUBECONFIG, ~/.kube/config, in-cluster)."""
    virtual_node_selector: str = "type=virtual-kubelet"
    """Label selector of the Nodes watched for placement summaries (--virtual-node-selector)."""
    slices: SliceSettings = field(default_factory=SliceSettings)
    """The namespace quota slices (--slice-cpu, --slice-memory, --slice-sync-delay, and
    --headroom)."""
    log_level: str = "info"
    log_format: str = "text"
    notes: tuple[str, ...] = ()
    """Flags given that are accepted but ignored, one sentence each (logged at start)."""
