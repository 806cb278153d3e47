"""A sibling's copy: a target another writer of the same copies made (another virtual node
of the same upper cluster over the same lower cluster), which serves as ours.

`SiblingPolicy` states the rules (pure): which sibling's copies a mirror keeps (one of its
tenant, standing for this very source key, of a kind that keeps siblings' copies); which
of those it must not write (`conflict`: written under settings other than its own, so the
two writers would undo each other); that its maker goes first (`turn`: written only once
it has differed from our translation, unchanged, for `grace` seconds); that it stays in
its maker's name, also when it is made again (`in_makers_name`); and that an on-request
copy is collected by its maker only (`collects`). `MakerWaits` remembers the waits
between the worker's visits of a key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tensile.contracts.objects import Obj, resource_version_of
from tensile.kube.mirror.spec import Creation, KindSpec, Tenancy

SIBLING_GRACE = 3.0
"""Default seconds a sibling's copy must have differed from our translation, unchanged,
before the worker writes it: longer than a live maker takes to follow a change (its watch
event and one write, well under a second on a healthy cluster), short enough that a dead
maker's copies lag by a few seconds only."""

_PRUNE_MIN = 64
"""Waits held before stale ones are looked for (see `MakerWaits.hold`)."""


@dataclass(frozen=True)
class Waiting:
    """A sibling's copy seen differing from our translation, left to its maker a while."""

    resource_version: str
    """The copy's resourceVersion when first seen differing: if it moves, someone (its
    maker) is keeping it, and the wait starts again."""
    due: float
    """Clock time (seconds) from which the worker writes it, if it still differs."""


@dataclass(frozen=True, kw_only=True)
class SiblingPolicy:
    """The rules for siblings' copies of one kind (see the module docstring)."""

    tenancy: Tenancy
    keeps_siblings: Callable[[str, Obj], bool]
    """The kind's `KindSpec.keeps_siblings`."""
    creation: Creation
    """The kind's `KindSpec.creation`."""
    sibling_conflict: Callable[[Obj, Obj], str | None] | None = None
    """The kind's `KindSpec.sibling_conflict`."""
    grace: float = SIBLING_GRACE
    """Seconds a sibling's copy must have differed, unchanged, before it is written."""

    @classmethod
    def of(cls, spec: KindSpec, *, tenancy: Tenancy, grace: float = SIBLING_GRACE) -> SiblingPolicy:
        """The policy of `spec`'s kind in `tenancy`, with `grace` (seconds)."""
        return cls(
            tenancy=tenancy,
            keeps_siblings=spec.keeps_siblings,
            creation=spec.creation,
            sibling_conflict=spec.sibling_conflict,
            grace=grace,
        )

    def keeps(self, key: str, target: Obj) -> bool:
        """Whether `target`, found where source `key`'s copy belongs, is kept: our own, or
        a sibling's copy of this very source key, of a kind that keeps siblings' copies."""
        tenancy = self.tenancy
        if tenancy.owned(target):
            return True
        return (
            tenancy.same_tenant(target)
            and tenancy.source_key(target) == key
            and self.keeps_siblings(key, target)
        )

    def conflict(self, target: Obj, source: Obj) -> str | None:
        """Why the kept `target`, standing for `source`, must not be written by us (a
        sibling's copy its kind's `sibling_conflict` objects to), or None: our own copy,
        or one we may write."""
        if self.sibling_conflict is None or self.tenancy.owned(target):
            return None
        return self.sibling_conflict(target, source)

    def collects(self, target: Obj) -> bool:
        """Whether a kept `target` may be collected by us: our own, or a sibling's copy in a
        mirror of every selected source (`creation` "always"; a sibling's on-request copy is
        there for the sibling's pods, so its collection is the sibling's)."""
        return self.tenancy.owned(target) or self.creation == "always"

    def in_makers_name(self, desired: Obj, maker: Obj | None) -> Obj:
        """`desired` in the name of `maker` (a sibling's copy it stands in for), or as it
        is when there is none (`maker` None or our own)."""
        if maker is None or self.tenancy.owned(maker):
            return desired
        return self.tenancy.in_name_of(desired, maker)

    def stale(self, waiting: Waiting, now: float) -> bool:
        """Whether nobody came back for `waiting` when it was due (the key failed or was
        handled otherwise): a copy seen again is looked at afresh."""
        return now > waiting.due + self.grace

    def turn(self, target: Obj, waited: Waiting | None, *, now: float) -> Waiting | None:
        """Return None when the worker may write `target` now, else the wait to hold (due
        later than `now`). Our own copy: always now. A sibling's: once it has differed with
        the same resourceVersion since `waited` began, for `grace` seconds (its maker, if
        alive, sees the same change and writes it meanwhile; it moving restarts the wait,
        and a write settles the key, so the next difference waits again). `now` is clock
        seconds."""
        if self.tenancy.owned(target):
            return None
        version = resource_version_of(target)
        if waited is None or waited.resource_version != version or self.stale(waited, now):
            waited = Waiting(resource_version=version, due=now + self.grace)
        return waited if now < waited.due else None


class MakerWaits:
    """Source key -> the wait for a sibling's copy's maker, until the key settles; stale
    entries (`SiblingPolicy.stale`) are dropped as new ones come."""

    def __init__(self, policy: SiblingPolicy) -> None:
        self._policy = policy
        self._waits: dict[str, Waiting] = {}
        self._prune_at = _PRUNE_MIN

    def __len__(self) -> int:
        return len(self._waits)

    def get(self, key: str) -> Waiting | None:
        """The wait held for `key`, if any."""
        return self._waits.get(key)

    def hold(self, key: str, waiting: Waiting, *, now: float) -> None:
        """Hold `waiting` for `key`. Stale waits are pruned when the entries have doubled
        since the last time: O(1) per wait on average, as many as the keys waiting now."""
        self._waits[key] = waiting
        if len(self._waits) >= self._prune_at:
            self._waits = {k: w for k, w in self._waits.items() if not self._policy.stale(w, now)}
            self._prune_at = max(_PRUNE_MIN, 2 * len(self._waits))

    def settle(self, key: str) -> None:
        """`key` settled: what was waited for is moot."""
        self._waits.pop(key, None)
