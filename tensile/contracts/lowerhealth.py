"""What a virtual Node says of its lower cluster's control plane: the condition and the taint
it writes while the lower apiserver does not answer, which the scheduler extender, the
descheduler and kubectl tensile read. Pure: no I/O, inputs never mutated.

A lower apiserver that does not answer is not a lower cluster that stopped running pods:
its kubelets keep running them. With `--lower-outage-policy=keep` (the default) the virtual
node stays Ready for `--lower-outage-grace`, says so with the condition
`LOWER_REACHABLE_CONDITION` False, and keeps new pods off with the NoSchedule taint
`LOWER_UNREACHABLE_TAINT`; past the grace it turns Ready False with `UNREACHABLE_REASON`
(docs/operations/partitions.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tensile.contracts.objects import as_list, as_mapping

LOWER_REACHABLE_CONDITION: Final = "LowerControlPlaneReachable"
"""The virtual Node's condition type: True while the lower apiserver answers the node's
ping (`/readyz` within 5 s), False from the first ping it did not answer (reason
`UNREACHABLE_REASON`, the message saying since when) until one it answers."""
REACHABLE_REASON: Final = "LowerControlPlaneReachable"
"""Reason of `LOWER_REACHABLE_CONDITION` True."""
UNREACHABLE_REASON: Final = "LowerControlPlaneUnreachable"
"""Reason of `LOWER_REACHABLE_CONDITION` False, and of Ready False once the outage outlasts
--lower-outage-grace."""
LOWER_UNREACHABLE_TAINT: Final = "tensile.io/lower-unreachable"
"""NoSchedule taint the virtual node puts on its Node while its lower apiserver does not
answer (--lower-outage-policy=keep), and takes off when it answers again: pods already
there stay (their lower pods keep running), new ones go elsewhere."""
TAINT_EFFECT: Final = "NoSchedule"


def lower_unreachable(node: Mapping[str, Any]) -> bool:
    """Tell whether Node `node` says its lower control plane does not answer (its
    `LOWER_REACHABLE_CONDITION` is False). A Node without the condition (not a virtual
    node, or one of an older version) answers False."""
    for item in as_list(as_mapping(node.get("status")).get("conditions")):
        condition = as_mapping(item)
        if condition.get("type") == LOWER_REACHABLE_CONDITION:
            return condition.get("status") == "False"
    return False


def has_unreachable_taint(taints: object) -> bool:
    """Tell whether the taint list `taints` (a Node's `spec.taints`) holds
    `LOWER_UNREACHABLE_TAINT`."""
    return any(as_mapping(t).get("key") == LOWER_UNREACHABLE_TAINT for t in as_list(taints))


def with_unreachable_taint(taints: object, *, present: bool) -> list[dict[str, Any]]:
    """Return the taint list `taints` with `LOWER_UNREACHABLE_TAINT` (NoSchedule) added
    (`present`) or removed; every other taint is kept as it is, in its order."""
    kept = [dict(as_mapping(t)) for t in as_list(taints)]
    kept = [t for t in kept if t.get("key") != LOWER_UNREACHABLE_TAINT]
    if present:
        kept.append({"key": LOWER_UNREACHABLE_TAINT, "effect": TAINT_EFFECT})
    return kept
