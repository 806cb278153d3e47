"""Reflector: keep a Store equal to the server's state of one resource, by list then watch.

What client-go's reflector does, with the lessons of the Python clients' watch bugs:
- list in pages (`ApiClient.pages`, which starts a list over when its continue token
  expires), then watch from the list's resourceVersion with bookmarks and a
  server-side timeout (jittered, so many watches do not expire together); each page goes
  into the store as it arrives, and objects no page named are deleted after the last one,
  so a relist of 10,000 pods never holds more than one page of full objects (client-go's
  Replace takes the whole list at once; the store ends up the same);
- a 410 Gone, as the watch request's HTTP status or as an ERROR event in the stream,
  means the resourceVersion was compacted: list again and emit DELETED for every object
  that vanished in the gap (a relist diff, so no deletion is missed);
- a stream that goes silent (no event and no bookmark for `idle_timeout`) is dropped and
  re-watched: half-open TCP connections otherwise hang forever;
- other failures back off exponentially with jitter; after several in a row, relist;
- `relist()` lists again on demand (the patrol's answer to a store that missed an event):
  the running watch is ended and the list dispatches every difference, as after a 410.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from tensile.contracts.objects import Obj, resource_version_of
from tensile.kube import codec, errors, metrics
from tensile.kube.backoff import ExponentialBackoff, jittered
from tensile.kube.client import ApiClient
from tensile.kube.resources import Resource, object_key
from tensile.kube.store import Store, decoded

logger = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Longest watch event line accepted, in bytes: far above the largest object etcd stores
(about 1.5 MiB by default), so only a broken or hostile stream reaches it."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """A change of the store: the new object (or the last state, for DELETED) and the old one."""

    type: EventType
    obj: Obj
    previous: Obj | bytes | None = None
    """The state a MODIFIED replaced, as the store held it (bytes in an encoded store)."""

    @property
    def old(self) -> Obj | None:
        """The state a MODIFIED replaced (decoded now, for an encoded store)."""
        return None if self.previous is None else decoded(self.previous)


@dataclass(frozen=True, kw_only=True)
class ReflectorSettings:
    """Timing of list and watch; every duration is in seconds."""

    page_size: int = 100
    """Objects per list page (limit/continue). Smaller than client-go's 500 on purpose: the
    memory a page takes while it is decoded stays scattered among what is kept afterwards;
    a node restarted with 1,000 pods held 103 MiB listing 500 at a time, 87 MiB listing
    100 (bench/forwarding.py's memory after a relist)."""
    watch_timeout: tuple[float, float] = (300.0, 600.0)
    """Range of the server-side watch timeout (timeoutSeconds), picked at random per watch."""
    idle_timeout: float = 150.0
    """Re-watch when nothing (not even a bookmark) arrived for this long."""
    backoff: ExponentialBackoff = field(
        default_factory=lambda: ExponentialBackoff(base=0.5, cap=30.0)
    )
    """Delay between failed attempts."""
    relist_after_failures: int = 5
    """Consecutive failed watches after which the next attempt lists again."""


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What one reflector lists and watches."""

    client: ApiClient
    resource: Resource
    namespace: str | None
    """The one namespace watched, or None for all."""
    selectors: dict[str, str]
    """The list parameters labelSelector and fieldSelector, when set."""


class Reflector:
    """Lists and watches one resource into a Store, reporting each change to `on_event`."""

    def __init__(
        self,
        client: ApiClient,
        resource: Resource,
        *,
        name: str,
        store: Store,
        on_event: Callable[[Event], None],
        on_synced: Callable[[], None] = lambda: None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        settings: ReflectorSettings | None = None,
        transform: Callable[[Obj], Obj] | None = None,
    ) -> None:
        """`transform` (like client-go's SetTransform) trims each object before it is stored."""
        self.name = name
        self._transform = transform
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._path = resource.path(namespace=namespace)
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["labelSelector"] = label_selector
        if field_selector:
            self._selectors["fieldSelector"] = field_selector
        self._store = store
        self._on_event = on_event
        self._on_synced = on_synced
        self._settings = settings or ReflectorSettings()
        self._rv: str | None = None
        self._progress = False
        """Whether the current attempt listed or received anything (resets failure counts)."""
        self._wake = asyncio.Event()
        self._relists: list[asyncio.Future[None]] = []
        """Callers of `relist` waiting for the next complete list."""
        self._response: Any = None
        """The watch response being read, so `relist` can end it."""
        self.last_error: BaseException | None = None
        """The error of the last failed attempt; None after a success."""

    async def run(self) -> None:
        """List and watch until cancelled."""
        failures = 0
        while True:
            self._progress = False
            try:
                if self._relists:
                    self._rv = None
                if self._rv is None:
                    await self._list_for_waiters()
                    self._progress = True
                    self._on_synced()
                await self._watch()
            except errors.Gone:
                logger.info(
                    "reflector %s: resourceVersion %s expired; listing again", self.name, self._rv
                )
                self._rv = None
                if not self._progress:
                    # A 410 before anything worked (a proxy, a list's first page): do not
                    # spin; back off like any other failure.
                    failures += 1
                    await self._pause(jittered(self._settings.backoff.delay(failures - 1)))
                    continue
            except errors.WatchIdle:
                # Quiet resources get no bookmarks for minutes: dropping a silent stream
                # is the watchdog doing its job (half-open connections), not a failure.
                logger.debug(
                    "reflector %s: no events for %.0fs; watching again",
                    self.name,
                    self._settings.idle_timeout,
                )
            except (errors.ApiError, errors.ApiUnavailable, ValueError) as exc:
                if self._relists and self._rv is not None:
                    continue  # `relist` ended the watch: no failure, list at once
                # ValueError: a body that is not JSON (a proxy's page, a truncated line).
                # Failures count as consecutive only without progress in between.
                failures = failures + 1 if not self._progress else 1
                self.last_error = exc
                if failures >= self._settings.relist_after_failures:
                    self._rv = None
                delay = jittered(self._settings.backoff.delay(failures - 1))
                logger.warning("reflector %s: %s; retrying in %.1fs", self.name, exc, delay)
                await self._pause(delay)
                continue
            # The list or the watch worked (even if the stream then ended or went quiet).
            failures = 0
            self.last_error = None

    def retry_now(self) -> None:
        """Cut a pending backoff short (the server is known to be back)."""
        self._wake.set()

    @property
    def selection(self) -> Selection:
        """What this reflector lists and watches."""
        return Selection(
            client=self._client,
            resource=self._resource,
            namespace=self._namespace,
            selectors=dict(self._selectors),
        )

    async def relist(self) -> None:
        """List again now, as after a 410 Gone: the running watch is ended, the store is
        brought to the list's state (handlers told of every difference, deletions
        included), and the watch resumes from the list. Returns once such a list has
        completed (a failed list is retried, with backoff, as any other; bound the wait
        with a timeout). For a store suspected to differ from its server (a missed event)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._relists.append(done)
        self._wake.set()
        if self._response is not None:
            self._response.close()
        await done

    async def _list_for_waiters(self) -> None:
        waiters, self._relists = self._relists, []
        try:
            await self._list()
        except BaseException:
            self._relists[:0] = waiters  # the next list answers them
            raise
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _pause(self, delay: float) -> None:
        self._wake.clear()
        try:
            async with asyncio.timeout(delay):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _list(self) -> None:
        metrics.RELISTS.labels(self.name).inc()
        seen: set[str] = set()
        # An expired continue token starts the list over (`ApiClient.pages`); a 410 on the
        # first page is raised, and `run` backs off before listing again.
        async for page in self._client.pages(
            self._path, limit=self._settings.page_size, params=self._selectors
        ):
            if page.restarted:
                # What the pages so far stored stays (it is newer than what it replaced);
                # only objects the new list does not name again are deleted at its end.
                seen.clear()
            self._store_page(page.items, seen=seen)
            if page.last:
                self._delete_unseen(seen)
                self._rv = page.resource_version

    def _store_page(self, items: list[Obj], *, seen: set[str]) -> None:
        # Each decoded object is let go as soon as it is stored, so the memory of the page
        # is reused for what is kept, rather than left in pieces around it.
        items.reverse()
        while items:
            item = items.pop()
            obj = self._transform(item) if self._transform is not None else item
            del item
            seen.add(object_key(obj))
            changed, previous = self._store.update(obj)
            if changed:
                kind: EventType = "ADDED" if previous is None else "MODIFIED"
                self._on_event(Event(type=kind, obj=obj, previous=previous))

    def _delete_unseen(self, seen: set[str]) -> None:
        # What the list did not name was deleted while no watch was running. A namespaced
        # reflector answers for its namespace only: a store may be shared by the reflectors
        # of several namespaces (`tensile.kube.namespaced`).
        mine = f"{self._namespace}/" if self._namespace else ""
        for key in self._store.keys():
            if key not in seen and key.startswith(mine):
                gone = self._store.delete(key)
                if gone is not None:
                    self._on_event(Event(type="DELETED", obj=gone))

    async def _watch(self) -> None:
        low, high = self._settings.watch_timeout
        params = {
            **self._selectors,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self._rv or "",
            "timeoutSeconds": str(int(random.uniform(low, high))),  # noqa: S311 - jitter only
        }
        async with self._client.stream(self._path, params=params) as response:
            self._response = response
            try:
                await self._read_watch(response)
            finally:
                self._response = None

    async def _read_watch(self, response: Any) -> None:
        if self._relists:
            return  # asked for before the response came: list first
        buffer = bytearray()
        async for chunk in _idle_bounded(
            response, self._settings.idle_timeout, ended=lambda: bool(self._relists)
        ):
            if self._relists:
                return  # what is left of the stream comes again after the list
            # Objects can be large (ConfigMaps up to 1 MiB): split lines ourselves
            # rather than rely on a line-length limit. Only a chunk with a newline
            # ends lines; the rest is appended in place, not copied again per chunk.
            if b"\n" not in chunk:
                buffer += chunk
                if len(buffer) > MAX_EVENT_BYTES:
                    raise ValueError(
                        f"a watch event longer than {MAX_EVENT_BYTES} bytes; watching again"
                    )
                continue
            head, _, tail = chunk.rpartition(b"\n")
            buffer += head
            for line in buffer.split(b"\n"):
                if line.strip():
                    self._handle(codec.loads(line))
            buffer = bytearray(tail)

    def _handle(self, event: object) -> None:
        # Anything but {"type": str, "object": {...}} is a broken stream (a proxy's page, a
        # hostile server): ValueError restarts the watch, with backoff, instead of killing it.
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ValueError(f"a watch event that is not a JSON object with a type: {event!r:.80}")
        kind = event["type"]
        obj = event.get("object") or {}
        if not isinstance(obj, dict) or (kind != "ERROR" and not _is_object(obj)):
            raise ValueError(f"a {kind} watch event without an object: {obj!r:.80}")
        if kind == "ERROR":
            code = int(obj.get("code") or 500)
            raise errors.from_response(code=code, body=codec.dumps(obj))
        self._progress = True
        self.last_error = None  # the stream works again
        if kind == "BOOKMARK":
            self._rv = resource_version_of(obj) or self._rv
            return
        if self._transform is not None:
            obj = self._transform(obj)
        if kind in ("ADDED", "MODIFIED"):
            changed, previous = self._store.update(obj)
            if changed:
                added: EventType = "ADDED" if previous is None else "MODIFIED"
                self._on_event(Event(type=added, obj=obj, previous=previous))
        elif kind == "DELETED":
            if self._store.delete(object_key(obj)) is not None:
                self._on_event(Event(type="DELETED", obj=obj))
        else:
            logger.warning("reflector %s: unknown watch event type %r", self.name, kind)
            return
        self._rv = resource_version_of(obj) or self._rv


def _is_object(obj: dict[str, Any]) -> bool:
    # What the store and handlers rely on: metadata is a mapping with a string name.
    meta = obj.get("metadata")
    return isinstance(meta, dict) and isinstance(meta.get("name", ""), str)


async def _idle_bounded(response: Any, idle: float, *, ended: Callable[[], bool]) -> Any:
    """Yield the response's chunks; raise WatchIdle when none arrives for `idle` seconds.
    A response closed on purpose (`ended()` true) just ends.

    One timer per quiet period rather than a timeout per chunk (which cost more than
    decoding a small event): when it fires it looks at when data last came, and either
    waits out the rest of the period or closes the response.
    """
    loop = asyncio.get_running_loop()
    last = loop.time()
    silent = False
    handle: asyncio.TimerHandle

    def check() -> None:
        nonlocal handle, silent
        if loop.time() - last >= idle:
            silent = True
            response.close()
        else:
            handle = loop.call_at(last + idle, check)

    handle = loop.call_at(last + idle, check)
    try:
        async for chunk in response.content.iter_any():
            last = loop.time()
            yield chunk
    except (aiohttp.ClientError, OSError):
        if not silent and not ended():
            raise
    finally:
        handle.cancel()
    if silent:
        raise errors.WatchIdle(f"no data for {idle:.0f}s")
