"""The `virtual-node` command line: tensile-kube's and virtual-kubelet's flags and environment
variables, parsed into frozen `Settings`. Invalid values raise UsageError (exit 2)."""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensile.contracts import names, podpolicy, selectors
from tensile.contracts.labels import DEFAULT_TAINT_KEY, is_label_value
from tensile.kube import timestamps
from tensile.serving import election_flags, flags, metrics_flags, tracing
from tensile.serving.flags import UsageError, boolean, duration
from vnode.api.certificates import MAX_EXPIRATION_SECONDS, MIN_EXPIRATION_SECONDS
from vnode.api.certstore import CertificateStore
from vnode.settings import (
    KNOWN_CONTROLLERS,
    LOWER_OUTAGE_POLICIES,
    SERVICE_CONTROLLERS,
    TAINT_EFFECTS,
    ApiSettings,
    ClientSettings,
    ControllerSettings,
    IngressSettings,
    KubeletAccessMode,
    LowerKubeletSettings,
    LowerOutagePolicy,
    MigrationSettings,
    NodeSettings,
    PatrolSettings,
    PodSecurityLevel,
    PodSettings,
    ServiceAccountSettings,
    Settings,
    Taint,
    default_cert_dir,
)

PROVIDERS = ("k8s", "mock")
DEFAULT_LEASE_NAMESPACE = "tensile-system"
"""--leader-elect-resource-namespace's default: where manifests/vnode runs the node."""
LEASE_NAME_PREFIX = "tensile-virtual-node-"
"""The default Lease of a node's replicas is this prefix + --nodename."""
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
"""What --lower-service-types may name (ExternalName exposes nothing and always travels)."""
# Keys of lower namespaces that tensile writes itself: a flag must not change them.
_OWN_NAMESPACE_KEYS = ("tensile.io/", "pod-security.kubernetes.io/enforce")
# A comma starts a new key=value item only when `key=` follows it and it is not escaped.
_ITEM_SPLIT = re.compile(r"(?<!\\),(?=\s*[A-Za-z0-9][-A-Za-z0-9_./]*=)")
MAX_NAMESPACE_PREFIX = 30


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    # Environment variables are flag defaults (virtual-kubelet's rule): a flag given on the
    # command line always wins, and --help names the variable beside the flag it feeds.
    p = flags.Parser(
        prog="virtual-node", description="A virtual node standing for a lower cluster."
    )
    a = p.add_argument
    # tensile-kube's own flags
    a("--client-kubeconfig", default=None, help="kubeconfig of the lower cluster (k8s provider)")
    a("--client-qps", type=float, default=500.0, help="lower cluster client QPS")
    a("--client-burst", type=int, default=1000, help="lower cluster client burst")
    a(
        "--ignore-labels",
        default="pod-group.scheduling.sigs.k8s.io",
        help="comma-separated label keys kept off lower pods",
    )
    a(
        "--enable-controllers",
        default="PVControllers,ServiceControllers",
        help="comma-separated controllers: " + ", ".join(KNOWN_CONTROLLERS),
    )
    a(
        "--enable-serviceaccount",
        type=boolean,
        default=True,
        nargs="?",
        const=True,
        help="mirror pods' ServiceAccounts in the lower cluster",
    )
    a(
        "--service-namespaces",
        default="",
        help="ServiceControllers: comma-separated upper namespaces whose Services and "
        "EndpointSlices are mirrored below (default: all but kube-system)",
    )
    a(
        "--lower-storage-class",
        default="",
        help="PVControllers: comma-separated UPPER=LOWER StorageClass pairs for the claims "
        "made below; a bare LOWER applies to every other class (default: the lower "
        "cluster's default StorageClass)",
    )
    # virtual-kubelet node-cli flags
    a(
        "--kubeconfig",
        default=None,
        help="kubeconfig of the upper cluster (env KUBECONFIG; then ~/.kube/config, then "
        "in-cluster)",
    )
    a("--namespace", default="", help="only forward upper pods of this namespace")
    a("--cluster-domain", default="cluster.local", help="accepted for compatibility; unused")
    a(
        "--nodename",
        default=env.get("DEFAULT_NODE_NAME") or env.get("DEFAULTNODE_NAME") or "virtual-kubelet",
        help="name of the virtual node (env DEFAULT_NODE_NAME; default virtual-kubelet)",
    )
    a("--os", default="Linux", help="operating system of the node (Linux or Windows)")
    a(
        "--provider",
        default="k8s",
        choices=PROVIDERS,
        help="k8s: forward pods to the lower cluster; mock: pods become Running with no lower "
        "cluster (virtual-kubelet's mock provider)",
    )
    a(
        "--provider-config",
        default="",
        help="mock: virtual-kubelet's mock config, a JSON file "
        '{"<nodename>": {"cpu": "20", "memory": "100Gi", "pods": "20"}} (those are the '
        "defaults); k8s: unused",
    )
    metrics_flags.add_flags(a, healthz=True)
    a(
        "--taint",
        default=env.get("VKUBELET_TAINT_KEY") or DEFAULT_TAINT_KEY,
        help="key of the node's taint (env VKUBELET_TAINT_KEY; value VKUBELET_TAINT_VALUE, "
        "default the provider; effect VKUBELET_TAINT_EFFECT, default NoSchedule)",
    )
    a("--disable-taint", action="store_true", help="do not taint the virtual node")
    a("--pod-sync-workers", type=int, default=50, help="workers per queue")
    a(
        "--namespace-weights",
        default="",
        help="fair queuing: NAMESPACE=WEIGHT,... ; the pod queues serve namespaces (tenants) "
        "in weighted round robin, a namespace taking up to WEIGHT pods per round (default: "
        "every namespace weighs 1)",
    )
    a("--enable-node-lease", type=boolean, default=True, nargs="?", const=True)
    a(
        "--full-resync-period",
        type=duration,
        default=None,
        help="node-cli's informer resync: accepted and ignored (said at start); informers "
        "are event-driven and the patrol (--patrol-period) re-checks both clusters",
    )
    a(
        "--startup-timeout",
        type=duration,
        default=0.0,
        help="wait this long for caches (0: forever)",
    )
    a("--kube-api-qps", type=float, default=0.0, help="upper cluster client QPS (0: 100)")
    a("--kube-api-burst", type=int, default=0, help="upper cluster client burst (0: 200)")
    a(
        "--event-qps",
        type=float,
        default=50.0,
        help="Events written to the upper cluster per second (0: no limit)",
    )
    a("--event-burst", type=int, default=100, help="Event burst above --event-qps")
    _add_patrol_flags(p)
    _add_kubelet_auth_flags(p, env)
    _add_placement_flags(p)
    # the kubelet's serving-certificate flags (used when APISERVER_CERT_LOCATION is unset)
    a(
        "--rotate-server-certificates",
        type=boolean,
        default=True,
        nargs="?",
        const=True,
        help="without APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION, request the kubelet "
        "serving certificate from the upper cluster (CSR, signer kubernetes.io/kubelet-serving) "
        "and renew it before it expires; false: the kubelet API is off without those files",
    )
    a(
        "--cert-dir",
        default=None,
        help="directory of the CSR-issued serving certificates "
        "(default .tensile-pki/<nodename> in the working directory); put it on persistent "
        "storage (or use --cert-secret): without the stored certificate a restart requests a "
        "new one, which may need an administrator's approval again; it must be writable "
        "(checked at start)",
    )
    a(
        "--cert-secret",
        default="",
        metavar="NAMESPACE/NAME",
        help="keep the CSR-issued serving certificates in this Secret of the upper cluster "
        "instead of --cert-dir, one key per address the node serves on (replicas share it): "
        "a restarted or rescheduled node serves the certificate it had, without a new CSR; "
        "the node needs get and update on it, and create only when it does not exist "
        "(checked at start)",
    )
    a(
        "--server-certificate-duration",
        type=duration,
        default=0.0,
        help="lifetime to ask for in each serving-certificate CSR (expirationSeconds, >= 10m); "
        "0: the signer's default (kube-controller-manager --cluster-signing-duration)",
    )
    # tensile's additions
    a(
        "--namespace-prefix",
        default="",
        help=f"lower namespace = prefix + upper namespace (1 to {MAX_NAMESPACE_PREFIX} "
        "characters of a-z, 0-9 and '-', starting with a letter or digit, e.g. 't1-'; a pod "
        "whose lower namespace name would be longer than 63 characters is refused; with a "
        "prefix, pods go only into lower namespaces tensile created for their upper namespace "
        "and cluster)",
    )
    a(
        "--lower-namespace-role",
        default="",
        help="with --namespace-prefix: a ClusterRole of the lower cluster that the node binds "
        "to its own lower identity in every lower namespace it makes (a RoleBinding made "
        "with the namespace), for lower credentials whose rights are namespaced "
        "(manifests/vnode/lower-rbac-namespaced.yaml); its copies are then watched per "
        "namespace, never cluster-wide. Empty (default): cluster-wide rights (lower-rbac.yaml)",
    )
    a(
        "--cluster-id",
        default="",
        help="identity of the upper cluster, recorded on every lower object so several upper "
        "clusters can share one lower cluster (a label value; default: the UID of the upper "
        "kube-system namespace)",
    )
    a(
        "--pod-security-level",
        default="baseline",
        choices=POD_SECURITY_LEVELS,
        help="Pod Security Standard the node enforces on forwarded pods and labels on the lower "
        "namespaces it creates (default baseline: no host namespaces, hostPath or privileged "
        "containers)",
    )
    _add_tenant_boundary_flags(p)
    _add_migration_flags(p)
    _add_serviceaccount_flags(p)
    flags.add_logging_flags(p)
    tracing.add_flags(p)
    a("--shutdown-timeout", type=duration, default=10.0, help="bound of a graceful stop")
    _add_lower_kubelet_flags(p)
    a(
        "--streaming-connection-idle-timeout",
        type=duration,
        default=ApiSettings().streaming_idle_timeout,
        help="close exec/attach/port-forward connections idle this long (kubelet's flag; "
        "seconds or a duration like 4h, 30m; 0: never)",
    )
    # replicas of one node: client-go's leader election (component-base's flag names)
    election_flags.add_flags(
        p,
        elect=False,
        namespace=DEFAULT_LEASE_NAMESPACE,
        name="",
        name_help=f"{LEASE_NAME_PREFIX}<nodename>",
    )
    return p


