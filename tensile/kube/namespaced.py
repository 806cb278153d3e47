"""One informer over a changing set of namespaces: a list+watch per namespace into one store.

For an identity whose rights are namespaced (a RoleBinding in each namespace it may use,
no cluster-wide list), a cluster-wide watch is refused, and a cluster-wide watch narrowed
by a label selector would select objects by marks anyone can forge anyway. A
`NamespacedInformer` watches each namespace of a `NamespaceSet` with a reflector of its
own, all writing into one `Store`, so its readers (mirrors, indexes, handlers) see one
informer as before. Namespaces join the set as they are found or made, and leave it when
they are deleted (their objects leave the store with a delete event each).

The cost is one watch per namespace and kind: a request the apiserver keeps open and a
connection here (HTTP/1.1 carries one watch per connection); docs/tenancy.md measures it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tensile.contracts.objects import Obj
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer, compact
from tensile.kube.reflector import Event, Reflector, ReflectorSettings, Selection
from tensile.kube.resources import Resource

logger = logging.getLogger(__name__)


class NamespaceSet:
    """The namespaces some informers watch, told to each as namespaces come and go.

    Informers over it are synced once `source` (the informer whose handlers fill the set
    with the namespaces that exist) is, and each namespace's list is done."""

    def __init__(self, *, source: Informer | None = None) -> None:
        self._names: set[str] = set()
        self._listeners: list[Callable[[str, bool], None]] = []
        self._source = source

    @property
    def source(self) -> Informer | None:
        """The informer that fills the set (to run with the informers over it)."""
        return self._source

    def has_synced(self) -> bool:
        """Whether the namespaces that exist are all in the set."""
        return self._source is None or self._source.has_synced()

    async def wait_synced(self) -> None:
        """Return once `has_synced`."""
        if self._source is not None:
            await self._source.wait_synced()

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def names(self) -> frozenset[str]:
        """The namespaces in the set now."""
        return frozenset(self._names)

    def add(self, name: str) -> None:
        """Add namespace `name` (nothing when it is in the set)."""
        if name not in self._names:
            self._names.add(name)
            for listener in self._listeners:
                listener(name, True)

    def discard(self, name: str) -> None:
        """Take namespace `name` out (nothing when it is not in the set)."""
        if name in self._names:
            self._names.discard(name)
            for listener in self._listeners:
                listener(name, False)

    def listen(self, listener: Callable[[str, bool], None]) -> None:
        """Call `listener(name, added)` for every later change."""
        self._listeners.append(listener)


class NamespacedInformer(Informer):
    """An `Informer` (same store, handlers, sync and relist) over the namespaces of a
    `NamespaceSet`, one reflector each. Its `selection` names no namespace: it stands for
    all of them, and is listed per namespace (`selections`)."""

    def __init__(
        self,
        client: ApiClient,
        resource: Resource,
        *,
        name: str,
        namespaces: NamespaceSet,
        label_selector: str | None = None,
        field_selector: str | None = None,
        settings: ReflectorSettings | None = None,
        transform: Callable[[Obj], Obj] | None = compact,
        encoded: bool = False,
    ) -> None:
        """As `Informer`, with `namespaces` for its one namespace."""
        # Not the parent's __init__: its one reflector is not made, this informer has one
        # per namespace.
        self._init_cache(name=name, indexers=None, encoded=encoded)
        self._client = client
        self._resource = resource
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._settings = settings or ReflectorSettings()
        self._transform = transform
        self._namespaces = namespaces
        self._reflectors: dict[str, Reflector] = {}
        self._synced_namespaces: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        namespaces.listen(self._namespace_changed)

    def _reflector_for(self, namespace: str) -> Reflector:
        def synced() -> None:
            self._synced_namespaces.add(namespace)
            self._check_synced()

        return Reflector(
            self._client,
            self._resource,
            name=f"{self.name}/{namespace}",
            namespace=namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            store=self.store,
            on_event=self._dispatch,
            on_synced=synced,
            settings=self._settings,
            transform=self._transform,
        )

    def _check_synced(self) -> None:
        if self._namespaces.has_synced() and set(self._reflectors) <= self._synced_namespaces:
            self._synced.set()

    def _namespace_changed(self, namespace: str, added: bool) -> None:
        if added:
            if namespace in self._reflectors:
                return
            self._reflectors[namespace] = self._reflector_for(namespace)
            if self._group is not None:
                self._start(namespace)
            return
        self._reflectors.pop(namespace, None)
        self._synced_namespaces.discard(namespace)
        task = self._tasks.pop(namespace, None)
        if task is not None:
            task.cancel()
        for key in self.store.keys():
            if key.startswith(f"{namespace}/"):
                gone = self.store.delete(key)
                if gone is not None:
                    self._dispatch(Event(type="DELETED", obj=gone))
        self._check_synced()

    def _start(self, namespace: str) -> None:
        assert self._group is not None
        reflector = self._reflectors[namespace]
        self._tasks[namespace] = self._group.create_task(
            reflector.run(), name=f"reflector-{self.name}-{namespace}"
        )

    async def run(self) -> None:
        """List and watch every namespace of the set until cancelled (never returns
        otherwise): each namespace added later gets its reflector at once."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                for namespace in self._namespace_names_sorted():
                    self._start(namespace)
                group.create_task(self._await_set_synced(), name=f"{self.name}-namespaces")
                await asyncio.Event().wait()
            finally:
                self._group = None
                for task in self._tasks.values():
                    task.cancel()
                self._tasks.clear()

    def _namespace_names_sorted(self) -> list[str]:
        for namespace in self._namespaces.names():
            if namespace not in self._reflectors:
                self._reflectors[namespace] = self._reflector_for(namespace)
        return sorted(self._reflectors)

    async def _await_set_synced(self) -> None:
        await self._namespaces.wait_synced()
        self._check_synced()

    def retry_now(self) -> None:
        """Retry every namespace's failed list or watch at once."""
        for reflector in self._reflectors.values():
            reflector.retry_now()

    @property
    def selection(self) -> Selection:
        """The resource and selectors, no namespace (it stands for all of its set)."""
        selectors = {}
        if self._label_selector:
            selectors["labelSelector"] = self._label_selector
        if self._field_selector:
            selectors["fieldSelector"] = self._field_selector
        return Selection(
            client=self._client, resource=self._resource, namespace=None, selectors=selectors
        )

    def selections(self) -> list[Selection]:
        """What each namespace's reflector lists and watches."""
        return [r.selection for _, r in sorted(self._reflectors.items())]

    async def relist(self) -> None:
        """List every namespace again now (see `Reflector.relist`)."""
        async with asyncio.TaskGroup() as group:
            for namespace, reflector in sorted(self._reflectors.items()):
                group.create_task(reflector.relist(), name=f"relist-{self.name}-{namespace}")

    @property
    def last_sync_error(self) -> BaseException | None:
        """The error of a namespace's last failed attempt (any one), None when none failed."""
        for reflector in self._reflectors.values():
            if reflector.last_error is not None:
                return reflector.last_error
        return None
