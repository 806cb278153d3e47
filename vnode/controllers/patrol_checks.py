"""The patrol's comparisons of upper and lower state, one per owner of a queue: each
gathers the facts from the caches, asks `patrol_decisions`, and repairs a mismatch by
adding its key to the owner's queue, so the repair is the event path's own work with its
ownership checks (the patrol never writes an object itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tensile.contracts.objects import uid_of
from tensile.kube.mirror.engine import Mirror
from tensile.kube.resources import object_key
from vnode.controllers import patrol_decisions
from vnode.controllers.patrol_decisions import Mismatch
from vnode.controllers.pods import PodController
from vnode.provider import BackendPodLister, BackendStamp, BackendStatusOf, PodProvider

_T = TypeVar("_T")
_PACE = 200
"""Objects compared between two yields to the event loop: a comparison of 10,000 pods
never holds the watches and workers for more than a few milliseconds at a time."""


class Check(Protocol):
    """One comparison of the patrol."""

    name: str

    def mismatches(self) -> AsyncIterator[Mismatch]:
        """Yield the drift found now."""

    def repair(self, mismatch: Mismatch) -> None:
        """Hand `mismatch`'s key to the queue that repairs it."""

    def in_hand(self, mismatch: Mismatch) -> bool:
        """Tell whether the queue that repairs `mismatch` still holds its key (queued,
        being worked on, or waiting for a retry after a failure)."""


async def paced(items: Iterable[_T]) -> AsyncIterator[_T]:
    """Yield `items`, letting the event loop run every `_PACE` of them."""
    for count, item in enumerate(items, 1):
        if count % _PACE == 0:
            await asyncio.sleep(0)
        yield item


@dataclass(frozen=True, slots=True)
class _Compared:
    """What an upper pod was compared on: its resourceVersion and UID and the provider's
    `BackendStamp.backend_stamp` for it, with the key of its backend pod (None without one)
    for the look for orphans."""

    version: str
    uid: str
    stamp: Hashable
    backend_key: str | None