def _add_patrol_flags(p: flags.Parser) -> None:
    """The patrol's period and client budget (`PatrolSettings`)."""
    a = p.add_argument
    a(
        "--patrol-period",
        type=duration,
        default=300.0,
        help="seconds between two patrols comparing the caches and both clusters (0: none)",
    )
    a("--patrol-qps", type=float, default=5.0, help="patrol client QPS per cluster (0: no limit)")
    a("--patrol-burst", type=int, default=10, help="patrol client burst above --patrol-qps")


def _add_kubelet_auth_flags(p: flags.Parser, env: Mapping[str, str]) -> None:
    """node-cli's kubelet API authentication and authorization flags (the kubelet's names):
    the cache lifetimes are honoured (`vnode.api.auth`); the kubelet API always checks bearer
    tokens, so --authentication-token-webhook=false is refused."""
    a = p.add_argument
    a(
        "--authentication-token-webhook",
        type=boolean,
        default=True,
        help="check bearer tokens with a TokenReview (always on: false is refused; node-cli "
        "without it did no authentication at all)",
    )
    for flag, default, what in (
        ("--authentication-token-webhook-cache-ttl", ApiSettings().token_cache_ttl, "TokenReview"),
        (
            "--authorization-webhook-cache-authorized-ttl",
            ApiSettings().authorized_cache_ttl,
            "allowing SubjectAccessReview",
        ),
        (
            "--authorization-webhook-cache-unauthorized-ttl",
            ApiSettings().unauthorized_cache_ttl,
            "denying SubjectAccessReview",
        ),
    ):
        a(
            flag,
            type=duration,
            default=default,
            help=f"how long the answer of a {what} is reused (default {default:g}s; 0: never)",
        )
    a(
        "--client-verify-ca",
        default=env.get("APISERVER_CA_CERT_LOCATION", ""),
        help="CA of kubelet API clients' certificates (env APISERVER_CA_CERT_LOCATION)",
    )
    a("--no-verify-clients", action="store_true", help="DEVELOPMENT ONLY: no kubelet API auth")
    a(
        "--anonymous-auth",
        type=boolean,
        default=False,
        nargs="?",
        const=True,
        help="kubelet API: requests without credentials are system:anonymous, then authorized "
        "by SubjectAccessReview (default false: 401)",
    )


def _add_lower_kubelet_flags(p: flags.Parser) -> None:
    """How the lower kubelets' resource metrics are read (`LowerKubeletSettings`)."""
    a = p.add_argument
    a(
        "--lower-kubelet-access",
        default="proxy",
        choices=("proxy", "direct"),
        help="read lower kubelets' metrics through the lower apiserver (proxy) or directly",
    )
    a(
        "--lower-kubelet-insecure-tls",
        action="store_true",
        help="with direct access, do not verify the lower kubelets' serving certificates",
    )
    a(
        "--lower-kubelet-token-file",
        default="",
        help="with direct access, send the bearer token in this file (re-read when it "
        "changes) to the lower kubelets instead of the lower kubeconfig's credential; "
        "give it only get on nodes/metrics and nodes/stats",
    )


