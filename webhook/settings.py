"""The webhook's settings: frozen, every field documented with its unit and default."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensile.contracts import avoidance
from tensile.contracts.labels import VIRTUAL_NODE_SELECTOR
from tensile.serving.bootstrap import SecretSettings
from tensile.serving.https import FlagNames, ServerSettings
from webhook.mutation import MutationSettings
from webhook.server import MAX_REQUEST_BYTES

FLAGS = FlagNames(cert_file="--tlscert", key_file="--tlskey", client_ca_file="--CA")
"""tensile-kube's names of the webhook's serving flags."""
DEFAULT_NAMESPACE = "tensile-system"
"""The namespace of the webhook's Service and certificate Secret without $POD_NAMESPACE."""
DEFAULT_SECRET = "tensile-webhook-tls"  # noqa: S105 - a Secret's name
"""The Secret a bootstrapped certificate is kept in (--tls-secret's name part)."""
DEFAULT_SERVER = ServerSettings(
    port=8080,
    secret=SecretSettings(namespace=DEFAULT_NAMESPACE, name=DEFAULT_SECRET),
    max_request_bytes=MAX_REQUEST_BYTES,
    shutdown_delay=3.0,
    shutdown_timeout=10.0,
    flags=FLAGS,
)
"""Where and how the webhook serves by default (flags in parentheses): --address 0.0.0.0,
--port 8080 (tensile-kube's default; its manifest used 443); the certificate from --tlscert
and --tlskey, reloaded when they change, else bootstrapped into the Secret --tls-secret
(named for --service and --tls-san, checked every --tls-resync, 1m); callers present a
certificate of --CA when it is given (the apiserver's); --max-request-bytes; --metrics-addr;
after SIGTERM the webhook keeps answering, not ready, for --shutdown-delay (3s) while
endpoints stop sending it calls, then calls in flight get --shutdown-timeout (10s)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything `tensile-webhook` runs with."""

    mutation: MutationSettings = field(default_factory=MutationSettings)
    server: ServerSettings = DEFAULT_SERVER
    webhook_configuration: str = "tensile-webhook"
    """The MutatingWebhookConfiguration whose caBundle is set to a bootstrapped CA, "" for
    none (--webhook-configuration)."""
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
