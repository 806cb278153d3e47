"""Pure decisions of the pod controller: what to enqueue, reject, and patch on an upper pod's
status (virtual-kubelet's node/pod.go behaviour, in our words).

No I/O and no mutation of inputs; `pods.py` acts on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts.objects import meta_of, resource_version_of, uid_of
from tensile.kube.resources import TERMINAL_PHASES

_MUTABLE_SPEC = ("containers", "initContainers", "activeDeadlineSeconds", "tolerations")


def spec_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Tell whether an upper pod update needs the provider (virtual-kubelet's podShouldEnqueue):
    a mutable spec field, labels, annotations or the deletion state changed."""
    old_meta, new_meta = meta_of(old), meta_of(new)
    for f in ("labels", "annotations", "deletionTimestamp", "deletionGracePeriodSeconds", "uid"):
        if old_meta.get(f) != new_meta.get(f):
            return True
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    return any(old_spec.get(f) != new_spec.get(f) for f in _MUTABLE_SPEC)


def bound_here(pod: Mapping[str, Any], *, node_name: str, uid: str | None) -> bool:
    """Tell whether upper pod `pod`, as the API returned it, is bound to node `node_name`,
    not being deleted, and of UID `uid` (any UID when None): a pod whose lower pod must
    stay, whatever a cache says."""
    meta = meta_of(pod)
    return (
        (pod.get("spec") or {}).get("nodeName") == node_name
        and not meta.get("deletionTimestamp")
        and (uid is None or meta.get("uid") == uid)
    )


