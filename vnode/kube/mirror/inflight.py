"""The mirror's own writes the target informer has not shown yet, so a worker never acts on
a stale cache: a copy deleted a moment ago is made again, not taken as present; one just
made is deleted by its UID if its source goes at once."""

from __future__ import annotations

from vnode.contracts.objects import Obj


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
    return cached is None or uid(cached) != deleted


def uid(obj: Obj) -> str:
    """The UID of `obj` ("" if it has none)."""
    return str((obj.get("metadata") or {}).get("uid") or "")


class WritesInFlight:
    """Target key -> what the mirror created there, or the UID it deleted there, until the
    target informer shows it."""

    def __init__(self) -> None:
        self._created: dict[str, Obj] = {}
        self._deleted: dict[str, str] = {}

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

    def created(self, target_key: str, target: Obj) -> None:
        """The mirror created `target` at `target_key`."""
        self._created[target_key] = target
        self._deleted.pop(target_key, None)

    def deleted(self, target_key: str, target_uid: str) -> None:
        """The mirror deleted the object with UID `target_uid` at `target_key`."""
        self._deleted[target_key] = target_uid
        self._created.pop(target_key, None)
