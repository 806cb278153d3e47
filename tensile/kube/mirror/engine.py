"""The mirror engine: `Mirror` keeps the targets of one `KindSpec` (see the package docstring).

Source and target events enqueue source keys; the worker, `ensure` and `collect` each read
the caches and the mirror's own writes in flight, ask `decide` what the key needs, and
perform the `Action` here (the only part that writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn, Protocol

from tensile.contracts.objects import (
    Obj,
    deletion_timestamp_of,
    meta_of,
    name_of,
    namespace_of,
    uid_of,
)
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.mirror.decide import (
    Action,
    Create,
    Delete,
    Missing,
    NameTaken,
    Nothing,
    Occasion,
    Recreate,
    StillDeleting,
    Update,
    UpToDate,
    WaitForMaker,
    decide,
)
from tensile.kube.mirror.inflight import WritesInFlight
from tensile.kube.mirror.siblings import SIBLING_GRACE, MakerWaits, SiblingPolicy
from tensile.kube.mirror.spec import KindSpec, Tenancy
from tensile.kube.resources import object_key
from tensile.kube.workqueue import QueueSettings, Requeue, WorkQueue

logger = logging.getLogger(__name__)

_TERMINATING_RETRY = 5.0
"""Seconds before a key whose target namespace is being deleted is looked at again."""
_STILL_DELETING_RETRY = 1.0
"""Seconds before a create that met an object being deleted is tried again."""
_REFUSALS = (errors.Invalid, errors.Forbidden, errors.BadRequest)
"""What the target cluster answers to a write it will not take as things are."""


class NameTakenError(Exception):
    """What `ensure` raises for `NameTaken`: a target object holding the copy's name may not
    be used; `target` is it."""

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


class _Existed(Exception):
    """The create of an `ensure` met `current` in the way."""

    def __init__(self, current: Obj) -> None:
        super().__init__("exists")
        self.current = current


@dataclass
class _Telling:
    """What a mirror told of one sort of message (notices, refusals), by source key."""

    told: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Source key -> (source UID, message) last told, so one is told once (not at every
    sync) and again when the object or the message changes."""
    pending: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    """Source key -> (source UID, message, clock time first seen) of a message not told
    yet, while it settles (`KindSpec.notice_settle`)."""

    def forget(self, key: str) -> None:
        self.told.pop(key, None)
        self.pending.pop(key, None)


