"""Reading Kubernetes objects as the API sends them: plain JSON dicts whose parts may be
missing, null or of the wrong shape (a malformed or hostile object), and the accessors
every program reads an object's metadata with. Pure; nothing here copies or mutates its
input.

`Obj` is the type every program keeps objects as (stores, informers, providers); the
readers return an empty value of the expected shape in place of anything else, so a
decision never fails on a missing or malformed part.

The accessors (`meta_of`, `labels_of`, `annotations_of`, `name_of`, `namespace_of`,
`uid_of`, `resource_version_of`, `deletion_timestamp_of`, `owner_references_of`; the upper
UID of a lower copy is `ownership.upper_uid_of`, beside the mark it reads) are the one way
an object's metadata is read. Each takes an object (a mapping; only its parts are
distrusted) and returns the part itself, never a copy:
- a mapping (`meta_of`, `labels_of`, `annotations_of`): the object's own dict, or an
  empty read-only one when the part is missing or not an object;
- a field every stored object has (`name_of`, `namespace_of`, `uid_of`,
  `resource_version_of`): its text, or "" when it is missing or not text (cluster-scoped
  objects have namespace "");
- a mark only some objects carry (`deletion_timestamp_of`): its text, or None when it is
  absent, empty or not text;
- a list (`owner_references_of`): the object's own list, or an empty tuple; its items are
  as the object holds them (check each with `as_mapping`).
They sit on every event's path (the pod controllers read several per event), so each is
a dict lookup or two and one type check per level: about as cheap as the inline read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object (or part of one) as decoded JSON."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
"""What a missing or malformed mapping reads as: empty, shared, and read-only."""


def as_mapping(value: object) -> Mapping[str, Any]:
    """Return `value` itself when it is a mapping, else an empty one (read-only)."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    """Return `value` itself when it is a list, else a new empty list."""
    return value if isinstance(value, list) else []


def dicts_in(value: object) -> list[dict[str, Any]]:
    """Return the dict items of `value` when it is a list (a new list of the same items;
    anything else a malformed object carries there is left out), else []."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return `obj`'s metadata (its own dict), or an empty read-only mapping."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else _EMPTY


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return `obj`'s labels (its own dict: label key -> value, values as the object holds
    them), or an empty read-only mapping."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else _EMPTY


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return `obj`'s annotations (its own dict: key -> value, values as the object holds
    them), or an empty read-only mapping."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else _EMPTY


def name_of(obj: Mapping[str, Any]) -> str:
    """Return `obj`'s metadata.name, or ""."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def namespace_of(obj: Mapping[str, Any]) -> str:
    """Return `obj`'s metadata.namespace, or "" (cluster-scoped, or missing)."""
    meta = obj.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return namespace if isinstance(namespace, str) else ""


def uid_of(obj: Mapping[str, Any]) -> str:
    """Return `obj`'s metadata.uid, or ""."""
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else ""


def resource_version_of(obj: Mapping[str, Any]) -> str:
    """Return `obj`'s metadata.resourceVersion (opaque text, compared only for equality),
    or ""."""
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) else ""


def deletion_timestamp_of(obj: Mapping[str, Any]) -> str | None:
    """Return `obj`'s metadata.deletionTimestamp (RFC 3339 text, UTC: when the apiserver
    was asked to delete it), or None while it is not being deleted."""
    meta = obj.get("metadata")
    stamp = meta.get("deletionTimestamp") if isinstance(meta, dict) else None
    return stamp if isinstance(stamp, str) and stamp else None


def owner_references_of(obj: Mapping[str, Any]) -> Sequence[Any]:
    """Return `obj`'s metadata.ownerReferences (its own list; items unchecked), or ()."""
    meta = obj.get("metadata")
    references = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return references if isinstance(references, list) else ()
