"""An informer's cache: objects by key ("namespace/name") with optional secondary indexes.

Synchronous and single-threaded (one event loop). Objects are the API's dicts and are
shared with readers: callers must treat them as read-only.

An `encoded` store keeps each object as compact JSON (bytes) and decodes it when read:
a quarter of the memory of the dicts, for caches that are large and read a few times per
object (all pods of a node, all pods of a lower cluster, all ConfigMaps of a cluster), at
about 20 microseconds per read of a pod. Questions asked of every object (which pods use a
ConfigMap) are answered from indexes, which hold keys only and decode nothing. Each
object's resourceVersion is kept beside its encoded text, so `version` (the patrol's cache
audit asks it of every object) decodes nothing either.

The objects in motion are read far more often than the rest: a forwarded pod is read by
its status sync, its backend lookup and its next watch event's handlers within a second
of each event, then rarely for hours. So an encoded store also keeps the last `hot`
objects it was given or read as dicts (a bounded, least recently used set): those reads
decode nothing, and neither does the next event's old state. Memory stays bounded by
`hot`, not by the number of objects. A kept dict is shared like a plain store's, so the
read-only rule above holds for both kinds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping

from tensile.contracts.objects import Obj, resource_version_of
from tensile.kube import codec
from tensile.kube.resources import object_key

IndexFunc = Callable[[Obj], Iterable[str]]

HOT = 256
"""Objects an encoded store keeps decoded by default: about the pods a node has in flight
at once (bench/forwarding.py's 64 concurrent creates, each moving for a few seconds), some
3-4 MiB of dicts per store."""


class _Unread:
    """The type of _UNREAD: `upsert` was not told what the store holds."""


_UNREAD = _Unread()


class Store:
    """Keyed objects plus indexes: `by_index(name, value)` finds objects by a derived value."""

    def __init__(
        self,
        *,
        indexers: Mapping[str, IndexFunc] | None = None,
        encoded: bool = False,
        hot: int = HOT,
    ) -> None:
        """`encoded`: keep objects as compact JSON; `hot`: how many of them an encoded store
        also keeps decoded, the most recently given or read (0: none)."""
        self._items: dict[str, Obj | bytes] = {}
        self._hot: OrderedDict[str, Obj] = OrderedDict()
        """An encoded store's recently used objects, decoded, by key, the most recent last:
        each the decoded form of what `_items` holds under its key. Ordered as a linked
        list: a plain dict whose oldest entries are popped over and over leaves holes that
        each next look for the oldest walks over again."""
        self._hot_size = hot if encoded else 0
        self._versions: dict[str, str] = {}
        """An encoded store's resourceVersions by key (a plain store reads its dicts)."""
        self._encoded = encoded
        self._indexers = dict(indexers or {})
        self._indexes: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Obj]:
        # Over the objects stored when iteration began; an encoded store decodes one at a
        # time, so walking 10,000 pods never holds them all decoded at once.
        # A walk does not make what it reads hot: it would push out the objects in motion.
        hot = self._hot
        for key, value in list(self._items.items()):
            yield hot.get(key) or _decoded(value)

    def get(self, key: str) -> Obj | None:
        """Return the object with `key`, or None."""
        value = self._items.get(key)
        if value is None or not isinstance(value, bytes):
            return value
        hot = self._hot
        obj = hot.get(key)
        if obj is not None:
            hot.move_to_end(key)
            return obj
        fresh: Obj = codec.loads(value)
        self._keep(key, fresh)
        return fresh

    def version(self, key: str) -> str | None:
        """Return the resourceVersion of the object with `key` ("" if it has none), or None
        when there is no such object. Nothing is decoded: an encoded store keeps it beside
        the text."""
        if self._encoded:
            return self._versions.get(key)
        value = self._items.get(key)
        return None if value is None else _version(value)

    def keys(self) -> list[str]:
        """Return every key."""
        return list(self._items)

    def add_indexer(self, name: str, func: IndexFunc) -> None:
        """Add the secondary index `name` (objects already stored are indexed at once), so a
        component sharing this store can look objects up by a value of its own.

        Raises ValueError when an index of that name exists.
        """
        if name in self._indexers:
            raise ValueError(f"index {name!r} exists")
        self._indexers[name] = func
        self._indexes[name] = {}
        for key, value in self._items.items():
            for derived in func(_decoded(value)):
                self._indexes[name].setdefault(derived, set()).add(key)

    def by_index(self, index: str, value: str) -> list[Obj]:
        """Return the objects whose indexer `index` yields `value`.

        Raises KeyError for an index that was not configured.
        """
        keys = self._indexes[index].get(value, ())
        hot = self._hot
        return [hot.get(k) or _decoded(self._items[k]) for k in keys]

    def index_keys(self, index: str, value: str) -> frozenset[str]:
        """Return the keys of the objects whose indexer `index` yields `value` (nothing is
        decoded). Raises KeyError for an index that was not configured."""
        return frozenset(self._indexes[index].get(value, ()))

    def upsert(self, obj: Obj, *, old: Obj | _Unread | None = _UNREAD) -> Obj | None:
        """Insert or replace `obj`; return the object it replaced, if any.

        `old`: what the store holds under `obj`'s key, when the caller has just read it
        (an encoded store then decodes it once, not twice).
        """
        key = object_key(obj)
        if isinstance(old, _Unread):
            old = self.get(key)
        if old is not None:
            self._unindex(key, old)
        self._put(key, obj, codec.packed(obj) if self._encoded else obj)
        return old

    def update(self, obj: Obj) -> tuple[bool, Obj | bytes | None]:
        """Insert or replace `obj` unless the store holds it already; return (changed, what
        it replaced). Nothing is decoded to decide: an encoded store compares the encoded
        text (an object whose resourceVersion moved always differs), a plain store the
        resourceVersions. What it replaced is as it was stored (in an encoded store its bytes,
        or its dict while kept decoded: `decoded` reads either), None when `obj` is new.
        """
        key = object_key(obj)
        previous = self._items.get(key)
        if self._encoded:
            value: Obj | bytes = codec.packed(obj)
            if previous is not None:
                unchanged = previous == value
                # Handed back decoded when kept so: the old state needs no decoding then.
                previous = self._hot.get(key, previous)
                if unchanged:
                    return False, previous
        else:
            value = obj
            if previous is not None and _version(previous) == _version(obj):
                return False, previous
        if previous is not None and self._indexers:
            self._unindex(key, _decoded(previous))
        self._put(key, obj, value)
        return True, previous

    def delete(self, key: str) -> Obj | None:
        """Remove the object with `key`; return it, or None if it was not there."""
        value = self._items.pop(key, None)
        if value is None:
            return None
        self._versions.pop(key, None)
        kept = self._hot.pop(key, None)
        old = kept if kept is not None else _decoded(value)
        self._unindex(key, old)
        return old

    def _put(self, key: str, obj: Obj, value: Obj | bytes) -> None:
        """Store `value`, `obj` as kept (its encoded text in an encoded store), and index it."""
        self._items[key] = value
        if self._encoded:
            self._versions[key] = resource_version_of(obj)
            self._keep(key, obj)
        self._index(key, obj)

    def _keep(self, key: str, obj: Obj) -> None:
        """Keep `obj` (the decoded form of what is stored under `key`) as the most recently
        used, dropping the least recently used beyond the bound."""
        if self._hot_size <= 0:
            return
        hot = self._hot
        hot[key] = obj
        hot.move_to_end(key)
        if len(hot) > self._hot_size:
            hot.popitem(last=False)

    def _index(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            for value in func(obj):
                self._indexes[name].setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            index = self._indexes[name]
            for value in func(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]


def decoded(value: Obj | bytes) -> Obj:
    """Return an object as `update` handed it back (decoding an encoded store's bytes)."""
    return _decoded(value)


def _version(obj: Obj | bytes) -> str:
    return resource_version_of(obj) if isinstance(obj, dict) else ""


def _decoded(value: Obj | bytes) -> Obj:
    if isinstance(value, bytes):
        result: Obj = codec.loads(value)
        return result
    return value
