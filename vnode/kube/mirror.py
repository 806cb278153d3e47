"""Mirrors: objects of one cluster kept equal to a translation of objects of another.

A mirror has a direction (a source cluster's informer, a target cluster's informer and
client) and a `MirrorSpec` per kind saying which source objects are mirrored, how one is
translated, how a target is compared with its translation, when a target is garbage, and
which targets are the mirror's own. The specs are pure; this engine is the project's one
pipeline (informer -> store -> key work queue -> worker), as client-go controllers and
VirtualCluster's syncers are built:

- source and target events only enqueue the *source* key ("namespace/name"); one worker
  at a time handles a key, comparing the translation of the source object with the target
  object, then creating, patching, replacing or deleting the target; failures come back
  with per-key backoff;
- a target the spec calls neither owned nor shared is never changed or deleted: a mirror
  that finds one where its copy belongs reports a conflict (`on_problem`) and leaves it
  alone;
- a shared target (a sibling's copy: made by another writer of the same copies, e.g.
  another virtual node of the same upper cluster over the same lower cluster) serves as
  the copy and is kept like an owned one, in its owner's name (`as_shared`, also when it
  is replaced or made again): compared, patched or replaced, and, by a mirror with
  `creation="always"`, deleted when its source goes. So a copy whose maker died is still
  kept up to date. The worker gives the maker the first go: every sibling sees the same
  change at the same moment, so it writes a sibling's copy only once the copy has
  differed, unchanged, for `sibling_grace` seconds (a live maker has updated it by then,
  and one change costs one write, not one per sibling); siblings that translate a little
  differently (a rolling upgrade) thus write a copy at most once per grace each instead of
  back and forth without pause. `ensure` does not wait: a pod being made needs its copy
  current. On-request copies of a sibling are updated but left to their owner to collect
  (its pods are what use them);
- targets changed or deleted by someone else are repaired (their events enqueue the key);
- `creation="always"` mirrors every selected source object; `creation="on_request"` only
  creates a target when `ensure` asks (the ConfigMaps a pod needs), keeps existing ones up
  to date, and collects them once the spec allows it and `in_use` says nothing needs them;
- a create or delete whose effect the target informer has not shown yet is remembered, so
  a worker never acts on a stale cache (a copy deleted a moment ago is made again, not
  taken as present; one just made is deleted by its UID if its source goes at once).

`ensure` runs outside the queue (a pod creation waits for it) and takes the same per-key
lock as the worker, so an ensure and a collection of one object never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol

from vnode.contracts.objects import Obj
from vnode.kube import errors
from vnode.kube.client import MERGE_PATCH, ApiClient
from vnode.kube.informer import Handlers, Informer
from vnode.kube.resources import Resource
from vnode.kube.workqueue import QueueSettings, Requeue, WorkQueue

logger = logging.getLogger(__name__)

_TERMINATING_RETRY = 5.0
"""Seconds before a key whose target namespace is being deleted is looked at again."""
SIBLING_GRACE = 3.0
"""Default seconds a sibling's copy must have differed from our translation, unchanged,
before the worker writes it (see the module docstring): longer than a live maker takes to
follow a change (its watch event and one write, well under a second on a healthy cluster),
short enough that a dead maker's copies lag by a few seconds only."""

_PRUNE_MIN = 64
"""Waits for siblings' makers held before stale ones are looked for (see `_prune_waiting`)."""


@dataclass(frozen=True)
class _Waiting:
    """A sibling's copy seen differing from our translation, left to its maker a while."""

    resource_version: str
    """The copy's resourceVersion when first seen differing: if it moves, someone (its
    maker) is keeping it, and the wait starts again."""
    due: float
    """Clock time (seconds) from which the worker writes it, if it still differs."""


@dataclass(frozen=True)
class Patch:
    """Bring the target to its translation with this patch (a JSON merge patch unless
    `content_type` says otherwise)."""

    body: Obj
    content_type: str = MERGE_PATCH


@dataclass(frozen=True)
class Replace:
    """Delete the target and create its translation: a field that cannot change differs."""

    reason: str


Change = Patch | Replace | None
"""What `MirrorSpec.compare` decides: a patch, a replacement, or None (equal)."""

Creation = Literal["always", "on_request"]


