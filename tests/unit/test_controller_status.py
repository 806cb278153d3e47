"""Statuses the pod controller writes: provider failures and vanished lower pods."""

from __future__ import annotations

from typing import Any

import pytest

from tensile.kube import codec
from tests.unit.test_translate import NOW, deployment_pod, running_upper, unchanged
from vnode.controllers.node_objects import node_status, node_status_news
from vnode.controllers.pod_decisions import (
    GONE_CONTAINER_MESSAGE,
    FinalDelete,
    StatusWrite,
    already_written,
    deletion_unseen,
    nothing_to_tell,
    provider_failed_status,
    status_unseen,
)
from vnode.controllers.pod_decisions import vanished_status as lower_pod_gone_status
from vnode.settings import NodeSettings


def test_lower_pod_gone_fails_the_upper_pod_like_a_kubelet() -> None:
    upper = running_upper()
    status = unchanged(lower_pod_gone_status, upper, now=NOW)
    assert status["phase"] == "Failed"
    assert status["reason"] == "LowerPodDeleted"
    assert "outside this virtual node" in status["message"]
    web, sidecar = status["containerStatuses"]
    assert web["state"] == {
        "terminated": {
            "exitCode": 137,
            "reason": "ContainerStatusUnknown",
            "message": GONE_CONTAINER_MESSAGE,
            "finishedAt": NOW,
            "startedAt": "2025-01-02T03:00:40Z",
        }
    }
    assert sidecar["state"]["terminated"]["exitCode"] == 137
    assert "startedAt" not in sidecar["state"]["terminated"]
    assert not web["ready"]
    assert not sidecar["ready"]
    init = status["initContainerStatuses"][0]
    assert init["state"] == upper["status"]["initContainerStatuses"][0]["state"]
    by_type = {c["type"]: c for c in status["conditions"]}
    for kind in ("Ready", "ContainersReady"):
        assert by_type[kind]["status"] == "False"
        assert by_type[kind]["lastTransitionTime"] == NOW
    assert by_type["PodScheduled"]["status"] == "True"


def test_gone_status_keeps_existing_false_transition_times_and_terminal_pods() -> None:
    upper = deployment_pod()
    upper["status"]["conditions"].append(
        {"type": "Ready", "status": "False", "lastTransitionTime": "t0"}
    )
    by_type = {c["type"]: c for c in lower_pod_gone_status(upper, now=NOW)["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "t0"
    assert by_type["ContainersReady"]["lastTransitionTime"] == NOW
    upper["status"]["phase"] = "Succeeded"
    assert lower_pod_gone_status(upper, now=NOW) == upper["status"]


def test_provider_failure_leaves_the_pod_pending_for_a_retry() -> None:
    upper = deployment_pod()
    status = unchanged(provider_failed_status, upper, message="quota exceeded", now=NOW)
    assert status == {
        **upper["status"],
        "phase": "Pending",
        "reason": "ProviderFailed",
        "message": "quota exceeded",
    }


def test_provider_failure_fails_a_never_restarting_pod() -> None:
    upper = deployment_pod()
    upper["spec"]["restartPolicy"] = "Never"
    status = provider_failed_status(upper, message="denied", now=NOW)
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed",
        "ProviderFailed",
        "denied",
    )
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodScheduled": "True",
        "Ready": "False",
        "ContainersReady": "False",
    }
    upper["status"]["phase"] = "Failed"
    assert provider_failed_status(upper, message="again", now=NOW) == upper["status"]


def test_a_transient_provider_failure_fails_no_pod() -> None:
    """An unreachable backend: the pod has not run and will, so even restartPolicy Never
    stays Pending, with the reason shown."""
    upper = deployment_pod()
    upper["spec"]["restartPolicy"] = "Never"
    status = unchanged(
        provider_failed_status, upper, message="lower cluster: refused", now=NOW, transient=True
    )
    assert status == {
        **upper["status"],
        "phase": "Pending",
        "reason": "ProviderFailed",
        "message": "lower cluster: refused",
    }


# -- which backend statuses are worth a write ------------------------------------------------

