"""Copies of what forwarded pods need in the lower cluster: ConfigMaps, Secrets, ServiceAccounts.

- Before a pod is created below, every object it references is copied from the upper
  cluster (created, or brought up to date); a missing mandatory one is an error, not a pod
  that starts without it (tensile-kube's fire-and-forget copies were a defect).
- Later changes of an upper ConfigMap or Secret reach its lower copy (event-driven).
- A copy no lower pod references any more is deleted (garbage collection per namespace).
- Only copies this virtual node made are ever updated or deleted; a same-named lower
  object that is not ours is never touched, and a pod needing it is refused with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vnode import errors as provider_errors
from vnode.kube import errors
from vnode.kube.client import MERGE_PATCH, ApiClient
from vnode.kube.informer import Handlers, Informer
from vnode.kube.resources import CONFIG_MAPS, SECRETS, SERVICE_ACCOUNTS, Resource, split_key
from vnode.kube.store import Obj
from vnode.kube.workqueue import WorkQueue
from vnode.provider import PodEvent
from vnode.providers.k2k import missing, naming, slim, translate

logger = logging.getLogger(__name__)

KINDS: dict[str, Resource] = {
    "ConfigMap": CONFIG_MAPS,
    "Secret": SECRETS,
    "ServiceAccount": SERVICE_ACCOUNTS,
}
# The token controller of the lower cluster owns these; a copy would be deleted or, worse,
# carry upper-cluster credentials with a lower-cluster meaning.
_SKIPPED_SECRET_TYPES = frozenset({"kubernetes.io/service-account-token"})
_COPIED_FIELDS = {
    "ConfigMap": ("data", "binaryData", "immutable"),
    "Secret": ("data", "type", "immutable"),
    "ServiceAccount": ("automountServiceAccountToken",),
}


def copy_of(upper: Mapping[str, Any], *, kind: str, namespace: str, owner: naming.Owner) -> Obj:
    """Return the lower copy of an upper ConfigMap, Secret or ServiceAccount (pure)."""
    meta = upper.get("metadata") or {}
    labels, annotations = naming.owner_marks(owner)
    copy: Obj = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": meta.get("name"),
            "namespace": namespace,
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": annotations,
        },
    }
    for f in _COPIED_FIELDS[kind]:
        if f in upper:
            copy[f] = upper[f]
    return copy


def needs_update(lower: Mapping[str, Any], desired: Mapping[str, Any], *, kind: str) -> bool:
    """Tell whether the lower copy's content differs from the desired copy (pure)."""
    return any(lower.get(f) != desired.get(f) for f in _COPIED_FIELDS[kind] if f != "immutable")


def _same_cluster(obj: Mapping[str, Any], owner: naming.Owner) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return bool(
        labels.get(naming.CLUSTER_LABEL) == naming.label_value(owner.cluster_id)
        and annotations.get(naming.CLUSTER_ANNOTATION) == owner.cluster_id
    )


@dataclass(frozen=True, kw_only=True)
class Ensured:
    """What `DependencySync.ensure` did for a pod."""

    created: list[tuple[str, str, str]]
    """Copies created (kind, lower namespace, name), to roll back if the pod is refused."""
    events: list[PodEvent]
    """Events to record about the pod (optional references it starts without)."""
    absent: frozenset[tuple[str, str]] = frozenset()
    """(kind, name) of the ConfigMaps and Secrets the pod references but that are not
    copied below: the lower pod must not reference them (`translate.lower_pod`)."""