def _never(_target: Obj) -> bool:
    return False


def _as_is(desired: Obj, _target: Obj) -> Obj:
    return desired


def _always(_target: Obj, _source: Obj) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class MirrorSpec:
    """One kind mirrored in one direction. Every function is pure and gets read-only
    objects (the source as its informer caches it, the target as the target's does)."""

    name: str
    """The mirror's queue name (metrics, logs), e.g. "services_to_lower"."""
    kind: str
    """The source kind, for messages ("Service")."""
    source: Resource
    target: Resource
    selects: Callable[[Obj], bool]
    """Which source objects are mirrored."""
    translate: Callable[[Obj], Obj]
    """The target object for a selected source object, ownership marks included."""
    compare: Callable[[Obj, Obj], Change]
    """(current target, translation) -> what to do."""
    collectable: Callable[[Obj, Obj | None], bool]
    """(owned target, its selected source or None) -> whether the target is garbage (an
    on-request mirror also asks `in_use`)."""
    owned: Callable[[Obj], bool]
    """Whether a target object is this mirror's own (its ownership marks)."""
    target_key: Callable[[str], str]
    """Source key -> the key its target has ("ns/name" -> "prefix-ns/name")."""
    source_key: Callable[[Obj], str | None]
    """An owned target -> the key of the source it stands for (None: unknown)."""
    creation: Creation = "always"
    shared: Callable[[Obj], bool] = _never
    """A target that is not owned -> whether it is a sibling's copy of a source this mirror
    mirrors too (e.g. made by another virtual node of the same upper cluster, within this
    mirror's selection): kept like an owned one (see the module docstring). The engine also
    checks that it stands for the same source key (`source_key`)."""
    as_shared: Callable[[Obj, Obj], Obj] = _as_is
    """(translation, a shared target) -> the translation in the target's owner's name (its
    ownership marks), so keeping a sibling's copy never takes it over (two live siblings
    would otherwise take it back and forth)."""
    report: Callable[[Obj, Obj], Obj | None] | None = None
    """(source, its target) -> a merge patch that records something of the target on the
    source (e.g. the lower ClusterIP), or None when the source already shows it."""
    describe: Callable[[Obj], str] = lambda _target: "not this mirror's"
    """A target that is not owned -> whose it is, for conflict messages ("owned by ...")."""
    stands_for: Callable[[Obj, Obj], bool] = _always
    """(owned target, source of its key) -> whether the target was made for this very
    source object: False (e.g. another UID) makes it the leftover of an earlier object of
    the same name, collected as one whose source is gone, or in the way if it is kept."""


class MirrorConflict(Exception):
    """A target object where the copy belongs is not the mirror's own; `target` is it."""

    def __init__(self, message: str, *, target: Obj) -> None:
        super().__init__(message)
        self.target = target


class Refused(Exception):
    """A target cannot be made as things are (the message says why, e.g. its namespace
    belongs to someone else); the key is retried with backoff."""


class Namespaces(Protocol):
    """Makes target namespaces exist before the first object is created in them."""

    async def ensure(self, namespace: str, *, source_namespace: str) -> None:
        """Create `namespace` for `source_namespace`, or check the existing one may be used.

        Raises Refused saying why it may not, kube errors for API failures."""

    def forget(self, namespace: str) -> None:
        """Forget that `namespace` exists (it was deleted under us)."""


EnsureResult = Literal["created", "present", "shared"]