_SCHEDULED = {"type": "PodScheduled", "status": "True", "lastTransitionTime": NOW}


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Pending"},
        {"phase": "Pending", "qosClass": "Burstable"},
        {"phase": "Pending", "conditions": [_SCHEDULED], "qosClass": "Burstable"},
    ],
)
def test_a_backend_pod_just_created_or_scheduled_costs_no_write(status: dict[str, Any]) -> None:
    assert nothing_to_tell(status)


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Running", "conditions": [_SCHEDULED]},
        {
            "phase": "Pending",
            "conditions": [
                {**_SCHEDULED, "status": "False", "reason": "Unschedulable", "message": "0/3"}
            ],
        },
        {
            "phase": "Pending",
            "conditions": [_SCHEDULED, {"type": "Initialized", "status": "False"}],
        },
        {
            "phase": "Pending",
            "conditions": [_SCHEDULED],
            "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "ErrImagePull"}}}],
        },
        {"phase": "Pending", "reason": "Evicted", "message": "node out of memory"},
        {"phase": "Failed"},
    ],
)
def test_what_a_backend_says_beyond_scheduling_is_written(status: dict[str, Any]) -> None:
    assert not nothing_to_tell(status)


# -- a status write the cache has not seen yet is not sent again ------------------------------

_RUNNING = {"phase": "Running", "conditions": [_SCHEDULED], "podIP": "10.0.0.1"}
_STALE = {"metadata": {"uid": "u1", "resourceVersion": "7"}, "status": {"phase": "Pending"}}
_CAUGHT_UP = {"metadata": {"uid": "u1", "resourceVersion": "8"}, "status": _RUNNING}
_OTHERS_AT_8 = {
    "metadata": {"uid": "u1", "resourceVersion": "8"},
    "status": {**_RUNNING, "phase": "Failed"},
}


def _wrote(
    version: str,
    status: dict[str, Any],
    *,
    answered: float = 0.0,
    removed: frozenset[str] = frozenset(),
) -> StatusWrite:
    return StatusWrite(uid="u1", started=version, status=status, removed=removed, answered=answered)


@pytest.mark.parametrize(
    ("pod", "desired", "written", "again"),
    [
        # The pod synced again before the watch brought our write back: the API says it.
        (_STALE, _RUNNING, _wrote("7", _RUNNING), True),
        # Something new to say since that write: written, against the cache as ever.
        (_STALE, {**_RUNNING, "podIP": "10.0.0.2"}, _wrote("7", _RUNNING), False),
        # The cache shows another version (ours came back, or another writer's): as usual.
        (_CAUGHT_UP, _RUNNING, _wrote("7", _RUNNING), False),
        # Another writer's event came while ours was on its way (it may have undone ours):
        # the cache is compared, and ours written again where it differs.
        (_OTHERS_AT_8, _RUNNING, _wrote("7", _RUNNING), False),
        ({**_STALE, "metadata": {}}, _RUNNING, _wrote("", _RUNNING), False),
        (_STALE, _RUNNING, None, False),
    ],
    ids=[
        "stale-cache-same",
        "stale-cache-new",
        "caught-up",
        "another-writer-meanwhile",
        "no-version",
        "never-written",
    ],
)
def test_a_status_write_is_not_sent_again_before_the_cache_sees_it(
    pod: dict[str, Any],
    desired: dict[str, Any],
    written: StatusWrite | None,
    again: bool,
) -> None:
    assert already_written(pod, desired, written) is again


_PENDING_AT_8 = {"metadata": {"uid": "u1", "resourceVersion": "8"}, "status": {"phase": "Pending"}}
_WITH_MESSAGE = {
    "metadata": {"uid": "u1", "resourceVersion": "9"},
    "status": {**_RUNNING, "message": "x"},
}
_MSG = frozenset({"message"})
_MADE_AGAIN = {"metadata": {"uid": "u2", "resourceVersion": "9"}, "status": {"phase": "Pending"}}


