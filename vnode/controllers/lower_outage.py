"""What the node controller does while the lower apiserver does not answer (pure: the node
controller measures, this decides; docs/operations/partitions.md says why).

A kubelet that stops reporting is marked Unknown by the upper node lifecycle controller,
which taints it `node.kubernetes.io/unreachable:NoExecute` and evicts its pods after their
toleration; a kubelet whose container runtime is down keeps its Lease and says Ready False,
with the same outcome. A lower apiserver that does not answer is neither: the lower
kubelets keep running every pod without it, only the node cannot see or change them. So,
under the `keep` policy, the Node stays Ready and its Lease renewed, says what it knows
with the condition `LowerControlPlaneReachable` False, and keeps new pods off with a
NoSchedule taint (`tensile.contracts.lowerhealth`), for `grace` seconds; past the grace it
says Ready False like a kubelet whose runtime is down, and its pods move after their
toleration. The `evict` policy is tensile-kube's (virtual-kubelet's node controller): no
Lease renewal and no status write while the ping fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensile.contracts import lowerhealth
from vnode.settings import LowerOutagePolicy


@dataclass(frozen=True, kw_only=True)
class Outage:
    """A lower outage in progress: since the first ping that was not answered."""

    started: float
    """When, on the monotonic clock (seconds)."""
    since: str
    """When, RFC 3339 (the conditions' lastTransitionTime and message)."""


@dataclass(frozen=True, kw_only=True)
class Stance:
    """What the node does about its lower control plane now."""

    renew_lease: bool
    """Renew the node's Lease."""
    write_status: bool
    """Write the Node's status (heartbeat times, capacity, conditions)."""
    tainted: bool
    """The Node carries `lowerhealth.LOWER_UNREACHABLE_TAINT` (NoSchedule)."""
    conditions: tuple[dict[str, str], ...]
    """Ready and LowerControlPlaneReachable, as type/status/reason/message (no times)."""


_READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
}
_REACHABLE = {
    "type": lowerhealth.LOWER_REACHABLE_CONDITION,
    "status": "True",
    "reason": lowerhealth.REACHABLE_REASON,
    "message": "the lower cluster's apiserver answers",
}


def stance(*, policy: LowerOutagePolicy, grace: float, outage: Outage | None, now: float) -> Stance:
    """Return what to do with the lower outage `outage` (None: the lower apiserver answers)
    at monotonic time `now` under `policy`, with `grace` seconds (--lower-outage-grace).

    Messages stay the same through an outage (only the start is in them), so an outage
    costs one status write and one taint write when it starts, at the grace, and when it
    ends, not one per ping.
    """
    if outage is None:
        return Stance(
            renew_lease=True, write_status=True, tainted=False, conditions=(_READY, _REACHABLE)
        )
    if policy == "evict":
        # tensile-kube's node: silent until the lower apiserver answers again.
        return Stance(
            renew_lease=False, write_status=False, tainted=False, conditions=(_READY, _REACHABLE)
        )
    unreachable = {
        "type": lowerhealth.LOWER_REACHABLE_CONDITION,
        "status": "False",
        "reason": lowerhealth.UNREACHABLE_REASON,
        "message": (
            f"the lower cluster's apiserver has not answered since {outage.since}; its pods "
            "are kept as last seen, and no new pod is scheduled here"
        ),
    }
    ready = _READY
    if now - outage.started >= grace:
        ready = {
            "type": "Ready",
            "status": "False",
            "reason": lowerhealth.UNREACHABLE_REASON,
            "message": (
                f"the lower cluster's apiserver has not answered since {outage.since}, longer "
                f"than --lower-outage-grace ({grace:g}s): the node is not ready, and its pods "
                "are evicted after their not-ready toleration"
            ),
        }
    return Stance(
        renew_lease=True, write_status=True, tainted=True, conditions=(ready, unreachable)
    )


def taints_to_write(current: object, *, stance: Stance) -> list[dict[str, Any]] | None:
    """Return the Node's `spec.taints` to write for `stance`, given its taints now
    (`current`), or None when they are right already."""
    if lowerhealth.has_unreachable_taint(current) == stance.tainted:
        return None
    return lowerhealth.with_unreachable_taint(current, present=stance.tainted)
