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
    Callable,
    Container,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any

from tensile.contracts import ownership, podpolicy
from tensile.contracts.objects import (
    Obj,
    deletion_timestamp_of,
    meta_of,
    namespace_of,
    uid_of,
)
from tensile.kube import errors, timestamps
from tensile.kube.client import STRATEGIC_MERGE_PATCH, ApiClient
from tensile.kube.informer import Informer
from tensile.kube.mirror.engine import Mirror, Refused
from tensile.kube.resources import PODS, object_key
from tensile.serving.lifecycle import Component
from tensile.serving.tracing import NO_TRACING, Tracing
from vnode import provider_errors
from vnode.provider import (
    NodeUsage,
    PodEvent,
    PortSession,
    RemoteCommand,
    RemoteSession,
)
from vnode.providers.k2k import boundtokens, capacity, naming, podsecurity, streams, translate
from vnode.providers.k2k.dependencies import DependencySync
from vnode.providers.k2k.events import EventMirror
from vnode.providers.k2k.lowerpods import LowerPodBook, Write
from vnode.providers.k2k.namespaces import LowerNamespaces
from vnode.providers.k2k.provisioner import VolumeProvisioner
from vnode.providers.k2k.scrape import ResourceScraper
from vnode.providers.k2k.tokens import UpperTokens
from vnode.settings import PV_CONTROLLERS

logger = logging.getLogger(__name__)

PING_TIMEOUT = 5.0
"""Seconds the lower apiserver has to answer a ping (`/readyz`), all of the call included."""
_REFUSALS = (errors.Invalid, errors.Forbidden, errors.BadRequest)
_LOG_CHUNK = 256 * 1024
"""Bytes of log joined into one downstream write at most."""
# The spans of a pod's create, children of the pod controller's sync (its trace: see
# vnode.controllers.pod_traces).
DEPENDENCIES_SPAN = "pod.dependencies"
"""The copies of the pod's ConfigMaps, Secrets and ServiceAccount below."""
VOLUMES_SPAN = "pod.volumes"
"""The claims the node provisions below for the pod (with PVControllers)."""
TOKENS_SPAN = "pod.tokens"
"""The pod's upper ServiceAccount token Secret made below (with --upper-api-address)."""
TRANSLATE_SPAN = "pod.translate"
"""The lower pod made from the upper one (`translate.lower_pod`)."""
LOWER_CREATE_SPAN = "pod.lower_create"
"""The POST of the lower pod; its context is the lower pod's `TRACEPARENT_ANNOTATION`."""