class PodCheck:
    """Upper pods bound to the node against their backend pods, and backend pods of ours
    against upper pods (when the provider can name them: `BackendPodLister`). A pod whose
    key a queue holds, or whose backend create or delete is in flight, is in hand; so is
    a stale status or lost deletion that a status write or final deletion of the pod
    controller's, answered and not in the upper cache yet, explains
    (`PodController.status_unseen`, `deletion_unseen`).

    With a provider that stamps its answers (`BackendStamp`), a pod found clean is
    remembered with what it was judged on, and the next run passes over it without decoding
    either pod while its upper resourceVersion and the stamp are unchanged: the comparison
    is a pure function of those (`patrol_decisions.upper_pod_drift` of the upper pod, the
    backend pod and the status translated from both), so it would find it clean again."""

    name = "pods"

    def __init__(self, *, pods: PodController, provider: PodProvider) -> None:
        """`pods`: the pod controller (its cache and queues); `provider`: its provider."""
        self._pods = pods
        self._provider = provider
        # The optional roles, asked once (a Protocol's isinstance costs microseconds).
        self._book = provider if isinstance(provider, BackendPodLister) else None
        self._statuses = provider if isinstance(provider, BackendStatusOf) else None
        self._stamps = provider if isinstance(provider, BackendStamp) else None
        self._clean: dict[str, _Compared] = {}
        """Upper pod key -> what it was found clean on, by the last run (only pods found
        clean by a run, so a key deleted since is gone at the next)."""

    async def mismatches(self) -> AsyncIterator[Mismatch]:
        """Yield upper pods missing below, with a stale status or a lost deletion, then
        backend pods whose upper pod is gone."""
        store, book, stamps = self._pods.informer.store, self._book, self._stamps
        before, self._clean = self._clean, {}
        # Keys of the backend pods found with their upper pods: no orphans, so the look for
        # orphans passes over them (an upper pod deleted since is the next run's to find).
        matched: set[str] = set()
        async for key in paced(store.keys()):
            version = store.version(key)  # decodes nothing
            known = before.get(key)
            if (
                known is not None
                and stamps is not None
                and known.version == version
                and stamps.backend_stamp(key, upper_uid=known.uid) == known.stamp
            ):
                self._clean[key] = known
            else:
                mismatch, known = self._compare(key)
                if mismatch is not None:
                    yield mismatch
            if known is not None and known.backend_key is not None:
                matched.add(known.backend_key)
        if book is None:
            return
        async for key, uid in paced(book.owned_backend_pods(besides=matched)):
            reason = patrol_decisions.backend_pod_drift(
                upper_uid=uid,
                upper_exists=store.version(key) is not None,  # decodes nothing
                deleting=self._pods.deleting(key),
                in_hand=self._in_hand(key) or book.backend_writing(uid),
            )
            if reason is not None:
                yield Mismatch(kind="pods", reason=reason, key=key)

    def _compare(self, key: str) -> tuple[Mismatch | None, _Compared | None]:
        """Compare the upper pod `key` with its backend pod: (the drift found or None, what
        was compared), (None, None) when the key is gone. What was compared is remembered
        for the next run when the pod is clean on its own merits, not only because a queue
        holds it."""
        store, book, stamps = self._pods.informer.store, self._book, self._stamps
        version, pod = store.version(key), store.get(key)
        if version is None or pod is None:
            return None, None  # deleted since the keys were taken
        uid = uid_of(pod)
        # Taken before the backend pod is read, and nothing is awaited before the verdict:
        # the verdict is of what the stamp describes.
        stamp = stamps.backend_stamp(key, upper_uid=uid) if stamps is not None else None
        backend = self._provider.backend_pod(pod)
        if backend is None:
            desired = None
        elif self._statuses is not None:
            desired = self._statuses.status_of(pod, backend=backend)  # not read twice
        else:
            desired = self._provider.pod_status(pod)
        in_hand = self._in_hand(key) or (book is not None and book.backend_writing(uid))
        status_unseen, deletion_unseen = self._unseen(key)
        reason = patrol_decisions.upper_pod_drift(
            pod,
            backend=backend,
            desired_status=desired,
            in_hand=in_hand,
            status_unseen=status_unseen,
            deletion_unseen=deletion_unseen,
        )
        # A verdict held for a write on its way is no verdict: not remembered as clean.
        in_hand = in_hand or status_unseen or deletion_unseen
        compared = _Compared(
            version=version,
            uid=uid,
            stamp=stamp,
            backend_key=None if backend is None else object_key(backend),
        )
        if reason == "stale_status":
            fields = patrol_decisions.stale_fields(pod, desired)

            return Mismatch(kind="pods", reason=reason, key=key, detail=", ".join(fields)), compared
        if reason is not None:
            return Mismatch(kind="pods", reason=reason, key=key), compared
        if not in_hand and stamps is not None:
            self._clean[key] = compared
        return None, compared

    def _in_hand(self, key: str) -> bool:
        return self._pods.pods_from_upper.pending(key) or self._pods.status_from_lower.pending(key)

    def _unseen(self, key: str) -> tuple[bool, bool]:
        """Whether a status write / the final deletion of the pod controller's for `key`,
        answered, is not in the cache yet: the cached pod is older than the pod, and
        comparing it would find drift that is not there (a loaded upper apiserver's watch
        lags its answers by a second and more)."""
        return self._pods.status_unseen(key), self._pods.deletion_unseen(key)

    def in_hand(self, mismatch: Mismatch) -> bool:
        """Whether either pod queue still holds `mismatch`'s key, or a write of the pod
        controller's that the cache does not show yet explains it."""
        if self._in_hand(mismatch.key):
            return True
        status_unseen, deletion_unseen = self._unseen(mismatch.key)
        return patrol_decisions.unseen_write_explains(
            mismatch.reason, status_unseen=status_unseen, deletion_unseen=deletion_unseen
        )

    def repair(self, mismatch: Mismatch) -> None:
        """A stale status goes to the status queue, everything else to the pod queue."""
        if mismatch.reason == "stale_status":
            self._pods.status_from_lower.add(mismatch.key)
        else:
            self._pods.pods_from_upper.add(mismatch.key)


class MirrorCheck:
    """The copies of one mirror (ConfigMaps, Secrets, ServiceAccounts, Services,
    EndpointSlices, claims) against their sources: what its worker would write now."""

    def __init__(self, mirror: Mirror) -> None:
        """Compare through `mirror`'s own decision (`Mirror.decision`)."""
        self._mirror = mirror
        self.name = mirror.name
        self._kind = mirror.spec.source.plural

    async def mismatches(self) -> AsyncIterator[Mismatch]:
        """Yield the keys whose copy is missing, differs or is left over."""
        mirror = self._mirror
        async for key in paced(sorted(mirror.keys())):
            if mirror.queue.pending(key):
                # Its worker decides soon; a decision is not always free of effects (the
                # claims mirror's takes the upper PV read for the worker's next decision).
                continue
            reason = patrol_decisions.copy_drift(mirror.decision(key))
            if reason is not None:
                yield Mismatch(kind=self._kind, reason=reason, key=key)

    def in_hand(self, mismatch: Mismatch) -> bool:
        """Whether the mirror's queue still holds `mismatch`'s key."""
        return self._mirror.queue.pending(mismatch.key)

    def repair(self, mismatch: Mismatch) -> None:
        """Queue the key on the mirror's own queue."""
        self._mirror.queue.add(mismatch.key)