def _add_placement_flags(p: flags.Parser) -> None:
    """What the virtual node tells the placement programs (tensile-scheduler): its lower
    cluster's summary, and whether that cluster's pods can be placed at all now."""
    p.add_argument(
        "--placement-summary-interval",
        type=duration,
        default=1.0,
        help="seconds between two looks at the lower nodes for the placement summary on the "
        "virtual Node that tensile-scheduler reads (written only when changed; 0: none)",
    )
    p.add_argument(
        "--lower-node-selector",
        default="",
        help="label selector over the lower Nodes this virtual node stands for (a node pool, "
        "e.g. pool=gpu): capacity, placement summary and metrics come from them only, and "
        "the lower pods are confined to them by node affinity (default: every lower node)",
    )
    p.add_argument(
        "--lower-node-labels-to-copy",
        default="",
        help="comma-separated label keys of the lower nodes copied onto the virtual Node, "
        "each with the value every node of --lower-node-selector's pool shares, so upper "
        "nodeSelectors keep working (read at start; a key the nodes disagree on is left out)",
    )
    _add_lower_outage_flags(p)


def _add_lower_outage_flags(p: flags.Parser) -> None:
    """What the Node says while the lower apiserver does not answer (docs/operations/
    partitions.md)."""
    a = p.add_argument
    a(
        "--lower-outage-policy",
        default="keep",
        choices=LOWER_OUTAGE_POLICIES,
        help="while the lower apiserver does not answer: keep (the Node stays Ready with "
        "condition LowerControlPlaneReachable=False and taint tensile.io/lower-unreachable:"
        "NoSchedule for --lower-outage-grace, its pods and their lower pods kept; then Ready "
        "False) or evict (tensile-kube's: heartbeats stop at once, the Node turns Unknown and "
        "its pods are evicted after their toleration)",
    )
    a(
        "--lower-outage-grace",
        type=duration,
        default=900.0,
        help="keep policy: how long a lower outage leaves the Node Ready (seconds or a "
        "duration like 15m; 0: Ready False at once); past it the Node is not Ready and its "
        "pods are evicted after their not-ready toleration (300 s by default)",
    )


def _add_tenant_boundary_flags(p: flags.Parser) -> None:
    """What a tenant's choices become below: Service exposure, priority classes and the
    marks of the lower namespaces the node creates (README "What a tenant may do below")."""
    a = p.add_argument
    a(
        "--lower-service-types",
        default="ClusterIP",
        help="ServiceControllers: comma-separated Service types the lower cluster takes as "
        f"they are ({', '.join(SERVICE_TYPES)}), with their exposure fields and annotations; "
        "copies of other types are ClusterIP below (default ClusterIP: nothing is exposed "
        "outside the lower cluster; ExternalName is always copied)",
    )
    a(
        "--endpointslice-managers",
        default="*",
        help="ServiceControllers: comma-separated endpointslice.kubernetes.io/managed-by values: "
        "only upper EndpointSlices labelled so are considered (default *: all). It grants no "
        "trust, the label is the writer's: an endpoint crosses only as the IP of an upper pod "
        "its Service selects",
    )
    a(
        "--selectorless-services",
        default="",
        help="ServiceControllers: comma-separated NAMESPACE/NAME (or NAMESPACE/* for a whole "
        "namespace) of upper Services without a selector whose EndpointSlices cross as written: "
        "their addresses are their writer's choice, so only the administrator of the lower "
        "network may vouch for them (default: none; their slices cross without endpoints)",
    )
    a(
        "--lower-service-annotations",
        default="",
        help="ServiceControllers: comma-separated annotation keys, or prefixes ending in *, "
        "of upper Services copied onto the NodePort and LoadBalancer copies "
        "--lower-service-types allows (* alone: every annotation; default: none, as "
        "annotations pin addresses and pools of the lower network)",
    )
    a(
        "--priority-class-map",
        default="",
        help="comma-separated UPPER=LOWER PriorityClass names: the lower pod's class for an "
        "upper one; pods of other classes run at the lower default priority (no LOWER may "
        "start with system-)",
    )
    a(
        "--scheduler-name-map",
        default="",
        help="comma-separated UPPER=LOWER scheduler names: the lower pod's schedulerName for "
        "an upper one; other names are dropped, so the lower default scheduler places the pod",
    )
    a(
        "--runtime-class-map",
        default="",
        help="comma-separated UPPER=LOWER RuntimeClass names: the lower pod's class for an "
        "upper one; other classes are dropped (the lower default runtime handler)",
    )
    a(
        "--allowed-volume-types",
        default="",
        help="comma-separated volume types that reach outside the pod and may go below ("
        + ", ".join(sorted(podpolicy.OUTSIDE_VOLUMES))
        + "); pods with others are refused (default: none; hostPath is --pod-security-level's)",
    )
    a(
        "--lower-namespace-labels",
        action="append",
        default=[],
        help="key=value,... labels set on every lower namespace the node creates (and on those "
        "it created before), e.g. for the lower cluster's Pod Security or quota tooling; "
        "repeatable; a comma inside a value is written \\,",
    )
    a(
        "--lower-namespace-annotations",
        action="append",
        default=[],
        help="key=value,... annotations set like --lower-namespace-labels, e.g. "
        "scheduler.alpha.kubernetes.io/tolerationsWhitelist or "
        "scheduler.alpha.kubernetes.io/node-selector; repeatable; a comma inside a value is "
        "written \\, (a comma not followed by key= is kept, so JSON values need no escape)",
    )
    _add_ingress_flags(p)


def _add_ingress_flags(p: flags.Parser) -> None:
    """Ingresses copied below (`IngressSettings`, vnode.providers.k2k.ingresses)."""
    a = p.add_argument
    a(
        "--enable-ingress",
        type=boolean,
        nargs="?",
        const=True,
        default=False,
        help="ServiceControllers: copy below the upper Ingresses whose backends are all "
        "Services this node copied there, with their TLS Secrets, and bring their "
        "status.loadBalancer back up (Liqo's name)",
    )
    a(
        "--ingress-class-map",
        default="",
        help="with --enable-ingress: comma-separated UPPER=LOWER IngressClass names: the lower "
        "copy's class for an upper one; Ingresses of other classes, or of none, are not copied "
        "(a Warning Event says so)",
    )
    a(
        "--lower-ingress-annotations",
        default="",
        help="with --enable-ingress: comma-separated annotation keys, or prefixes ending in *, "
        "of upper Ingresses copied onto their copies (* alone: every annotation; default: "
        "none, as annotations configure the lower cluster's ingress controller)",
    )


