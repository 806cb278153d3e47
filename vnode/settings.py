"""Frozen settings of a virtual node, built once from flags and environment (`vnode.cli`).

Every field has a default and says its unit. Names follow tensile-kube's and
virtual-kubelet's flags and environment variables.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Literal

from tensile.contracts.selectors import EVERYTHING, Selector
from tensile.kube.leaderelection import LeaderElectionSettings
from tensile.serving.tracing import TraceSettings

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

PodSecurityLevel = Literal["privileged", "baseline", "restricted"]
"""The levels of the Pod Security Standards (kubernetes.io/docs/concepts/security/)."""
LowerOutagePolicy = Literal["keep", "evict"]
"""--lower-outage-policy values (docs/operations/partitions.md)."""
LOWER_OUTAGE_POLICIES: tuple[LowerOutagePolicy, ...] = ("keep", "evict")


def default_cert_dir(node_name: str) -> str:
    """Return the default --cert-dir: `.tensile-pki/<node name>` under the working
    directory (one directory per node, so several nodes can run from one place)."""
    return f".tensile-pki/{node_name}"


@dataclass(frozen=True, kw_only=True)
class Taint:
    """The taint the virtual node carries (VKUBELET_TAINT_KEY/VALUE/EFFECT)."""

    key: str = "virtual-kubelet.io/provider"
    value: str = "k8s"
    effect: str = "NoSchedule"


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """How to reach one cluster."""

    kubeconfig: str | None = None
    """Kubeconfig path; None: $KUBECONFIG, ~/.kube/config, then in-cluster."""
    qps: float = 100.0
    """Client-side requests per second (token bucket rate)."""
    burst: int = 200
    """Client-side request burst."""
    server: str = ""
    """The apiserver URL used instead of the kubeconfig's (node-cli's MASTER_URI; "": the
    kubeconfig's)."""


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """The Node object in the upper cluster and its heartbeats."""

    name: str = "virtual-kubelet"
    """--nodename: the Node's name."""
    operating_system: str = "linux"
    """--os, lower-cased (kubernetes.io/os label and nodeInfo.operatingSystem)."""
    taint: Taint | None = field(default_factory=Taint)
    """None with --disable-taint."""
    extra_labels: tuple[tuple[str, str], ...] = ()
    """VKUBELET_NODE_LABEL ("key:value")."""
    internal_ip: str = ""
    """VKUBELET_POD_IP, or detected: the address the upper apiserver reaches us at."""
    external_ip: str = ""
    """VKUBELET_EXTERNAL_POD_IP: published as ExternalIP when set."""
    kubelet_port: int = 10250
    """KUBELET_PORT: published in status.daemonEndpoints.kubeletEndpoint.port."""
    enable_lease: bool = True
    """--enable-node-lease: renew kube-node-lease/<name>."""
    lease_duration: int = 40
    """Lease duration in seconds."""
    lease_renew_interval: float = 10.0
    """Seconds between lease renewals (and health pings of the lower cluster)."""
    status_interval: float = 60.0
    """Seconds between full node status updates when nothing changed."""
    status_min_interval: float = 1.0
    """At most one node status update per this many seconds (debounce)."""
    placement_summary_interval: float = 1.0
    """--placement-summary-interval: seconds between two looks at the lower nodes for the
    placement summary annotation `tensile-scheduler` reads (written only when it changed;
    0: not published)."""
    lower_node_selector: Selector = EVERYTHING
    """--lower-node-selector: the lower nodes (a pool) this virtual node stands for: its
    capacity, summary and metrics are theirs, its lower pods are confined to them."""
    lower_node_labels_to_copy: tuple[str, ...] = ()
    """--lower-node-labels-to-copy: label keys put on the virtual Node with the value every
    node of the pool shares (read at start)."""
    lower_outage_policy: LowerOutagePolicy = "keep"
    """--lower-outage-policy: what the Node says while the lower apiserver does not answer.
    keep: Ready, with the LowerControlPlaneReachable condition False and the NoSchedule
    taint tensile.io/lower-unreachable, Lease renewed, for `lower_outage_grace`; then Ready
    False. evict (tensile-kube's): no Lease renewal and no status write at once, so the node
    lifecycle controller marks the Node Unknown and evicts its pods after their toleration."""
    lower_outage_grace: float = 900.0
    """--lower-outage-grace: seconds of a lower outage the Node stays Ready under the keep
    policy (0: Ready False at the first unanswered ping)."""


