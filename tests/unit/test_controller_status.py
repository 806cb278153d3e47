"""Statuses the pod controller writes: provider failures and vanished lower pods."""

from __future__ import annotations

from tests.unit.test_translate import NOW, deployment_pod, running_upper, unchanged
from vnode.controllers.status import GONE_CONTAINER_MESSAGE, provider_failed_status
from vnode.controllers.status import vanished_status as lower_pod_gone_status


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