def _ingress_settings(args: argparse.Namespace, *, controllers: Sequence[str]) -> IngressSettings:
    """--enable-ingress, --ingress-class-map, --lower-ingress-annotations -> settings.
    Raises UsageError for --enable-ingress without ServiceControllers (an Ingress is copied
    only beside the Services it routes to), and as `_name_map` and `_service_annotations`
    do."""
    if args.enable_ingress and SERVICE_CONTROLLERS not in controllers:
        raise UsageError("--enable-ingress needs ServiceControllers in --enable-controllers")
    return IngressSettings(
        enabled=args.enable_ingress,
        class_map=_name_map(
            args.ingress_class_map, flag="--ingress-class-map", what="IngressClass name"
        ),
        annotations=_service_annotations(
            args.lower_ingress_annotations, flag="--lower-ingress-annotations"
        ),
    )


def _add_migration_flags(p: flags.Parser) -> None:
    """Switching over from tensile-kube (`MigrationSettings`, docs/migration.md)."""
    p.add_argument(
        "--adopt-tensile-kube",
        type=boolean,
        nargs="?",
        const=True,
        default=False,
        help="once leading, take over the lower pods, ConfigMaps, Secrets, claims and "
        "Services tensile-kube's virtual node of the same node name made for this node's "
        "upper objects (owner marks added, nothing re-created or deleted; the rest is "
        "listed); needs --adopt-tensile-kube-before",
    )
    p.add_argument(
        "--adopt-tensile-kube-before",
        default="",
        help="with --adopt-tensile-kube: an RFC 3339 time (e.g. 2026-03-01T12:00:00Z), when "
        "tensile-kube's virtual node was stopped; only lower objects created before it are "
        "adopted (required: objects shaped like tensile-kube's made later are someone "
        "else's)",
    )


def _add_serviceaccount_flags(p: flags.Parser) -> None:
    """Upper ServiceAccount tokens for lower pods (`ServiceAccountSettings`)."""
    p.add_argument(
        "--upper-api-address",
        default="",
        help="HOST:PORT at which lower pods reach the upper apiserver: with "
        "--enable-serviceaccount, they get bound tokens of their upper ServiceAccount, the "
        "upper CA and this address as KUBERNETES_SERVICE_HOST/PORT (default: none, lower "
        "pods use the lower cluster's API)",
    )
    p.add_argument(
        "--serviceaccount-token-refresh-fraction",
        type=float,
        default=0.8,
        help="renew an upper token after this part of its life (0 < f < 1; the kubelet's 0.8)",
    )
    p.add_argument(
        "--upper-token-kubeconfig",
        default="",
        help="kubeconfig of the upper cluster whose user is this node's identity "
        "(system:node:<nodename>, group system:nodes): the upper tokens are asked for with "
        "it, so the upper Node authorizer and NodeRestriction admission grant only tokens "
        "bound to pods bound to this node (default: none, the upper kubeconfig's user asks, "
        "which needs create on serviceaccounts/token)",
    )


def _serviceaccount_settings(args: argparse.Namespace) -> ServiceAccountSettings:
    """--upper-api-address and the token refresh fraction, checked."""
    fraction = args.serviceaccount_token_refresh_fraction
    if not 0 < fraction < 1:
        raise UsageError(
            f"--serviceaccount-token-refresh-fraction must be between 0 and 1, got {fraction}"
        )
    address = args.upper_api_address
    host, sep, port = address.rpartition(":")
    if address and (
        not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536
    ):
        raise UsageError(f"--upper-api-address must be HOST:PORT, got {address!r}")
    if args.upper_token_kubeconfig and not (address and args.enable_serviceaccount):
        raise UsageError(
            "--upper-token-kubeconfig needs --upper-api-address (and --enable-serviceaccount): "
            "without them no upper token is asked for"
        )
    return ServiceAccountSettings(
        upper_api_address=address,
        token_refresh_fraction=fraction,
        token_kubeconfig=args.upper_token_kubeconfig,
    )


def _migration_settings(
    args: argparse.Namespace, *, now: dt.datetime | None = None
) -> MigrationSettings:
    """--adopt-tensile-kube and its cut-off, checked against what tensile-kube could have
    made; `now` (aware; default: the clock) refuses a cut-off in the future."""
    before = _adoption_cutoff(args.adopt_tensile_kube_before, now=now)
    if not args.adopt_tensile_kube:
        if before is not None:
            raise UsageError("--adopt-tensile-kube-before needs --adopt-tensile-kube")
        return MigrationSettings()
    if args.provider != "k8s":
        raise UsageError("--adopt-tensile-kube needs --provider=k8s (it adopts lower objects)")
    if args.namespace_prefix:
        raise UsageError(
            "--adopt-tensile-kube cannot be used with --namespace-prefix: tensile-kube kept "
            "namespace names, so its objects are in the unprefixed namespaces"
        )
    if before is None:
        raise UsageError(
            "--adopt-tensile-kube needs --adopt-tensile-kube-before=<RFC 3339 time>: when "
            "tensile-kube's virtual node was stopped (only lower objects created before it "
            "are adopted)"
        )
    return MigrationSettings(adopt_tensile_kube=True, adopt_before=before)


def _adoption_cutoff(text: str, *, now: dt.datetime | None) -> dt.datetime | None:
    """--adopt-tensile-kube-before: an RFC 3339 time, not in the future (None: not given).
    Raises UsageError naming the flag."""
    if not text:
        return None
    moment = timestamps.parse_rfc3339(text.strip())
    if moment is None:
        raise UsageError(
            "--adopt-tensile-kube-before must be an RFC 3339 time with its offset, e.g. "
            f"2026-03-01T12:00:00Z, got {text!r}"
        )
    current = now or dt.datetime.now(dt.UTC)
    if moment > current:
        raise UsageError(
            f"--adopt-tensile-kube-before {text} is in the future: give the time "
            "tensile-kube's virtual node was stopped"
        )
    return moment


