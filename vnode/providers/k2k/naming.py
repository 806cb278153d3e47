"""Names, labels and annotations that mark what a virtual node owns in the lower cluster.

Every object a virtual node creates below carries tensile-kube's `virtual-pod=true` label
(so tools written for tensile-kube still recognise it) and, beyond tensile-kube, its owner:
the name of the virtual node **and** the identity of the upper cluster that node belongs to.
Node names repeat across clusters (the default is `virtual-kubelet` everywhere), so the name
alone would let two upper clusters sharing one lower cluster delete each other's pods; with
both, several virtual nodes of several upper clusters share one lower cluster and none ever
updates, adopts or deletes another's objects. Pure functions only.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import clusterselector
from tensile.contracts import labels as contract_labels
from tensile.kube import names

# tensile-kube compatible names (exact strings); those the webhook and the descheduler use
# too are defined in tensile.contracts.
VIRTUAL_POD_LABEL = contract_labels.VIRTUAL_POD_LABEL
VIRTUAL_POD_VALUE = contract_labels.VIRTUAL_POD_VALUE
CLUSTER_SELECTOR_ANNOTATION = clusterselector.ANNOTATION
TRIPPED_LABELS_ANNOTATION = "tripped-labels"
"""On a lower pod (tensile-kube's name): JSON of the labels `--ignore-labels` kept off it,
written by the virtual node, which restores them when it reads the pod back (tensile-kube's
GetPod)."""
GLOBAL_ANNOTATION = "global"
"""On every owned lower object, value "true" (tensile-kube's mark of what a virtual node made)."""

# tensile's own ownership marks.
NODE_LABEL = "tensile.io/virtual-node"
"""Label on every owned lower object, `node_label_value(node)`; owned pods are selected by it."""
NODE_ANNOTATION = "tensile.io/virtual-node"
"""Annotation on every owned lower object: the owning virtual node's full name."""
CLUSTER_LABEL = "tensile.io/cluster-id"
"""Label on every owned lower object: `label_value(cluster ID)` of the owning upper cluster."""
CLUSTER_ANNOTATION = "tensile.io/cluster-id"
"""Annotation on every owned lower object: the owning upper cluster's full ID."""
UPPER_UID_ANNOTATION = "tensile.io/upper-uid"
"""Annotation on a lower pod: the UID of the upper pod it stands for."""
UPPER_NAMESPACE_ANNOTATION = "tensile.io/upper-namespace"
"""Annotation on a lower pod: the upper pod's namespace (differs when a prefix is used)."""
OWNERSHIP_LABELS = (VIRTUAL_POD_LABEL, NODE_LABEL, CLUSTER_LABEL)
"""The labels `owner_marks` adds (never shown on upper pods)."""
MANAGED_NAMESPACE_LABEL = "tensile.io/managed"
"""Label on lower namespaces a virtual node created (never deleted by it)."""

_LABEL_VALUE_MAX = 63
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
NAMESPACE_MAX = names.LABEL_MAX
"""Namespace names are DNS-1123 labels: at most 63 characters."""


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Who owns a lower object: one virtual node of one upper cluster."""

    node_name: str
    cluster_id: str
    """The upper cluster's identity: the UID of its `kube-system` namespace unless
    `--cluster-id` says otherwise (a valid label value, see `is_label_value`)."""

    @functools.cached_property
    def node_label(self) -> str:
        """`label_value(node_name)`, worked out once (every lower event asks for it)."""
        return label_value(self.node_name)

    @functools.cached_property
    def cluster_label(self) -> str:
        """`label_value(cluster_id)`, worked out once."""
        return label_value(self.cluster_id)


def is_label_value(text: str) -> bool:
    """Tell whether `text` is a valid label value (at most 63 characters of alphanumerics,
    '-', '_' and '.', starting and ending alphanumeric; empty is valid), as Kubernetes'
    apimachinery validation defines it."""
    return len(text) <= _LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(text) is not None


def is_dns_label(text: str) -> bool:
    """Tell whether `text` is a DNS-1123 label (what namespace names must be)."""
    return names.is_dns1123_label(text)


def label_value(text: str) -> str:
    """Return a label value standing for `text` (label values are at most 63 characters).

    Values that are valid are used as they are; others become `h-` + 40 hex digits of
    their SHA-1, which is stable and still a valid label value.
    """
    if is_label_value(text):
        return text
    return "h-" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def owner_selector(owner: Owner) -> str:
    """Return the label selector matching the lower objects `owner` owns."""
    return (
        f"{NODE_LABEL}={label_value(owner.node_name)},"
        f"{CLUSTER_LABEL}={label_value(owner.cluster_id)}"
    )


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
    """
    meta = lower.get("metadata") or {}
    namespace = (meta.get("annotations") or {}).get(UPPER_NAMESPACE_ANNOTATION)
    lower_ns = str(meta.get("namespace") or "")
    if not namespace:
        if not lower_ns.startswith(prefix) or len(lower_ns) == len(prefix):
            return None
        namespace = lower_ns[len(prefix) :]
    return f"{namespace}/{meta.get('name')}"


def is_owned(obj: Mapping[str, Any], *, owner: Owner) -> bool:
    """Tell whether a lower object belongs to `owner` (its node name and cluster ID).

    All four marks must agree: the labels (what we select on) and the annotations (the
    full values, which labels only hash when they are long).
    """
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return bool(
        labels.get(NODE_LABEL) == owner.node_label
        and annotations.get(NODE_ANNOTATION) == owner.node_name
        and labels.get(CLUSTER_LABEL) == owner.cluster_label
        and annotations.get(CLUSTER_ANNOTATION) == owner.cluster_id
    )


def same_cluster(obj: Mapping[str, Any], *, owner: Owner) -> bool:
    """Tell whether a lower object was made for `owner`'s upper cluster (by any of its
    virtual nodes): both cluster marks agree."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return bool(
        labels.get(CLUSTER_LABEL) == label_value(owner.cluster_id)
        and annotations.get(CLUSTER_ANNOTATION) == owner.cluster_id
    )


def cluster_selector(owner: Owner) -> str:
    """Return the label selector matching the lower objects of every virtual node of
    `owner`'s upper cluster (its own and its siblings')."""
    return f"{CLUSTER_LABEL}={label_value(owner.cluster_id)}"


def in_name_of(obj: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
    """Return `obj` (a copy carrying some owner's marks) with `target`'s owner marks instead:
    what a sibling's copy should be, in its owner's name. Pure: `obj` is not changed."""
    meta = dict(obj.get("metadata") or {})
    target_meta = target.get("metadata") or {}
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

    owner: Owner
    prefix: str
    """--namespace-prefix ("" keeps the names)."""

    def owned(self, target: Mapping[str, Any]) -> bool:
        """Whether `target` is this node's (`is_owned`)."""
        return is_owned(target, owner=self.owner)

    def same_tenant(self, target: Mapping[str, Any]) -> bool:
        """Whether `target` was made for this node's upper cluster (`same_cluster`)."""
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
        """Whose `target` is (`owner_of`)."""
        return owner_of(target)


def owner_marks(owner: Owner) -> tuple[dict[str, str], dict[str, str]]:
    """Return the (labels, annotations) that mark an object as owned by `owner`."""
    labels = {
        VIRTUAL_POD_LABEL: VIRTUAL_POD_VALUE,
        NODE_LABEL: label_value(owner.node_name),
        CLUSTER_LABEL: label_value(owner.cluster_id),
    }
    annotations = {
        NODE_ANNOTATION: owner.node_name,
        CLUSTER_ANNOTATION: owner.cluster_id,
        GLOBAL_ANNOTATION: "true",
    }
    return labels, annotations


def owner_of(obj: Mapping[str, Any]) -> str:
    """Describe who owns a lower object by its marks, for messages ("virtual node X of
    cluster Y", or "not tensile")."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    node, cluster = annotations.get(NODE_ANNOTATION), annotations.get(CLUSTER_ANNOTATION)
    if not node:
        return "not managed by tensile"
    return f"owned by virtual node {node} of upper cluster {cluster or '(unknown)'}"


def namespace_marks(*, owner: Owner, upper_namespace: str) -> tuple[dict[str, str], dict[str, str]]:
    """Return the (labels, annotations) of a lower namespace created for `upper_namespace`
    of `owner`'s upper cluster: who created it, and for which upper namespace."""
    labels = {
        MANAGED_NAMESPACE_LABEL: "true",
        CLUSTER_LABEL: label_value(owner.cluster_id),
    }
    annotations = {
        CLUSTER_ANNOTATION: owner.cluster_id,
        UPPER_NAMESPACE_ANNOTATION: upper_namespace,
    }
    return labels, annotations


def namespace_conflict(
    namespace: Mapping[str, Any], *, owner: Owner, upper_namespace: str, prefix: str
) -> str | None:
    """Return why pods of `upper_namespace` must not be placed in the existing lower
    `namespace`, or None when they may.

    Without a prefix a namespace has the same name above and below and is shared by design
    (several upper clusters' `default`, say); objects inside are owned one by one. With a
    prefix the lower namespace belongs to one tenant: it must carry this upper cluster's ID
    and this upper namespace, as `namespace_marks` wrote them. A namespace someone else
    created, or made for another upper namespace whose prefixed name happens to be the same
    (`t1-` + `x-y` and `t1-x-` + `y`), is refused.
    """
    if not prefix:
        return None
    meta = namespace.get("metadata") or {}
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
