"""The `tensile-descheduler` command line: tensile-kube's descheduler flags, client-go's
leader-election flags, and ours, parsed into frozen `Settings`. Invalid values (a bad
policy file included) raise UsageError: one message, exit 2."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
from collections.abc import Sequence

from descheduler import policyfile
from descheduler.mover import MoveSettings
from descheduler.policy import POD_SELECTOR, Criteria
from descheduler.settings import Settings
from tensile.contracts import avoidance, selectors
from tensile.serving import election_flags, flags, metrics_flags
from tensile.serving.flags import UsageError
from tensile.serving.https import FlagNames, ServerSettings

DEFAULT_LEASE = "tensile-system/tensile-descheduler"
SECURE_PORT = 10260
"""Default --secure-port: the Kubernetes descheduler's own 10258 and kube-scheduler's 10259
are where tensile's manifests have long served the descheduler's plain /metrics and probes,
and 10260 is used by no other tensile program (the virtual node: 10250/10450-10456, the
webhook and the extender: 8443)."""
MAX_AVOID_TTL = 365 * 86400.0
"""Longest --avoid-ttl (seconds): an avoidance is for a lower cluster that is full now, and
its expiry must stay a time RFC 3339 (and Python) can write."""


def _parser() -> argparse.ArgumentParser:
    p = flags.Parser(
        prog="tensile-descheduler",
        description="Move pods a lower cluster cannot place to another virtual node.",
    )
    a = p.add_argument
    # tensile-kube's flags
    a(
        "--descheduling-interval",
        type=flags.duration,
        default=10.0,
        help="time between rounds (default 10s; 0: one round, then exit)",
    )
    a("--kubeconfig", default=None, help="upper cluster (env KUBECONFIG; then in-cluster)")
    a(
        "--policy-config-file",
        default="",
        help="DeschedulerPolicy file (descheduler/v1alpha1; PodLifeTime's maxPodLifeTimeSeconds)",
    )
    a(
        "--dry-run",
        type=flags.boolean,
        nargs="?",
        const=True,
        default=False,
        help="change nothing: log and count what would be done",
    )
    a("--node-selector", default=None, help="label selector of the virtual nodes considered")
    a(
        "--pod-selector",
        default=POD_SELECTOR,
        help="the webhook's --pod-selector: pods with a controller move only if it selects them "
        f"(default {POD_SELECTOR})",
    )
    a(
        "--max-pods-to-evict-per-node",
        type=int,
        default=None,
        help="moves off one virtual node per round (0, the default: no limit)",
    )
    a(
        "--evict-local-storage-pods",
        type=flags.boolean,
        nargs="?",
        const=True,
        default=None,
        help="also move pods with emptyDir or hostPath volumes",
    )
    # ours
    a(
        "--unschedulable-timeout",
        type=flags.duration,
        default=60.0,
        help="how long a pod must be unschedulable below before it moves (default 60s)",
    )
    a(
        "--avoid-ttl",
        type=flags.duration,
        default=300.0,
        help="how long an owner's pods avoid a virtual node they were moved off "
        "(default 5m, at most 8760h)",
    )
    a(
        "--avoid-configmap",
        default=avoidance.DEFAULT_CONFIGMAP,
        help=f"NAMESPACE/NAME of the avoidance record the webhook reads "
        f"(default {avoidance.DEFAULT_CONFIGMAP})",
    )
    a(
        "--eviction-rate",
        type=float,
        default=2.0,
        help="moves per second across all virtual nodes (default 2; 0: no limit)",
    )
    a("--eviction-burst", type=int, default=10, help="moves at once above the rate (default 10)")
    a("--kube-api-qps", type=float, default=50.0, help="upper cluster client QPS (default 50)")
    a("--kube-api-burst", type=int, default=100, help="upper cluster client burst (default 100)")
    # kube-controller-manager's and the Kubernetes descheduler's secure serving flags
    a(
        "--secure-port",
        type=int,
        default=SECURE_PORT,
        help="HTTPS port of /metrics (for callers the upper cluster allows get on the "
        "non-resource URL /metrics), /healthz and /readyz "
        f"(default {SECURE_PORT}; 0: no HTTPS port)",
    )
    a(
        "--bind-address",
        default="0.0.0.0",  # noqa: S104 - Prometheus scrapes it from wherever it runs
        help="IP address --secure-port listens on (default 0.0.0.0: all)",
    )
    a(
        "--tls-cert-file",
        default="",
        help="serving certificate file of --secure-port (reloaded when it changes; default: a "
        "self-signed certificate made at start)",
    )
    a("--tls-private-key-file", default="", help="its private key file")
    metrics_flags.add_flags(a, healthz=True)
    flags.add_logging_flags(p)
    # client-go's leader election (component-base's flag names)
    election_flags.add_flags(
        p,
        elect=True,
        namespace=DEFAULT_LEASE.partition("/")[0],
        name=DEFAULT_LEASE.partition("/")[2],
    )
    return p


def _check_limits(args: argparse.Namespace) -> None:
    """Raise UsageError for rates, bursts and an avoidance TTL that cannot work."""
    for flag, rate in (
        ("--eviction-rate", args.eviction_rate),
        ("--kube-api-qps", args.kube_api_qps),
    ):
        if not math.isfinite(rate) or rate < 0:
            raise UsageError(f"{flag} must be a finite number >= 0, got {rate}")
    if args.eviction_burst < 1:
        raise UsageError("--eviction-burst must be >= 1")
    if args.kube_api_burst < 1:
        raise UsageError("--kube-api-burst must be >= 1")
    if not 0 < args.avoid_ttl <= MAX_AVOID_TTL:
        raise UsageError("--avoid-ttl must be greater than 0 and at most 365 days")


def _secure_serving(args: argparse.Namespace) -> ServerSettings | None:
    """The HTTPS server of --secure-port (None: 0, none). Raises UsageError naming the flag."""
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise UsageError(
            "--tls-cert-file and --tls-private-key-file go together (or neither: a "
            "self-signed certificate)"
        )
    if not 0 <= args.secure_port < 65536:
        raise UsageError(
            f"--secure-port must be 0-65535 (0: no HTTPS port), got {args.secure_port}"
        )
    try:
        bind = str(ipaddress.ip_address(args.bind_address.strip()))
    except ValueError:
        raise UsageError(
            f"--bind-address must be an IP address, got {args.bind_address!r}"
        ) from None
    if args.secure_port == 0:
        return None
    return ServerSettings(
        address=bind,
        port=args.secure_port,
        cert_file=args.tls_cert_file,
        key_file=args.tls_private_key_file,
        require_client_certificate=False,
        flags=FlagNames(port="--secure-port"),
    )


def parse(argv: Sequence[str], *, holder: str | None = None) -> tuple[Settings, tuple[str, ...]]:
    """Parse `argv` into Settings; also return the policy file's warnings (to be logged).

    Raises UsageError naming the flag (or the policy file and its field), VersionRequested.
    """
    args = _parser().parse_args(list(argv))
    try:
        policy = (
            policyfile.load(args.policy_config_file)
            if args.policy_config_file
            else policyfile.Policy()
        )
    except policyfile.PolicyError as exc:
        raise UsageError(f"--policy-config-file: {exc}") from None
    node_selector = args.node_selector if args.node_selector is not None else policy.node_selector
    try:
        selector = selectors.parse(node_selector or "")
    except selectors.SelectorError as exc:
        raise UsageError(f"--node-selector: {exc}") from None
    try:
        pods = selectors.parse(args.pod_selector)
    except selectors.SelectorError as exc:
        raise UsageError(f"--pod-selector: {exc}") from None
    per_node = args.max_pods_to_evict_per_node
    if per_node is None:
        per_node = policy.max_pods_per_node or 0
    if per_node < 0:
        raise UsageError(f"--max-pods-to-evict-per-node must be >= 0, got {per_node}")
    local = args.evict_local_storage_pods
    if local is None:
        local = bool(policy.evict_local_storage_pods)
    namespace, name = flags.namespaced(args.avoid_configmap, "--avoid-configmap")
    _check_limits(args)
    election = election_flags.election_settings(args, holder=holder)
    log_choice = flags.logging_choice(args)
    settings = Settings(
        kubeconfig=args.kubeconfig,
        interval=args.descheduling_interval,
        criteria=Criteria(
            unschedulable_timeout=args.unschedulable_timeout,
            max_pod_lifetime=policy.max_pod_lifetime,
            evict_local_storage_pods=local,
            node_selector=selector,
            pod_selector=pods,
            max_pods_per_node=per_node,
        ),
        moves=dataclasses.replace(MoveSettings(), dry_run=args.dry_run, avoid_ttl=args.avoid_ttl),
        avoid_namespace=namespace,
        avoid_name=name,
        eviction_rate=args.eviction_rate,
        eviction_burst=args.eviction_burst,
        leader_election=election,
        qps=args.kube_api_qps,
        burst=args.kube_api_burst,
        server=_secure_serving(args),
        metrics_addr=metrics_flags.metrics_addr(args),
        healthz_addr=metrics_flags.healthz_addr(args),
        log_level=log_choice.level,
        log_format=log_choice.format,
        notes=log_choice.notes,
    )
    return settings, policy.warnings