@pytest.mark.parametrize(
    ("pod", "written", "now", "unseen"),
    [
        # Answered a moment ago, the cache still at the version it showed then.
        (_STALE, _wrote("7", _RUNNING, answered=100.0), 100.5, True),
        # Another event came (an earlier write's), not this write: still on its way.
        (_PENDING_AT_8, _wrote("7", _RUNNING, answered=100.0), 100.5, True),
        # The watch brought it: the cache is compared.
        (_CAUGHT_UP, _wrote("7", _RUNNING, answered=100.0), 100.5, False),
        # It came with another writer's field (theirs before or after ours): it is in.
        (_WITH_MESSAGE, _wrote("7", _RUNNING, answered=100.0), 100.5, False),
        # A write that removed the message: not in while the cache still has one.
        (_WITH_MESSAGE, _wrote("7", _RUNNING, answered=100.0, removed=_MSG), 100.5, True),
        (_CAUGHT_UP, _wrote("7", _RUNNING, answered=100.0, removed=_MSG), 100.5, False),
        # A pod of the same name made again: the write was to another pod.
        (_MADE_AGAIN, _wrote("7", _RUNNING, answered=100.0), 100.5, False),
        # Past the bound: a write the cache never showed hides nothing any more.
        (_STALE, _wrote("7", _RUNNING, answered=100.0), 130.0, False),
        (_STALE, None, 100.5, False),
        (None, _wrote("7", _RUNNING, answered=100.0), 100.5, False),
    ],
    ids=[
        "on-its-way",
        "behind-another-event",
        "seen",
        "seen-with-another-field",
        "a-removal-not-in-yet",
        "a-removal-in",
        "made-again",
        "past-the-bound",
        "never-written",
        "gone",
    ],
)
def test_a_status_write_is_on_its_way_until_the_cache_shows_it_or_the_bound_passes(
    pod: dict[str, Any] | None, written: StatusWrite | None, now: float, unseen: bool
) -> None:
    assert status_unseen(pod, written, now=now, within=30.0) is unseen


_DELETING = {"metadata": {"uid": "u1", "deletionTimestamp": NOW}, "status": _RUNNING}


@pytest.mark.parametrize(
    ("pod", "deleted", "now", "unseen"),
    [
        (_DELETING, FinalDelete(uid="u1", answered=100.0), 100.5, True),
        # A pod of the same name made again: the deletion was of another pod.
        ({"metadata": {"uid": "u2"}}, FinalDelete(uid="u1", answered=100.0), 100.5, False),
        # The watch brought it: the cache has no such pod.
        (None, FinalDelete(uid="u1", answered=100.0), 100.5, False),
        (_DELETING, FinalDelete(uid="u1", answered=100.0), 130.0, False),
        (_DELETING, None, 100.5, False),
    ],
    ids=["on-its-way", "made-again", "seen", "past-the-bound", "never-deleted"],
)
def test_a_final_deletion_is_on_its_way_until_the_cache_drops_the_pod_or_the_bound_passes(
    pod: dict[str, Any] | None, deleted: FinalDelete | None, now: float, unseen: bool
) -> None:
    assert deletion_unseen(pod, deleted, now=now, within=30.0) is unseen


# -- node status: written when it says something new ----------------------------------------


def _node_after(body: dict[str, Any]) -> dict[str, Any]:
    """The Node as the apiserver shows it after `body` was patched in (plus its own fields)."""
    status = codec.deep_copy(body["status"])
    status["nodeInfo"]["bootID"] = "set-by-nobody-but-kept"
    return {"metadata": {"name": "vn"}, "status": status}


def test_a_node_status_differing_only_in_heartbeats_is_not_news() -> None:
    settings = NodeSettings(name="vn", internal_ip="192.0.2.1")
    capacity = {"cpu": "8", "memory": "16Gi", "pods": "110"}
    info = {"kubeletVersion": "v1.37.1"}
    first = node_status(None, settings=settings, capacity=capacity, node_info=info, now=NOW)
    current = _node_after(first)
    later = node_status(
        current, settings=settings, capacity=capacity, node_info=info, now="2030-01-01T00:00:00Z"
    )
    assert not node_status_news(current, later)
    assert node_status_news(None, first)
    fuller = node_status(
        current,
        settings=settings,
        capacity={**capacity, "cpu": "7"},
        node_info=info,
        now="2030-01-01T00:00:00Z",
    )
    assert node_status_news(current, fuller)
    # The node lifecycle controller marked it Unknown meanwhile: our Ready is news.
    stale = codec.deep_copy(current)
    stale["status"]["conditions"][0].update(status="Unknown", reason="NodeStatusUnknown")
    assert node_status_news(stale, later)