@dataclass(frozen=True, kw_only=True)
class PodSettings:
    """How pods are forwarded."""

    namespace: str | None = None
    """--namespace: only upper pods of this namespace (None: all)."""
    namespace_prefix: str = ""
    """--namespace-prefix: lower namespace = prefix + upper namespace."""
    lower_namespace_role: str = ""
    """--lower-namespace-role: the lower ClusterRole bound to the node's lower identity in
    each lower namespace it makes ("": its rights are cluster-wide)."""
    cluster_id: str = ""
    """--cluster-id: the upper cluster's identity on lower objects ("": read the UID of the
    upper kube-system namespace at start)."""
    pod_security_level: PodSecurityLevel = "baseline"
    """--pod-security-level: the Pod Security Standard forwarded pods must meet."""
    ignore_labels: tuple[str, ...] = ("pod-group.scheduling.sigs.k8s.io",)
    """--ignore-labels: label keys kept off the lower pod (restored on the way up)."""
    enable_service_account: bool = True
    """--enable-serviceaccount: mirror the pod's ServiceAccount in the lower cluster."""
    workers: int = 50
    """--pod-sync-workers: concurrent workers per queue."""
    namespace_weights: tuple[tuple[str, int], ...] = ()
    """--namespace-weights: (namespace, weight >= 1) pairs. The pod queues serve namespaces
    in weighted round robin: per round a namespace gets up to its weight of pods handled;
    namespaces not named weigh 1 (all equal by default)."""
    priority_class_map: tuple[tuple[str, str], ...] = ()
    """--priority-class-map UPPER=LOWER pairs: the lower pod's priorityClassName for an
    upper one; a class not mapped is dropped (the lower default priority applies). No
    LOWER starts with `system-`."""
    scheduler_name_map: tuple[tuple[str, str], ...] = ()
    """--scheduler-name-map UPPER=LOWER pairs: the lower pod's schedulerName for an upper
    one; a name not mapped is dropped (the lower default scheduler places the pod)."""
    runtime_class_map: tuple[tuple[str, str], ...] = ()
    """--runtime-class-map UPPER=LOWER pairs: the lower pod's runtimeClassName for an upper
    one; a class not mapped is dropped (the lower default runtime handler)."""
    allowed_volume_types: frozenset[str] = frozenset()
    """--allowed-volume-types: the volume types reaching outside the pod
    (`tensile.contracts.podpolicy.OUTSIDE_VOLUMES`) that go below; pods with others are
    refused."""
    lower_namespace_labels: tuple[tuple[str, str], ...] = ()
    """--lower-namespace-labels: labels set on every lower namespace tensile creates (and
    on those it created before, when they lack or differ in one)."""
    lower_namespace_annotations: tuple[tuple[str, str], ...] = ()
    """--lower-namespace-annotations: the same for annotations."""


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The kubelet HTTPS API (served by vnode.api)."""

    cert_file: str = ""
    """APISERVER_CERT_LOCATION: the serving certificate file, reloaded when it changes.
    Set together with `key_file`; when set, no CSR is made."""
    key_file: str = ""
    """APISERVER_KEY_LOCATION."""
    rotate_server_certificates: bool = True
    """--rotate-server-certificates (the kubelet's flag): without certificate files, get the
    serving certificate from the upper cluster through a kubernetes.io/kubelet-serving CSR
    and renew it at 80 % of its lifetime. False without files: the API is off."""
    cert_dir: str = ""
    """--cert-dir: where CSR-issued certificates are kept (kubelet-server-*.pem and the
    kubelet-server-current.pem pointer); "" means `default_cert_dir(node name)`. Must be
    writable (checked at start) and belongs on persistent storage: a restart without the
    stored certificate makes a new CSR."""
    cert_secret: tuple[str, str] | None = None
    """--cert-secret NAMESPACE/NAME: keep CSR-issued certificates in this Secret of the
    upper cluster instead of `cert_dir` (`vnode.api.secretstore`), so a restarted or
    rescheduled node needs no new CSR; None: `cert_dir`."""
    server_certificate_duration: int = 0
    """--server-certificate-duration in seconds: the CSR's spec.expirationSeconds (>= 600);
    0 leaves it out, so the signer's default applies (kube-controller-manager's
    --cluster-signing-duration, one year unless changed)."""
    client_ca_file: str = ""
    """--client-verify-ca / APISERVER_CA_CERT_LOCATION."""
    verify_clients: bool = True
    """False with --no-verify-clients (development only)."""
    anonymous_auth: bool = False
    """--anonymous-auth (the kubelet's flag, default false here as in every hardened kubelet
    configuration): a request with neither a client certificate nor a bearer token is user
    `system:anonymous`, group `system:unauthenticated`, and is then authorized by a
    SubjectAccessReview like anyone else (so RBAC still decides). False: such a request is
    answered 401. A bad token is 401 either way."""
    streaming_idle_timeout: float = 4 * 3600.0
    """--streaming-connection-idle-timeout: seconds an exec/attach/port-forward connection
    may move no frame before it is closed (kubelet's default 4 h; 0: never)."""
    token_cache_ttl: float = 120.0
    """--authentication-token-webhook-cache-ttl: seconds a TokenReview's answer is reused
    (the kubelet's default 2 min; 0: never)."""
    authorized_cache_ttl: float = 300.0
    """--authorization-webhook-cache-authorized-ttl: seconds an allowing SubjectAccessReview
    is reused (the kubelet's default 5 min; 0: never)."""
    unauthorized_cache_ttl: float = 30.0
    """--authorization-webhook-cache-unauthorized-ttl: seconds a denying SubjectAccessReview
    is reused (the kubelet's default 30 s; 0: never)."""


PV_CONTROLLERS = "PVControllers"
SERVICE_CONTROLLERS = "ServiceControllers"
KNOWN_CONTROLLERS = (PV_CONTROLLERS, SERVICE_CONTROLLERS)
"""tensile-kube's names for --enable-controllers."""


@dataclass(frozen=True, kw_only=True)
class IngressSettings:
    """--enable-ingress and what it needs (vnode.providers.k2k.ingresses)."""

    enabled: bool = False
    """--enable-ingress (Liqo's name): upper Ingresses whose backends are all Services this
    node copied below are copied there too, with their TLS Secrets (needs
    ServiceControllers)."""
    class_map: tuple[tuple[str, str], ...] = ()
    """--ingress-class-map UPPER=LOWER IngressClass pairs; an Ingress of a class not named
    (or of none) is not copied."""
    annotations: tuple[str, ...] = ()
    """--lower-ingress-annotations: annotation keys (or prefixes ending in `*`; `*` alone:
    all) of an upper Ingress copied onto its copy; none by default."""


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    """--enable-controllers (tensile-kube's names) and what the chosen ones need. The
    copies of pods' ConfigMaps, Secrets and ServiceAccounts always run."""

    enabled: tuple[str, ...] = KNOWN_CONTROLLERS
    """ServiceControllers: upper Services and their EndpointSlices mirrored below;
    PVControllers: the node provisions claims of upper StorageClasses of provisioner
    tensile.io/virtual-node, and copies claims of other classes down with their pods."""
    service_namespaces: tuple[str, ...] = ()
    """--service-namespaces: the upper namespaces whose Services are mirrored (empty: all
    but kube-system)."""
    lower_storage_classes: tuple[tuple[str, str], ...] = ()
    """--lower-storage-class UPPER=LOWER pairs: the lower StorageClass of a lower claim."""
    lower_storage_class_default: str | None = None
    """--lower-storage-class LOWER (a bare name): the lower class for upper classes not
    paired; None: lower claims name no class, so the lower default StorageClass applies."""
    lower_service_types: tuple[str, ...] = ("ClusterIP",)
    """--lower-service-types: the Service types copied below as they are, with their
    exposure fields; any other exposure type (NodePort, LoadBalancer) becomes ClusterIP
    below. ExternalName always travels (it exposes nothing)."""
    lower_service_annotations: tuple[str, ...] = ()
    """--lower-service-annotations: the annotation keys (or prefixes ending in `*`; `*`
    alone: all) of an upper Service copied onto a NodePort or LoadBalancer copy the
    --lower-service-types allow; none by default."""
    endpointslice_managers: tuple[str, ...] = ()
    """--endpointslice-managers: only upper EndpointSlices with one of these
    `endpointslice.kubernetes.io/managed-by` values are considered; empty: every slice of a
    mirrored Service. It grants no trust (the label is the writer's choice): what crosses
    is verified (vnode.providers.k2k.endpointslices)."""
    selectorless_services: tuple[tuple[str, str], ...] = ()
    """--selectorless-services: (namespace, name or "*") of the selector-less upper Services
    whose hand-written endpoints cross as written (the administrator vouches for them)."""
    ingress: IngressSettings = IngressSettings()
    """--enable-ingress, --ingress-class-map, --lower-ingress-annotations."""


KubeletAccessMode = Literal["proxy", "direct"]
ProviderName = Literal["k8s", "mock"]


@dataclass(frozen=True, kw_only=True)
class LowerKubeletSettings:
    """How the lower kubelets' resource metrics (behind the node's /metrics/resource and
    /stats/summary) are read."""

    access: KubeletAccessMode = "proxy"
    """--lower-kubelet-access: "proxy" through the lower apiserver's nodes/<node>/proxy
    (needs `get` on nodes/proxy, which also allows exec into every lower container:
    manifests/vnode/lower-rbac-metrics-proxy.yaml), or "direct" to each node's address and
    kubelet port, as metrics-server does (needs network reach and `get` on nodes/metrics;
    best with `token_file`)."""
    insecure_tls: bool = False
    """--lower-kubelet-insecure-tls: with direct access, do not verify the kubelets' serving
    certificates (otherwise they must chain to the lower kubeconfig's CA)."""
    token_file: str = ""
    """--lower-kubelet-token-file: with direct access, a file holding the bearer token sent
    to the kubelets instead of the lower kubeconfig's credential (read again when it
    changes), e.g. of a ServiceAccount allowed only `get` on nodes/metrics and nodes/stats
    (manifests/vnode/lower-rbac-kubelet-metrics.yaml). "": the lower kubeconfig's."""


@dataclass(frozen=True, kw_only=True)
class PatrolSettings:
    """The patrol's period and its own client budget (see vnode.controllers.patrol)."""

    period: float = 300.0
    """--patrol-period seconds between two patrol runs (0: no patrol)."""
    qps: float = 5.0
    """--patrol-qps: requests per second of the patrol's clients (one per cluster)."""
    burst: int = 10
    """--patrol-burst: request burst of the patrol's clients."""


@dataclass(frozen=True, kw_only=True)
class MigrationSettings:
    """Switching over from tensile-kube (docs/migration.md)."""

    adopt_tensile_kube: bool = False
    """--adopt-tensile-kube: once leading, take over the lower pods and copies
    tensile-kube's virtual node made for this node's upper objects
    (`vnode.providers.k2k.tensilekube`)."""
    adopt_before: dt.datetime | None = None
    """--adopt-tensile-kube-before (aware, UTC): only lower objects created before it are
    adopted; set exactly when `adopt_tensile_kube` is."""


@dataclass(frozen=True, kw_only=True)
class ServiceAccountSettings:
    """Upper ServiceAccount tokens for lower pods (docs/serviceaccount.md)."""

    upper_api_address: str = ""
    """--upper-api-address host:port at which lower pods reach the upper apiserver; with
    --enable-serviceaccount, lower pods get bound tokens of their upper ServiceAccount, the
    upper CA and this address as KUBERNETES_SERVICE_HOST/PORT ("": the lower cluster's)."""
    token_refresh_fraction: float = 0.8
    """--serviceaccount-token-refresh-fraction: the part of a token's life after which it
    is renewed (the kubelet's 0.8); 0 < fraction < 1."""
    token_kubeconfig: str = ""
    """--upper-token-kubeconfig: a kubeconfig of the upper cluster whose user is this node's
    identity (`system:node:<node>`, group `system:nodes`), with which the tokens are asked
    for: the upper Node authorizer and NodeRestriction then grant only tokens bound to
    pods bound to this node ("": the upper kubeconfig's user, which needs `create` on
    `serviceaccounts/token` for every ServiceAccount)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a virtual node runs with."""

    provider: ProviderName = "k8s"
    """--provider: "k8s" forwards pods to the lower cluster; "mock" makes them Running with
    no lower cluster (virtual-kubelet's mock; see vnode.providers.mock)."""
    provider_config: str = ""
    """--provider-config: for "mock", virtual-kubelet's mock config file (capacity)."""
    node: NodeSettings = field(default_factory=NodeSettings)
    pods: PodSettings = field(default_factory=PodSettings)
    upper: ClientSettings = field(default_factory=ClientSettings)
    lower: ClientSettings = field(default_factory=lambda: ClientSettings(qps=500.0, burst=1000))
    events: ClientSettings = field(default_factory=lambda: ClientSettings(qps=50.0, burst=100))
    """--event-qps/--event-burst: the budget of Events written upstairs (the kubelet's)."""
    api: ApiSettings = field(default_factory=ApiSettings)
    lower_kubelets: LowerKubeletSettings = field(default_factory=LowerKubeletSettings)
    controllers: ControllerSettings = field(default_factory=ControllerSettings)
    """--enable-controllers and the flags of the controllers it chooses."""
    metrics_addr: str = ""
    """--metrics-addr host:port of the plain-HTTP Prometheus endpoint ("" disables it;
    loopback unless --metrics-insecure: `tensile.serving.metrics_flags`)."""
    healthz_addr: str = ""
    """--healthz-addr host:port of a plain-HTTP /healthz and /readyz ("" disables it)."""
    log_level: str = "info"
    """--log-level: debug, info, warn, error."""
    log_format: str = "text"
    """--log-format: text or json."""
    notes: tuple[str, ...] = ()
    """Flags given that are accepted but ignored, one sentence each (logged at start)."""
    startup_timeout: float = 0.0
    """--startup-timeout seconds to wait for the caches before giving up (0: wait forever)."""
    shutdown_timeout: float = 10.0
    """Seconds SIGTERM waits for in-flight work before abandoning it."""
    patrol: PatrolSettings = field(default_factory=PatrolSettings)
    """--patrol-period, --patrol-qps, --patrol-burst."""
    leader_election: LeaderElectionSettings | None = None
    """--leader-elect and its timing flags: replicas of this node compete for this Lease in
    the upper cluster and only its holder writes (see `tensile.serving.leadership`); None
    (--leader-elect=false, the default): this process leads alone."""
    migration: MigrationSettings = field(default_factory=MigrationSettings)
    """--adopt-tensile-kube, --adopt-tensile-kube-before."""
    serviceaccount: ServiceAccountSettings = field(default_factory=ServiceAccountSettings)
    """--upper-api-address, --serviceaccount-token-refresh-fraction,
    --upper-token-kubeconfig."""
    tracing: TraceSettings = field(default_factory=TraceSettings)
    """--trace-exporter, --trace-sample-rate, --trace-service-name, --trace-tag (off by
    default: see `tensile.serving.tracing`)."""