def parse(
    argv: Sequence[str], env: Mapping[str, str] | None = None, *, holder: str | None = None
) -> Settings:
    """Build Settings from command-line arguments and environment variables; `holder` is
    the leader-election identity (default: host name and a fresh UUID).

    Raises UsageError with a message naming the bad flag or variable.
    """
    env = os.environ if env is None else env
    try:
        args = _parser(env).parse_args(list(argv))
    except argparse.ArgumentTypeError as exc:  # pragma: no cover - argparse wraps these
        raise UsageError(str(exc)) from exc
    log_choice = flags.logging_choice(args)
    notes = _compatibility_notes(args)
    if args.provider == "k8s" and not args.client_kubeconfig:
        raise UsageError("--client-kubeconfig is required (the lower cluster's kubeconfig)")
    operating_system = args.os.lower()
    if operating_system not in ("linux", "windows"):
        raise UsageError(f"--os must be Linux or Windows, got {args.os!r}")
    controllers = tuple(c.strip() for c in args.enable_controllers.split(",") if c.strip())
    unknown = [c for c in controllers if c not in KNOWN_CONTROLLERS]
    if unknown:
        raise UsageError(
            f"--enable-controllers: unknown {', '.join(unknown)} "
            f"(known: {', '.join(KNOWN_CONTROLLERS)})"
        )
    if args.lower_kubelet_insecure_tls and args.lower_kubelet_access != "direct":
        raise UsageError("--lower-kubelet-insecure-tls needs --lower-kubelet-access=direct")
    if args.lower_kubelet_token_file and args.lower_kubelet_access != "direct":
        raise UsageError("--lower-kubelet-token-file needs --lower-kubelet-access=direct")
    for flag, value in (("--pod-sync-workers", args.pod_sync_workers),):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    for flag, value in (
        ("--client-qps", args.client_qps),
        ("--kube-api-qps", args.kube_api_qps),
        ("--event-qps", args.event_qps),
        ("--patrol-qps", args.patrol_qps),
    ):
        if value < 0 or not math.isfinite(value):
            raise UsageError(f"{flag} must be >= 0, got {value}")
    if args.event_burst < 1:
        raise UsageError(f"--event-burst must be >= 1, got {args.event_burst}")
    if args.patrol_burst < 1:
        raise UsageError(f"--patrol-burst must be >= 1, got {args.patrol_burst}")
    node = _node_settings(args, env, operating_system)
    trace, trace_notes = tracing.settings_of(args, env)
    return Settings(
        provider="mock" if args.provider == "mock" else "k8s",
        provider_config=args.provider_config,
        node=node,
        pods=PodSettings(
            namespace=args.namespace or None,
            namespace_prefix=_namespace_prefix(args.namespace_prefix),
            lower_namespace_role=_lower_namespace_role(args),
            cluster_id=_cluster_id(args.cluster_id),
            pod_security_level=_pod_security_level(args.pod_security_level),
            ignore_labels=tuple(k.strip() for k in args.ignore_labels.split(",") if k.strip()),
            enable_service_account=args.enable_serviceaccount,
            workers=args.pod_sync_workers,
            namespace_weights=_namespace_weights(args.namespace_weights),
            priority_class_map=_priority_class_map(args.priority_class_map),
            scheduler_name_map=_name_map(
                args.scheduler_name_map, flag="--scheduler-name-map", what="scheduler name"
            ),
            runtime_class_map=_name_map(
                args.runtime_class_map, flag="--runtime-class-map", what="RuntimeClass name"
            ),
            allowed_volume_types=_volume_types(args.allowed_volume_types),
            lower_namespace_labels=_namespace_marks(
                args.lower_namespace_labels, flag="--lower-namespace-labels", labels=True
            ),
            lower_namespace_annotations=_namespace_marks(
                args.lower_namespace_annotations,
                flag="--lower-namespace-annotations",
                labels=False,
            ),
        ),
        upper=ClientSettings(
            kubeconfig=args.kubeconfig or None,
            qps=args.kube_api_qps or 100.0,
            burst=args.kube_api_burst or 200,
            server=flags.server_url(env.get("MASTER_URI", ""), "MASTER_URI"),
        ),
        lower=ClientSettings(
            kubeconfig=args.client_kubeconfig, qps=args.client_qps, burst=args.client_burst
        ),
        events=ClientSettings(qps=args.event_qps, burst=args.event_burst),
        api=_api_settings(args, env, node_name=node.name),
        lower_kubelets=LowerKubeletSettings(
            access=_kubelet_access(args.lower_kubelet_access),
            insecure_tls=args.lower_kubelet_insecure_tls,
            token_file=args.lower_kubelet_token_file,
        ),
        controllers=ControllerSettings(
            enabled=controllers,
            service_namespaces=_service_namespaces(args.service_namespaces),
            lower_service_types=_service_types(args.lower_service_types),
            lower_service_annotations=_service_annotations(args.lower_service_annotations),
            endpointslice_managers=_endpointslice_managers(args.endpointslice_managers),
            selectorless_services=_selectorless_services(args.selectorless_services),
            ingress=_ingress_settings(args, controllers=controllers),
            **_storage_classes(args.lower_storage_class),
        ),
        metrics_addr=metrics_flags.metrics_addr(args),
        healthz_addr=metrics_flags.healthz_addr(args),
        log_level=log_choice.level,
        log_format=log_choice.format,
        notes=(*log_choice.notes, *notes, *trace_notes),
        startup_timeout=args.startup_timeout,
        shutdown_timeout=args.shutdown_timeout,
        patrol=PatrolSettings(
            period=args.patrol_period, qps=args.patrol_qps, burst=args.patrol_burst
        ),
        leader_election=election_flags.election_settings(
            args, name=lease_name(node.name), holder=holder
        ),
        migration=_migration_settings(args),
        serviceaccount=_serviceaccount_settings(args),
        tracing=trace,
    )


def _compatibility_notes(args: argparse.Namespace) -> tuple[str, ...]:
    """Return one sentence per flag given that is accepted and ignored (node-cli's), or
    whose meaning narrowed (--endpointslice-managers no longer grants trust). Raises
    UsageError for --authentication-token-webhook=false (we never serve unauthenticated
    unless --no-verify-clients says so, for development)."""
    if not args.authentication_token_webhook and not args.no_verify_clients:
        raise UsageError(
            "--authentication-token-webhook=false: the kubelet API always checks bearer tokens "
            "with a TokenReview (node-cli then checked nothing); drop the flag"
        )
    notes = []
    if args.full_resync_period is not None:
        notes.append(
            f"--full-resync-period={args.full_resync_period:g}s is ignored: informers are "
            f"event-driven and the patrol re-checks both clusters every {args.patrol_period:g}s "
            "(--patrol-period)"
        )
    if args.endpointslice_managers.strip() != "*":
        notes.append(
            f"--endpointslice-managers={args.endpointslice_managers} only narrows which upper "
            "EndpointSlices are considered; it grants no trust: an endpoint crosses only as the "
            "IP of an upper pod its Service selects, and a selector-less Service's only when "
            "--selectorless-services names it"
        )
    return tuple(notes)


def lease_name(node_name: str) -> str:
    """Return the default Lease of the replicas of node `node_name`."""
    return f"{LEASE_NAME_PREFIX}{node_name}"