class DependencySync:
    """Keeps the lower copies of pods' dependencies; see the module docstring."""

    def __init__(
        self,
        *,
        upper: ApiClient,
        lower: ApiClient,
        owner: naming.Owner,
        namespace_prefix: str,
        upper_namespace: str | None,
        enable_service_account: bool,
        lower_pods: Informer,
        on_resolved: Callable[[str], None],
    ) -> None:
        """`lower_pods` is the provider's cache of lower pods (`slim`, indexed by
        `slim.by_reference`); `on_resolved(upper pod key)` is called (non-blocking) when an
        object a waiting pod needed is added or changed upstairs, so its creation is
        retried at once."""
        self._on_resolved = on_resolved
        self._waiting: dict[tuple[str, str, str], set[str]] = {}
        """(kind, upper namespace, name) -> upper pods whose creation waits for it."""
        self._upper = upper
        self._lower = lower
        self._owner = owner
        self._prefix = namespace_prefix
        self._enable_sa = enable_service_account
        self._lower_pods = lower_pods
        self.upper_informers = {
            kind: Informer(
                upper,
                resource,
                name=f"upper-{resource.plural}",
                namespace=upper_namespace,
                encoded=True,  # every ConfigMap and Secret upstairs; read when a pod needs one
            )
            for kind, resource in KINDS.items()
        }
        self.lower_informers = {
            kind: Informer(
                lower,
                resource,
                name=f"lower-owned-{resource.plural}",
                label_selector=naming.owner_selector(owner),
            )
            for kind, resource in KINDS.items()
        }
        self.updates = WorkQueue(name="dependencies_from_upper")
        self.collections = WorkQueue(name="dependency_collection")
        # Lower namespaces with a pod creation in flight: their unused copies may be about
        # to be used, so collection waits.
        self._creating: dict[str, int] = {}
        for kind, informer in self.upper_informers.items():
            informer.add_handlers(self._handlers_for(kind))

    def _handlers_for(self, kind: str) -> Handlers:
        def added(obj: Obj) -> None:
            self._upper_changed(kind, obj)

        def updated(_old: Obj, new: Obj) -> None:
            self._upper_changed(kind, new)

        def deleted(obj: Obj) -> None:
            # Its copy stays while pods below use it (as a kubelet keeps a mounted volume);
            # once none does, collection removes it.
            namespace = str((obj.get("metadata") or {}).get("namespace"))
            self.schedule_collection(naming.lower_namespace(namespace, prefix=self._prefix))

        return Handlers(on_add=added, on_update=updated, on_delete=deleted)

    def informers(self) -> list[Informer]:
        """Every informer this syncer needs running."""
        return [*self.upper_informers.values(), *self.lower_informers.values()]

    async def run(self, *, workers: int) -> None:
        """Run the update and collection workers until the queues shut down.

        Every lower namespace holding copies is looked at once at the start: copies left by
        a create that a crash or a restart cut short (copied, but no pod made) have no pod
        whose deletion would ever schedule their collection.
        """
        for informer in self.lower_informers.values():
            for copy in informer.store:
                self.schedule_collection(str(copy["metadata"]["namespace"]))
        async with asyncio.TaskGroup() as group:
            group.create_task(
                self.updates.run(workers=workers, handler=self._sync_update),
                name="dependencies-from-upper",
            )
            group.create_task(
                self.collections.run(workers=1, handler=self._collect), name="dependency-collection"
            )

    async def shut_down(self) -> None:
        """Stop both queues."""
        await self.updates.shut_down()
        await self.collections.shut_down()

    # -- before a pod is created ---------------------------------------------------------

    async def ensure(self, pod: Mapping[str, Any]) -> Ensured:
        """Create or update the lower copies `pod` needs.

        Returns the copies created and the events about optional references skipped.
        Raises MissingDependency for a mandatory object or key missing upstairs (the pod is
        then announced to `on_resolved` once that object is added or changed), InvalidPod
        for a same-named lower object that is not ours, and kube errors for API failures.
        """
        upper_ns = str(pod["metadata"]["namespace"])
        pod_key = f"{upper_ns}/{pod['metadata']['name']}"
        lower_ns = naming.lower_namespace(upper_ns, prefix=self._prefix)
        deps = translate.dependencies(pod)

        def lookup(kind: str, name: str) -> Obj | None:
            return self.upper_informers[kind].store.get(f"{upper_ns}/{name}")

        gaps = missing.unresolved(pod, lookup=lookup)
        self.forget_waiting(pod_key)
        error = missing.first_mandatory(gaps, namespace=upper_ns)
        account = deps.service_account
        if self._enable_sa and account and account != "default":
            if error is None and lookup("ServiceAccount", account) is None:
                error = provider_errors.MissingDependency(
                    f'serviceaccount "{account}" not found',
                    kind="ServiceAccount",
                    namespace=upper_ns,
                    name=account,
                )
        else:
            account = None
        if error is not None:
            self._waiting.setdefault((error.kind, upper_ns, error.name), set()).add(pod_key)
            raise error
        wanted = [("ConfigMap", n) for n in sorted(deps.config_maps)]
        wanted += [("Secret", n) for n in sorted(deps.secrets)]
        if account:
            wanted.append(("ServiceAccount", account))
        created: list[tuple[str, str, str]] = []
        absent: set[tuple[str, str]] = set()
        optional = translate.optional_references(pod)
        for kind, name in wanted:
            source = lookup(kind, name)
            if source is None:
                absent.add((kind, name))  # optional and missing: the pod starts without it
                continue
            if kind == "Secret" and source.get("type") in _SKIPPED_SECRET_TYPES:
                if (kind, name) not in optional:
                    raise provider_errors.InvalidPod(
                        f"Secret {upper_ns}/{name} holds a ServiceAccount token of the upper "
                        "cluster; tensile does not copy upper credentials below, and a lower "
                        "Secret of that name would be someone else's: refusing the pod"
                    )
                absent.add((kind, name))
                continue
            if await self._put(kind, source, lower_ns):
                created.append((kind, lower_ns, name))
        return Ensured(
            created=created,
            events=missing.skipped_events(gaps, namespace=upper_ns),
            absent=frozenset(absent),
        )

    def forget_waiting(self, pod_key: str) -> None:
        """Stop announcing upper pod `pod_key` (namespace/name) when a dependency appears."""
        for what in [w for w, pods in self._waiting.items() if pod_key in pods]:
            self._waiting[what].discard(pod_key)
            if not self._waiting[what]:
                del self._waiting[what]

    async def rollback(self, created: Iterable[tuple[str, str, str]]) -> None:
        """Delete copies made for a pod that was then refused, unless another pod uses them."""
        for kind, ns, name in list(created):
            if not self._in_use(ns, kind, name):
                await self._delete(kind, ns, name)

    def _in_use(self, lower_ns: str, kind: str, name: str) -> bool:
        """Tell whether a lower pod of `lower_ns` (anyone's) references `kind` `name`."""
        index = self._lower_pods.store.index_keys(
            slim.REFS_INDEX, slim.reference(lower_ns, kind, name)
        )
        return bool(index)

    @contextlib.contextmanager
    def creating(self, lower_ns: str) -> Iterator[None]:
        """Mark a pod creation in `lower_ns` while it runs, so collection waits for it."""
        self._creating[lower_ns] = self._creating.get(lower_ns, 0) + 1
        try:
            yield
        finally:
            self._creating[lower_ns] -= 1
            if not self._creating[lower_ns]:
                del self._creating[lower_ns]

    async def _put(self, kind: str, source: Mapping[str, Any], lower_ns: str) -> bool:
        """Make the lower copy equal to `source`; True if it had to be created."""
        name = str(source["metadata"]["name"])
        desired = copy_of(source, kind=kind, namespace=lower_ns, owner=self._owner)
        resource = KINDS[kind]
        current = self.lower_informers[kind].store.get(f"{lower_ns}/{name}")
        if current is None:
            try:
                await self._lower.request("POST", resource.path(namespace=lower_ns), body=desired)
                return True
            except errors.AlreadyExists:
                current = await self._lower.request(
                    "GET", resource.path(namespace=lower_ns, name=name)
                )
        if not naming.is_owned(current, owner=self._owner):
            if _same_cluster(current, self._owner) and not needs_update(
                current, desired, kind=kind
            ):
                # Another virtual node of this upper cluster copied the same upper object
                # into this lower namespace: identical by construction, and kept so by it.
                return False
            raise provider_errors.InvalidPod(
                f"{kind} {lower_ns}/{name} exists in the lower cluster and is "
                f"{naming.owner_of(current)}; refusing to use or overwrite it (the pod would "
                "run with another tenant's object)"
            )
        if needs_update(current, desired, kind=kind):
            await self._update(kind, current, desired)
        return False

    async def _update(self, kind: str, current: Mapping[str, Any], desired: Obj) -> None:
        resource = KINDS[kind]
        meta = current["metadata"]
        if current.get("immutable"):
            # An immutable copy cannot change: replace it (pods already running keep the
            # old content, exactly as with an immutable object upstairs).
            await self._delete(kind, meta["namespace"], meta["name"])
            await self._lower.request(
                "POST", resource.path(namespace=meta["namespace"]), body=desired
            )
            return
        patch = {f: desired.get(f) for f in _COPIED_FIELDS[kind]}
        await self._lower.request(
            "PATCH",
            resource.path(namespace=meta["namespace"], name=meta["name"]),
            body=patch,
            content_type=MERGE_PATCH,
        )

    async def _delete(self, kind: str, namespace: str, name: str) -> None:
        current = self.lower_informers[kind].store.get(f"{namespace}/{name}")
        if current is not None and not naming.is_owned(current, owner=self._owner):
            return
        with contextlib.suppress(errors.NotFound):
            await self._lower.request("DELETE", KINDS[kind].path(namespace=namespace, name=name))

    # -- afterwards ----------------------------------------------------------------------

    def _upper_changed(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        for pod_key in self._waiting.pop(
            (kind, str(meta.get("namespace")), str(meta.get("name"))), ()
        ):
            self._on_resolved(pod_key)
        if kind == "ServiceAccount":
            return
        lower_ns = naming.lower_namespace(str(meta.get("namespace")), prefix=self._prefix)
        if self.lower_informers[kind].store.get(f"{lower_ns}/{meta.get('name')}") is not None:
            self.updates.add(f"{kind}/{meta.get('namespace')}/{meta.get('name')}")

    async def _sync_update(self, key: str) -> None:
        kind, _, rest = key.partition("/")
        upper_ns, name = split_key(rest)
        source = self.upper_informers[kind].store.get(rest)
        lower_ns = naming.lower_namespace(str(upper_ns), prefix=self._prefix)
        current = self.lower_informers[kind].store.get(f"{lower_ns}/{name}")
        if source is None or current is None or not naming.is_owned(current, owner=self._owner):
            return
        desired = copy_of(source, kind=kind, namespace=lower_ns, owner=self._owner)
        if needs_update(current, desired, kind=kind):
            logger.info("updating lower %s %s/%s from the upper cluster", kind, lower_ns, name)
            await self._update(kind, current, desired)

    def schedule_collection(self, lower_ns: str) -> None:
        """Look for unused copies in `lower_ns` soon (after a pod there went away)."""
        self.collections.add_after(lower_ns, 2.0)

    async def _collect(self, lower_ns: str) -> None:
        if self._creating.get(lower_ns):
            self.collections.add_after(lower_ns, 2.0)
            return
        for kind, informer in self.lower_informers.items():
            for copy in list(informer.store):
                meta = copy["metadata"]
                if meta.get("namespace") != lower_ns or self._in_use(lower_ns, kind, meta["name"]):
                    continue
                if kind == "ServiceAccount" and meta["name"] == "default":
                    continue
                logger.info("deleting unused lower %s %s/%s", kind, lower_ns, meta["name"])
                await self._delete(kind, lower_ns, meta["name"])
