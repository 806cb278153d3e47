"""The webhook's settings: frozen, every field documented with its unit and default."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensile.contracts import avoidance
from tensile.contracts.labels import VIRTUAL_NODE_SELECTOR
from webhook.mutation import MutationSettings
from webhook.server import MAX_REQUEST_BYTES
from webhook.tls import TlsSettings


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Where and how the webhook serves (flags in parentheses)."""

    address: str = "0.0.0.0"  # noqa: S104 - a webhook serves the apiserver, wherever it is
    """Listen address (--address)."""
    port: int = 8080
    """Listen port (--port; tensile-kube's default, its manifest used 443)."""
    max_request_bytes: int = MAX_REQUEST_BYTES
    """Largest AdmissionReview body accepted (--max-request-bytes); larger gets 413."""
    metrics_addr: str = ""
    """host:port of a plain-HTTP /metrics, /healthz, /readyz as well ("" : only on the HTTPS
    port) (--metrics-addr)."""
    shutdown_delay: float = 3.0
    """Seconds the webhook keeps answering after SIGTERM, not ready, while endpoints stop
    sending it calls (--shutdown-delay)."""
    shutdown_timeout: float = 10.0
    """Seconds in-flight calls get to finish after that (--shutdown-timeout)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `tensile-webhook` runs with."""

    mutation: MutationSettings = field(default_factory=MutationSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    kubeconfig: str | None = None
    """Upper cluster kubeconfig (--kubeconfig; then $KUBECONFIG, ~/.kube/config, in-cluster)."""
    master: str = ""
    """--master: the apiserver URL used instead of the kubeconfig's ("": the kubeconfig's)."""
    virtual_node_selector: str = VIRTUAL_NODE_SELECTOR
    """Label selector of the virtual nodes (--virtual-node-selector)."""
    avoid_configmap: tuple[str, str] = avoidance.DEFAULT_LOCATION
    """(namespace, name) of the descheduler's avoidance record (--avoid-configmap)."""
    log_level: str = "info"
    log_format: str = "text"
    notes: tuple[str, ...] = ()
    """Flags given that are accepted but ignored, one sentence each (logged at start)."""
