"""How a virtual node maps upper names to lower ones: namespaces (with or without a
prefix), object keys, and the tenancy its mirrors share (`NodeTenancy`). The ownership
marks it writes on every lower object, and `NodeIdentity`, are an agreement between the
programs: `tensile.contracts.ownership`. Pure functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensile.contracts import names
from tensile.contracts.objects import meta_of
from tensile.contracts.ownership import (
    CLUSTER_ANNOTATION,
    CLUSTER_LABEL,
    NODE_ANNOTATION,
    NODE_LABEL,
    UPPER_NAMESPACE_ANNOTATION,
    NodeIdentity,
    is_owned,
    owner_of,
    same_cluster,
)
from tensile.kube.namespaced import NamespaceSet

TRIPPED_LABELS_ANNOTATION = "tripped-labels"
"""On a lower pod (tensile-kube's name): JSON of the labels `--ignore-labels` kept off it,
written by the virtual node, which restores them when it reads the pod back (tensile-kube's
GetPod)."""
TRACEPARENT_ANNOTATION = "tensile.io/traceparent"
"""On a lower pod the virtual node created while tracing (--trace-exporter): the W3C
traceparent (`00-<trace id>-<span id>-<flags>`) of the span of its create, so a tool on the
lower side can join the pod's trace. Only the node writes it: one on the upper pod stays
upstairs, and a pod forwarded untraced has none."""
NAMESPACE_MAX = names.LABEL_MAX
"""Namespace names are DNS-1123 labels: at most 63 characters."""


def is_dns_label(text: str) -> bool:
    """Tell whether `text` is a DNS-1123 label (what namespace names must be)."""
    return names.is_dns1123_label(text)


def lower_namespace(upper_namespace: str, *, prefix: str) -> str:
    """Return the lower namespace for an upper one (`prefix` + name; no prefix keeps the name).

    The result may be longer than a namespace may be; `namespace_problem` says so.
    """
    return f"{prefix}{upper_namespace}"


def lower_key(upper_key: str, *, prefix: str) -> str:
    """Return the lower "namespace/name" of the object an upper one is copied to."""
    namespace, _, name = upper_key.partition("/")
    return f"{lower_namespace(namespace, prefix=prefix)}/{name}"


def upper_key_of(lower: Mapping[str, Any], *, prefix: str) -> str | None:
    """Return the upper "namespace/name" an owned lower object stands for, or None.

    The upper namespace is the `UPPER_NAMESPACE_ANNOTATION` when the object has it, else
    its lower namespace without `prefix` (copies made before the annotation existed).
    Either way an object stands only for an upper object whose namespace maps to the
    object's own (`lower_namespace`): the annotation, which anyone who can write the
    object can write, never points a node at an object outside the namespaces it maps to
    (None then).
    """
    meta = meta_of(lower)
    namespace = (meta.get("annotations") or {}).get(UPPER_NAMESPACE_ANNOTATION)
    lower_ns = str(meta.get("namespace") or "")
    if not namespace:
        if not lower_ns.startswith(prefix) or len(lower_ns) == len(prefix):
            return None
        namespace = lower_ns[len(prefix) :]
    if lower_namespace(namespace, prefix=prefix) != lower_ns:
        return None
    return f"{namespace}/{meta.get('name')}"


def in_name_of(obj: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
    """Return `obj` (a copy carrying some owner's marks) with `target`'s owner marks instead:
    what a sibling's copy should be, in its owner's name. Pure: `obj` is not changed."""
    meta = dict(obj.get("metadata") or {})
    target_meta = meta_of(target)
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    for marks, theirs, keys in (
        (labels, target_meta.get("labels") or {}, (NODE_LABEL, CLUSTER_LABEL)),
        (annotations, target_meta.get("annotations") or {}, (NODE_ANNOTATION, CLUSTER_ANNOTATION)),
    ):
        for key in keys:
            if key in theirs:
                marks[key] = theirs[key]
            else:
                marks.pop(key, None)
    meta["labels"], meta["annotations"] = labels, annotations
    return {**obj, "metadata": meta}


@dataclass(frozen=True, kw_only=True)
class NodeTenancy:
    """The tenancy of one virtual node's copies (a `tensile.kube.mirror.spec.Tenancy`): its
    ownership marks, its siblings' (the other virtual nodes of its upper cluster), and the
    namespace prefix that maps an upper key to a lower one. Built once from the node's
    identity and shared by every kind it mirrors."""

    owner: NodeIdentity
    prefix: str
    """--namespace-prefix ("" keeps the names)."""
    watched: NamespaceSet | None = field(default=None, compare=False)
    """With --lower-namespace-role: the lower namespaces the node made and holds rights
    in, which its caches of copies watch one by one (None: they watch cluster-wide)."""

    def owned(self, target: Mapping[str, Any]) -> bool:
        """Whether `target` is this node's (`ownership.is_owned`)."""
        return is_owned(target, owner=self.owner)

    def same_tenant(self, target: Mapping[str, Any]) -> bool:
        """Whether `target` was made for this node's upper cluster (`ownership.same_cluster`)."""
        return same_cluster(target, owner=self.owner)

    def target_key(self, source_key: str) -> str:
        """The lower key of upper `source_key` (`lower_key`)."""
        return lower_key(source_key, prefix=self.prefix)

    def source_key(self, target: Mapping[str, Any]) -> str | None:
        """The upper key a lower copy stands for (`upper_key_of`)."""
        return upper_key_of(target, prefix=self.prefix)

    def in_name_of(self, desired: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
        """`desired` with `target`'s owner marks (`in_name_of`)."""
        return in_name_of(desired, target)

    def describe(self, target: Mapping[str, Any]) -> str:
        """Whose `target` is (`ownership.owner_of`)."""
        return owner_of(target)


def namespace_conflict(
    namespace: Mapping[str, Any], *, owner: NodeIdentity, upper_namespace: str, prefix: str
) -> str | None:
    """Return why pods of `upper_namespace` must not be placed in the existing lower
    `namespace`, or None when they may.

    Without a prefix a namespace has the same name above and below and is shared by design
    (several upper clusters' `default`, say); objects inside are owned one by one. With a
    prefix the lower namespace belongs to one tenant: it must carry this upper cluster's ID
    and this upper namespace, as `ownership.namespace_marks` wrote them. A namespace someone else
    created, or made for another upper namespace whose prefixed name happens to be the same
    (`t1-` + `x-y` and `t1-x-` + `y`), is refused.
    """
    if not prefix:
        return None
    meta = meta_of(namespace)
    annotations = meta.get("annotations") or {}
    name = meta.get("name")
    cluster = annotations.get(CLUSTER_ANNOTATION)
    made_for = annotations.get(UPPER_NAMESPACE_ANNOTATION)
    if cluster is None or made_for is None:
        return (
            f"lower namespace {name} exists and was not created by tensile; refusing to place "
            f"pods of namespace {upper_namespace} in it (with --namespace-prefix, tensile uses "
            "only namespaces it created)"
        )
    if cluster != owner.cluster_id:
        return (
            f"lower namespace {name} belongs to upper cluster {cluster}, not to this one "
            f"({owner.cluster_id}); refusing to place pods of namespace {upper_namespace} in it"
        )
    if made_for != upper_namespace:
        return (
            f"lower namespace {name} was created for upper namespace {made_for}; refusing to "
            f"place pods of namespace {upper_namespace} in it (their prefixed names collide)"
        )
    return None


def namespace_problem(upper_namespace: str, *, prefix: str) -> str | None:
    """Return why `upper_namespace` cannot be mapped below with `prefix` (the mapped name
    is not a valid namespace name), or None."""
    lower = lower_namespace(upper_namespace, prefix=prefix)
    if is_dns_label(lower):
        return None
    return (
        f"namespace {upper_namespace} maps to {lower!r} below, which is not a valid namespace "
        f"name (a DNS-1123 label of at most {NAMESPACE_MAX} characters); use a shorter "
        "--namespace-prefix or a shorter namespace"
    )
