"""Names, labels and annotations that mark what a virtual node owns in the lower cluster.

Every object a virtual node creates below carries tensile-kube's `virtual-pod=true` label
(so tools written for tensile-kube still recognise it) and, beyond tensile-kube, the name of
the owning virtual node, so several virtual nodes can share one lower cluster and none ever
updates or deletes another's objects. Pure functions only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

# tensile-kube compatible names (exact strings).
VIRTUAL_POD_LABEL = "virtual-pod"
VIRTUAL_POD_VALUE = "true"
CLUSTER_SELECTOR_ANNOTATION = "clusterSelector"
TRIPPED_LABELS_ANNOTATION = "tripped-labels"
GLOBAL_ANNOTATION = "global"

# tensile's own ownership marks.
NODE_LABEL = "tensile.io/virtual-node"
"""Label on every owned lower object, `node_label_value(node)`; owned pods are selected by it."""
NODE_ANNOTATION = "tensile.io/virtual-node"
"""Annotation on every owned lower object: the owning virtual node's full name."""
UPPER_UID_ANNOTATION = "tensile.io/upper-uid"
"""Annotation on a lower pod: the UID of the upper pod it stands for."""
UPPER_NAMESPACE_ANNOTATION = "tensile.io/upper-namespace"
"""Annotation on a lower pod: the upper pod's namespace (differs when a prefix is used)."""
MANAGED_NAMESPACE_LABEL = "tensile.io/managed"
"""Label on lower namespaces a virtual node created (never deleted by it)."""

_LABEL_VALUE_MAX = 63


def node_label_value(node_name: str) -> str:
    """Return the label value naming `node_name` (label values are at most 63 characters).

    Names that fit are used as they are; longer ones become `h-` + 40 hex digits of their
    SHA-1, which is stable and still a valid label value.
    """
    if len(node_name) <= _LABEL_VALUE_MAX:
        return node_name
    return "h-" + hashlib.sha1(node_name.encode(), usedforsecurity=False).hexdigest()


def owner_selector(node_name: str) -> str:
    """Return the label selector matching the lower objects owned by `node_name`."""
    return f"{NODE_LABEL}={node_label_value(node_name)}"


def lower_namespace(upper_namespace: str, *, prefix: str) -> str:
    """Return the lower namespace for an upper one (`prefix` + name; no prefix keeps the name)."""
    return f"{prefix}{upper_namespace}"


def is_owned(obj: Mapping[str, Any], *, node_name: str) -> bool:
    """Tell whether a lower object belongs to the virtual node `node_name`.

    Both marks must agree: the label (what we select on) and the annotation (the full
    name, which the label only hashes when it is long).
    """
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return bool(
        labels.get(NODE_LABEL) == node_label_value(node_name)
        and annotations.get(NODE_ANNOTATION) == node_name
    )


def owner_marks(node_name: str) -> tuple[dict[str, str], dict[str, str]]:
    """Return the (labels, annotations) that mark an object as owned by `node_name`."""
    labels = {VIRTUAL_POD_LABEL: VIRTUAL_POD_VALUE, NODE_LABEL: node_label_value(node_name)}
    annotations = {NODE_ANNOTATION: node_name, GLOBAL_ANNOTATION: "true"}
    return labels, annotations
