"""The mirror's own writes the target informer has not shown yet, so a worker never acts on
a stale cache: a copy deleted a moment ago is made again, not taken as present; one just
made is deleted by its UID if its source goes at once."""

from __future__ import annotations

from tensile.contracts.objects import Obj, uid_of


def known_target(cached: Obj | None, *, created: Obj | None, deleted: str | None) -> Obj | None:
    """Return the target as the mirror knows it: the `cached` one, corrected by its own
    writes the cache has not shown yet: `created` (what it made there) and `deleted` (the
    UID it deleted there, moot once `deletion_seen`)."""
    if deleted is not None and not deletion_seen(cached, deleted):
        return None
    return cached if cached is not None else created


def deletion_seen(cached: Obj | None, deleted: str) -> bool:
    """Whether the cache shows the deletion of the object with UID `deleted`: it holds no
    object there, or another one."""
    return cached is None or uid_of(cached) != deleted


class WritesInFlight:
    """Target key -> what the mirror created there, or the UID it deleted there, until the
    target informer shows it.

    A create is forgotten once the informer shows the object made (an add or a change of
    that UID) or its deletion, whichever comes first and also when it comes before the
    create's answer: a copy made and then deleted by someone else is never taken as present
    (a remembered create the cache cannot correct would mask the deletion for good). A
    delete is forgotten once the informer shows that UID gone or another object there."""

    def __init__(self) -> None:
        self._created: dict[str, Obj] = {}
        self._deleted: dict[str, str] = {}
        self._shown_gone: dict[str, set[str]] = {}
        """Target key with a create on its way -> the UIDs the informer showed deleted there
        meanwhile (one may be the object made, its answer not back yet)."""

    def known(self, target_key: str, cached: Obj | None) -> Obj | None:
        """The target at `target_key` as known (`known_target` of the `cached` one);
        forgets the writes the cache shows now."""
        if cached is not None:
            self._created.pop(target_key, None)
        deleted = self._deleted.get(target_key)
        if deleted is not None and deletion_seen(cached, deleted):
            del self._deleted[target_key]
        return known_target(
            cached, created=self._created.get(target_key), deleted=self._deleted.get(target_key)
        )

    def creating(self, target_key: str) -> None:
        """A create at `target_key` is sent now; `created` or `abandoned` follows."""
        self._shown_gone.setdefault(target_key, set())

    def abandoned(self, target_key: str) -> None:
        """The create at `target_key` made nothing (it failed, or met an object)."""
        self._shown_gone.pop(target_key, None)

    def created(self, target_key: str, target: Obj) -> None:
        """The mirror created `target` at `target_key` (remembered unless the informer has
        shown its deletion already)."""
        self._deleted.pop(target_key, None)
        if uid_of(target) in self._shown_gone.pop(target_key, set()):
            self._created.pop(target_key, None)
            return
        self._created[target_key] = target

    def deleted(self, target_key: str, target_uid: str) -> None:
        """The mirror deleted the object with UID `target_uid` at `target_key`."""
        self._deleted[target_key] = target_uid
        self._created.pop(target_key, None)

    def shown(self, target_key: str, target: Obj) -> None:
        """The target informer showed `target` (added or changed) at `target_key`."""
        created = self._created.get(target_key)
        if created is not None and uid_of(created) == uid_of(target):
            del self._created[target_key]

    def shown_gone(self, target_key: str, target: Obj) -> None:
        """The target informer showed the deletion of `target` at `target_key`."""
        gone = uid_of(target)
        created = self._created.get(target_key)
        if created is not None and uid_of(created) == gone:
            del self._created[target_key]
        if self._deleted.get(target_key) == gone:
            del self._deleted[target_key]
        noted = self._shown_gone.get(target_key)
        if noted is not None:
            noted.add(gone)

    def __len__(self) -> int:
        """How many writes are remembered (creates, deletes, creates on their way)."""
        return len(self._created) + len(self._deleted) + len(self._shown_gone)
