"""Which virtual node of which upper cluster a lower object belongs to: the marks a virtual
node writes on every object it creates below, and `NodeIdentity`, the node they name.

Every object a virtual node creates below carries tensile-kube's `virtual-pod=true` label
(so tools written for tensile-kube still recognise it) and, beyond tensile-kube, its owner:
the name of the virtual node **and** the identity of the upper cluster that node belongs to.
Node names repeat across clusters (the default is `virtual-kubelet` everywhere), so the name
alone would let two upper clusters sharing one lower cluster delete each other's pods; with
both, several virtual nodes of several upper clusters share one lower cluster and none ever
updates, adopts or deletes another's objects.

The virtual node writes the marks and acts only on objects that carry its own; kubectl
tensile finds the lower pod of an upper pod by them. Pure functions only.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts.labels import VIRTUAL_POD_LABEL, VIRTUAL_POD_VALUE, is_label_value
from tensile.contracts.objects import annotations_of, meta_of

GLOBAL_ANNOTATION = "global"
"""On every owned lower object, value "true" (tensile-kube's mark of what a virtual node made)."""
NODE_LABEL = "tensile.io/virtual-node"
"""Label on every owned lower object, `label_value(node name)`; owned pods are selected by it."""
NODE_ANNOTATION = "tensile.io/virtual-node"
"""Annotation on every owned lower object: the owning virtual node's full name."""
CLUSTER_LABEL = "tensile.io/cluster-id"
"""Label on every owned lower object: `label_value(cluster ID)` of the owning upper cluster."""
CLUSTER_ANNOTATION = "tensile.io/cluster-id"
"""Annotation on every owned lower object: the owning upper cluster's full ID."""
UPPER_UID_ANNOTATION = "tensile.io/upper-uid"
"""Annotation on a lower pod (and the lower copies of Services and claims): the UID of the
upper object it stands for (read it with `upper_uid_of`)."""
UPPER_NAMESPACE_ANNOTATION = "tensile.io/upper-namespace"
"""Annotation on a lower pod: the upper pod's namespace (differs when a prefix is used)."""
OWNERSHIP_LABELS = (VIRTUAL_POD_LABEL, NODE_LABEL, CLUSTER_LABEL)
"""The labels `owner_marks` adds (never shown on upper pods)."""
MANAGED_NAMESPACE_LABEL = "tensile.io/managed"
"""Label on lower namespaces a virtual node created (never deleted by it)."""


@dataclass(frozen=True, kw_only=True)
class NodeIdentity:
    """One virtual node among those of every upper cluster: its name and its upper
    cluster's ID (names repeat across upper clusters, the pair does not). The owner that
    the marks on a lower object name; not a Kubernetes owner reference."""

    node_name: str
    cluster_id: str
    """The upper cluster's identity: the UID of its `kube-system` namespace unless
    `--cluster-id` says otherwise (a valid label value, `labels.is_label_value`)."""

    @functools.cached_property
    def node_label(self) -> str:
        """`label_value(node_name)`, worked out once (every lower event asks for it)."""
        return label_value(self.node_name)

    @functools.cached_property
    def cluster_label(self) -> str:
        """`label_value(cluster_id)`, worked out once."""
        return label_value(self.cluster_id)


def label_value(text: str) -> str:
    """Return a label value standing for `text` (label values are at most 63 characters).

    Values that are valid are used as they are; others become `h-` + 40 hex digits of
    their SHA-1, which is stable and still a valid label value.
    """
    if is_label_value(text):
        return text
    return "h-" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def upper_uid_of(lower: Mapping[str, Any]) -> str | None:
    """Return the UID of the upper object a lower copy stands for (its
    `UPPER_UID_ANNOTATION`), or None when it carries none (absent, empty or not text).
    An accessor like those of `tensile.contracts.objects`: never raises on a malformed
    object, never copies it."""
    uid = annotations_of(lower).get(UPPER_UID_ANNOTATION)
    return uid if isinstance(uid, str) and uid else None


def owner_selector(owner: NodeIdentity) -> str:
    """Return the label selector matching the lower objects `owner` owns."""
    return (
        f"{NODE_LABEL}={label_value(owner.node_name)},"
        f"{CLUSTER_LABEL}={label_value(owner.cluster_id)}"
    )


def is_owned(obj: Mapping[str, Any], *, owner: NodeIdentity) -> bool:
    """Tell whether a lower object belongs to `owner` (its node name and cluster ID).

    All four marks must agree: the labels (what we select on) and the annotations (the
    full values, which labels only hash when they are long).
    """
    meta = meta_of(obj)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return bool(
        labels.get(NODE_LABEL) == owner.node_label
        and annotations.get(NODE_ANNOTATION) == owner.node_name
        and labels.get(CLUSTER_LABEL) == owner.cluster_label
        and annotations.get(CLUSTER_ANNOTATION) == owner.cluster_id
    )


def same_cluster(obj: Mapping[str, Any], *, owner: NodeIdentity) -> bool:
    """Tell whether a lower object was made for `owner`'s upper cluster (by any of its
    virtual nodes): both cluster marks agree."""
    meta = meta_of(obj)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return bool(
        labels.get(CLUSTER_LABEL) == label_value(owner.cluster_id)
        and annotations.get(CLUSTER_ANNOTATION) == owner.cluster_id
    )


def cluster_selector(owner: NodeIdentity) -> str:
    """Return the label selector matching the lower objects of every virtual node of
    `owner`'s upper cluster (its own and its siblings')."""
    return f"{CLUSTER_LABEL}={label_value(owner.cluster_id)}"


def owner_marks(owner: NodeIdentity) -> tuple[dict[str, str], dict[str, str]]:
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
    annotations = annotations_of(obj)
    node, cluster = annotations.get(NODE_ANNOTATION), annotations.get(CLUSTER_ANNOTATION)
    if not node:
        return "not managed by tensile"
    return f"owned by virtual node {node} of upper cluster {cluster or '(unknown)'}"


def namespace_marks(
    *, owner: NodeIdentity, upper_namespace: str
) -> tuple[dict[str, str], dict[str, str]]:
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
