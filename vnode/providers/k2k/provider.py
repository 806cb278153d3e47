"""The Kubernetes-to-Kubernetes provider: upper pods run as pods of a lower cluster.

It implements the Protocols of `vnode.provider` with the lower cluster's API: informers on
the lower cluster's pods, nodes and events feed the status flow up and the capacity; the
pure modules `translate`, `capacity` and `naming` decide; this module does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any

import aiohttp

from vnode import provider_errors
from vnode.contracts.objects import Obj
from vnode.kube import errors
from vnode.kube.client import STRATEGIC_MERGE_PATCH, ApiClient
from vnode.kube.events import EventRecorder
from vnode.kube.informer import Handlers, Informer
from vnode.kube.informer_factory import InformerFactory
from vnode.kube.mirror.engine import Mirror, Refused
from vnode.kube.mirror.spec import KindSpec
from vnode.kube.resources import NODES, PODS, object_key
from vnode.provider import (
    NodeUsage,
    PodEvent,
    PortSession,
    RemoteCommand,
    RemoteSession,
)
from vnode.providers.k2k import capacity, naming, podsecurity, services, slim, translate, volumes
from vnode.providers.k2k.dependencies import DependencySync
from vnode.providers.k2k.events import EventMirror
from vnode.providers.k2k.namespaces import LowerNamespaces
from vnode.providers.k2k.provisioner import VolumeProvisioner
from vnode.providers.k2k.scrape import KubeletAccess, ResourceScraper, ThroughApiserver
from vnode.serving.lifecycle import Component
from vnode.settings import PV_CONTROLLERS, SERVICE_CONTROLLERS, ControllerSettings

logger = logging.getLogger(__name__)

PING_TIMEOUT = 5.0
"""Seconds the lower apiserver has to answer a ping (`/readyz`), all of the call included."""
_REFUSALS = (errors.Invalid, errors.Forbidden, errors.BadRequest)
_LOG_CHUNK = 256 * 1024
"""Bytes of log joined into one downstream write at most."""


def _upper_key_of(pod: Obj) -> list[str]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    ns = annotations.get(naming.UPPER_NAMESPACE_ANNOTATION)
    return [f"{ns}/{pod['metadata']['name']}"] if ns else []


class K2KProvider:
    """Forwards the pods of one virtual node to a lower cluster."""

    name = "k2k-provider"

    def __init__(
        self,
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
    ) -> None:
        """`informers` shares informers with the node's other components; `node_ip` is the
        virtual node's InternalIP, shown as the pods' hostIP upstairs; `upper_events`
        writes the Events mirrored from below (default `upper`; a client of their own keeps
        a flood of them from delaying statuses); `lower_heartbeat` answers `ping` (default
        `lower`; a client of its own, with its own connections and no rate limit, keeps
        busy pod, log and exec traffic from delaying the node's heartbeats, which wait for
        the ping); `kubelets` how the lower kubelets'
        resource metrics are read (default: through the lower apiserver's node proxy);
        `workers` bounds concurrent copy updates per kind (--pod-sync-workers);
        `controllers` chooses the mirrors of Services and volumes that run beside the
        dependency copies (default: both, as tensile-kube's --enable-controllers)."""
        self._node_ip = node_ip
        self._node = policy.node_name
        self._owner = policy.owner
        self._upper = upper
        self._lower = lower
        self._heartbeat = lower_heartbeat or lower
        self.policy = policy
        self._started = False
        self.namespaces = LowerNamespaces(
            lower=lower,
            upper=upper,
            owner=self._owner,
            prefix=policy.namespace_prefix,
            pod_security_level=policy.pod_security_level,
        )
        self.pods = informers.informer(
            lower,
            PODS,
            name="lower-pods",
            transform=slim.SlimLowerPods(self._owner),
            # Every pod of the lower cluster, read a few times in a pod's life: encoded, a
            # quarter of the memory (see Store); capacity reads `_others`, not this cache.
            encoded=True,
        )
        self._others = capacity.Ledger()
        """Requests of the lower pods that are not this node's (the capacity they take)."""
        self.nodes = informers.informer(lower, NODES, name="lower-nodes")
        self.dependencies = DependencySync(
            upper=upper,
            lower=lower,
            owner=self._owner,
            namespace_prefix=policy.namespace_prefix,
            upper_namespace=upper_namespace,
            enable_service_account=policy.enable_service_account,
            lower_pods=self.pods,
            informers=informers,
            on_resolved=self._notify_key,
            workers=workers,
        )
        self.events = EventMirror(
            upper=upper_events or upper,
            lower=lower,
            owner=self._owner,
            lower_objects=self.pods,
            informers=informers,
        )
        controllers = controllers or ControllerSettings()
        self.services = (
            self._service_mirrors(
                upper=upper,
                upper_events=upper_events or upper,
                lower=lower,
                informers=informers,
                controllers=controllers,
            )
            if SERVICE_CONTROLLERS in controllers.enabled
            else []
        )
        self.volumes = (
            VolumeProvisioner(
                upper=upper,
                upper_events=upper_events or upper,
                lower=lower,
                informers=informers,
                owner=self._owner,
                prefix=policy.namespace_prefix,
                namespaces=self.namespaces,
                classes=volumes.StorageClassMap(
                    classes=controllers.lower_storage_classes,
                    default=controllers.lower_storage_class_default,
                ),
                on_resolved=self._notify_key,
                upper_namespace=upper_namespace,
            )
            if PV_CONTROLLERS in controllers.enabled
            else None
        )
        self.usage = ResourceScraper(
            access=kubelets or ThroughApiserver(lower),
            pods=self.pods.store,
            nodes=self.nodes.store,
            owner=self._owner,
        )
        self._pod_callbacks: list[Callable[[str], None]] = []
        self._node_callbacks: list[Callable[[], None]] = []
        self._deleting: set[str] = set()
        """Upper UIDs whose lower pod this node is deleting."""
        self._vanished: set[str] = set()
        """Upper UIDs whose lower pod was deleted by someone else."""
        self._kubelet_version = "v0.0.0"
        self.pods.add_handlers(
            Handlers(
                on_add=self._pod_changed, on_modify=self._pod_changed, on_delete=self._pod_deleted
            )
        )
        self.nodes.add_handlers(
            Handlers(
                on_add=lambda _n: self._node_changed(),
                on_modify=lambda _n: self._node_changed(),
                on_delete=lambda _n: self._node_changed(),
            )
        )

    # -- running -------------------------------------------------------------------------

    def informers(self) -> list[Informer]:
        """The lower pods, nodes and pod Events (the copies' informers belong to their
        mirrors, see `components`)."""
        return [self.pods, self.nodes, self.events.informer]

    def components(self) -> Sequence[Component]:
        """The mirrors of pods' ConfigMaps, Secrets and ServiceAccounts (always run), then
        those --enable-controllers chose: Services and EndpointSlices (ServiceControllers),
        the volume provisioner and its claims mirror (PVControllers)."""
        chosen: list[Component] = [*self.dependencies.components(), *self.services]
        if self.volumes is not None:
            chosen += [self.volumes, *self.volumes.components()]
        return chosen

    def _service_mirrors(
        self,
        *,
        upper: ApiClient,
        upper_events: ApiClient,
        lower: ApiClient,
        informers: InformerFactory,
        controllers: ControllerSettings,
    ) -> list[Mirror]:
        selection = services.ServiceSelection(namespaces=frozenset(controllers.service_namespaces))
        # One namespace: watch only it (and need only a Role there upstairs).
        only = controllers.service_namespaces
        namespace = only[0] if len(only) == 1 else None
        prefix = self.policy.namespace_prefix
        recorder = EventRecorder(
            upper_events, component=f"{self._node}/service-mirror", host=self._node
        )
        tenancy = naming.NodeTenancy(owner=self._owner, prefix=prefix)
        mirrors = []
        for make in (services.service_spec, services.slice_spec):
            spec = make(tenancy=tenancy, selection=selection)
            resource = spec.source
            mirrors.append(
                Mirror(
                    spec=spec,
                    tenancy=tenancy,
                    source=informers.informer(
                        upper, resource, name=f"upper-{resource.plural}", namespace=namespace
                    ),
                    # Every copy of this upper cluster's (ours and sibling nodes'), so a
                    # copy whose maker is gone is still kept (see `Mirror`).
                    target=informers.informer(
                        lower,
                        resource,
                        name=f"lower-copies-{resource.plural}",
                        label_selector=naming.cluster_selector(self._owner),
                    ),
                    source_client=upper,
                    target_client=lower,
                    namespaces=self.namespaces,
                    on_problem=_problem_recorder(recorder, spec),
                )
            )
        return mirrors

    async def start(self) -> None:
        """Read what must be known before the first pod: the lower cluster's version.
        Raises kube errors when the lower cluster does not answer."""
        version = await self._lower.request("GET", "/version")
        self._kubelet_version = str(version.get("gitVersion") or "v0.0.0")
        self._started = True

    def ready(self) -> bool:
        """Whether the lower cluster's version is known and the lower caches synced."""
        return self._started and all(i.has_synced() for i in self.informers())

    async def run(self) -> None:
        """Run the provider's own workers (lower Events mirrored up)."""
        await self.events.queue.run(workers=4, handler=self.events.sync)

    async def shut_down(self) -> None:
        """Stop the provider's queue."""
        await self.events.queue.shut_down()

    # -- PodLifecycleHandler ---------------------------------------------------------------

    def _lower_key(self, pod: Mapping[str, Any]) -> str:
        meta = pod["metadata"]
        ns = naming.lower_namespace(str(meta["namespace"]), prefix=self.policy.namespace_prefix)
        return f"{ns}/{meta['name']}"

    def _ours(self, lower: Mapping[str, Any] | None) -> bool:
        return lower is not None and naming.is_owned(lower, owner=self._owner)

    def backend_pod(self, pod: Obj) -> Obj | None:
        """Return the lower pod standing for `pod` (same upper UID), or None."""
        lower = self.pods.store.get(self._lower_key(pod))
        if not self._ours(lower) or lower is None:
            return None
        uid = (lower["metadata"].get("annotations") or {}).get(naming.UPPER_UID_ANNOTATION)
        return lower if uid == pod["metadata"].get("uid") else None

    async def create_pod(self, pod: Obj) -> list[PodEvent]:
        """Create the lower pod (with its namespace and dependencies) for `pod`.

        Returns events about optional references the pod starts without. Raises InvalidPod
        when the pod cannot go below as it is: the lower cluster refuses it (copies made for
        it are removed again), its lower namespace name is invalid or belongs to another
        tenant, or a lower pod or dependency of the same name is not ours (the message names
        the conflicting object; nothing of someone else's is ever adopted or changed).
        Raises MissingDependency, BackendUnavailable, or ProviderError when a stale lower
        pod of the same name is still going away; Requeue while the pod's namespace is
        being deleted, above or below (`LowerNamespaces.going`: below, the pod waits until
        the namespace is gone and makes it again).
        """
        upper_ns = str(pod["metadata"]["namespace"])
        problem = naming.namespace_problem(upper_ns, prefix=self.policy.namespace_prefix)
        if problem is not None:
            raise provider_errors.InvalidPod(problem)
        level = self.policy.pod_security_level
        if reasons := podsecurity.violations(pod, level=level):
            raise provider_errors.InvalidPod(
                f'violates PodSecurity "{level}" (--pod-security-level): {"; ".join(reasons)}'
            )
        if self.volumes is None and (claims := _claims_of(pod)):
            raise provider_errors.InvalidPod(
                f"the pod mounts PersistentVolumeClaim {claims[0]}, and this virtual node runs "
                f"without {PV_CONTROLLERS} (--enable-controllers): its claims are not brought "
                "below"
            )
        lower_key = self._lower_key(pod)
        lower_ns, _, _name = lower_key.partition("/")
        existing = self.pods.store.get(lower_key)
        if existing is not None and self.backend_pod(pod) is None:
            if not self._ours(existing):
                raise provider_errors.InvalidPod(
                    f"pod {lower_key} exists in the lower cluster and is "
                    f"{await self._owner_of_pod(lower_key)}; refusing to adopt or replace it"
                )
            await self._delete_lower(existing, grace_period=0)
            raise provider_errors.ProviderError(
                f"waiting for lower pod {lower_key} of an earlier pod of the same name to go"
            )
        try:
            for attempt in (1, 2):
                await self._ensure_namespace(lower_ns, upper_namespace=upper_ns)
                try:
                    return await self._create_lower(pod, lower_ns=lower_ns, lower_key=lower_key)
                except errors.NotFound:
                    # The lower namespace was deleted under us (the only NotFound a create
                    # gets): make it again, once.
                    self.namespaces.forget(lower_ns)
                    if attempt == 2:
                        raise
        except errors.TRANSIENT as exc:
            # Down, failing or overloaded (429s the client's own retries did not outlast):
            # nothing is wrong with the pod, it waits.
            raise provider_errors.BackendUnavailable(f"lower cluster: {exc}") from exc
        except errors.NotFound as exc:
            raise provider_errors.ProviderError(
                f"lower namespace {lower_ns} keeps disappearing: {exc.message}"
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _owner_of_pod(self, lower_key: str) -> str:
        # The cache keeps no annotations of others' pods (see slim): read the one in the way.
        namespace, _, name = lower_key.partition("/")
        try:
            found = await self._lower.request("GET", PODS.path(namespace=namespace, name=name))
        except (errors.ApiError, errors.ApiUnavailable):
            return "not managed by this virtual node"
        return naming.owner_of(found)

    async def _create_lower(self, pod: Obj, *, lower_ns: str, lower_key: str) -> list[PodEvent]:
        # A create that fails after copying (the lower apiserver went away, a cancellation)
        # has its copies looked at again once it is over: no pod may use them now.
        with self.dependencies.creating(pod):
            ensured = await self.dependencies.ensure(pod)
            if self.volumes is not None:
                await self.volumes.ensure_for_pod(pod)
            body = translate.lower_pod(pod, policy=self.policy, absent=ensured.absent)
            try:
                await self._lower.request("POST", PODS.path(namespace=lower_ns), body=body)
            except errors.AlreadyExists:
                return []  # our earlier attempt got through; the informer will show it
            except _REFUSALS as exc:
                if exc.namespace_terminating:
                    # The namespace is going (deleted below, maybe by hand): the pod waits
                    # for it to be gone and made again, it is not refused.
                    logger.info("lower pod %s waits: %s", lower_key, exc.message)
                    raise self.namespaces.going(lower_ns) from exc
                await self.dependencies.rollback(pod, ensured.created)
                raise provider_errors.InvalidPod(
                    f"lower cluster refused the pod: {exc.message}"
                ) from exc
        self._vanished.discard(str(pod["metadata"].get("uid")))
        logger.info("created lower pod %s for upper pod %s", lower_key, _key(pod))
        return ensured.events

    async def update_pod(self, pod: Obj) -> None:
        """Apply image, activeDeadlineSeconds, toleration, label and annotation changes."""
        lower = self.backend_pod(pod)
        if lower is None:
            return
        patch = translate.spec_update(pod, lower, policy=self.policy)
        if patch is None:
            return
        meta = lower["metadata"]
        try:
            await self._lower.request(
                "PATCH",
                PODS.path(namespace=meta["namespace"], name=meta["name"]),
                body=patch,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except _REFUSALS as exc:
            raise provider_errors.InvalidPod(
                f"lower cluster refused the update: {exc.message}"
            ) from exc

    async def delete_pod(self, pod: Obj, *, grace_period: int | None) -> bool:
        """Delete the lower pod gracefully; True once it is gone below."""
        self.dependencies.pod_deleted(_key(pod))
        if self.volumes is not None:
            self.volumes.forget_waiting(_key(pod))
        lower = self.backend_pod(pod)
        if lower is None:
            return True
        if lower["metadata"].get("deletionTimestamp"):
            return False
        self._deleting.add(str(pod["metadata"].get("uid")))
        return await self._delete_lower(lower, grace_period=grace_period)

    async def _delete_lower(self, lower: Obj, *, grace_period: int | None) -> bool:
        meta = lower["metadata"]
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": meta["uid"]},
        }
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        try:
            await self._lower.request(
                "DELETE", PODS.path(namespace=meta["namespace"], name=meta["name"]), body=body
            )
        except (errors.NotFound, errors.Conflict):
            return True  # gone already, or a different pod now has the name
        except errors.ApiUnavailable as exc:
            raise provider_errors.BackendUnavailable(str(exc)) from exc
        return False

    async def container_logs(
        self, pod: Obj, *, container: str, options: Mapping[str, str]
    ) -> AsyncGenerator[bytes, None]:
        """Stream the log of `container` of the lower pod standing for `pod`.

        `options` are pods/log query parameters (follow, tailLines, ...). Raises NotFound
        when there is no lower pod yet, BackendUnavailable, or ProviderError with the lower
        apiserver's message (e.g. a container that has not started).
        """
        meta = self._lower_of(pod)["metadata"]
        path = PODS.path(namespace=meta["namespace"], name=meta["name"], subresource="log")
        with _as_provider_errors():
            async with self._lower.stream(
                path, params={"container": container, **options}, accept="*/*"
            ) as response:
                content = response.content
                while chunk := await content.readany():
                    # What else has already arrived goes out with it: fewer, larger writes
                    # downstream, and never a wait for more (follow stays live).
                    parts, size = [chunk], len(chunk)
                    while size < _LOG_CHUNK and (more := content.read_nowait(_LOG_CHUNK - size)):
                        parts.append(more)
                        size += len(more)
                    yield b"".join(parts) if len(parts) > 1 else chunk

    async def open_exec(
        self, pod: Obj, *, container: str, options: RemoteCommand, attach: bool
    ) -> RemoteSession:
        """Start `options.command` (or attach) in the lower pod, over a WebSocket to the
        lower apiserver (v5.channel.k8s.io, else v4). Raises NotFound, BackendUnavailable
        or ProviderError (with the lower apiserver's refusal)."""
        meta = self._lower_of(pod)["metadata"]
        params = [("container", container)]
        if not attach:
            params += [("command", c) for c in options.command]
        for name, value in (
            ("stdin", options.stdin),
            ("stdout", options.stdout),
            ("stderr", options.stderr),
            ("tty", options.tty),
        ):
            params.append((name, "true" if value else "false"))
        path = PODS.path(
            namespace=meta["namespace"],
            name=meta["name"],
            subresource="attach" if attach else "exec",
        )
        with _as_provider_errors():
            ws = await self._lower.websocket(
                path, params=params, protocols=("v5.channel.k8s.io", "v4.channel.k8s.io")
            )
        return _ChannelSession(ws)

    async def open_port_forward(self, pod: Obj, *, port: int) -> PortSession:
        """Connect to `port` of the lower pod through the lower apiserver (WebSocket
        port-forward, v4.channel.k8s.io). Raises NotFound, BackendUnavailable, ProviderError."""
        meta = self._lower_of(pod)["metadata"]
        path = PODS.path(namespace=meta["namespace"], name=meta["name"], subresource="portforward")
        with _as_provider_errors():
            ws = await self._lower.websocket(
                path, params=[("ports", str(port))], protocols=("v4.channel.k8s.io",)
            )
        return _PortChannels(ws)

    def _lower_of(self, pod: Obj) -> Obj:
        lower = self.backend_pod(pod)
        if lower is None:
            raise provider_errors.PodNotFound(
                f"pod {_key(pod)} has no pod in the lower cluster yet"
            )
        return lower

    def pod_status(self, pod: Obj) -> dict[str, Any] | None:
        """Return the upper status mirrored from the lower pod, or None if there is none."""
        lower = self.backend_pod(pod)
        if lower is None:
            return None
        return translate.upper_status(lower, upper=pod, node_ip=self._node_ip)

    def vanished(self, pod: Obj) -> bool:
        """Tell whether the lower pod of `pod` was deleted by someone other than us."""
        return str(pod["metadata"].get("uid")) in self._vanished

    async def cleanup_dangling(self, upper_pods: Iterable[Obj]) -> None:
        """Delete owned lower pods whose upper pod no longer exists (run once at start)."""
        alive = {str(p["metadata"].get("uid")) for p in upper_pods}
        for lower in self.pods.store:
            if not self._ours(lower):
                continue
            uid = (lower["metadata"].get("annotations") or {}).get(naming.UPPER_UID_ANNOTATION)
            if uid not in alive and not lower["metadata"].get("deletionTimestamp"):
                logger.info("deleting lower pod %s: its upper pod is gone", _key(lower))
                await self._delete_lower(lower, grace_period=None)

    async def _ensure_namespace(self, name: str, *, upper_namespace: str) -> None:
        """Create the lower namespace `name` for `upper_namespace`, or check that the existing
        one may take its pods (`naming.namespace_conflict`); raises InvalidPod if not."""
        try:
            await self.namespaces.ensure(name, source_namespace=upper_namespace)
        except Refused as exc:
            raise provider_errors.InvalidPod(str(exc)) from exc

    # -- MetricsProvider --------------------------------------------------------------------

    async def resource_usage(self) -> NodeUsage:
        """Return the usage of this node's pods, read from the lower kubelets (see `scrape`)."""
        return await self.usage.resource_usage()

    # -- PodNotifier ------------------------------------------------------------------------

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        """Register `callback(upper key)` for every change of an owned lower pod."""
        self._pod_callbacks.append(callback)

    def _notify(self, lower: Obj) -> None:
        for key in _upper_key_of(lower):
            self._notify_key(key)

    def _notify_key(self, key: str) -> None:
        for callback in self._pod_callbacks:
            callback(key)

    def _count(self, pod: Obj) -> None:
        """Keep `_others` up to date with a lower pod's new state; tell the node controller
        when the capacity moved."""
        key = object_key(pod)
        try:
            changed = self._others.remove(key) if self._ours(pod) else self._others.put(key, pod)
        except ValueError as exc:  # the lower apiserver validates quantities: not expected
            logger.warning("lower pod %s: not counted against the capacity: %s", key, exc)
            changed = self._others.remove(key)
        if changed:
            self._node_changed()

    def _pod_changed(self, pod: Obj) -> None:
        self._count(pod)
        if self._ours(pod):
            self._notify(pod)

    def _pod_deleted(self, pod: Obj) -> None:
        if self._others.remove(object_key(pod)):
            self._node_changed()
        if not self._ours(pod):
            return
        uid = str((pod["metadata"].get("annotations") or {}).get(naming.UPPER_UID_ANNOTATION))
        if uid in self._deleting:
            self._deleting.discard(uid)
        else:
            self._vanished.add(uid)
        self._notify(pod)

    # -- NodeProvider -----------------------------------------------------------------------

    async def ping(self) -> None:
        """Return if the lower apiserver answers `/readyz` within PING_TIMEOUT seconds;
        raise BackendUnavailable otherwise. The bound covers the whole call (a wait for a
        rate slot or a connection, retries): a ping that comes late delays the node's
        Lease renewal by as much."""
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                await self._heartbeat.request("GET", "/readyz")
        except TimeoutError as exc:
            raise provider_errors.BackendUnavailable(
                f"lower cluster: /readyz did not answer within {PING_TIMEOUT:g}s"
            ) from exc
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            raise provider_errors.BackendUnavailable(f"lower cluster: {exc}") from exc

    def capacity(self) -> Mapping[str, str]:
        """Return what the lower cluster can still take for this node's pods."""
        return capacity.node_resources(self._others.free(self.nodes.store))

    def node_info(self) -> Mapping[str, str]:
        """Return status.nodeInfo: the lower apiserver's version stands for the kubelet's."""
        return {
            "kubeletVersion": self._kubelet_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": f"tensile://{self._kubelet_version}",
            "osImage": "tensile virtual node",
        }

    def notify_node_changed(self, callback: Callable[[], None]) -> None:
        """Register `callback()` for changes that may change the capacity."""
        self._node_callbacks.append(callback)

    def _node_changed(self) -> None:
        for callback in self._node_callbacks:
            callback()


@contextlib.contextmanager
def _as_provider_errors() -> Iterator[None]:
    """Report the lower apiserver's errors in the provider's vocabulary."""
    try:
        yield
    except errors.NotFound as exc:
        raise provider_errors.PodNotFound(exc.message) from exc
    except errors.ApiUnavailable as exc:
        raise provider_errors.BackendUnavailable(str(exc)) from exc
    except errors.ApiError as exc:
        raise provider_errors.ProviderError(exc.message or str(exc)) from exc


def _claims_of(pod: Mapping[str, Any]) -> list[str]:
    return [
        str(v["persistentVolumeClaim"].get("claimName"))
        for v in (pod.get("spec") or {}).get("volumes") or []
        if v.get("persistentVolumeClaim")
    ]


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


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


class _ChannelSession:
    """A command running below, over the WebSocket channel protocol (v4 or v5)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._v5 = ws.protocol == "v5.channel.k8s.io"

    async def send(self, channel: int, data: bytes) -> None:
        if not self._ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._ws.send_bytes(bytes([channel]) + data)

    async def close_stdin(self) -> None:
        # v5's CLOSE signal half-closes stdin; v4 cannot, as with kubectl itself.
        if self._v5 and not self._ws.closed:
            await self._ws.send_bytes(bytes([255, 0]))

    async def receive(self) -> tuple[int, bytes] | None:
        while True:
            message = await self._ws.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                data = bytes(message.data)
                if len(data) > 1:
                    return data[0], data[1:]
                continue  # an empty message only says the session is up
            if message.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.ERROR,
            ):
                return None

    async def close(self) -> None:
        await self._ws.close()


class _PortChannels:
    """One forwarded connection over the WebSocket port-forward protocol: channel 0 carries
    the data, channel 1 the error; each channel first carries the port (2 bytes)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._started: set[int] = set()
        self._error = b""

    async def send(self, data: bytes) -> None:
        if not self._ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._ws.send_bytes(b"\x00" + data)

    async def receive(self) -> bytes | None:
        while True:
            message = await self._ws.receive()
            if message.type != aiohttp.WSMsgType.BINARY:
                return None
            data = bytes(message.data)
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel not in self._started:
                self._started.add(channel)
                payload = payload[2:]  # the port, little-endian
            if channel == 0 and payload:
                return payload
            if channel == 1:
                self._error += payload

    def error(self) -> str:
        return self._error.decode("utf-8", errors="replace")

    async def close(self) -> None:
        await self._ws.close()
