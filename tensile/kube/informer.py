"""Informer: a reflector filling a store and telling handlers what changed.

Handlers run synchronously on the event loop right after the store changed; they must only
look at the objects and enqueue keys (DESIGN.md: nothing blocks the watch stream).
`wait_synced` returns once the first list is in the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tensile.contracts.objects import Obj
from tensile.kube import metrics
from tensile.kube.client import ApiClient
from tensile.kube.reflector import Event, Reflector, ReflectorSettings, Selection
from tensile.kube.resources import Resource
from tensile.kube.store import IndexFunc, Store

logger = logging.getLogger(__name__)


def compact(obj: Obj) -> Obj:
    """Return `obj` as it is best cached: without metadata.managedFields (server-side apply
    bookkeeping, often the largest part of an object and never read by us). Key strings
    need no interning: the codec shares them between the documents it decodes."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


@dataclass(frozen=True, kw_only=True)
class Handlers:
    """Callbacks for changes. `on_update` gets (old, new); `on_modify` the new state only,
    so an encoded store never decodes the old one for it; `on_delete` the last known
    state."""

    on_add: Callable[[Obj], None] | None = None
    on_update: Callable[[Obj, Obj], None] | None = None
    on_modify: Callable[[Obj], None] | None = None
    on_delete: Callable[[Obj], None] | None = None


class Informer:
    """Watches one resource (optionally one namespace and selectors) into a Store."""

    def __init__(
        self,
        client: ApiClient,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: Mapping[str, IndexFunc] | None = None,
        settings: ReflectorSettings | None = None,
        transform: Callable[[Obj], Obj] | None = compact,
        encoded: bool = False,
    ) -> None:
        """`transform` trims objects before they are cached (default: `compact`); `encoded`
        keeps them as JSON text (see `Store`)."""
        self._init_cache(name=name, indexers=indexers, encoded=encoded)
        self._reflector = Reflector(
            client,
            resource,
            name=name,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            store=self.store,
            on_event=self._dispatch,
            on_synced=self._synced.set,
            settings=settings or ReflectorSettings(),
            transform=transform,
        )

    def _init_cache(
        self, *, name: str, indexers: Mapping[str, IndexFunc] | None, encoded: bool
    ) -> None:
        """The store, the handlers and the sync state: every informer's, however many
        reflectors fill its store (`NamespacedInformer` has one per namespace)."""
        self.name = name
        self.store = Store(indexers=indexers, encoded=encoded)
        self._handlers: list[Handlers] = []
        self._always: list[Handlers] = []
        self._held = False
        """While True the store is kept but no handler is told (a standby replica)."""
        self._synced = asyncio.Event()
        self._cached = metrics.CACHED_OBJECTS.labels(name)  # looked up once
        self._counted = -1
        """The count `_cached` was last set to: most events change no count, and setting a
        gauge takes a lock (3 % of the node's samples when set on every event)."""

    def add_handlers(self, handlers: Handlers, *, always: bool = False) -> None:
        """Register callbacks; add them before `run` so the initial list reaches them.
        `always`: told even while the handlers are held (`hold_handlers`), for callbacks
        that keep what a standby must keep warm too (which namespaces to watch), never
        for ones that queue work."""
        (self._always if always else self._handlers).append(handlers)

    def hold_handlers(self) -> None:
        """Keep the store current but tell no handler of any change until
        `release_handlers` (a standby replica keeps its caches warm and its queues empty)."""
        self._held = True

    def release_handlers(self) -> None:
        """Tell the handlers again, starting with an add of every object in the store, as
        the first list does for a fresh process (client-go tells a handler registered on a
        running informer the same way). Synchronous: no change can come in between."""
        if not self._held:
            return
        self._held = False
        for obj in self.store:
            self._dispatch(Event(type="ADDED", obj=obj))

    def has_synced(self) -> bool:
        """Tell whether the first list has been stored."""
        return self._synced.is_set()

    async def wait_synced(self, *, timeout: float | None = None) -> None:
        """Wait for the first list (`timeout` in seconds). Raises TimeoutError."""
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    async def run(self) -> None:
        """List and watch until cancelled (never returns otherwise)."""
        await self._reflector.run()

    def retry_now(self) -> None:
        """Retry a failed list or watch at once instead of after its backoff."""
        self._reflector.retry_now()

    @property
    def selection(self) -> Selection:
        """What the informer lists and watches (client, resource, namespace, selectors)."""
        return self._reflector.selection

    async def relist(self) -> None:
        """List again now and bring the store to the list (see `Reflector.relist`)."""
        await self._reflector.relist()

    @property
    def last_sync_error(self) -> BaseException | None:
        """The error of the last failed list or watch attempt, cleared by a success."""
        return self._reflector.last_error

    def _dispatch(self, event: Event) -> None:
        count = len(self.store)
        if count != self._counted:
            self._counted = count
            self._cached.set(count)
        for h in self._always if self._held else [*self._always, *self._handlers]:
            try:
                if event.type == "ADDED" and h.on_add is not None:
                    h.on_add(event.obj)
                elif event.type == "MODIFIED":
                    if h.on_update is not None:
                        h.on_update(event.old or event.obj, event.obj)
                    if h.on_modify is not None:
                        h.on_modify(event.obj)
                elif event.type == "DELETED" and h.on_delete is not None:
                    h.on_delete(event.obj)
            except Exception:
                # A failing handler must not stop the watch (tensile-kube's panics on
                # tombstones did); it is a bug to fix, so say it loudly.
                logger.exception("informer %s: handler failed on %s", self.name, event.type)
