"""The `tensile-webhook` command line: tensile-kube's webhook flags (`--address`, `--port`,
`--tlscert`, `--tlskey`, `--CA`, `--kubeconfig`, `--ignore-selector-keys`, and the
`--master`/`--incluster`/`--v` it accepted) plus tensile's, parsed into frozen `Settings`.
Invalid values raise UsageError (the command exits 2 with its one-line message).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping, Sequence

from tensile.contracts import avoidance, clusterselector, names, selectors
from tensile.contracts.labels import DEFAULT_TAINT_KEY, VIRTUAL_NODE_SELECTOR
from tensile.serving import flags, metrics_flags
from tensile.serving.bootstrap import SecretSettings
from tensile.serving.flags import UsageError
from tensile.serving.https import ServerSettings
from webhook.mutation import MutationSettings
from webhook.server import MAX_REQUEST_BYTES
from webhook.settings import DEFAULT_NAMESPACE, DEFAULT_SECRET, DEFAULT_SERVER, FLAGS, Settings

DEFAULT_SERVICE = "tensile-webhook"
DEFAULT_CONFIGURATION = "tensile-webhook"
_MAX_TOLERATION_SECONDS = 2**63 - 1


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    namespace = env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    p = flags.Parser(
        prog="tensile-webhook",
        description="Mutating admission webhook: moves placement meant for lower clusters "
        "into the clusterSelector annotation of pods for virtual nodes.",
    )
    a = p.add_argument
    # tensile-kube's flags
    a("--address", default="0.0.0.0", help="listen address (default 0.0.0.0)")  # noqa: S104
    a("--port", type=int, default=8080, help="listen port (default 8080)")
    a("--tlscert", default="", help="serving certificate file (reloaded when it changes)")
    a("--tlskey", default="", help="its private key file")
    a(
        "--CA",
        dest="client_ca",
        default="",
        help="require client certificates signed by this CA (the apiserver's, from its "
        "admission control configuration); probes then need --metrics-addr",
    )
    a(
        "--kubeconfig",
        default=None,
        help="kubeconfig of the upper cluster (env KUBECONFIG; then ~/.kube/config, then "
        "in-cluster)",
    )
    a(
        "--ignore-selector-keys",
        default="clusterID",
        help="comma-separated node label keys that stay on the pod (they target virtual "
        "nodes); default clusterID",
    )
    a(
        "--master",
        default="",
        help="apiserver URL used instead of the kubeconfig's (client-go's master URL)",
    )
    a(
        "--incluster",
        type=flags.boolean,
        nargs="?",
        const=True,
        default=False,
        help="accepted for compatibility with tensile-kube; unused (no --kubeconfig and no "
        "~/.kube/config means in-cluster)",
    )
    # tensile's
    a(
        "--pod-selector",
        default="virtual-pod=true",
        help="label selector of the pods converted (default virtual-pod=true)",
    )
    a(
        "--excluded-namespaces",
        default="kube-system",
        help="comma-separated namespaces whose pods are never converted (default kube-system)",
    )
    a(
        "--virtual-node-selector",
        default=VIRTUAL_NODE_SELECTOR,
        help="label selector of the virtual nodes (default type=virtual-kubelet)",
    )
    a(
        "--taint",
        default=env.get("VKUBELET_TAINT_KEY") or DEFAULT_TAINT_KEY,
        help="key of the virtual nodes' taint, tolerated on converted pods (env "
        f"VKUBELET_TAINT_KEY; default {DEFAULT_TAINT_KEY})",
    )
    for kind in ("not-ready", "unreachable"):
        a(
            f"--default-{kind}-toleration-seconds",
            type=int,
            default=clusterselector.DEFAULT_TOLERATION_SECONDS,
            help=f"tolerationSeconds of the node.kubernetes.io/{kind} toleration on converted "
            "pods: how long a pod stays on a virtual node that stopped reporting before it is "
            f"evicted and replaced (default {clusterselector.DEFAULT_TOLERATION_SECONDS}, "
            "kube-apiserver's; -1: never, tensile-kube's behaviour)",
        )
    a(
        "--service",
        default=f"{namespace}/{DEFAULT_SERVICE}",
        help="namespace/name of the webhook's Service: its DNS names go into a bootstrapped "
        f"certificate (default $POD_NAMESPACE/{DEFAULT_SERVICE}, namespace {DEFAULT_NAMESPACE} "
        "without POD_NAMESPACE)",
    )
    a(
        "--tls-san",
        action="append",
        default=[],
        help="more DNS names or IP addresses for a bootstrapped certificate (comma-separated, "
        "repeatable), e.g. for a URL webhook configuration",
    )
    a(
        "--tls-secret",
        default=f"{namespace}/{DEFAULT_SECRET}",
        help="namespace/name of the Secret a bootstrapped certificate is kept in, shared by "
        f"all replicas (default $POD_NAMESPACE/{DEFAULT_SECRET})",
    )
    a(
        "--webhook-configuration",
        default=DEFAULT_CONFIGURATION,
        help="MutatingWebhookConfiguration whose caBundle is set to the bootstrapped CA "
        f"(default {DEFAULT_CONFIGURATION}; empty: none)",
    )
    a(
        "--tls-resync",
        type=flags.duration,
        default=DEFAULT_SERVER.resync,
        help="how often a bootstrapped certificate (renewed by another replica, or due) and "
        "the caBundle are checked again (default 1m)",
    )
    a(
        "--max-request-bytes",
        type=int,
        default=MAX_REQUEST_BYTES,
        help=f"largest AdmissionReview body accepted (default {MAX_REQUEST_BYTES})",
    )
    metrics_flags.add_flags(a)
    a(
        "--avoid-configmap",
        default=avoidance.DEFAULT_CONFIGMAP,
        help="NAMESPACE/NAME of the descheduler's avoidance record "
        f"(default {avoidance.DEFAULT_CONFIGMAP}; the same flag as the descheduler's)",
    )
    a(
        "--shutdown-delay",
        type=flags.duration,
        default=DEFAULT_SERVER.shutdown_delay,
        help="after SIGTERM, keep answering (not ready) this long while endpoints stop "
        "sending calls (default 3s)",
    )
    a(
        "--shutdown-timeout",
        type=flags.duration,
        default=DEFAULT_SERVER.shutdown_timeout,
        help="then give in-flight calls this long (default 10s)",
    )
    flags.add_logging_flags(p)
    return p


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from command-line arguments and environment variables (POD_NAMESPACE,
    VKUBELET_TAINT_KEY). Raises UsageError naming the bad flag, VersionRequested."""
    env = os.environ if env is None else env
    args = _parser(env).parse_args(list(argv))
    log_choice = flags.logging_choice(args)
    if bool(args.tlscert) != bool(args.tlskey):
        raise UsageError("--tlscert and --tlskey go together (or neither: bootstrapped TLS)")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1-65535, got {args.port}")
    if args.max_request_bytes < 1024:
        raise UsageError(f"--max-request-bytes must be at least 1024, got {args.max_request_bytes}")
    mutation = MutationSettings(
        pod_selector=_selector(args.pod_selector, "--pod-selector"),
        excluded_namespaces=frozenset(_list(args.excluded_namespaces)),
        ignore_selector_keys=frozenset(_list(args.ignore_selector_keys)),
        taint_key=_non_empty(args.taint, "--taint"),
        not_ready_seconds=_seconds(
            args.default_not_ready_toleration_seconds, "--default-not-ready-toleration-seconds"
        ),
        unreachable_seconds=_seconds(
            args.default_unreachable_toleration_seconds,
            "--default-unreachable-toleration-seconds",
        ),
    )
    _selector(args.virtual_node_selector, "--virtual-node-selector")
    service_namespace, service = flags.namespaced(
        args.service,
        "--service",
        valid=names.is_dns1035_label,
        what="a Service name (a DNS-1035 label)",
    )
    secret_namespace, secret = flags.namespaced(args.tls_secret, "--tls-secret")
    avoid_configmap = flags.namespaced(args.avoid_configmap, "--avoid-configmap")
    sans = [_subject_name(s) for item in args.tls_san for s in _list(item)]
    return Settings(
        mutation=mutation,
        server=ServerSettings(
            address=_address(args.address),
            port=args.port,
            cert_file=args.tlscert,
            key_file=args.tlskey,
            secret=SecretSettings(
                namespace=secret_namespace,
                name=secret,
                names=(*service_names(service_namespace, service), *sans),
            ),
            resync=_positive(args.tls_resync, "--tls-resync"),
            client_ca_file=args.client_ca,
            require_client_certificate=True,
            max_request_bytes=args.max_request_bytes,
            metrics_addr=metrics_flags.metrics_addr(args),
            shutdown_delay=args.shutdown_delay,
            shutdown_timeout=args.shutdown_timeout,
            flags=FLAGS,
        ),
        webhook_configuration=args.webhook_configuration,
        kubeconfig=args.kubeconfig or None,
        master=flags.server_url(args.master, "--master"),
        virtual_node_selector=args.virtual_node_selector,
        avoid_configmap=avoid_configmap,
        log_level=log_choice.level,
        log_format=log_choice.format,
        notes=log_choice.notes,
    )