class PodChanges:
    """The callbacks registered with `K2KProvider.notify_pods`; calling it with an upper
    pod's key ("namespace/name") calls each, in the order they came. The provider's
    collaborators hold it too, to tell of a pod whose missing dependency appeared."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[str], None]] = []

    def add(self, callback: Callable[[str], None]) -> None:
        """Register `callback(upper key)`."""
        self._callbacks.append(callback)

    def __call__(self, key: str) -> None:
        for callback in self._callbacks:
            callback(key)


class K2KProvider:
    """Forwards the pods of one virtual node to a lower cluster (built by
    `vnode.providers.k2k.assembly.build`)."""

    name = "k2k-provider"

    def __init__(
        self,
        *,
        lower: ApiClient,
        lower_heartbeat: ApiClient,
        policy: translate.TranslationPolicy,
        node_ip: str,
        namespaces: LowerNamespaces,
        pods: Informer,
        nodes: Informer,
        book: LowerPodBook,
        dependencies: DependencySync,
        events: EventMirror,
        services: Sequence[Mirror],
        volumes: VolumeProvisioner | None,
        usage: ResourceScraper,
        pod_changes: PodChanges,
        adoption: Component | None = None,
        tokens: UpperTokens | None = None,
        publisher: Component | None = None,
        pool: Component | None = None,
        tracing: Tracing = NO_TRACING,
        own_namespaces: Informer | None = None,
    ) -> None:
        """Take the collaborators, ready-made and wired (`assembly.build`): `lower` carries
        the pod, log, exec and port-forward traffic, `lower_heartbeat` answers `ping`;
        `node_ip` is the virtual node's InternalIP (the pods' hostIP upstairs); `pods` and
        `nodes` are the lower cluster's, and their handlers are to call
        `lower_pod_changed`, `lower_pod_deleted` and `capacity_moved`; `book` keeps the
        lower pods' bookkeeping; `services` are the Service mirrors (empty without
        ServiceControllers), `volumes` the provisioner (None without PVControllers);
        `pod_changes` is what `notify_pods` registers with; `adoption` (with
        --adopt-tensile-kube) takes over tensile-kube's lower objects once this process
        may write, before any other component works (its `take_over`); `tokens` (with
        --upper-api-address) gives the lower pods their upper ServiceAccount tokens;
        `publisher` writes the placement summary (None: not published); `pool` reports
        the pods on lower nodes that left --lower-node-selector's pool (None: no pool);
        `tracing` makes spans of a traced pod's create (--trace-exporter);
        `own_namespaces` (with --lower-namespace-role) lists the lower namespaces whose
        copies are watched one by one."""
        self._node_ip = node_ip
        self._lower = lower
        self._heartbeat = lower_heartbeat
        self.policy = policy
        self.namespaces = namespaces
        self.pods = pods
        self.nodes = nodes
        self.book = book
        self.dependencies = dependencies
        self.events = events
        self.services = list(services)
        self.volumes = volumes
        self.usage = usage
        self._pod_changes = pod_changes
        self._adoption = adoption
        self.tokens = tokens
        self._publisher = publisher
        self._pool = pool
        self._tracing = tracing
        self._own_namespaces = own_namespaces
        self._node_callbacks: list[Callable[[], None]] = []
        self._started = False
        self._kubelet_version = "v0.0.0"
        self._refused_resizes: dict[str, translate.RefusedResize] = {}
        """Upper pod UID -> the resize the lower cluster refused for it (`_resize`)."""

    # -- running -------------------------------------------------------------------------

    def informers(self) -> list[Informer]:
        """The lower pods, nodes and pod Events, and the node's own lower namespaces when
        its copies are watched one by one (the copies' informers belong to their mirrors,
        see `components`)."""
        own = [] if self._own_namespaces is None else [self._own_namespaces]
        return [self.pods, self.nodes, self.events.informer, *own]

    def components(self) -> Sequence[Component]:
        """The mirrors of pods' ConfigMaps, Secrets and ServiceAccounts (always run), then
        those --enable-controllers chose: Services and EndpointSlices (ServiceControllers),
        the volume provisioner and its claims mirror (PVControllers); first of all the
        adoption of tensile-kube's objects, when asked for (its `take_over` precedes every
        other component's work)."""
        chosen: list[Component] = [] if self._adoption is None else [self._adoption]
        chosen += [*self.dependencies.components(), *self.services]
        if self.tokens is not None:
            chosen.append(self.tokens)
        if self.volumes is not None:
            chosen += [self.volumes, *self.volumes.components()]
        if self._publisher is not None:
            chosen.append(self._publisher)
        if self._pool is not None:
            chosen.append(self._pool)
        return chosen

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
        meta = meta_of(pod)
        return naming.lower_key(
            f"{meta['namespace']}/{meta['name']}", prefix=self.policy.namespace_prefix
        )

    def _ours(self, lower: Mapping[str, Any] | None) -> bool:
        return self.book.ours(lower)

    def backend_pod(self, pod: Obj) -> Obj | None:
        """Return the lower pod standing for `pod`, or None: the pod this node made for it
        (`LowerPodBook.made`: its marks, its upper UID and the lower UID the node recorded),
        never a pod someone else put at that name with copied marks."""
        lower = self.pods.store.get(self._lower_key(pod))
        if lower is None or not self.book.made(lower):
            return None
        uid = ownership.upper_uid_of(lower)
        return lower if uid == uid_of(pod) else None

    async def create_pod(self, pod: Obj) -> list[PodEvent]:
        """Create the lower pod (with its namespace and dependencies) for `pod`.

        Returns events about optional references the pod starts without, and about fields
        the pod table drops although the tenant asked for them (`translate.dropped_classes`).
        Raises InvalidPod when the pod cannot go below as it is: it is above
        --pod-security-level (`podsecurity`) or the pod table refuses it
        (`podpolicy.refusals`), the lower cluster refuses it (copies made for it are removed
        again), its lower namespace name is invalid or belongs to another tenant, or a lower
        pod or dependency of the same name is not ours (the message names the conflicting
        object; nothing of someone else's is ever adopted or changed).
        Raises MissingDependency, BackendUnavailable, or ProviderError when a stale lower
        pod of the same name is still going away; Requeue while the pod's namespace is
        being deleted, above or below (`LowerNamespaces.going`: below, the pod waits until
        the namespace is gone and makes it again).
        """
        upper_ns = namespace_of(pod)
        problem = naming.namespace_problem(upper_ns, prefix=self.policy.namespace_prefix)
        if problem is not None:
            raise provider_errors.InvalidPod(problem)
        level = self.policy.pod_security_level
        if reasons := podsecurity.violations(pod, level=level):
            raise provider_errors.InvalidPod(
                f'violates PodSecurity "{level}" (--pod-security-level): {"; ".join(reasons)}'
            )
        if reserved := boundtokens.reserved_secret(translate.dependencies(pod).secrets):
            raise provider_errors.InvalidPod(reserved)
        if reasons := podpolicy.refusals(pod, policy=self.policy.pods):
            raise provider_errors.InvalidPod(
                f"refused by the virtual node's pod policy: {'; '.join(reasons)}"
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
        return ownership.owner_of(found)

    async def _create_lower(self, pod: Obj, *, lower_ns: str, lower_key: str) -> list[PodEvent]:
        # A create that fails after copying (the lower apiserver went away, a cancellation)
        # has its copies looked at again once it is over: no pod may use them now.
        with self.dependencies.creating(pod):
            with self._tracing.step(DEPENDENCIES_SPAN):
                ensured = await self.dependencies.ensure(pod)
            provisioned: frozenset[str] = frozenset()
            if self.volumes is not None:
                with self._tracing.step(VOLUMES_SPAN):
                    provisioned = await self.volumes.ensure_for_pod(pod)
            if self.tokens is not None:
                # Its token Secret is the node's before the pod can mount that name.
                try:
                    with self._tracing.step(TOKENS_SPAN):
                        await self.tokens.prepare(pod)
                except provider_errors.InvalidPod:
                    await self.dependencies.rollback(pod, ensured.created)
                    raise
            with self._tracing.step(TRANSLATE_SPAN):
                body = translate.lower_pod(
                    pod, policy=self.policy, absent=ensured.absent, provisioned=provisioned
                )
            uid = uid_of(pod)
            self.book.create_sent(upper_uid=uid, lower_key=lower_key)
            try:
                created = await self._post_pod(body, lower_key=lower_key)
            except errors.AlreadyExists:
                # Our earlier attempt got through; the informer will show it. Its tokens may
                # not have been asked for (that attempt raised before `issue`).
                if self.tokens is not None:
                    self.tokens.issue(pod, body)
                return []
            except errors.ApiError as exc:
                if not errors.is_transient(exc):
                    # An answer: nothing is on its way. (A 5xx or 429 may have got through.)
                    self.book.create_refused(uid)
                if not isinstance(exc, _REFUSALS):
                    raise
                if exc.namespace_terminating:
                    # The namespace is going (deleted below, maybe by hand): the pod waits
                    # for it to be gone and made again, it is not refused.
                    logger.info("lower pod %s waits: %s", lower_key, exc.message)
                    raise self.namespaces.going(lower_ns) from exc
                await self.dependencies.rollback(pod, ensured.created)
                if self.tokens is not None:
                    await self.tokens.discard(pod)
                raise provider_errors.InvalidPod(
                    f"lower cluster refused the pod: {exc.message}"
                ) from exc
        self.book.created(uid, lower_uid=uid_of(created) or None)
        if self.tokens is not None:
            self.tokens.issue(pod, created)
        logger.info("created lower pod %s for upper pod %s", lower_key, object_key(pod))
        # Recorded once, with the create: later syncs patch the pod and say nothing.
        dropped = [
            PodEvent(type="Warning", reason=reason, message=message)
            for reason, message in translate.dropped_classes(pod, policy=self.policy)
        ]
        return [*ensured.events, *dropped]

    async def _post_pod(self, body: Obj, *, lower_key: str) -> Obj:
        """Create `body` below and return the pod created. Traced (the pod's trace is the
        current one), the POST is a span whose context the pod carries
        (`naming.TRACEPARENT_ANNOTATION`), so a lower-side tool can join the trace.
        Raises what the lower apiserver answers (kube errors)."""
        with self._tracing.step(LOWER_CREATE_SPAN, {"tensile.lower.pod": lower_key}):
            traceparent = self._tracing.traceparent()
            if traceparent is not None:
                body["metadata"]["annotations"][naming.TRACEPARENT_ANNOTATION] = traceparent
            namespace = namespace_of(body)
            return await self._lower.request("POST", PODS.path(namespace=namespace), body=body)

    async def update_pod(self, pod: Obj) -> None:
        """Apply image, activeDeadlineSeconds, toleration, label and annotation changes
        (`translate.spec_update`), then a resize (`translate.resize_patch`: the upper pod's
        container cpu and memory, sent to the lower pod's `resize` subresource as kubectl
        patch --subresource resize does). Raises InvalidPod with the lower apiserver's
        message when it refuses the update; a refused resize is not an error but the lower
        node's answer, shown upstairs as Infeasible (`_resize`)."""
        lower = self.backend_pod(pod)
        if lower is None:
            return
        meta = meta_of(lower)
        path = PODS.path(namespace=meta["namespace"], name=meta["name"])
        patch = translate.spec_update(pod, lower, policy=self.policy)
        if patch is not None:
            try:
                await self._lower.request(
                    "PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH
                )
            except _REFUSALS as exc:
                raise provider_errors.InvalidPod(
                    f"lower cluster refused the update: {exc.message}"
                ) from exc
        await self._resize(pod, lower)

    async def _resize(self, pod: Obj, lower: Obj) -> None:
        """Send the upper pod's resize below (`translate.resize_patch`), once per upper
        generation: a refusal is remembered (`translate.RefusedResize`) and shown upstairs
        as the lower node's Infeasible would be, until the upper pod changes again."""
        uid, generation = uid_of(pod), meta_of(pod).get("generation")
        refused = self._refused_resizes.get(uid)
        resize = translate.resize_patch(pod, lower)
        # A refusal stands for its generation until the upper pod is resized again or back.
        stale = refused is not None and (resize is None or refused.generation != generation)
        if stale:
            del self._refused_resizes[uid]
            self._pod_changes(object_key(pod))
        if resize is None or (refused is not None and not stale):
            return
        meta = meta_of(lower)
        try:
            await self._lower.request(
                "PATCH",
                PODS.path(namespace=meta["namespace"], name=meta["name"], subresource="resize"),
                body=resize,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except _REFUSALS as exc:
            if not isinstance(generation, int):
                raise provider_errors.InvalidPod(
                    f"lower cluster refused the resize: {exc.message}"
                ) from exc
            logger.info("lower cluster refused the resize of %s: %s", object_key(pod), exc.message)
            self._refused_resizes[uid] = translate.RefusedResize(
                generation=generation, message=exc.message, at=timestamps.now_rfc3339()
            )
            self._pod_changes(object_key(pod))

    async def delete_pod(self, pod: Obj, *, grace_period: int | None) -> bool:
        """Delete the lower pod gracefully; True once it is gone below.

        A pod whose create is in flight or in doubt (`LowerPodBook.creating`) and whose lower
        pod the cache does not show is looked up in the lower cluster first: "gone" is never
        answered while its POST may have landed. Raises BackendUnavailable while the lower
        cluster cannot tell or cannot take the DELETE (unreachable, 429, 5xx).
        """
        self.dependencies.pod_deleted(object_key(pod))
        if self.volumes is not None:
            self.volumes.forget_waiting(object_key(pod))
        uid = uid_of(pod)
        self._refused_resizes.pop(uid, None)
        lower = self.backend_pod(pod)
        if lower is None and (create := self.book.creating(uid)) is not None:
            lower = await self._landed(create)
        if lower is None:
            if self.tokens is not None:
                await self.tokens.discard(pod)  # made before a create that did not land
            self.book.forget(uid)
            return True
        if deletion_timestamp_of(lower):
            return False
        return await self._delete_lower(lower, grace_period=grace_period)

    async def _landed(self, create: Write) -> Obj | None:
        """Read the lower pod a create in flight or in doubt was for; return it if it is ours
        for that upper UID, None if there is none (or it is someone else's)."""
        namespace, _, name = create.lower_key.partition("/")
        try:
            found = await self._lower.request("GET", PODS.path(namespace=namespace, name=name))
        except errors.NotFound:
            return None
        except errors.TRANSIENT as exc:
            raise provider_errors.BackendUnavailable(f"lower cluster: {exc}") from exc
        if self._ours(found) and str(ownership.upper_uid_of(found)) == create.upper_uid:
            return found
        return None

    async def delete_dangling(self, key: str) -> None:
        """Delete the lower pod of ours standing for upper pod `key` ("namespace/name"),
        which the node does not have (any upper UID): e.g. a create in doubt that landed
        after its upper pod was finalized. Raises BackendUnavailable while the lower
        cluster cannot take the DELETE."""
        lower = self.pods.store.get(naming.lower_key(key, prefix=self.policy.namespace_prefix))
        if (
            lower is None
            or not self._ours(lower)
            or naming.upper_key_of(lower, prefix=self.policy.namespace_prefix) != key
        ):
            return
        if deletion_timestamp_of(lower):
            return
        logger.info("deleting lower pod %s: its upper pod %s is gone", object_key(lower), key)
        await self._delete_lower(lower, grace_period=None)

    async def _delete_lower(self, lower: Obj, *, grace_period: int | None) -> bool:
        """Delete `lower` (this UID only), recorded in flight in the book until the
        informer shows it gone. True when it was gone already."""
        meta = meta_of(lower)
        self.book.delete_sent(
            upper_uid=str(ownership.upper_uid_of(lower)), lower_key=object_key(lower)
        )
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": meta["uid"]},
        }
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        try:
            await self._lower.request(
                "DELETE",
                PODS.path(namespace=meta["namespace"], name=meta["name"]),
                body=body,
                decode=False,  # the informer shows the deletion; the answer is not read
            )
        except (errors.NotFound, errors.Conflict):
            self.book.delete_answered_gone(str(ownership.upper_uid_of(lower)))
            return True  # gone already, or a different pod now has the name
        except errors.TRANSIENT as exc:
            # Unreachable, overloaded or failing: the DELETE may not have happened, and is
            # sent again (its delete in flight stays recorded until the informer shows it).
            raise provider_errors.BackendUnavailable(f"lower cluster: {exc}") from exc
        return False

    async def container_logs(
        self, pod: Obj, *, container: str, options: Mapping[str, str]
    ) -> AsyncGenerator[bytes, None]:
        """Stream the log of `container` of the lower pod standing for `pod`.

        `options` are pods/log query parameters (follow, tailLines, ...). Raises NotFound
        when there is no lower pod yet, BackendUnavailable, or ProviderError with the lower
        apiserver's message (e.g. a container that has not started).
        """
        meta = meta_of(self._lower_of(pod))
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
        meta = meta_of(self._lower_of(pod))
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
            ws = await self._lower.websocket(path, params=params, protocols=streams.EXEC_PROTOCOLS)
        return streams.ChannelSession(ws)

    async def open_port_forward(self, pod: Obj, *, port: int) -> PortSession:
        """Connect to `port` of the lower pod through the lower apiserver (WebSocket
        port-forward, v4.channel.k8s.io). Raises NotFound, BackendUnavailable, ProviderError."""
        meta = meta_of(self._lower_of(pod))
        path = PODS.path(namespace=meta["namespace"], name=meta["name"], subresource="portforward")
        with _as_provider_errors():
            ws = await self._lower.websocket(
                path, params=[("ports", str(port))], protocols=streams.PORT_FORWARD_PROTOCOLS
            )
        return streams.PortChannels(ws)

    def _lower_of(self, pod: Obj) -> Obj:
        lower = self.backend_pod(pod)
        if lower is None:
            raise provider_errors.PodNotFound(
                f"pod {object_key(pod)} has no pod in the lower cluster yet"
            )
        return lower

    def pod_status(self, pod: Obj) -> dict[str, Any] | None:
        """Return the upper status mirrored from the lower pod, or None if there is none."""
        lower = self.backend_pod(pod)
        return None if lower is None else self.status_of(pod, backend=lower)

    def status_of(self, pod: Obj, *, backend: Obj) -> dict[str, Any]:
        """Return the upper status mirrored from `backend`, the lower pod `backend_pod(pod)`
        returned (`BackendStatusOf`: the patrol reads it once)."""
        return translate.upper_status(
            backend,
            upper=pod,
            node_ip=self._node_ip,
            refused=self._refused_resizes.get(uid_of(pod)),
        )

    def backend_stamp(self, pod_key: str, *, upper_uid: str) -> Hashable:
        """What `backend_pod` and `status_of` read besides the upper pod, undecoded
        (`BackendStamp`): the lower pod's key and resourceVersion (its marks, UID and status
        go with it), the lower UID the book recorded for `upper_uid`, the resize the lower
        cluster refused for it, and the node's IP."""
        lower_key = naming.lower_key(pod_key, prefix=self.policy.namespace_prefix)
        return (
            lower_key,
            self.pods.store.version(lower_key),
            self.book.made_for(upper_uid),
            self._refused_resizes.get(upper_uid),
            self._node_ip,
        )

    def vanished(self, pod: Obj) -> bool:
        """Tell whether the lower pod of `pod` was deleted by someone other than us."""
        return self.book.vanished(uid_of(pod))

    def owned_backend_pods(
        self, *, besides: Container[str] = frozenset()
    ) -> Iterator[tuple[str, str]]:
        """(upper "namespace/name", upper UID) of every lower pod of ours that is not being
        deleted (the patrol looks for those without their upper pod), but those whose lower
        key is in `besides` (not even read: the cache decodes each pod it hands out)."""
        store = self.pods.store
        for lower_key in store.keys():
            if lower_key in besides:
                continue
            lower = store.get(lower_key)  # None: deleted since the keys were taken
            if lower is None or not self._ours(lower) or deletion_timestamp_of(lower):
                continue
            key = naming.upper_key_of(lower, prefix=self.policy.namespace_prefix)
            if key is not None:
                yield key, str(ownership.upper_uid_of(lower))

    def backend_writing(self, upper_uid: str) -> bool:
        """Tell whether the book has a create or delete in flight for `upper_uid`."""
        return self.book.writing(upper_uid=upper_uid)

    async def cleanup_dangling(self, upper_pods: Iterable[Obj]) -> None:
        """Delete owned lower pods whose upper pod no longer exists (run once at start)."""
        alive = {uid_of(p) for p in upper_pods}
        for lower in self.pods.store:
            if not self._ours(lower):
                continue
            uid = ownership.upper_uid_of(lower)
            if uid not in alive and not deletion_timestamp_of(lower):
                logger.info("deleting lower pod %s: its upper pod is gone", object_key(lower))
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
        self._pod_changes.add(callback)

    def lower_pod_changed(self, pod: Obj) -> None:
        """Take in a lower pod added or modified (the lower pods informer's handler)."""
        if self.book.seen(pod):
            self.capacity_moved()
        if self._ours(pod):
            self._notify(pod)

    def lower_pod_deleted(self, pod: Obj) -> None:
        """Take in a lower pod deleted (the lower pods informer's handler)."""
        if self.book.gone(pod):
            self.capacity_moved()
        if self._ours(pod):
            self._notify(pod)

    def _notify(self, lower: Obj) -> None:
        if (key := naming.upper_key_of(lower, prefix=self.policy.namespace_prefix)) is not None:
            self._pod_changes(key)

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
        return capacity.node_resources(self.book.free(self.nodes.store))

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

    def capacity_moved(self) -> None:
        """Tell the registered callbacks that the capacity may have changed (a lower node
        or another tenant's pod changed)."""
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