def _api_settings(
    args: argparse.Namespace, env: Mapping[str, str], *, node_name: str
) -> ApiSettings:
    cert_file = env.get("APISERVER_CERT_LOCATION", "")
    key_file = env.get("APISERVER_KEY_LOCATION", "")
    if bool(cert_file) != bool(key_file):
        given, missing = (
            ("APISERVER_CERT_LOCATION", "APISERVER_KEY_LOCATION")
            if cert_file
            else ("APISERVER_KEY_LOCATION", "APISERVER_CERT_LOCATION")
        )
        raise UsageError(
            f"{given} is set but {missing} is not: set both (serving certificate files) "
            "or neither (certificate from a CSR)"
        )
    return ApiSettings(
        cert_file=cert_file,
        key_file=key_file,
        client_ca_file=args.client_verify_ca,
        verify_clients=not args.no_verify_clients,
        anonymous_auth=args.anonymous_auth,
        rotate_server_certificates=args.rotate_server_certificates,
        cert_dir=_cert_dir(args.cert_dir, node_name),
        cert_secret=_cert_secret(args.cert_secret, cert_dir_given=args.cert_dir is not None),
        server_certificate_duration=_certificate_duration(args.server_certificate_duration),
        streaming_idle_timeout=args.streaming_connection_idle_timeout,
        token_cache_ttl=args.authentication_token_webhook_cache_ttl,
        authorized_cache_ttl=args.authorization_webhook_cache_authorized_ttl,
        unauthorized_cache_ttl=args.authorization_webhook_cache_unauthorized_ttl,
    )


def check_cert_dir(api: ApiSettings) -> None:
    """When the serving certificate comes from a CSR (no certificate files, rotation on),
    make sure --cert-dir can be created and written, before anything starts: an issued
    certificate that cannot be stored is lost at the next restart, and its replacement may
    need a human to approve it again. Does nothing otherwise (--cert-secret is checked once
    the upper cluster answers: `vnode.preflight`).

    Creates the directory (0700) when missing. Raises UsageError naming the directory and
    what failed."""
    if api.cert_file or not api.rotate_server_certificates or api.cert_secret is not None:
        return
    try:
        CertificateStore(Path(api.cert_dir)).check_writable()
    except OSError as exc:
        raise UsageError(
            f"--cert-dir: cannot create or write in {api.cert_dir!r} ({exc}); the serving "
            "certificate from a CSR is kept there: give a writable directory on persistent "
            "storage"
        ) from None


def _cert_dir(text: str | None, node_name: str) -> str:
    if text is None:
        return default_cert_dir(node_name)
    if not text.strip():
        raise UsageError("--cert-dir must name a directory, got an empty value")
    if os.path.exists(text) and not os.path.isdir(text):
        raise UsageError(f"--cert-dir must be a directory, but {text!r} is a file")
    return text


def _cert_secret(text: str, *, cert_dir_given: bool) -> tuple[str, str] | None:
    """--cert-secret NAMESPACE/NAME, checked; None when not given."""
    if not text:
        return None
    if cert_dir_given:
        raise UsageError(
            "--cert-secret and --cert-dir both say where the serving certificate is kept: give one"
        )
    namespace, slash, name = text.partition("/")
    if not slash or not names.is_dns1123_label(namespace) or not names.is_dns1123_subdomain(name):
        raise UsageError(
            f"--cert-secret must be NAMESPACE/NAME (a namespace and a Secret name), got {text!r}"
        )
    return namespace, name


def _certificate_duration(seconds: float) -> int:
    # The CSR field is an int32 number of seconds, at least ten minutes (API validation).
    if seconds == 0:
        return 0
    if seconds != int(seconds):
        raise UsageError(f"--server-certificate-duration must be whole seconds, got {seconds:g}s")
    if not MIN_EXPIRATION_SECONDS <= seconds <= MAX_EXPIRATION_SECONDS:
        raise UsageError(
            "--server-certificate-duration must be 0 (the signer's default) or between 10m "
            f"and {MAX_EXPIRATION_SECONDS}s (the CSR API's limits), got {seconds:g}s"
        )
    return int(seconds)


def _node_settings(
    args: argparse.Namespace, env: Mapping[str, str], operating_system: str
) -> NodeSettings:
    name = args.nodename
    if not name:
        raise UsageError("--nodename must not be empty")
    taint: Taint | None = None
    if not args.disable_taint:
        effect = env.get("VKUBELET_TAINT_EFFECT", "NoSchedule")
        if effect not in TAINT_EFFECTS:
            raise UsageError(
                f"VKUBELET_TAINT_EFFECT must be one of {', '.join(TAINT_EFFECTS)}, got {effect!r}"
            )
        taint = Taint(
            key=args.taint,
            value=env.get("VKUBELET_TAINT_VALUE", args.provider),
            effect=effect,
        )
    labels: tuple[tuple[str, str], ...] = ()
    raw_label = env.get("VKUBELET_NODE_LABEL", "")
    if raw_label:
        parts = [p.strip() for p in raw_label.split(":")]
        if len(parts) != 2 or not all(parts):
            raise UsageError(f"VKUBELET_NODE_LABEL must be key:value, got {raw_label!r}")
        labels = ((parts[0], parts[1]),)
    port_text = env.get("KUBELET_PORT", "10250")
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"KUBELET_PORT must be a port number, got {port_text!r}") from None
    if not 0 < port < 65536:
        raise UsageError(f"KUBELET_PORT must be 1-65535, got {port}")
    return NodeSettings(
        name=name,
        operating_system=operating_system,
        taint=taint,
        extra_labels=labels,
        internal_ip=_ip(env.get("VKUBELET_POD_IP", ""), "VKUBELET_POD_IP"),
        external_ip=_ip(env.get("VKUBELET_EXTERNAL_POD_IP", ""), "VKUBELET_EXTERNAL_POD_IP"),
        kubelet_port=port,
        enable_lease=args.enable_node_lease,
        placement_summary_interval=args.placement_summary_interval,
        lower_node_selector=_lower_node_selector(args.lower_node_selector),
        lower_node_labels_to_copy=_label_keys(
            args.lower_node_labels_to_copy, flag="--lower-node-labels-to-copy"
        ),
        lower_outage_policy=_lower_outage_policy(args.lower_outage_policy),
        lower_outage_grace=args.lower_outage_grace,
    )


def _lower_outage_policy(value: str) -> LowerOutagePolicy:
    for policy in LOWER_OUTAGE_POLICIES:
        if policy == value:
            return policy
    raise UsageError(  # pragma: no cover - argparse's choices refuse it first
        f"--lower-outage-policy must be one of {', '.join(LOWER_OUTAGE_POLICIES)}, got {value!r}"
    )


