"""Assembly of the k2k provider: builds its collaborators from settings and clients and
wires them together (informers shared with the node, the copies' mirrors, callbacks).

`build` is the one place that knows how the pieces fit; `K2KProvider` only uses them, so a
test can hand it collaborators of its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Iterable

from tensile.contracts import ownership, selectors
from tensile.contracts.objects import Obj, annotations_of, name_of, namespace_of
from tensile.kube.client import ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.mirror.engine import Mirror
from tensile.kube.mirror.spec import KindSpec
from tensile.kube.namespaced import NamespaceSet
from tensile.kube.resources import (
    INGRESSES,
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
    Resource,
    object_key,
)
from tensile.serving.tracing import NO_TRACING, Tracing
from vnode.providers.k2k import (
    endpointslices,
    ingresses,
    naming,
    services,
    slim,
    tensilekube,
    translate,
)
from vnode.providers.k2k.adoption import TensileKubeAdoption
from vnode.providers.k2k.dependencies import DependencySync
from vnode.providers.k2k.events import EventMirror
from vnode.providers.k2k.lowerpods import LowerPodBook
from vnode.providers.k2k.namespacerbac import NamespaceGrant
from vnode.providers.k2k.namespaces import LowerNamespaces
from vnode.providers.k2k.pool import PoolWatch
from vnode.providers.k2k.provider import K2KProvider, PodChanges
from vnode.providers.k2k.provisioner import VolumeProvisioner
from vnode.providers.k2k.publisher import SummaryPublisher
from vnode.providers.k2k.scrape import KubeletAccess, ResourceScraper, ThroughApiserver
from vnode.providers.k2k.tokens import UpperTokens
from vnode.settings import PV_CONTROLLERS, SERVICE_CONTROLLERS, ControllerSettings


def build(
    *,
    upper: ApiClient,
    lower: ApiClient,
    informers: InformerFactory,
    policy: translate.TranslationPolicy,
    node_ip: str,
    upper_events: ApiClient | None = None,
    lower_heartbeat: ApiClient | None = None,
    upper_namespace: str | None = None,
    kubelets: KubeletAccess | None = None,
    workers: int = 50,
    controllers: ControllerSettings | None = None,
    namespace_labels: tuple[tuple[str, str], ...] = (),
    namespace_annotations: tuple[tuple[str, str], ...] = (),
    adopt_tensile_kube_before: dt.datetime | None = None,
    token_refresh_fraction: float = 0.8,
    token_minter: ApiClient | None = None,
    summary_interval: float = 0.0,
    upper_placement: ApiClient | None = None,
    tracing: Tracing = NO_TRACING,
    namespace_role: str = "",
) -> K2KProvider:
    """Return the provider that forwards the pods of node `policy.node_name` to `lower`.

    `informers` shares informers with the node's other components; `node_ip` is the
    virtual node's InternalIP, shown as the pods' hostIP upstairs; `upper_events` writes the
    Events mirrored from below (default `upper`; a client of their own keeps a flood of them
    from delaying statuses); `lower_heartbeat` answers `ping` (default `lower`; a client of
    its own, with its own connections and no rate limit, keeps busy pod, log and exec
    traffic from delaying the node's heartbeats, which wait for the ping); `kubelets` how
    the lower kubelets' resource metrics are read (default: through the lower apiserver's
    node proxy); `workers` bounds concurrent copy updates per kind (--pod-sync-workers);
    `controllers` chooses the mirrors of Services and volumes that run beside the
    dependency copies (default: both, as tensile-kube's --enable-controllers);
    `namespace_labels`/`namespace_annotations` the lower administrator's marks for the lower
    namespaces the node makes (--lower-namespace-labels/-annotations);
    `adopt_tensile_kube_before` (--adopt-tensile-kube's cut-off; None: no adoption) takes
    over tensile-kube's lower objects created before it, once leading;
    `token_refresh_fraction` of an upper token's life passes before it is renewed (with
    `policy.upper_tokens`), asked for through `token_minter` (the node's own identity,
    --upper-token-kubeconfig; default `upper`); `summary_interval` the seconds between two
    looks for the placement summary (--placement-summary-interval; 0: not published),
    written through `upper_placement` (default `upper`); `tracing` makes spans of traced
    pods' creates (--trace-exporter; default none); `namespace_role`
    (--lower-namespace-role, with a prefix) the lower ClusterRole the node binds to itself
    in each lower namespace it makes, whose copies are then watched namespace by namespace
    (`own_namespaces`). `policy.lower_node_selector` (--lower-node-selector) narrows the
    lower nodes watched to the node's pool, whose departures `pool.PoolWatch` reports.
    Nothing is started and no request is made: the node starts the
    provider and its informers.
    """
    owner = policy.owner
    events_client = upper_events or upper
    controllers = controllers or ControllerSettings()
    changes = PodChanges()
    watched = (
        own_namespaces(informers, lower=lower, owner=owner, prefix=policy.namespace_prefix)
        if namespace_role
        else None
    )
    namespaces = LowerNamespaces(
        lower=lower,
        upper=upper,
        owner=owner,
        prefix=policy.namespace_prefix,
        pod_security_level=policy.pod_security_level,
        extra_labels=dict(namespace_labels),
        extra_annotations=dict(namespace_annotations),
        grant=NamespaceGrant(lower=lower, role=namespace_role, on_granted=watched.add)
        if watched is not None
        else None,
    )
    pods = informers.informer(
        lower,
        PODS,
        name="lower-pods",
        transform=slim.SlimLowerPods(owner),
        # Every pod of the lower cluster, read a few times in a pod's life: encoded, a
        # quarter of the memory (see Store); capacity reads the book's ledger, not this.
        encoded=True,
    )
    # Only the pool's nodes (--lower-node-selector), filtered by the API server: the
    # capacity, the summary and the metrics read this cache, and a node that stops matching
    # leaves it at once (`pool`).
    pool = policy.lower_node_selector
    nodes = informers.informer(
        lower, NODES, name="lower-nodes", label_selector=selectors.render(pool) or None
    )
    # Every kind this node mirrors shares one tenancy: its marks, its siblings', its prefix.
    tenancy = naming.NodeTenancy(owner=owner, prefix=policy.namespace_prefix, watched=watched)
    dependencies = DependencySync(
        upper=upper,
        lower=lower,
        tenancy=tenancy,
        upper_namespace=upper_namespace,
        enable_service_account=policy.enable_service_account,
        lower_pods=pods,
        informers=informers,
        on_resolved=changes,
        workers=workers,
    )
    # Which lower pods this node made: their Events, usage and pool reports are the upper
    # pods'; a pod that only copies the marks is no one's.
    book = LowerPodBook(owner=owner)
    events = EventMirror(
        upper=events_client,
        lower=lower,
        made=book.made,
        lower_objects=pods,
        informers=informers,
    )
    service_mirrors = (
        _service_mirrors(
            upper=upper,
            upper_events=events_client,
            lower=lower,
            informers=informers,
            controllers=controllers,
            tenancy=tenancy,
            namespaces=namespaces,
            dependencies=dependencies,
        )
        if SERVICE_CONTROLLERS in controllers.enabled
        else []
    )
    provisioner = (
        VolumeProvisioner(
            upper=upper,
            upper_events=events_client,
            lower=lower,
            informers=informers,
            tenancy=tenancy,
            namespaces=namespaces,
            classes=policy.storage_classes,
            on_resolved=changes,
            upper_namespace=upper_namespace,
        )
        if PV_CONTROLLERS in controllers.enabled
        else None
    )
    usage = ResourceScraper(
        access=kubelets or ThroughApiserver(lower),
        pods=pods.store,
        nodes=nodes.store,
        made=book.made,
    )
    publisher = (
        SummaryPublisher(
            upper=upper_placement or upper,
            node_name=policy.node_name,
            book=book,
            nodes=nodes,
            pods=pods,
            interval=summary_interval,
        )
        if summary_interval > 0
        else None
    )
    provider = K2KProvider(
        lower=lower,
        lower_heartbeat=lower_heartbeat or lower,
        policy=policy,
        node_ip=node_ip,
        namespaces=namespaces,
        pods=pods,
        nodes=nodes,
        book=book,
        dependencies=dependencies,
        events=events,
        services=service_mirrors,
        volumes=provisioner,
        usage=usage,
        pod_changes=changes,
        adoption=_adoption(
            upper=upper,
            upper_events=events_client,
            lower=lower,
            controllers=controllers,
            owner=owner,
            namespace=upper_namespace,
            created_before=adopt_tensile_kube_before,
            informers=informers,
        )
        if adopt_tensile_kube_before is not None
        else None,
        tokens=UpperTokens(
            upper=upper,
            minter=token_minter,
            lower=lower,
            owner=owner,
            prefix=policy.namespace_prefix,
            lower_pods=pods,
            refresh_fraction=token_refresh_fraction,
        )
        if policy.upper_tokens
        else None,
        publisher=publisher,
        pool=PoolWatch(
            lower=lower,
            upper_events=events_client,
            owner=owner,
            made=book.made,
            pool=pool,
            nodes=nodes,
            pods=pods,
        )
        if pool.requirements
        else None,
        tracing=tracing,
        own_namespaces=watched.source if watched is not None else None,
    )
    pods.add_handlers(
        Handlers(
            on_add=provider.lower_pod_changed,
            on_modify=provider.lower_pod_changed,
            on_delete=provider.lower_pod_deleted,
        )
    )
    nodes.add_handlers(
        Handlers(
            on_add=lambda _n: provider.capacity_moved(),
            on_modify=lambda _n: provider.capacity_moved(),
            on_delete=lambda _n: provider.capacity_moved(),
        )
    )
    return provider


def own_namespaces(
    informers: InformerFactory, *, lower: ApiClient, owner: ownership.NodeIdentity, prefix: str
) -> NamespaceSet:
    """The lower namespaces this node's upper cluster made (with `prefix`, its marks), kept
    current from a watch of the lower namespaces carrying its marks (list and watch of
    namespaces is cluster-wide: their names and marks, nothing inside). A namespace of
    another name or cluster is never in it, whatever its labels say: with namespaced lower
    RBAC (lower-rbac-namespaced.yaml) only this upper cluster's identity can make a
    namespace of its prefix."""
    source = informers.informer(
        lower,
        NAMESPACES,
        name="lower-own-namespaces",
        label_selector=f"{ownership.MANAGED_NAMESPACE_LABEL}=true,{ownership.cluster_selector(owner)}",
    )
    watched = NamespaceSet(source=source)

    def seen(namespace: Obj) -> None:
        name = name_of(namespace)
        if ours(namespace):
            watched.add(name)
        else:
            watched.discard(name)

    def ours(namespace: Obj) -> bool:
        name = name_of(namespace)
        return (
            name.startswith(prefix)
            and len(name) > len(prefix)
            and annotations_of(namespace).get(ownership.CLUSTER_ANNOTATION) == owner.cluster_id
        )

    # Told in a standby too: its caches of copies are kept warm like the others.
    source.add_handlers(
        Handlers(on_add=seen, on_modify=seen, on_delete=lambda n: watched.discard(name_of(n))),
        always=True,
    )
    return watched


def _adoption(
    *,
    upper: ApiClient,
    upper_events: ApiClient,
    lower: ApiClient,
    controllers: ControllerSettings,
    owner: ownership.NodeIdentity,
    namespace: str | None,
    created_before: dt.datetime,
    informers: InformerFactory,
) -> TensileKubeAdoption:
    """The adoption of tensile-kube's lower objects (--adopt-tensile-kube), scoped to what
    this node mirrors and to what was made before `created_before`."""
    node = owner.node_name
    return TensileKubeAdoption(
        upper=upper,
        lower=lower,
        scope=tensilekube.Scope(
            owner=owner,
            mirror_services=SERVICE_CONTROLLERS in controllers.enabled,
            mirror_claims=PV_CONTROLLERS in controllers.enabled,
            service_selection=services.ServiceSelection(
                namespaces=frozenset(controllers.service_namespaces)
            ),
        ),
        recorder=EventRecorder(upper_events, component=f"{node}/adoption", host=node),
        created_before=created_before,
        namespace=namespace,
        informers=informers,
    )


def _service_mirrors(
    *,
    upper: ApiClient,
    upper_events: ApiClient,
    lower: ApiClient,
    informers: InformerFactory,
    controllers: ControllerSettings,
    tenancy: naming.NodeTenancy,
    namespaces: LowerNamespaces,
    dependencies: DependencySync,
) -> list[Mirror]:
    """The mirrors of the upper Services and EndpointSlices (ServiceControllers), and of the
    Ingresses with --enable-ingress. The slice mirror reads the Service mirror's caches and
    the upper pods (`endpointslices.Caches`); the Ingress mirror the Service mirror's and
    the Secret copies' (`ingresses.Caches`), whose mirror copies its TLS Secrets."""
    selection = services.ServiceSelection(
        namespaces=frozenset(controllers.service_namespaces),
        slice_managers=frozenset(controllers.endpointslice_managers),
    )
    exposure = services.ServiceExposure(
        types=frozenset(controllers.lower_service_types),
        annotations=controllers.lower_service_annotations,
    )
    # One namespace: watch only it (and need only a Role there upstairs).
    only = controllers.service_namespaces
    namespace = only[0] if len(only) == 1 else None
    node = tenancy.owner.node_name
    recorder = EventRecorder(upper_events, component=f"{node}/service-mirror", host=node)

    def source(resource: Resource) -> Informer:
        return informers.informer(
            upper, resource, name=f"upper-{resource.plural}", namespace=namespace
        )

    def target(resource: Resource) -> Informer:
        # Every copy of this upper cluster's (ours and sibling nodes'), so a copy whose
        # maker is gone is still kept (see `Mirror`).
        return informers.informer(
            lower,
            resource,
            name=f"lower-copies-{resource.plural}",
            label_selector=ownership.cluster_selector(tenancy.owner),
            namespaces=tenancy.watched,
        )

    # Every upper pod that may be an endpoint, whichever node runs it (a sibling's, the
    # upper cluster's own): kept slim and encoded, about 360 bytes a pod. Only namespaces
    # with a Service that selects pods can have such endpoints: a cluster-wide watch made
    # every node decode every upper pod's every change (0.7-0.8 ms of CPU a pod, and one
    # more watcher on the upper apiserver for each), most of them in namespaces no Service
    # selects from.
    upper_services = source(SERVICES)
    upper_pods = informers.informer(
        upper,
        PODS,
        name="upper-endpoint-pods",
        namespace=namespace,
        namespaces=None
        if namespace is not None
        else _selecting_namespaces(upper_services, selection=selection),
        field_selector=endpointslices.UPPER_POD_FIELD_SELECTOR,
        transform=endpointslices.slim_upper_pod,
        encoded=True,
    )
    slice_spec = endpointslices.slice_spec(
        tenancy=tenancy,
        selection=selection,
        selectorless=endpointslices.SelectorlessServices(
            names=frozenset(controllers.selectorless_services)
        ),
        caches=endpointslices.Caches(
            upper_services=upper_services.store,
            service_copies=target(SERVICES).store,
            upper_pods=upper_pods.store,
        ),
    )
    mirrors = []
    for spec, reason, reads in (
        (
            services.service_spec(tenancy=tenancy, selection=selection, exposure=exposure),
            NARROWED,
            (),
        ),
        (slice_spec, DROPPED, (source(SERVICES), target(SERVICES), upper_pods)),
    ):
        mirrors.append(
            Mirror(
                spec=spec,
                tenancy=tenancy,
                source=source(spec.source),
                target=target(spec.target),
                source_client=upper,
                target_client=lower,
                namespaces=namespaces,
                on_problem=_problem_recorder(recorder, spec),
                on_notice=_notice_recorder(recorder, spec, reason=reason),
                reads=reads,
            )
        )
    _revisit_slices(
        mirrors[1],
        upper_services=source(SERVICES),
        service_copies=target(SERVICES),
        upper_pods=upper_pods,
        tenancy=tenancy,
    )
    if controllers.ingress.enabled:
        secrets = dependencies.mirrors["Secret"]
        caches = ingresses.Caches(
            upper_services=source(SERVICES).store,
            service_copies=target(SERVICES).store,
            upper_secrets=secrets.source.store,
            secret_copies=secrets.target.store,
        )
        policy = ingresses.IngressPolicy(
            classes=controllers.ingress.class_map, annotations=controllers.ingress.annotations
        )
        spec = ingresses.ingress_spec(
            tenancy=tenancy, selection=selection, policy=policy, caches=caches
        )
        mirror = Mirror(
            spec=spec,
            tenancy=tenancy,
            source=source(INGRESSES),
            target=target(INGRESSES),
            source_client=upper,
            target_client=lower,
            namespaces=namespaces,
            on_problem=_problem_recorder(recorder, spec),
            on_refusal=_notice_recorder(recorder, spec, reason=ingresses.REASON),
            reads=(source(SERVICES), target(SERVICES), secrets.source, secrets.target),
        )
        _revisit_ingresses(
            mirror,
            secrets=secrets,
            dependencies=dependencies,
            upper_services=source(SERVICES),
            service_copies=target(SERVICES),
            tenancy=tenancy,
            judge=lambda ingress: ingresses.judge(
                ingress, caches=caches, tenancy=tenancy, policy=policy
            ),
        )
        mirrors.append(mirror)
    return mirrors


def _revisit_ingresses(
    ingress_mirror: Mirror,
    *,
    secrets: Mirror,
    dependencies: DependencySync,
    upper_services: Informer,
    service_copies: Informer,
    tenancy: naming.NodeTenancy,
    judge: Callable[[Obj], ingresses.Verdict],
) -> None:
    """Keep the TLS Secrets of the Ingresses that want them (`ingresses.Verdict.wants`) in
    use by the Secret mirror, and look at the upper Ingresses (and their Secrets) again when
    what `ingresses.judge` read for them changes: a backend's upper Service or its lower
    copy, a TLS Secret upstairs or its copy below, or the Ingress itself."""
    store = ingress_mirror.source.store
    store.add_indexer(_INGRESS_BY_SERVICE, ingresses.services_of_ingress)
    # By the lower keys of their TLS Secrets' copies: what the Secret mirror's `in_use` asks.
    store.add_indexer(
        _INGRESS_BY_SECRET,
        lambda ingress: [tenancy.target_key(k) for k in ingresses.secrets_of_ingress(ingress)],
    )

    def in_use(copy_key: str) -> bool:
        for key in store.index_keys(_INGRESS_BY_SECRET, copy_key):
            ingress = store.get(key)
            if ingress is not None and judge(ingress).wants:
                return True
        return False

    dependencies.add_use("Secret", in_use)

    def revisit(keys: Iterable[str]) -> None:
        keys = list(keys)
        ingress_mirror.revisit(keys)
        for key in keys:
            ingress = store.get(key)
            if ingress is not None:
                secrets.revisit(ingresses.secrets_of_ingress(ingress))

    def ingress_changed(ingress: Obj) -> None:
        # Its Secrets may be wanted now, or no longer (deleted, class unmapped).
        secrets.revisit(ingresses.secrets_of_ingress(ingress))

    def by(index: str, key: str | None) -> None:
        if key is not None:
            revisit(store.index_keys(index, key))

    upper_services.add_handlers(_all_changes(lambda s: by(_INGRESS_BY_SERVICE, object_key(s))))
    service_copies.add_handlers(
        _all_changes(lambda c: by(_INGRESS_BY_SERVICE, tenancy.source_key(c)))
    )
    secrets.source.add_handlers(
        _all_changes(lambda s: by(_INGRESS_BY_SECRET, tenancy.target_key(object_key(s))))
    )
    secrets.target.add_handlers(_all_changes(lambda c: by(_INGRESS_BY_SECRET, object_key(c))))
    ingress_mirror.source.add_handlers(_all_changes(ingress_changed))


def _all_changes(changed: Callable[[Obj], None]) -> Handlers:
    return Handlers(on_add=changed, on_modify=changed, on_delete=changed)


_INGRESS_BY_SERVICE = "ingresses-by-service"
_INGRESS_BY_SECRET = "ingresses-by-secret"  # noqa: S105 - an index name


def _selecting_namespaces(
    upper_services: Informer, *, selection: services.ServiceSelection
) -> NamespaceSet:
    """The upper namespaces that hold a mirrored Service with a selector
    (`endpointslices.selects_pods`), as `upper_services` shows them: the only ones whose
    pods an EndpointSlice this node copies can name as verified endpoints
    (`endpointslices.judge`). The set is synced with the Services' informer, whose initial
    list fills it, so at start every such namespace's pods are listed before the slice mirror
    judges a slice. A namespace that joins later is listed from then on: a slice judged
    before its pods arrive loses endpoints for that moment and is looked at again as each
    pod arrives (the slice mirror's pod handlers); a Service's copy below, beside which its
    slices cross, usually comes after that list, a round trip to the lower cluster later.
    Kept in a standby too (its handlers are never held), so a replica that takes over has
    the pods listed already."""
    namespaces = NamespaceSet(source=upper_services)
    selecting: dict[str, set[str]] = {}
    """Upper namespace -> the names of its Services that select pods."""

    def gone(service: Obj) -> None:
        namespace = namespace_of(service)
        names = selecting.get(namespace)
        if names is None:
            return
        names.discard(name_of(service))
        if not names:
            del selecting[namespace]
            namespaces.discard(namespace)

    def seen(service: Obj) -> None:
        if not endpointslices.selects_pods(service, selection=selection):
            gone(service)  # its selector was removed
            return
        namespace = namespace_of(service)
        selecting.setdefault(namespace, set()).add(name_of(service))
        namespaces.add(namespace)

    upper_services.add_handlers(Handlers(on_add=seen, on_modify=seen, on_delete=gone), always=True)
    return namespaces


def _revisit_slices(
    slices: Mirror,
    *,
    upper_services: Informer,
    service_copies: Informer,
    upper_pods: Informer,
    tenancy: naming.NodeTenancy,
) -> None:
    """Look at the upper slices again when what `endpointslices.judge` read for them
    changes: their upper Service (selector, UID, deletion), its lower copy (made, taken,
    gone) or a pod their endpoints name (labels, IPs). The upper EndpointSlice controller
    rewrites its slices after such changes too, but an endpoint this node's caches could
    not verify yet (the pod cache a moment behind) must not wait for the next rewrite; the
    patrol compares every slice with the same decision behind both."""
    store = slices.source.store
    store.add_indexer(_BY_SERVICE, endpointslices.service_of_slice)
    store.add_indexer(_BY_POD, endpointslices.pods_of_slice)

    def by_service(key: str | None) -> None:
        if key is not None:
            slices.revisit(store.index_keys(_BY_SERVICE, key))

    def service_changed(service: Obj) -> None:
        by_service(object_key(service))

    def copy_changed(copy: Obj) -> None:
        by_service(tenancy.source_key(copy))

    def pod_changed(pod: Obj) -> None:
        slices.revisit(store.index_keys(_BY_POD, object_key(pod)))

    def pod_updated(old: Obj, new: Obj) -> None:
        if endpointslices.pod_changed(old, new):
            pod_changed(new)

    for informer, changed in ((upper_services, service_changed), (service_copies, copy_changed)):
        informer.add_handlers(Handlers(on_add=changed, on_modify=changed, on_delete=changed))
    upper_pods.add_handlers(
        Handlers(on_add=pod_changed, on_update=pod_updated, on_delete=pod_changed)
    )


_BY_SERVICE = "endpointslices-by-service"
_BY_POD = "endpointslices-by-pod"


def _problem_recorder(
    recorder: EventRecorder, spec: KindSpec
) -> Callable[[Obj, str], Awaitable[None]]:
    """Report a mirror's problems (conflicts, refusals) as Warning Events on the upper
    object, where `kubectl describe` shows them."""
    api_version = spec.source.api_version

    async def problem(source: Obj, message: str) -> None:
        await recorder.record(
            source,
            type="Warning",
            reason="MirrorFailed",
            message=message,
            kind=spec.kind,
            api_version=api_version,
        )

    return problem


NARROWED = "ServiceTypeNarrowed"
"""Reason of the Event on an upper Service whose lower copy has a narrower type."""
DROPPED = "EndpointsDropped"
"""Reason of the Event on an upper EndpointSlice some of whose endpoints stay upstairs
(`endpointslices.dropped_message`)."""


def _notice_recorder(
    recorder: EventRecorder, spec: KindSpec, *, reason: str
) -> Callable[[Obj, str], Awaitable[None]]:
    """Tell a mirror's notices (e.g. a Service copied as ClusterIP) as Warning Events of
    `reason` on the upper object."""
    api_version = spec.source.api_version

    async def notice(source: Obj, message: str) -> None:
        await recorder.record(
            source,
            type="Warning",
            reason=reason,
            message=message,
            kind=spec.kind,
            api_version=api_version,
        )

    return notice
