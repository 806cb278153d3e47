"""What one source key needs, decided from what the mirror knows (pure): `decide`.

The engine gathers the facts (the source as cached, the target as cached corrected by its
own writes in flight, `inflight.known_target`; whether something uses the target; the wait and the
sibling's copy remembered for the key), calls `decide` and performs the `Action`. The
rules are those of the package docstring; every case is a row of
tests/unit/test_mirror_decide.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tensile.contracts.objects import Obj, deletion_timestamp_of
from tensile.kube.mirror.siblings import SiblingPolicy, Waiting
from tensile.kube.mirror.spec import KindSpec, Patch, Replace
from tensile.kube.resources import object_key

Occasion = Literal["sync", "ensure", "collect", "met", "met_ensure"]
"""Why a key is looked at: the worker (`sync`); a pod that needs the copy now (`ensure`:
it is made whatever `creation` says, without waiting for a sibling's maker); a collection
asked for (`collect`: our own copy only, never made); a create that found `current` in the
way (`met`, or `met_ensure` for the create of an `ensure`)."""


@dataclass(frozen=True)
class Nothing:
    """Nothing to write: no copy is wanted and none is kept, or one is kept as it is
    (needed, or not ours to change; a name taken is its own action, `NameTaken`)."""


@dataclass(frozen=True)
class UpToDate:
    """The kept `target` equals its translation (the worker reports it on the source)."""

    target: Obj


@dataclass(frozen=True)
class Create:
    """POST `desired` (in its maker's name when it stands in for a sibling's copy)."""

    desired: Obj


@dataclass(frozen=True)
class Update:
    """Patch the kept `target` with `patch`."""

    target: Obj
    patch: Patch


@dataclass(frozen=True)
class Recreate:
    """Delete `target` (UID precondition) and POST `desired`."""

    target: Obj
    desired: Obj
    reason: str
    leftover: bool = False
    """The target is the leftover of an earlier source object of the same name (not a
    replacement): `ensure` answers "created"; the worker does not report the new copy (its
    own event brings the key back)."""


@dataclass(frozen=True)
class Delete:
    """Delete `target` (UID precondition): garbage."""

    target: Obj


@dataclass(frozen=True)
class WaitForMaker:
    """`target` is a sibling's copy whose maker goes first: hold `waiting`, look again in
    `after` seconds."""

    target: Obj
    waiting: Waiting
    after: float


@dataclass(frozen=True)
class StillDeleting:
    """The object a create met is being deleted (a finalizer holds it): try again soon."""

    target: Obj


@dataclass(frozen=True)
class NameTaken:
    """`target` holds the copy's name and may not be used (someone else's object, a sibling's
    copy the kind does not keep, or our copy kept for an earlier source of the same name):
    `message` says why."""

    target: Obj
    message: str


@dataclass(frozen=True)
class Missing:
    """`ensure` was asked for a source that is absent or not selected."""


Action = (
    Nothing
    | UpToDate
    | Create
    | Update
    | Recreate
    | Delete
    | WaitForMaker
    | StillDeleting
    | NameTaken
    | Missing
)


def decide(  # noqa: PLR0911 - a dispatch
    key: str,
    *,
    source: Obj | None,
    current: Obj | None,
    spec: KindSpec,
    siblings: SiblingPolicy,
    occasion: Occasion = "sync",
    in_use: bool = False,
    waited: Waiting | None = None,
    remade: Obj | None = None,
    now: float,
) -> Action:
    """Return what the target of source `key` needs.

    `source`: the source object as cached, or None; `current`: the target as known
    (`inflight.known_target`; for `met`/`met_ensure` the object the create found), or None;
    `in_use`: whether something needs the target of `key`, present or not (on-request
    mirrors: a copy in use that is gone is made again); `waited`: the wait
    held for `key` (`MakerWaits`); `remade`: the sibling's copy deleted to be made again,
    whose owner's name a new copy takes; `now`: clock seconds. Raises nothing; the spec's
    functions are called as the case needs them.
    """
    if source is not None and not spec.selects(source):
        source = None
    rules = _Rules(
        key=key,
        spec=spec,
        siblings=siblings,
        in_use=in_use,
        waited=waited,
        remade=remade,
        now=now,
    )
    if occasion == "sync":
        return rules.sync(source, current)
    if occasion == "collect":
        return rules.collect(source, current)
    if source is None:
        return Missing()
    if occasion == "ensure":
        return rules.ensure(source, current)
    if current is None:  # nothing in the way after all: nothing to do with it
        return Nothing()
    if occasion == "met":
        return rules.met(source, current)
    return rules.met_ensure(source, current)


@dataclass(frozen=True, kw_only=True)
class _Rules:
    """The cases of one `decide` call."""

    key: str
    spec: KindSpec
    siblings: SiblingPolicy
    in_use: bool
    waited: Waiting | None
    remade: Obj | None
    now: float

    def sync(self, source: Obj | None, current: Obj | None) -> Action:  # noqa: PLR0911 - the cases
        always = self.spec.creation == "always"
        if current is None:
            # An on-request copy something still uses is made again when it went (deleted
            # below by someone else, or collected by the sibling that made it): the next
            # container start of a pod using it would fail for good without it.
            if source is not None and (always or self.in_use):
                return Create(self.desired(source, None))
            return Nothing()
        if not self.siblings.keeps(self.key, current):
            if source is not None and always:
                return self.name_taken(current, whose=self.siblings.tenancy.describe(current))
            return Nothing()
        mine = source if source is None or self.spec.stands_for(current, source) else None
        if self.collectable(current, mine):
            wait = self.wait(current)
            if wait is not None:
                return wait
            if source is not None and mine is None and always:
                return self.leftover(source, current)
            return Delete(current)
        if mine is None:
            if source is not None and always:
                return self.name_taken(current, whose=_EARLIER)
            return Nothing()
        return self.apply(mine, current, wait=True)

    def ensure(self, source: Obj, current: Obj | None) -> Action:
        if current is None:
            return Create(self.desired(source, None))
        keeps = self.siblings.keeps(self.key, current)
        if keeps and not self.spec.stands_for(current, source):
            if not self.collectable(current, None):
                return NameTaken(
                    current,
                    f"{self.spec.target.kind} {object_key(current)} is kept for an earlier "
                    f"{self.spec.kind} of the same name",
                )
            return self.leftover(source, current)
        if not keeps:
            return NameTaken(current, f"{self.spec.target.kind} {object_key(current)} {_NOT_OURS}")
        return self.apply(source, current, wait=False)

    def collect(self, source: Obj | None, current: Obj | None) -> Action:
        if current is None or not self.siblings.tenancy.owned(current):
            return Nothing()
        if source is not None and not self.spec.stands_for(current, source):
            source = None
        if self.spec.collectable(current, source) and not self.in_use:
            return Delete(current)
        return Nothing()

    def met(self, source: Obj, current: Obj) -> Action:
        if _deleting(current):
            return StillDeleting(current)
        if not self.siblings.keeps(self.key, current):
            return self.name_taken(current, whose=self.siblings.tenancy.describe(current))
        if not self.spec.stands_for(current, source):
            return self.name_taken(current, whose=_EARLIER)
        return self.apply(source, current, wait=True)

    def met_ensure(self, source: Obj, current: Obj) -> Action:
        if _deleting(current):
            return StillDeleting(current)
        if not self.siblings.keeps(self.key, current):
            return NameTaken(current, f"{self.spec.target.kind} {object_key(current)} {_NOT_OURS}")
        return self.apply(source, current, wait=False)

    # -- the parts ---------------------------------------------------------------------

    def apply(self, source: Obj, current: Obj, *, wait: bool) -> Action:
        """Bring the kept `current` to the translation of `source`, in its owner's name;
        with `wait`, a sibling's copy is left to its maker a while first; one we must not
        write (`SiblingPolicy.conflict`) is left to it for good."""
        if (conflict := self.siblings.conflict(current, source)) is not None:
            return NameTaken(
                current,
                f"{self.spec.target.kind} {object_key(current)} is "
                f"{self.siblings.tenancy.describe(current)}, {conflict}; leaving it to its maker",
            )
        desired = self.siblings.in_makers_name(self.spec.translate(source), current)
        change = self.spec.compare(current, desired)
        if change is None:
            return UpToDate(current)
        if wait:
            waiting = self.wait(current)
            if waiting is not None:
                return waiting
        if isinstance(change, Replace):
            return Recreate(current, self.desired(source, current), change.reason)
        return Update(current, change)

    def desired(self, source: Obj, replaced: Obj | None) -> Obj:
        """The translation of `source` to create, in the name of the sibling whose copy it
        replaces (`replaced`, or the one `remade` remembers)."""
        maker = replaced
        if maker is None or self.siblings.tenancy.owned(maker):
            maker = self.remade
        return self.siblings.in_makers_name(self.spec.translate(source), maker)

    def leftover(self, source: Obj, current: Obj) -> Recreate:
        return Recreate(
            current,
            self.desired(source, current),
            f"made for an earlier {self.spec.kind} of the same name",
            leftover=True,
        )

    def collectable(self, current: Obj, source: Obj | None) -> bool:
        """Whether a kept `current` is deleted now: garbage by the spec, needed by nothing,
        and ours to collect (`SiblingPolicy.collects`)."""
        return (
            self.spec.collectable(current, source)
            and not self.in_use
            and self.siblings.collects(current)
        )

    def wait(self, current: Obj) -> WaitForMaker | None:
        waiting = self.siblings.turn(current, self.waited, now=self.now)
        if waiting is None:
            return None
        return WaitForMaker(current, waiting, waiting.due - self.now)

    def name_taken(self, current: Obj, *, whose: str) -> NameTaken:
        return NameTaken(
            current,
            f"{self.spec.target.kind} {object_key(current)} exists in the target cluster and "
            f"is {whose}; leaving it alone (the {self.spec.kind} {self.key} is not mirrored)",
        )


_EARLIER = "kept for an earlier object of the same name"
_NOT_OURS = "is not this mirror's"


def _deleting(target: Obj) -> bool:
    return bool(deletion_timestamp_of(target))