def nothing_to_tell(status: Mapping[str, Any]) -> bool:
    """Tell whether a backend pod's status says nothing the upper pod does not already say:
    Pending, with no container statuses, no message or reason, and no condition but
    PodScheduled True (the upper scheduler set that one when it bound the pod). A pod whose
    backend schedules and starts it then costs one status write (Running), as a kubelet's
    that starts a pod before its first sync; a backend that cannot place the pod
    (PodScheduled False) or is creating its containers is told at once."""
    return (
        status.get("phase") == "Pending"
        and not (status.get("message") or status.get("reason"))
        and not any(status.get(f) for f in _CONTAINER_STATUSES)
        and all(
            c.get("type") == "PodScheduled" and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
    )


_CONTAINER_STATUSES = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


def rejection(pod: Mapping[str, Any]) -> str | None:
    """Return why a virtual node does not run this pod, or None if it does.

    kube-system pods (cluster add-ons meant for real nodes) and DaemonSet pods (one per
    node, which a whole lower cluster is not) are refused with a status saying so,
    instead of being left Pending forever as tensile-kube did.
    """
    meta = meta_of(pod)
    if meta.get("namespace") == "kube-system":
        return "pods in kube-system are not forwarded by a virtual node"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "DaemonSet" and owner.get("controller"):
            return "DaemonSet pods do not run on a virtual node (taint it or exclude it)"
    return None


def rejected_status(
    pod: Mapping[str, Any], *, message: str, reason: str = "UnsupportedPod"
) -> dict[str, Any]:
    """Return the Failed status of a refused pod (like a kubelet's admission refusal)."""
    status = dict(pod.get("status") or {})
    status.update(phase="Failed", reason=reason, message=message)
    return status


def admission_rejected_status(
    pod: Mapping[str, Any], *, reason: str, message: str
) -> dict[str, Any]:
    """Return the status of a pod the node's admission refused, as a kubelet writes it
    (`Kubelet.rejectPod`, pkg/kubelet/kubelet.go): Failed, `reason`, and the message
    "Pod was rejected: " + `message`."""
    return rejected_status(pod, reason=reason, message=f"Pod was rejected: {message}")


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return a JSON merge patch turning `current` status into `desired`, or None if equal.

    Keys absent from `desired` are removed (null), so the upper status mirrors the lower one
    rather than accumulating stale fields.
    """
    if dict(current) == dict(desired):
        return None
    body: dict[str, Any] = {k: v for k, v in desired.items() if current.get(k) != v}
    body.update({k: None for k in current if k not in desired})
    return {"status": body}


@dataclass(frozen=True, kw_only=True)
class StatusWrite:
    """A status write of ours to an upper pod, answered by the apiserver, that the cache may
    not show yet."""

    uid: str
    """The UID of the upper pod written (a pod of the same name made again is another)."""
    started: str
    """The resourceVersion of the upper pod the write was made against (as the cache showed
    it): its patch says what that version lacked."""
    status: Mapping[str, Any]
    """The status it wrote."""
    removed: frozenset[str]
    """The status fields its patch removed (set to null)."""
    answered: float
    """When the apiserver answered it, on the monotonic clock (seconds)."""


def already_written(
    pod: Mapping[str, Any],
    desired: Mapping[str, Any],
    written: StatusWrite | None,
) -> bool:
    """Tell whether writing status `desired` to upper pod `pod` (as the cache shows it) would
    send again the patch a write of ours already sent: `written` was made against the
    version the cache still shows, and wrote `desired`. The API says it already; only a
    cache the watch has not yet brought that write to says otherwise (the pod synced again
    in between, e.g. the backend told of a change that made no difference). Once the cache
    shows another version (ours, or another writer's, which may have changed what ours
    wrote), the pod's status there is compared as usual."""
    return (
        written is not None
        and bool(written.started)
        and written.started == resource_version_of(pod)
        and dict(written.status) == dict(desired)
    )


def shows_write(pod: Mapping[str, Any], written: StatusWrite) -> bool:
    """Tell whether upper pod `pod` (as the cache shows it) shows the status `written` wrote:
    every field it set, none it removed, whatever else the status holds (another writer's
    field, set before or after ours, is the patrol's to compare, not a write on its way)."""
    status = pod.get("status") or {}
    return all(status.get(key) == value for key, value in written.status.items()) and not any(
        key in status for key in written.removed
    )


def status_unseen(
    pod: Mapping[str, Any] | None, written: StatusWrite | None, *, now: float, within: float
) -> bool:
    """Tell whether a status write of ours is still on its way to the cache: `written` is of
    the cached pod `pod` (its UID), was answered less than `within` seconds before `now`
    (monotonic seconds), and `pod` does not show it (`shows_write`). Until the watch brings
    it, the cached status is older than the pod's: comparing it with the backend would find
    drift that is not there. That holds whatever events came meanwhile (under load, an
    earlier write's event arrives while the next write is on its way). Past `within`, a
    write the cache never showed (one the apiserver made something else of, or another
    writer's status after it) no longer hides what the cache shows. A pod gone from the
    cache has nothing on its way."""
    return (
        written is not None
        and pod is not None
        and uid_of(pod) == written.uid
        and now - written.answered < within
        and not shows_write(pod, written)
    )


@dataclass(frozen=True, kw_only=True)
class FinalDelete:
    """The node's own deletion of an upper pod (grace 0, its backend pod gone), answered by
    the apiserver, that the cache may not show yet."""

    uid: str
    """The UID of the upper pod deleted (its DELETE's precondition)."""
    answered: float
    """When the apiserver answered it, on the monotonic clock (seconds)."""


def deletion_unseen(
    pod: Mapping[str, Any] | None, deleted: FinalDelete | None, *, now: float, within: float
) -> bool:
    """Tell whether the node's final deletion of upper pod `pod` (as the cache shows it) is
    still on its way to the cache: `deleted` is of that pod's UID and was answered less than
    `within` seconds before `now` (monotonic seconds). Until the watch brings the deletion,
    the cache shows a pod being deleted upstairs whose backend pod is gone, which is what a
    lost deletion looks like. A pod of the same name made again has another UID."""
    return (
        deleted is not None
        and pod is not None
        and uid_of(pod) == deleted.uid
        and now - deleted.answered < within
    )


def provider_failed_status(
    pod: Mapping[str, Any], *, message: str, now: str, transient: bool = False
) -> dict[str, Any]:
    """Return the status of a pod the provider could not start (virtual-kubelet's behaviour).

    Pending (retried), or Failed with Ready/ContainersReady False when it may not restart
    (restartPolicy Never); reason ProviderFailed, the provider's message. A `transient`
    failure (the backend unreachable or overloaded, nothing wrong with the pod) leaves it
    Pending whatever its restartPolicy: it has not run, and it will once the backend
    answers (virtual-kubelet fails such a pod; a kubelet whose runtime is down does not).
    A terminal pod's status is returned unchanged.
    """
    status = dict(pod.get("status") or {})
    if status.get("phase") in TERMINAL_PHASES:
        return status
    never = not transient and (pod.get("spec") or {}).get("restartPolicy") == "Never"
    status.update(phase="Failed" if never else "Pending", reason="ProviderFailed", message=message)
    if never:
        status["conditions"] = _not_ready(list(status.get("conditions") or []), now=now)
    return status


def waiting_status(
    pod: Mapping[str, Any], *, reason: str, message: str | None, now: str
) -> dict[str, Any]:
    """Return the Pending status of a pod whose containers cannot be created yet.

    As a kubelet shows it (pkg/kubelet/kuberuntime): `reason` CreateContainerConfigError when
    a container's environment cannot be built (a missing ConfigMap, Secret or key, `message`
    saying which), ContainerCreating while a volume cannot be mounted. The first container
    group that would run (init containers, else containers) waits with that reason; with init
    containers, the others wait with PodInitializing. Ready and ContainersReady are False
    (ContainersNotReady). Phase Pending whatever the restartPolicy: a kubelet retries until the
    object appears. A terminal pod's status is returned unchanged.
    """
    status = dict(pod.get("status") or {})
    if status.get("phase") in TERMINAL_PHASES:
        return status
    spec = pod.get("spec") or {}
    names = {
        g: [str(c.get("name")) for c in spec.get(g) or []] for g in ("initContainers", "containers")
    }
    images = {
        str(c.get("name")): str(c.get("image") or "")
        for g in ("initContainers", "containers")
        for c in spec.get(g) or []
    }
    blocked = {"reason": reason, **({"message": message} if message else {})}

    def waiting(group: str, state: dict[str, str]) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "image": images[name],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": dict(state)},
            }
            for name in names[group]
        ]

    conditions = {str(c.get("type")): c for c in status.get("conditions") or []}

    def condition(kind: str, ok: bool, why: str = "", what: str = "") -> dict[str, Any]:
        old = conditions.get(kind)
        value = "True" if ok else "False"
        since = old.get("lastTransitionTime", now) if old and old.get("status") == value else now
        cond: dict[str, Any] = {"type": kind, "status": value, "lastTransitionTime": since}
        if why:
            cond.update(reason=why, message=what)
        return cond

    unready = f"containers with unready status: [{' '.join(names['containers'])}]"
    new_conditions = [
        c for c in conditions.values() if c.get("type") not in (*_READY_CONDITIONS, "Initialized")
    ]
    if names["initContainers"]:
        status["initContainerStatuses"] = waiting("initContainers", blocked)
        status["containerStatuses"] = waiting("containers", {"reason": "PodInitializing"})
        incomplete = f"containers with incomplete status: [{' '.join(names['initContainers'])}]"
        new_conditions.append(
            condition("Initialized", False, "ContainersNotInitialized", incomplete)
        )
    else:
        status["containerStatuses"] = waiting("containers", blocked)
        new_conditions.append(condition("Initialized", True))
    for kind in _READY_CONDITIONS:
        new_conditions.append(condition(kind, False, "ContainersNotReady", unready))
    status["conditions"] = new_conditions
    status["phase"] = "Pending"
    status.pop("reason", None)
    status.pop("message", None)
    return status


