"""What a mirror knows of the kind it mirrors (`KindSpec`) and of whose targets it keeps
(`Tenancy`, one for every kind of one writer). Pure: every function gets read-only objects
(a source as its informer caches it, a target as the target's informer does). A spec may
also be built over read-only views of other caches (the EndpointSlice mirror reads Services
and pods to decide what crosses); its functions then answer for those caches as they are,
the mirror is given their informers (`Mirror(reads=...)`), and whoever wires it revisits the
keys a change of them concerns (`Mirror.revisit`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from tensile.contracts.objects import Obj
from tensile.kube.resources import Resource


@dataclass(frozen=True)
class Patch:
    """Bring the target to its translation with this patch."""

    body: Obj | list[Obj]
    content_type: str | None = None
    """The patch's media type; None: a JSON merge patch (RFC 7386). A JSON patch (RFC
    6902, a list of operations) says "application/json-patch+json"."""


@dataclass(frozen=True)
class Replace:
    """Delete the target and create its translation: a field that cannot change differs."""

    reason: str


Change = Patch | Replace | None
"""What `KindSpec.compare` decides: a patch, a replacement, or None (equal)."""

Creation = Literal["always", "on_request"]


class Tenancy(Protocol):
    """Whose targets a writer keeps: its ownership marks and its siblings' (other writers of
    the same copies, e.g. the virtual nodes of one upper cluster over one lower cluster),
    and where the target of a source key is. The same for every kind one writer mirrors."""

    def owned(self, target: Obj) -> bool:
        """Whether `target` carries this writer's own marks."""

    def same_tenant(self, target: Obj) -> bool:
        """Whether `target` carries the marks of this writer's tenant: its own or a
        sibling's (any virtual node of the same upper cluster)."""

    def target_key(self, source_key: str) -> str:
        """Source key -> the key its target has ("ns/name" -> "prefix-ns/name"); works
        after the source is gone."""

    def source_key(self, target: Obj) -> str | None:
        """A target of this tenant -> the key of the source it stands for (None: unknown)."""

    def in_name_of(self, desired: Obj, target: Obj) -> Obj:
        """`desired` (a translation, in this writer's name) with `target`'s ownership
        marks instead: a sibling's copy stays its maker's when we write it."""

    def describe(self, target: Obj) -> str:
        """Whose `target` is, for the messages of a name taken ("owned by ...")."""


def _never(_key: str, _target: Obj) -> bool:
    return False


def _always(_target: Obj, _source: Obj) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class KindSpec:
    """One kind mirrored in one direction: what is mirrored and how (ownership is the
    `Tenancy`'s). Every function is pure."""

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
    """(kept target, its selected source or None) -> whether the target is garbage (an
    on-request mirror also asks `in_use`)."""
    creation: Creation = "always"
    report: Callable[[Obj, Obj], Obj | None] | None = None
    """(source, its target) -> a merge patch that records something of the target on the
    source (e.g. the lower ClusterIP), or None when the source already shows it."""
    report_status: Callable[[Obj, Obj], Obj | None] | None = None
    """(source, its target) -> a merge patch of the source's `status` subresource (e.g. the
    addresses of an Ingress's copy), or None; asked after `report`, with the source as its
    patch left it."""
    stands_for: Callable[[Obj, Obj], bool] = _always
    """(kept target, source of its key) -> whether the target was made for this very
    source object: False (e.g. another UID) makes it the leftover of an earlier object of
    the same name, collected as one whose source is gone, or in the way if it is kept."""
    notice: Callable[[Obj], str | None] | None = None
    """(source) -> what its user should know about how it was mirrored (e.g. a Service
    type the target cluster does not take), told once per source object and message, or
    None."""
    refusal: Callable[[Obj], str | None] | None = None
    """(a source `selects` leaves out) -> why it is not mirrored, for its user (e.g. an
    Ingress whose class the target cluster does not take), told once per source object and
    message (`Mirror(on_refusal=...)`) after `notice_settle`, or None (nothing to tell)."""
    notice_settle: float = 0.0
    """Seconds a `notice` (or a `refusal`) must stay the same before it is told (0: at
    once). For notices that other caches the functions read can make true for a moment (an
    endpoint whose pod another informer has not shown yet): only one that outlasts such a
    lag is told."""
    keeps_siblings: Callable[[str, Obj], bool] = _never
    """(source key, a sibling's copy of it) -> whether this kind keeps it like its own
    (e.g. within this node's --service-namespaces); default: never."""
    sibling_conflict: Callable[[Obj, Obj], str | None] | None = None
    """(a kept sibling's copy, its source) -> why this writer must not write it, or None
    (None, the default: it may). E.g. the copy says it was written under settings other
    than this writer's (which types a Service may have below): the writers would undo each
    other's writes, so the copy is left to its maker, which keeps it; its collection,
    once the source is gone, stays anyone's."""