class Mirror:
    """Keeps the targets of one `MirrorSpec` (see the module docstring)."""

    def __init__(
        self,
        *,
        spec: MirrorSpec,
        source: Informer,
        target: Informer,
        source_client: ApiClient,
        target_client: ApiClient,
        workers: int = 4,
        in_use: Callable[[Obj], bool] | None = None,
        namespaces: Namespaces | None = None,
        on_problem: Callable[[Obj, str], Awaitable[None]] | None = None,
        queue_settings: QueueSettings | None = None,
        collect_delay: float = 2.0,
        sibling_grace: float = SIBLING_GRACE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`source` and `target` may be shared informers; `target` must select at least
        this mirror's own objects, and the siblings' ones too for shared copies to be
        repaired and collected (a narrower one keeps a sibling's copy up to date only when
        a create meets it). `in_use(target)` (on-request mirrors) tells whether
        something still needs an owned target. `namespaces` makes target namespaces exist
        before creates. `on_problem(source, message)` is told about conflicts and targets
        the target cluster refuses. `collect_delay` (seconds) is how long
        `schedule_collection` waits, so a burst of pod deletions is collected once.
        `sibling_grace` (seconds, default `SIBLING_GRACE`) is how long a sibling's copy must
        have differed, unchanged, before the worker writes it; `clock` (seconds) times it."""
        self.spec = spec
        self.name = spec.name
        self.source = source
        self.target = target
        self._source_client = source_client
        self._target_client = target_client
        self._workers = workers
        self._in_use = in_use
        self._namespaces = namespaces
        self._on_problem = on_problem
        self._collect_delay = collect_delay
        self._sibling_grace = sibling_grace
        self._clock = clock
        self.queue = WorkQueue(name=spec.name, settings=queue_settings)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._created: dict[str, Obj] = {}
        """Target key -> what this mirror created there, until the target informer shows it."""
        self._deleted: dict[str, str] = {}
        """Target key -> UID this mirror deleted there, until the target informer drops it."""
        self._reported: set[tuple[str, str]] = set()
        """(source key, target UID) conflicts already logged."""
        self._waiting: dict[str, _Waiting] = {}
        """Source key -> its sibling's copy the worker waits to write (`_wait_for_maker`),
        until the key settles; stale entries are dropped as new ones come."""
        self._prune_waiting_at = _PRUNE_MIN
        self._remake_as: dict[str, Obj] = {}
        """Source key -> the sibling's copy deleted to be made again, whose owner's name the
        new copy takes, until it is made or the key settles otherwise."""
        source.add_handlers(
            Handlers(
                on_add=self._source_changed,
                on_modify=self._source_changed,
                on_delete=self._source_changed,
            )
        )
        target.add_handlers(
            Handlers(
                on_add=self._target_changed,
                on_modify=self._target_changed,
                on_delete=self._target_changed,
            )
        )

    # -- the Component contract ------------------------------------------------------------

    def informers(self) -> Sequence[Informer]:
        """The source and target informers (synced before `run`)."""
        return [self.source, self.target]

    async def start(self) -> None:
        """Nothing to prepare: the informers carry the state."""

    def ready(self) -> bool:
        """Whether both informers have synced."""
        return self.source.has_synced() and self.target.has_synced()

    async def run(self) -> None:
        """Work the queue until `shut_down`. Every owned target is looked at once first
        (targets of sources deleted while no one watched are garbage now)."""
        for target in list(self.target.store):
            self._enqueue_target(target)
        await self.queue.run(workers=self._workers, handler=self.sync)

    async def shut_down(self) -> None:
        """Stop handing out keys (in-flight work finishes)."""
        await self.queue.shut_down()

    # -- events ----------------------------------------------------------------------------

    def _source_changed(self, obj: Obj) -> None:
        key = _key(obj)
        if self.spec.creation == "on_request" and self.current(key) is None:
            return  # nothing mirrored yet: a pod's `ensure` will make it when needed
        self.queue.add(key)

    def _target_changed(self, obj: Obj) -> None:
        self._enqueue_target(obj)

    def _enqueue_target(self, target: Obj) -> None:
        if not (self.spec.owned(target) or self.spec.shared(target)):
            return
        key = self.spec.source_key(target)
        if key is not None:
            self.queue.add(key)

    def schedule_collection(self, keys: Sequence[str]) -> None:
        """Look at the targets of source `keys` soon (something that used them went)."""
        for key in keys:
            self.queue.add_after(key, self._collect_delay)

    # -- state -----------------------------------------------------------------------------

    def current(self, key: str) -> Obj | None:
        """Return the target standing for source `key` as this mirror last knew it (the
        cache, corrected by its own creates and deletes not yet seen there), or None."""
        target_key = self.spec.target_key(key)
        cached = self.target.store.get(target_key)
        deleted = self._deleted.get(target_key)
        if deleted is not None and (cached is None or _uid(cached) != deleted):
            del self._deleted[target_key]  # the cache has caught up
            deleted = None
        if cached is not None:
            self._created.pop(target_key, None)
            return None if deleted is not None else cached
        return None if deleted is not None else self._created.get(target_key)

    @contextlib.asynccontextmanager
    async def _locked(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    # -- rules -----------------------------------------------------------------------------

    def _keeps(self, key: str, target: Obj) -> bool:
        """Whether `target`, found where source `key`'s copy belongs, is kept by this mirror:
        its own, or a sibling's copy of this very source key."""
        spec = self.spec
        return spec.owned(target) or (spec.shared(target) and spec.source_key(target) == key)

    def _collectable(self, target: Obj, source: Obj | None) -> bool:
        """Whether a kept `target` is deleted now: garbage by the spec, needed by nothing,
        and ours, or a sibling's copy in a mirror of every selected source (`creation
        "always"`; a sibling's on-request copy is there for the sibling's pods, so its
        collection is the sibling's)."""
        spec = self.spec
        return (
            spec.collectable(target, source)
            and not self._needed(target)
            and (spec.owned(target) or spec.creation == "always")
        )

    # -- work ------------------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        """Bring the target of source `key` to what the spec says (the queue's handler).

        Raises Requeue while a sibling's copy is left to its maker (`_wait_for_maker`) or
        its namespace is going, kube errors for API failures (retried by the queue)."""
        async with self._locked(key):
            await self._sync(key)
            # Settled: what was waited for or remembered for this key is moot now.
            self._waiting.pop(key, None)
            self._remake_as.pop(key, None)

    async def _sync(self, key: str) -> None:
        spec = self.spec
        source = self.source.store.get(key)
        if source is not None and not spec.selects(source):
            source = None
        current = self.current(key)
        if current is not None and not self._keeps(key, current):
            if source is not None and spec.creation == "always":
                await self._conflict(key, source, current)
            return
        if current is not None:
            mine = source if source is None or spec.stands_for(current, source) else None
            if self._collectable(current, mine):
                self._wait_for_maker(key, current)
                logger.info("%s: deleting %s (no longer mirrored)", self.name, _key(current))
                await self._delete(current, remade_for=key)
                if source is not None and mine is None and spec.creation == "always":
                    await self._create(key, source)
                return
            if mine is None:
                if source is not None and spec.creation == "always":
                    await self._conflict(key, source, current)
                return  # kept while something needs it
            current = await self._apply(key, mine, current, wait=True)
        elif source is not None and spec.creation == "always":
            current = await self._create(key, source)
        if current is not None and source is not None:
            await self._report(source, current)

    def _needed(self, target: Obj) -> bool:
        return self._in_use is not None and self._in_use(target)

    async def ensure(self, key: str) -> EnsureResult:
        """Make the target of source `key` exist and equal its translation now.

        Returns "created" (made now), "present" (it existed; brought up to date) or
        "shared" (a sibling's copy serves; brought up to date in its owner's name). Raises KeyError
        when the source is missing or not selected, MirrorConflict when an object that is
        not the mirror's own is in the way, and kube errors for API failures.
        """
        async with self._locked(key):
            source = self.source.store.get(key)
            if source is None or not self.spec.selects(source):
                raise KeyError(key)
            current = self.current(key)
            if (
                current is not None
                and self._keeps(key, current)
                and not self.spec.stands_for(current, source)
            ):
                if not self._collectable(current, None):
                    raise MirrorConflict(
                        f"{self.spec.target.kind} {_key(current)} is kept for an earlier "
                        f"{self.spec.kind} of the same name",
                        target=current,
                    )
                await self._delete(current, remade_for=key)
                current = None
            if current is None:
                try:
                    await self._create(key, source, raise_conflict=True)
                    return "created"
                except _Existed as existed:
                    current = existed.current
            if not self._keeps(key, current):
                raise MirrorConflict(
                    f"{self.spec.target.kind} {_key(current)} is not this mirror's",
                    target=current,
                )
            # No wait for a sibling's copy here: the pod being made needs it current now.
            await self._apply(key, source, current, wait=False)
            return "present" if self.spec.owned(current) else "shared"

    async def collect(self, key: str) -> None:
        """Delete the target of source `key` now if the spec and `in_use` allow it."""
        async with self._locked(key):
            current = self.current(key)
            if current is None or not self.spec.owned(current):
                return
            source = self.source.store.get(key)
            if source is not None and not (
                self.spec.selects(source) and self.spec.stands_for(current, source)
            ):
                source = None
            if self.spec.collectable(current, source) and not self._needed(current):
                await self._delete(current)

    async def _create(self, key: str, source: Obj, *, raise_conflict: bool = False) -> Obj | None:
        """POST the translation (in the name of the sibling whose copy of `key` was deleted
        to be made again, if so); on AlreadyExists hand the existing object to the caller
        (`_Existed` with `raise_conflict`, else handled here as a conflict or an update)."""
        desired = self.spec.translate(source)
        remade = self._remake_as.get(key)
        if remade is not None:
            desired = self.spec.as_shared(desired, remade)
        namespace = desired.get("metadata", {}).get("namespace")
        await self._prepare_namespace(namespace, source)
        path = self.spec.target.path(namespace=namespace)
        for attempt in (1, 2):
            try:
                created = await self._target_client.request("POST", path, body=desired)
                break
            except errors.AlreadyExists:
                existing = await self._target_client.request(
                    "GET",
                    self.spec.target.path(namespace=namespace, name=desired["metadata"]["name"]),
                )
                return await self._existing(key, source, existing, raise_conflict=raise_conflict)
            except errors.NotFound:
                # The only NotFound a create gets: the namespace went under us. Make it
                # again, once.
                if attempt == 2 or not namespace or self._namespaces is None:
                    raise
                self._namespaces.forget(namespace)
                await self._prepare_namespace(namespace, source)
            except (errors.Invalid, errors.Forbidden, errors.BadRequest) as exc:
                await self._refused(source, f"{self.spec.target.kind} {_key(desired)}", exc)
        target_key = self.spec.target_key(key)
        self._created[target_key] = created
        self._deleted.pop(target_key, None)
        self._remake_as.pop(key, None)
        logger.info("%s: created %s", self.name, _key(created))
        return created

    async def _prepare_namespace(self, namespace: str | None, source: Obj) -> None:
        if not namespace or self._namespaces is None:
            return
        try:
            await self._namespaces.ensure(
                namespace, source_namespace=str(source["metadata"]["namespace"])
            )
        except Refused as exc:
            await self._problem(source, str(exc))
            raise

    async def _existing(
        self, key: str, source: Obj, existing: Obj, *, raise_conflict: bool
    ) -> Obj | None:
        """What a create that found `existing` in the way does with it."""
        if existing.get("metadata", {}).get("deletionTimestamp"):
            # Replaced, or collected a moment ago, and held by a finalizer: make the copy
            # once the old one is gone.
            raise Requeue(1.0, f"{_key(existing)} is still being deleted")
        if raise_conflict:
            raise _Existed(existing)
        if not self._keeps(key, existing):
            await self._conflict(key, source, existing)
            return None
        if not self.spec.stands_for(existing, source):
            await self._conflict(key, source, existing)
            return None
        return await self._apply(key, source, existing, wait=True)

    async def _refused(self, source: Obj, what: str, exc: errors.ApiError) -> NoReturn:
        """Report the target cluster's refusal (write `what` it refused) and re-raise it;
        one in a namespace being deleted is only waited out."""
        if exc.namespace_terminating:
            # Its namespace is going (often in both clusters): nothing to report; the
            # source's own deletion usually settles the key meanwhile.
            raise Requeue(_TERMINATING_RETRY, exc.message) from exc
        await self._problem(source, f"the target cluster refused {what}: {exc.message}")
        raise exc

    async def _apply(self, key: str, source: Obj, current: Obj, *, wait: bool) -> Obj:
        """Bring the kept `current` to the translation of `source` (in its owner's name);
        return it as written. With `wait`, a sibling's copy is left to its maker a while
        first (`_wait_for_maker` raises Requeue)."""
        desired = self.spec.translate(source)
        if not self.spec.owned(current):
            desired = self.spec.as_shared(desired, current)
        change = self.spec.compare(current, desired)
        if change is None:
            return current
        if wait:
            self._wait_for_maker(key, current)
        meta = current["metadata"]
        path = self.spec.target.path(namespace=meta.get("namespace"), name=meta["name"])
        try:
            if isinstance(change, Replace):
                logger.info("%s: replacing %s (%s)", self.name, _key(current), change.reason)
                await self._delete(current, remade_for=key)
                created = await self._create(key, source)
                return created or current
            logger.info("%s: updating %s", self.name, _key(current))
            updated = await self._target_client.request(
                "PATCH", path, body=change.body, content_type=change.content_type
            )
        except (errors.Invalid, errors.Forbidden, errors.BadRequest) as exc:
            await self._refused(
                source, f"the update of {self.spec.target.kind} {_key(current)}", exc
            )
        return updated

    def _wait_for_maker(self, key: str, current: Obj) -> None:
        """Raise Requeue unless the worker may write `current`, the copy of source `key`,
        now: always for our own copy; for a sibling's, once it has differed from our
        translation, with the same resourceVersion, for `sibling_grace` seconds (its maker,
        if alive, sees the same change and writes it meanwhile; it moving restarts the wait,
        and a write settles the key, so the next difference waits again)."""
        if self.spec.owned(current):
            return
        now = self._clock()
        version = str(current.get("metadata", {}).get("resourceVersion") or "")
        waiting = self._waiting.get(key)
        if (
            waiting is None
            or waiting.resource_version != version
            or now > waiting.due + self._sibling_grace  # not back when due: look afresh
        ):
            waiting = self._waiting[key] = _Waiting(
                resource_version=version, due=now + self._sibling_grace
            )
            if len(self._waiting) >= self._prune_waiting_at:
                self._prune_waiting(now)
        if now < waiting.due:
            wait = waiting.due - now
            logger.debug(
                "%s: %s is a sibling's copy; leaving it to its maker for %.1fs",
                self.name,
                _key(current),
                wait,
            )
            raise Requeue(wait, f"{_key(current)} is a sibling's copy, left to its maker")

    def _prune_waiting(self, now: float) -> None:
        """Drop the waits nobody came back for (their keys failed for good, or were handled
        outside the worker), so the entries stay as many as the keys waiting now: pruned
        when they have doubled since the last time, O(1) per wait on average."""
        grace = self._sibling_grace
        self._waiting = {k: w for k, w in self._waiting.items() if now <= w.due + grace}
        self._prune_waiting_at = max(_PRUNE_MIN, 2 * len(self._waiting))

    async def _delete(self, current: Obj, *, remade_for: str | None = None) -> None:
        """Delete `current` (UID precondition). `remade_for`: the source key whose copy it
        is, when it may be made again: a sibling's copy is then made in its owner's name."""
        if remade_for is not None and not self.spec.owned(current):
            self._remake_as[remade_for] = current
        meta = current["metadata"]
        path = self.spec.target.path(namespace=meta.get("namespace"), name=meta["name"])
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": _uid(current)},
        }
        try:
            await self._target_client.request("DELETE", path, body=body)
        except (errors.NotFound, errors.Conflict):
            pass  # gone already, or another object now has the name: not ours to delete
        target_key = _key(current)
        self._deleted[target_key] = _uid(current)
        self._created.pop(target_key, None)

    async def _report(self, source: Obj, target: Obj) -> None:
        if self.spec.report is None:
            return
        patch = self.spec.report(source, target)
        if patch is None:
            return
        meta = source["metadata"]
        try:
            await self._source_client.request(
                "PATCH",
                self.spec.source.path(namespace=meta.get("namespace"), name=meta["name"]),
                body=patch,
                content_type=MERGE_PATCH,
            )
        except errors.NotFound:
            pass  # the source went meanwhile; its deletion brings the key back

    async def _conflict(self, key: str, source: Obj, current: Obj) -> None:
        whose = (
            "kept for an earlier object of the same name"
            if self._keeps(key, current)
            else self.spec.describe(current)
        )
        message = (
            f"{self.spec.target.kind} {_key(current)} exists in the target cluster and is "
            f"{whose}; leaving it alone (the {self.spec.kind} {key} is not mirrored)"
        )
        if (key, _uid(current)) not in self._reported:
            self._reported.add((key, _uid(current)))
            logger.warning("%s: %s", self.name, message)
        await self._problem(source, message)

    async def _problem(self, source: Obj, message: str) -> None:
        if self._on_problem is not None:
            await self._on_problem(source, message)


class _Existed(Exception):
    def __init__(self, current: Obj) -> None:
        super().__init__("exists")
        self.current = current


def _key(obj: Any) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