GONE_CONTAINER_MESSAGE = (
    "The container could not be located when the pod was deleted.  The container used to be Running"
)


def vanished_status(pod: Mapping[str, Any], *, now: str) -> dict[str, Any]:
    """Return the Failed status of a pod whose backend pod was deleted behind our back.

    Mirrors what a kubelet reports when a container disappears: every container status not
    yet terminated becomes terminated with exit code 137 and reason ContainerStatusUnknown
    (a running one keeps its startedAt); Ready and ContainersReady become False. A terminal
    pod's status is returned unchanged.
    """
    status = dict(pod.get("status") or {})
    if status.get("phase") in TERMINAL_PHASES:
        return status
    status.update(
        phase="Failed",
        reason="LowerPodDeleted",
        message="the pod's lower-cluster pod was deleted outside this virtual node",
    )
    for field in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        if field in status:
            status[field] = [_gone_container(cs, now=now) for cs in status[field] or []]
    status["conditions"] = _not_ready(list(status.get("conditions") or []), now=now)
    return status


def _gone_container(original: Mapping[str, Any], *, now: str) -> dict[str, Any]:
    cs = dict(original)
    state = cs.get("state") or {}
    if "terminated" in state:
        return cs
    terminated: dict[str, Any] = {
        "exitCode": 137,
        "reason": "ContainerStatusUnknown",
        "message": GONE_CONTAINER_MESSAGE,
        "finishedAt": now,
    }
    started = (state.get("running") or {}).get("startedAt")
    if started:
        terminated["startedAt"] = started
    cs.update(state={"terminated": terminated}, ready=False, started=False)
    return cs


_READY_CONDITIONS = ("Ready", "ContainersReady")


def _not_ready(conditions: list[dict[str, Any]], *, now: str) -> list[dict[str, Any]]:
    # A kubelet marks a terminal pod's Ready and ContainersReady False with reason PodFailed;
    # a condition that was False already keeps its transition time.
    result = [c for c in conditions if c.get("type") not in _READY_CONDITIONS]
    for kind in _READY_CONDITIONS:
        old = next((c for c in conditions if c.get("type") == kind), None)
        since = old.get("lastTransitionTime", now) if old and old.get("status") == "False" else now
        result.append(
            {"type": kind, "status": "False", "reason": "PodFailed", "lastTransitionTime": since}
        )
    return result