def _lower_node_selector(text: str) -> selectors.Selector:
    """--lower-node-selector, parsed by the one label-selector parser (`selectors.parse`)."""
    try:
        return selectors.parse(text)
    except selectors.SelectorError as exc:
        raise UsageError(f"--lower-node-selector: {exc}") from None


def _label_keys(text: str, *, flag: str) -> tuple[str, ...]:
    """A comma-separated list of label keys, each checked, without repeats (order kept)."""
    keys: list[str] = []
    for item in text.split(","):
        key = item.strip()
        if not key:
            continue
        if not selectors.is_label_key(key):
            raise UsageError(f"{flag}: {key!r} is not a label key")
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def _service_namespaces(text: str) -> tuple[str, ...]:
    given = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in given:
        if not names.is_dns1123_label(name):
            raise UsageError(f"--service-namespaces: {name!r} is not a namespace name")
    return given


def _storage_classes(text: str) -> dict[str, Any]:
    """--lower-storage-class "UPPER=LOWER,...[,LOWER]" -> ControllerSettings fields."""
    pairs: dict[str, str] = {}
    default: str | None = None
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        upper, sep, lower = (part.strip() for part in item.partition("="))
        for name in (upper, lower) if sep else (upper,):
            if not names.is_dns1123_subdomain(name):
                raise UsageError(
                    f"--lower-storage-class: {name!r} in {item!r} is not a StorageClass name"
                )
        if not sep:
            if default is not None:
                raise UsageError(
                    f"--lower-storage-class: two classes for all others ({default}, {upper})"
                )
            default = upper
        elif upper in pairs:
            raise UsageError(f"--lower-storage-class: {upper} is mapped twice")
        else:
            pairs[upper] = lower
    return {"lower_storage_classes": tuple(pairs.items()), "lower_storage_class_default": default}


def _ip(text: str, name: str) -> str:
    if not text:
        return ""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise UsageError(f"{name} must be an IP address, got {text!r}") from None


def _lower_namespace_role(args: argparse.Namespace) -> str:
    """--lower-namespace-role, checked: it needs --namespace-prefix (without one the lower
    namespaces are shared with the lower cluster's own workloads and not the node's to
    grant itself rights in) and a ClusterRole name."""
    role = str(args.lower_namespace_role)
    if not role:
        return ""
    if not args.namespace_prefix:
        raise UsageError(
            "--lower-namespace-role needs --namespace-prefix: only namespaces the node makes "
            "for its own upper cluster get its RoleBinding"
        )
    if not names.is_dns1123_subdomain(role):
        raise UsageError(f"--lower-namespace-role must be a ClusterRole name, got {role!r}")
    return role


def _namespace_prefix(prefix: str) -> str:
    # The prefix starts every lower namespace name, a DNS-1123 label: lower-case letters,
    # digits and '-', starting with a letter or digit. Upper namespace names start with a
    # letter or digit too, so prefix + name is a label whenever it is short enough; the
    # bound leaves upper namespaces of up to 63 - MAX_NAMESPACE_PREFIX characters room.
    if not prefix:
        return prefix
    if not all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in prefix):
        raise UsageError(f"--namespace-prefix may hold only a-z, 0-9 and '-', got {prefix!r}")
    if not prefix[0].isalnum():
        raise UsageError(f"--namespace-prefix must start with a letter or digit, got {prefix!r}")
    if len(prefix) > MAX_NAMESPACE_PREFIX:
        raise UsageError(
            f"--namespace-prefix may be at most {MAX_NAMESPACE_PREFIX} characters (lower "
            f"namespace names are at most 63), got {len(prefix)}"
        )
    return prefix


MAX_NAMESPACE_WEIGHT = 1000


def _namespace_weights(text: str) -> tuple[tuple[str, int], ...]:
    # NAMESPACE=WEIGHT pairs: a namespace is a DNS label, a weight a whole number of keys
    # per round (bounded, so one namespace cannot be configured into starving the rest).
    weights: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        namespace, sep, value = item.partition("=")
        namespace, value = namespace.strip(), value.strip()
        if not sep or not names.is_dns1123_label(namespace):
            raise UsageError(
                f"--namespace-weights: expected NAMESPACE=WEIGHT (a namespace name), got {item!r}"
            )
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_NAMESPACE_WEIGHT:
            raise UsageError(
                f"--namespace-weights: the weight of {namespace} must be a whole number from 1 "
                f"to {MAX_NAMESPACE_WEIGHT}, got {value!r}"
            )
        if namespace in weights:
            raise UsageError(f"--namespace-weights: {namespace} is given twice")
        weights[namespace] = int(value)
    return tuple(sorted(weights.items()))


def _cluster_id(text: str) -> str:
    # Recorded as a label value on every lower object, so it must be one.
    value = text.strip()
    if text and not value:
        raise UsageError("--cluster-id must not be blank")
    if value and not is_label_value(value):
        raise UsageError(
            "--cluster-id must be a label value (at most 63 characters: letters, digits, '-', "
            f"'_' and '.', starting and ending with a letter or digit), got {text!r}"
        )
    return value


def _pod_security_level(value: str) -> PodSecurityLevel:
    # argparse's `choices` already refused anything else; this narrows the type.
    if value == "privileged":
        return "privileged"
    if value == "baseline":
        return "baseline"
    if value == "restricted":
        return "restricted"
    raise UsageError(f"--pod-security-level must be one of {', '.join(POD_SECURITY_LEVELS)}")


def _kubelet_access(value: str) -> KubeletAccessMode:
    # argparse's `choices` already refused anything else; this narrows the type.
    if value == "direct":
        return "direct"
    if value == "proxy":
        return "proxy"
    raise UsageError(f"--lower-kubelet-access must be proxy or direct, got {value!r}")


def _service_types(text: str) -> tuple[str, ...]:
    # ClusterIP is always taken: it is what every other type becomes below.
    chosen = ["ClusterIP"]
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item == "ExternalName":
            raise UsageError(
                "--lower-service-types: ExternalName is always copied (a DNS alias exposes "
                "nothing); name only " + ", ".join(SERVICE_TYPES)
            )
        if item not in SERVICE_TYPES:
            raise UsageError(
                f"--lower-service-types: unknown type {item!r} (known: {', '.join(SERVICE_TYPES)})"
            )
        if item not in chosen:
            chosen.append(item)
    return tuple(chosen)