def service_names(namespace: str, name: str) -> tuple[str, ...]:
    """Return the DNS names a Service `namespace`/`name` is reached by in a cluster (the
    apiserver calls `<name>.<namespace>.svc`)."""
    return (
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
    )


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _selector(text: str, flag: str) -> selectors.Selector:
    try:
        return selectors.parse(text)
    except selectors.SelectorError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _non_empty(text: str, flag: str) -> str:
    if not text.strip():
        raise UsageError(f"{flag} must not be empty")
    return text.strip()


def _positive(seconds: float, flag: str) -> float:
    if seconds <= 0:
        raise UsageError(f"{flag} must be more than 0")
    return seconds


def _seconds(value: int, flag: str) -> int | None:
    if value == -1:
        return None
    if not 0 <= value <= _MAX_TOLERATION_SECONDS:
        raise UsageError(f"{flag} must be -1 (never evicted) or seconds >= 0, got {value}")
    return value


def _subject_name(text: str) -> str:
    """A name for a bootstrapped certificate: an IP address, or an ASCII DNS name (a
    leading `*.` allowed) that Go's TLS stack can match."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        host = text.removeprefix("*.")
        if not names.is_dns1123_subdomain(host.lower()):
            raise UsageError(
                f"--tls-san: {text!r} is not a DNS name or an IP address (IDNs go in their "
                "xn-- form)"
            ) from None
    return text


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise UsageError(f"--address must be an IP address, got {text!r}") from None
