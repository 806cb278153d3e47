"""Labels and taints the programs agree on (tensile-kube's exact strings: users and tools
move between the two), and the syntax every label value has (`is_label_value`)."""

from __future__ import annotations

import re

VIRTUAL_POD_LABEL = "virtual-pod"
"""On pods meant for lower clusters: the webhook converts those with value "true", the
virtual node marks every pod it creates below with it."""
VIRTUAL_POD_VALUE = "true"
CREATED_BY_DESCHEDULER_LABEL = "create-by-descheduler"
"""On pods the descheduler re-created (value "true"): their spec is converted already,
the webhook leaves it alone."""
NODE_TYPE_LABEL = "type"
"""Node label telling virtual nodes apart, value `VIRTUAL_NODE_TYPE`."""
VIRTUAL_NODE_TYPE = "virtual-kubelet"
VIRTUAL_NODE_SELECTOR = f"{NODE_TYPE_LABEL}={VIRTUAL_NODE_TYPE}"
"""The label selector of the virtual nodes, `type=virtual-kubelet`: the webhook's and the
scheduler's default --virtual-node-selector, and the nodes the descheduler, the quota
slices and kubectl tensile read."""
HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The well-known node label holding the node's name (set on virtual nodes too)."""
DEFAULT_TAINT_KEY = "virtual-kubelet.io/provider"
"""Key of the virtual node's taint unless `--taint` / VKUBELET_TAINT_KEY says otherwise."""
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
"""On claims (the scheduler's own annotation): the node the claim's volume is for. The
virtual node sets it on claims whose lower volume it shows upstairs (tensile-kube's path);
the webhook pins later pods using the claim to that node."""

_LABEL_VALUE_MAX = 63
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def is_label_value(text: str) -> bool:
    """Tell whether `text` is a valid label value (at most 63 characters of alphanumerics,
    '-', '_' and '.', starting and ending alphanumeric; empty is valid), as Kubernetes'
    apimachinery validation (IsValidLabelValue) defines it."""
    return len(text) <= _LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(text) is not None