class Mirror:
    """Keeps the targets of one `KindSpec` in one `Tenancy` (see the package docstring)."""

    def __init__(
        self,
        *,
        spec: KindSpec,
        tenancy: Tenancy,
        source: Informer,
        target: Informer,
        source_client: ApiClient,
        target_client: ApiClient,
        workers: int = 4,
        in_use: Callable[[str], bool] | None = None,
        namespaces: Namespaces | None = None,
        on_problem: Callable[[Obj, str], Awaitable[None]] | None = None,
        on_notice: Callable[[Obj, str], Awaitable[None]] | None = None,
        on_refusal: Callable[[Obj, str], Awaitable[None]] | None = None,
        reads: Sequence[Informer] = (),
        queue_settings: QueueSettings | None = None,
        collect_delay: float = 2.0,
        sibling_grace: float = SIBLING_GRACE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`tenancy` says which targets are ours and which siblings' (one for every kind of
        the writer). `source` and `target` may be shared informers; `target` must select
        at least this mirror's own objects, and the siblings' ones too for shared copies to
        be repaired and collected (a narrower one keeps a sibling's copy up to date only
        when a create meets it). `in_use(target key)` (on-request mirrors; "namespace/name")
        tells whether something still needs the target there: an owned one is not collected,
        and one that is gone is made again. `namespaces` makes target namespaces exist
        before creates. `on_problem(source, message)` is told about names taken (`NameTaken`) and
        targets the target cluster refuses; `on_notice(source, message)` of the spec's `notice`
        once a target stands for the source (once per source UID and message, and only after
        it has stayed the same for the spec's `notice_settle` seconds); `on_refusal(source,
        message)` likewise of the spec's `refusal`, for a source it leaves out. `reads` are the
        informers of other caches the spec's functions read (synced before `run`, like
        `source` and `target`); their changes reach a key through `revisit`.
        `collect_delay` (seconds) is how long `schedule_collection` waits, so a burst of pod
        deletions is collected once.
        `sibling_grace` (seconds, default `SIBLING_GRACE`) is how long a sibling's copy must
        have differed, unchanged, before the worker writes it; `clock` (seconds) times it."""
        self.spec = spec
        self.tenancy = tenancy
        self.name = spec.name
        self.source = source
        self.target = target
        self._source_client = source_client
        self._target_client = target_client
        self._workers = workers
        self._in_use = in_use
        self._namespaces = namespaces
        self._on_problem = on_problem
        self._on_notice = on_notice
        self._on_refusal = on_refusal
        self._reads = tuple(reads)
        self._notices = _Telling()
        self._refusals = _Telling()
        self._collect_delay = collect_delay
        self._clock = clock
        self.siblings = SiblingPolicy.of(spec, tenancy=tenancy, grace=sibling_grace)
        self.queue = WorkQueue(name=spec.name, settings=queue_settings)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._in_flight = WritesInFlight()
        self._reported: set[tuple[str, str]] = set()
        """(source key, target UID) of the names found taken, already logged."""
        self._waits = MakerWaits(self.siblings)
        """Source key -> the wait for its sibling's copy's maker, until the key settles."""
        self._remade: dict[str, Obj] = {}
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
                on_add=self._target_shown, on_modify=self._target_shown, on_delete=self._target_gone
            )
        )

    # -- the Component contract ------------------------------------------------------------

    def informers(self) -> Sequence[Informer]:
        """The source and target informers and those the spec reads (synced before `run`)."""
        return [self.source, self.target, *self._reads]

    async def start(self) -> None:
        """Nothing to prepare: the informers carry the state."""

    def ready(self) -> bool:
        """Whether every informer of `informers` has synced."""
        return all(informer.has_synced() for informer in self.informers())

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
        key = object_key(obj)
        if self.spec.creation == "on_request" and self.current(key) is None and not self._used(key):
            return  # nothing mirrored yet: a pod's `ensure` will make it when needed
        self.queue.add(key)

    def _target_shown(self, target: Obj) -> None:
        self._in_flight.shown(object_key(target), target)
        self._enqueue_target(target)

    def _target_gone(self, target: Obj) -> None:
        # A copy deleted below by someone else: the key's decision makes it again if it is
        # mirrored (or, on request, still in use).
        self._in_flight.shown_gone(object_key(target), target)
        self._enqueue_target(target)

    def _enqueue_target(self, target: Obj) -> None:
        key = self.tenancy.source_key(target)
        if key is not None and self.siblings.keeps(key, target):
            self.queue.add(key)

    def revisit(self, keys: Iterable[str]) -> None:
        """Look at source `keys` again: something the spec's functions read for them (not
        their source or target) changed."""
        for key in keys:
            self.queue.add(key)

    def schedule_collection(self, keys: Sequence[str]) -> None:
        """Look at the targets of source `keys` soon (something that used them went)."""
        for key in keys:
            self.queue.add_after(key, self._collect_delay)

    # -- state -----------------------------------------------------------------------------

    def current(self, key: str) -> Obj | None:
        """Return the target standing for source `key` as this mirror last knew it (the
        cache, corrected by its own creates and deletes not yet seen there), or None."""
        target_key = self.tenancy.target_key(key)
        return self._in_flight.known(target_key, self.target.store.get(target_key))

    def keys(self) -> set[str]:
        """Every source key the mirror may have work for: each source's, and each kept
        target's (its source may be gone)."""
        keys = set(self.source.store.keys())
        for target in self.target.store:
            key = self.tenancy.source_key(target)
            if key is not None and self.siblings.keeps(key, target):
                keys.add(key)
        return keys

    def decision(self, key: str) -> Action:
        """What the worker would do for source `key` now (nothing is written): a patrol's
        comparison of source and target."""
        return self._decide(key, self.source.store.get(key), self.current(key), "sync")

    def _used(self, key: str) -> bool:
        """Whether something needs the target of source `key`, present or not (`in_use`)."""
        return self._in_use is not None and self._in_use(self.tenancy.target_key(key))

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

    def _decide(
        self, key: str, source: Obj | None, current: Obj | None, occasion: Occasion
    ) -> Action:
        """`decide` on what the mirror knows of `key` now."""
        return decide(
            key,
            source=source,
            current=current,
            spec=self.spec,
            siblings=self.siblings,
            occasion=occasion,
            in_use=self._used(key),
            waited=self._waits.get(key),
            remade=self._remade.get(key),
            now=self._clock(),
        )

    # -- the entry points --------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        """Bring the target of source `key` to what the spec says (the queue's handler).

        Raises Requeue while a sibling's copy is left to its maker or its namespace is
        going, kube errors for API failures (retried by the queue)."""
        async with self._locked(key):
            source = self.source.store.get(key)
            action = self._decide(key, source, self.current(key), "sync")
            written = await self._perform(key, source, action)
            reports = not (isinstance(action, Recreate) and action.leftover)
            if written is not None and source is not None and reports:
                await self._report(source, written)
                await self._notice(key, source)
            elif source is None:
                self._notices.forget(key)
                self._refusals.forget(key)
            if source is not None and self.spec.refusal is not None:
                told = None if self.spec.selects(source) else self.spec.refusal(source)
                await self._tell(key, source, told, self._refusals, self._on_refusal)
            # Settled: what was waited for or remembered for this key is moot now.
            self._waits.settle(key)
            self._remade.pop(key, None)

    async def ensure(self, key: str) -> EnsureResult:
        """Make the target of source `key` exist and equal its translation now.

        Returns "created" (made now), "present" (it existed; brought up to date) or
        "shared" (a sibling's copy serves; brought up to date in its owner's name). Raises KeyError
        when the source is missing or not selected, NameTakenError when an object that is
        not the mirror's own is in the way, and kube errors for API failures.
        """
        async with self._locked(key):
            source = self.source.store.get(key)
            action = self._decide(key, source, self.current(key), "ensure")
            match action:
                case Missing():
                    raise KeyError(key)
                case Create() | Recreate(leftover=True) if source is not None:
                    if isinstance(action, Recreate):
                        await self._delete(action.target, remade_for=key)
                    try:
                        await self._create(key, source, action.desired, asked=True)
                        return "created"
                    except _Existed as existed:
                        action = self._decide(key, source, existed.current, "met_ensure")
            match action:
                case NameTaken(target=target, message=message):
                    raise NameTakenError(message, target=target)
                case UpToDate(target=target) | Update(target=target) | Recreate(target=target):
                    # No wait for a sibling's copy here: the pod being made needs it now.
                    await self._perform(key, source, action)
                    return "present" if self.tenancy.owned(target) else "shared"
            raise AssertionError(f"ensure decided {action!r}")

    async def collect(self, key: str) -> None:
        """Delete the target of source `key` now if the spec and `in_use` allow it."""
        async with self._locked(key):
            source = self.source.store.get(key)
            action = self._decide(key, source, self.current(key), "collect")
            await self._perform(key, source, action)

    # -- performing an action ------------------------------------------------------------

    async def _perform(  # noqa: PLR0911 - a dispatch
        self, key: str, source: Obj | None, action: Action
    ) -> Obj | None:
        """Do `action` for source `key`; return the target it leaves standing for the
        source (to report on), or None."""
        match action:
            case Nothing() | Missing():
                return None
            case UpToDate(target=target):
                return target
            case Delete(target=target):
                logger.info("%s: deleting %s (no longer mirrored)", self.name, object_key(target))
                await self._delete(target, remade_for=key)
                return None
            case WaitForMaker(target=target, waiting=waiting, after=after):
                self._waits.hold(key, waiting, now=self._clock())
                logger.debug(
                    "%s: %s is a sibling's copy; leaving it to its maker for %.1fs",
                    self.name,
                    object_key(target),
                    after,
                )
                raise Requeue(after, f"{object_key(target)} is a sibling's copy, left to its maker")
            case StillDeleting(target=target):
                # Replaced, or collected a moment ago, and held by a finalizer: make the copy
                # once the old one is gone.
                raise Requeue(_STILL_DELETING_RETRY, f"{object_key(target)} is still being deleted")
            case NameTaken(target=target, message=message):
                await self._name_taken(key, source, target, message)
                return None
        assert source is not None  # the writes below are decided only for a source
        match action:
            case Create(desired=desired):
                return await self._create(key, source, desired)
            case Update(target=target, patch=patch):
                logger.info("%s: updating %s", self.name, object_key(target))
                meta = meta_of(target)
                path = self.spec.target.path(namespace=meta.get("namespace"), name=meta["name"])
                try:
                    updated: Obj = await self._target_client.request(
                        "PATCH",
                        path,
                        body=patch.body,
                        content_type=patch.content_type or MERGE_PATCH,
                    )
                except _REFUSALS as exc:
                    what = f"the update of {self.spec.target.kind} {object_key(target)}"
                    await self._refused(source, what, exc)
                return updated
            case Recreate(target=target, desired=desired, reason=reason, leftover=leftover):
                what = "no longer mirrored" if leftover else reason
                verb = "deleting" if leftover else "replacing"
                logger.info("%s: %s %s (%s)", self.name, verb, object_key(target), what)
                await self._delete(target, remade_for=key)
                created = await self._create(key, source, desired)
                return created or target
        raise AssertionError(f"unhandled {action!r}")

    async def _name_taken(self, key: str, source: Obj | None, target: Obj, message: str) -> None:
        """Report a name taken that the worker met (logged once per key and target)."""
        if source is None:
            return
        if (key, uid_of(target)) not in self._reported:
            self._reported.add((key, uid_of(target)))
            logger.warning("%s: %s", self.name, message)
        await self._problem(source, message)

    async def _create(
        self, key: str, source: Obj, desired: Obj, *, asked: bool = False
    ) -> Obj | None:
        """POST `desired`; on AlreadyExists hand the existing object to `ensure` (`_Existed`,
        when `asked`), else decide and perform what the met object needs."""
        namespace = namespace_of(desired)
        await self._prepare_namespace(namespace, source)
        path = self.spec.target.path(namespace=namespace)
        target_key = self.tenancy.target_key(key)
        self._in_flight.creating(target_key)
        try:
            for attempt in (1, 2):
                try:
                    created: Obj = await self._target_client.request("POST", path, body=desired)
                    break
                except errors.AlreadyExists:
                    self._in_flight.abandoned(target_key)
                    name = name_of(desired)
                    existing = await self._target_client.request(
                        "GET", self.spec.target.path(namespace=namespace, name=name)
                    )
                    if asked and not deletion_timestamp_of(existing):
                        raise _Existed(existing) from None
                    met = self._decide(key, source, existing, "met")
                    return await self._perform(key, source, met)
                except errors.NotFound:
                    # The only NotFound a create gets: the namespace went under us. Make it
                    # again, once.
                    if attempt == 2 or not namespace or self._namespaces is None:
                        raise
                    self._namespaces.forget(namespace)
                    await self._prepare_namespace(namespace, source)
                except _REFUSALS as exc:
                    what = f"{self.spec.target.kind} {object_key(desired)}"
                    await self._refused(source, what, exc)
            self._in_flight.created(target_key, created)
        finally:
            self._in_flight.abandoned(target_key)  # a no-op after `created`
        self._remade.pop(key, None)
        logger.info("%s: created %s", self.name, object_key(created))
        return created

    async def _prepare_namespace(self, namespace: str | None, source: Obj) -> None:
        if not namespace or self._namespaces is None:
            return
        try:
            await self._namespaces.ensure(namespace, source_namespace=namespace_of(source))
        except Refused as exc:
            await self._problem(source, str(exc))
            raise

    async def _refused(self, source: Obj, what: str, exc: errors.ApiError) -> NoReturn:
        """Report the target cluster's refusal (write `what` it refused) and re-raise it;
        one in a namespace being deleted is only waited out."""
        if exc.namespace_terminating:
            # Its namespace is going (often in both clusters): nothing to report; the
            # source's own deletion usually settles the key meanwhile.
            raise Requeue(_TERMINATING_RETRY, exc.message) from exc
        await self._problem(source, f"the target cluster refused {what}: {exc.message}")
        raise exc

    async def _delete(self, current: Obj, *, remade_for: str) -> None:
        """Delete `current` (UID precondition), the target of source key `remade_for`: a
        sibling's copy made again for it is made in its owner's name."""
        if not self.tenancy.owned(current):
            self._remade[remade_for] = current
        meta = meta_of(current)
        path = self.spec.target.path(namespace=meta.get("namespace"), name=meta["name"])
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid_of(current)},
        }
        try:
            await self._target_client.request("DELETE", path, body=body)
        except (errors.NotFound, errors.Conflict):
            pass  # gone already, or (409) another object now has the name: not ours to delete
        self._in_flight.deleted(object_key(current), uid_of(current))

    async def _report(self, source: Obj, target: Obj) -> None:
        meta = meta_of(source)
        path = self.spec.source.path(namespace=meta.get("namespace"), name=meta["name"])
        try:
            patch = self.spec.report(source, target) if self.spec.report is not None else None
            if patch is not None:
                source = await self._source_client.request(
                    "PATCH", path, body=patch, content_type=MERGE_PATCH
                )
            if self.spec.report_status is None:
                return
            patch = self.spec.report_status(source, target)
            if patch is not None:
                await self._source_client.request(
                    "PATCH",
                    self.spec.source.path(
                        namespace=meta.get("namespace"), name=meta["name"], subresource="status"
                    ),
                    body=patch,
                    content_type=MERGE_PATCH,
                )
        except errors.NotFound:
            pass  # the source went meanwhile; its deletion brings the key back

    async def _notice(self, key: str, source: Obj) -> None:
        if self.spec.notice is not None:
            message = self.spec.notice(source)
            await self._tell(key, source, message, self._notices, self._on_notice)

    async def _tell(
        self,
        key: str,
        source: Obj,
        message: str | None,
        telling: _Telling,
        callback: Callable[[Obj, str], Awaitable[None]] | None,
    ) -> None:
        """Tell `callback` `message` about `source` once per source UID and message, after
        it has stayed so `notice_settle` seconds; None forgets what was told."""
        if message is None or callback is None:
            telling.forget(key)
            return
        uid = uid_of(source)
        if telling.told.get(key) == (uid, message):
            return
        settle = self.spec.notice_settle
        if settle > 0:
            now = self._clock()
            pending = telling.pending.get(key)
            if pending is None or pending[:2] != (uid, message):
                # First seen: told only if a look after `settle` finds it still so.
                telling.pending[key] = (uid, message, now)
                self.queue.add_after(key, settle)
                return
            if now < pending[2] + settle:
                self.queue.add_after(key, pending[2] + settle - now)
                return
            del telling.pending[key]
        telling.told[key] = (uid, message)
        await callback(source, message)

    async def _problem(self, source: Obj, message: str) -> None:
        if self._on_problem is not None:
            await self._on_problem(source, message)
