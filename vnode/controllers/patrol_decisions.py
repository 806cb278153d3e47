"""What the patrol calls drift between upper and lower state (pure): one function per
comparison, each answering a reason (a `tensile_patrol_*` label) or None.

The facts come from the caches the event path decides on (the patrol's cache audit first
makes sure those equal their servers); a key the event path has in hand (queued, being
worked on, due after a backoff) is never drift: its worker is about to look at it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensile.contracts.objects import deletion_timestamp_of
from tensile.kube.mirror.decide import Action, Create, Delete, Recreate, Update
from tensile.kube.resources import pod_is_terminal
from vnode.controllers import pod_decisions


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    """One piece of drift: what (`kind`, the resource's plural), why, and the key
    ("namespace/name") of the queue it is repaired through."""

    kind: str
    reason: str
    key: str
    detail: str = field(default="", compare=False)
    """What differs, for the log (e.g. the status fields of a stale status); not part of
    the mismatch's identity from one run to the next."""


def upper_pod_drift(
    pod: Mapping[str, Any],
    *,
    backend: Mapping[str, Any] | None,
    desired_status: Mapping[str, Any] | None,
    in_hand: bool,
    status_unseen: bool = False,
    deletion_unseen: bool = False,
) -> str | None:
    """Compare an upper pod bound to the node with its backend pod.

    `backend`: the provider's pod for it (same UID), None if it has none; `desired_status`:
    the status the provider says the upper pod should show (None without a backend pod);
    `in_hand`: whether the pod controller's queues hold the key; `status_unseen` /
    `deletion_unseen`: whether a status write / the final deletion of the node's, answered,
    is not in the cache yet (`PodController.status_unseen`, `deletion_unseen`): the cached
    pod does not say it yet, so no stale status / lost deletion is told. Reasons:
    "missing_below" (a live pod without a backend pod: a create lost, or a backend pod
    deleted behind the node's back that the upper pod does not show yet), "lost_deletion"
    (an upper deletion the backend has not been told of, or that finished below but not
    upstairs), "stale_status" (the upper status differs from the backend's, translated).
    Pods the node refuses (kube-system, DaemonSets) and finished pods have nothing below.
    """
    if in_hand or pod_decisions.rejection(pod) is not None:
        return None
    deleting = bool(deletion_timestamp_of(pod))
    if deleting:
        below_deleting = backend is not None and deletion_timestamp_of(backend)
        return None if below_deleting or deletion_unseen else "lost_deletion"
    if pod_is_terminal(pod):
        return None
    if backend is None:
        return "missing_below"
    stale = not status_unseen and _status_differs(pod, desired_status)
    return "stale_status" if stale else None


def unseen_write_explains(reason: str, *, status_unseen: bool, deletion_unseen: bool) -> bool:
    """Tell whether a write of the node's that the cache does not show yet explains drift of
    `reason` (a status write a stale status, the final deletion a lost deletion): the patrol
    holds such drift, as it holds drift whose key a queue holds."""
    return (reason == "stale_status" and status_unseen) or (
        reason == "lost_deletion" and deletion_unseen
    )


def stale_fields(pod: Mapping[str, Any], desired: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The upper pod's status fields a status write of `desired` would change (sorted; empty
    when it would write nothing): what a "stale_status" is about."""
    if desired is None:
        return ()
    patch = pod_decisions.status_patch(pod.get("status") or {}, desired)
    return () if patch is None else tuple(sorted(patch["status"]))


def _status_differs(pod: Mapping[str, Any], desired: Mapping[str, Any] | None) -> bool:
    """Whether the status worker would write `desired` over the upper pod's status."""
    if desired is None or pod_decisions.nothing_to_tell(desired):
        return False
    return pod_decisions.status_patch(pod.get("status") or {}, desired) is not None


def backend_pod_drift(
    *, upper_uid: str, upper_exists: bool, deleting: bool, in_hand: bool
) -> str | None:
    """Compare a backend pod of ours, made for the upper pod of UID `upper_uid`, with the
    upper pods now: `upper_exists` says whether one has its key. `deleting`: the pod
    controller still waits for that key's deletion below; `in_hand`: its queues hold the
    key. "orphan_below": a backend pod whose upper pod is gone (a deletion lost)."""
    if in_hand or deleting or upper_exists:
        # An upper pod of another UID is a pod of the same name made again: the
        # controller's own sync of that pod decides (the old backend pod is not its
        # backend pod), so the UID of the one there is not needed.
        return None
    return "orphan_below" if upper_uid else None


def copy_drift(action: Action) -> str | None:
    """Name what a mirror's worker would do for a key now (`Mirror.decision`), when it
    would write: "copy_missing" (a copy wanted and absent), "copy_differs" (a copy that
    is not its source's translation), "copy_orphaned" (a copy of ours nothing wants).
    Waiting for a sibling's maker, conflicts (reported by the event path) and copies being
    deleted are not drift. A key its mirror's queue holds is never asked about (see
    `patrol_checks.MirrorCheck`): its worker decides it soon."""
    match action:
        case Create():
            return "copy_missing"
        case Update() | Recreate():
            return "copy_differs"
        case Delete():
            return "copy_orphaned"
    return None