def _endpointslice_managers(text: str) -> tuple[str, ...]:
    """--endpointslice-managers "NAME,..." or "*" -> the managed-by values taken (empty:
    all). Raises UsageError for an empty list (it would silently mirror no endpoints) or a
    value that is not a label value (discovery.k8s.io/v1: the label's value names a
    controller)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if names == ("*",):
        return ()
    if not names:
        raise UsageError(
            "--endpointslice-managers: name at least one managed-by value, or * for every slice"
        )
    for name in names:
        if not is_label_value(name):
            raise UsageError(
                f"--endpointslice-managers: {name!r} is not a label value "
                "(* alone stands for every slice)"
            )
    return names


def _selectorless_services(text: str) -> tuple[tuple[str, str], ...]:
    """--selectorless-services "NAMESPACE/NAME,NAMESPACE/*,..." -> (namespace, name) pairs
    ("*": every Service of the namespace). Raises UsageError for an item that is not a
    namespace name (DNS-1123 label), "/", and a Service name (DNS-1035 label) or "*"."""
    pairs: dict[tuple[str, str], None] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        namespace, sep, name = (part.strip() for part in item.partition("/"))
        if not sep:
            raise UsageError(
                f"--selectorless-services: expected NAMESPACE/NAME or NAMESPACE/*, got {item!r}"
            )
        if not names.is_dns1123_label(namespace):
            raise UsageError(f"--selectorless-services: {namespace!r} is not a namespace name")
        if name != "*" and not names.is_dns1035_label(name):
            raise UsageError(
                f"--selectorless-services: {name!r} is not a Service name "
                "(or * for every Service of the namespace)"
            )
        pairs[(namespace, name)] = None
    return tuple(pairs)


def _name_map(text: str, *, flag: str, what: str) -> tuple[tuple[str, str], ...]:
    """`flag` "UPPER=LOWER,..." -> pairs of `what`s (DNS-1123 subdomains, as the apiserver
    validates PriorityClass, RuntimeClass and scheduler names). Raises UsageError for a
    malformed item, a name that is not one, or an UPPER mapped twice."""
    pairs: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        upper, sep, lower = (part.strip() for part in item.partition("="))
        if not sep:
            raise UsageError(f"{flag}: expected UPPER=LOWER, got {item!r}")
        for name in (upper, lower):
            if not names.is_dns1123_subdomain(name):
                raise UsageError(
                    f"{flag}: {name!r} in {item!r} is not a {what} (a DNS-1123 subdomain)"
                )
        if upper in pairs:
            raise UsageError(f"{flag}: {upper} is mapped twice")
        pairs[upper] = lower
    return tuple(pairs.items())


def _priority_class_map(text: str) -> tuple[tuple[str, str], ...]:
    """--priority-class-map "UPPER=LOWER,..." -> pairs (`_name_map`). Raises UsageError as
    it does, and for a LOWER class of Kubernetes' own (`system-*`: a tenant must never get
    node- or cluster-critical priority below; an administrator maps onto classes of
    theirs)."""
    flag = "--priority-class-map"
    pairs = _name_map(text, flag=flag, what="PriorityClass name")
    for upper, lower in pairs:
        if lower.startswith(podpolicy.SYSTEM_PRIORITY_PREFIX):
            raise UsageError(
                f"{flag}: '{upper}={lower}' maps onto {lower}, a class Kubernetes reserves "
                "for its own critical pods; map onto a class of the lower cluster's own"
            )
    return pairs


def _volume_types(text: str) -> frozenset[str]:
    """--allowed-volume-types "TYPE,..." -> the types. Raises UsageError for a type that does
    not reach outside the pod (always allowed, or hostPath: --pod-security-level's) or is
    not a volume type."""
    chosen = {t.strip() for t in text.split(",") if t.strip()}
    for kind in sorted(chosen):
        if kind in podpolicy.POD_SECURITY_VOLUMES:
            raise UsageError(
                f"--allowed-volume-types: {kind} is decided by the Pod Security level "
                "(--pod-security-level=privileged allows it)"
            )
        if kind in podpolicy.POD_VOLUMES | podpolicy.CLAIM_VOLUMES:
            raise UsageError(
                f"--allowed-volume-types: {kind} volumes always go below; name only types "
                "that reach outside the pod"
            )
        if kind not in podpolicy.OUTSIDE_VOLUMES:
            raise UsageError(
                f"--allowed-volume-types: unknown volume type {kind!r} (known: "
                f"{', '.join(sorted(podpolicy.OUTSIDE_VOLUMES))})"
            )
    return frozenset(chosen)


def _service_annotations(
    text: str, *, flag: str = "--lower-service-annotations"
) -> tuple[str, ...]:
    """`flag` "KEY,PREFIX*,..." -> the items (`*` alone: every key).
    Raises UsageError for an item that is neither an annotation key nor a prefix of one
    followed by `*`."""
    items = tuple(dict.fromkeys(i.strip() for i in text.split(",") if i.strip()))
    for item in items:
        if item == "*":
            continue
        stem = item.removesuffix("*")
        # A prefix need not be a whole key ("example.com/lb-*"): what it has must start one.
        problem = names.qualified_name_problem(stem.rstrip("/-_.") if item.endswith("*") else stem)
        if "*" in stem or problem is not None:
            raise UsageError(
                f"{flag}: {item!r} is not an annotation key or a prefix "
                f"of one followed by * ({problem or 'a * only at the end'})"
            )
    return items


def _namespace_marks(
    texts: Sequence[str], *, flag: str, labels: bool
) -> tuple[tuple[str, str], ...]:
    """--lower-namespace-labels/-annotations occurrences "key=value,..." -> pairs, in order.

    Keys must be qualified names, label values label values (apimachinery's validation, so
    the lower apiserver never refuses a namespace for them); keys tensile writes itself
    (`tensile.io/*`, `pod-security.kubernetes.io/enforce`, see --pod-security-level) are
    refused, as is a key given twice. Raises UsageError naming the item and what is wrong."""
    marks: dict[str, str] = {}
    for text in texts:
        for raw in _ITEM_SPLIT.split(text):
            item = raw.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip().replace("\\,", ",")
            if not sep:
                raise UsageError(f"{flag}: expected key=value, got {item!r}")
            problem = names.qualified_name_problem(key)
            if problem is not None:
                raise UsageError(f"{flag}: key {key!r} is not a valid key: {problem}")
            if labels and (problem := names.label_value_problem(value)) is not None:
                raise UsageError(f"{flag}: the value of {key} is not a label value: {problem}")
            if any(key.startswith(own) for own in _OWN_NAMESPACE_KEYS):
                raise UsageError(
                    f"{flag}: {key} is written by the virtual node itself (its ownership marks "
                    "and --pod-security-level)"
                )
            if key in marks:
                raise UsageError(f"{flag}: {key} is given twice")
            marks[key] = value
    return tuple(marks.items())
