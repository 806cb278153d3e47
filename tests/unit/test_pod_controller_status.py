"""A status the upper cluster cannot take now is never dropped.

The pod controller runs against fakes here (virtual-kubelet tests its pod controller the
same way): an upper client that fails as an unreachable or overloaded apiserver does, and a
provider that reports one status. What a real outage does end to end is in
tests/e2e/test_faults.py; this shows, without waiting out an outage, that the status key is
handed back as a `Requeue` (which the work queue never counts against its retry budget:
tests/unit/test_workqueue.py) for every kind of unavailability, however often it comes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tensile.contracts.objects import Obj
from tensile.kube import errors
from tensile.kube.events import EventRecorder
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import PODS
from tensile.kube.workqueue import Requeue, Transient
from vnode import provider_errors
from vnode.controllers import pods
from vnode.controllers.pods import PodController
from vnode.testing.fakeapi import FakeApi

FAILED = {"phase": "Failed", "reason": "Error", "message": "exit code 3"}


def failing_upper(fault: Exception | None) -> FakeApi:
    """An upper API holding pod ns/job whose every request fails with `fault` (until it
    is healed)."""
    upper = FakeApi(name="upper")
    upper.put(PODS, {"metadata": {"namespace": "ns", "name": "job", "uid": "u1"}})
    if fault is not None:
        upper.fail(error=fault)
    return upper


class OneStatus:
    """A provider whose only pod has completed below."""

    def backend_pod(self, pod: Obj) -> Obj | None:
        return {"status": FAILED}

    def pod_status(self, pod: Obj) -> dict[str, Any] | None:
        return dict(FAILED)

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        pass


def _controller(
    upper: FakeApi, *, provider: object | None = None, phase: str = "Running"
) -> PodController:
    """A pod controller over `upper` and `provider` (OneStatus by default) whose cache holds
    one restartPolicy Never pod ns/job in `phase`."""
    controller = PodController(
        upper=upper,
        informers=InformerFactory(),
        provider=provider or OneStatus(),  # type: ignore[arg-type]
        node_name="vn",
        namespace=None,
        workers=1,
        recorder=EventRecorder(upper, component="vn/pod-controller", host="vn"),
    )
    controller.informer.store.upsert(
        {
            "metadata": {"namespace": "ns", "name": "job", "uid": "u1", "resourceVersion": "1"},
            "spec": {"nodeName": "vn", "restartPolicy": "Never"},
            "status": {"phase": phase},
        }
    )
    return controller


@pytest.mark.parametrize(
    "fault",
    [
        errors.ApiUnavailable("connection refused"),
        errors.ServerError(code=503, status={"message": "unavailable"}),
        errors.TooManyRequests(code=429, status={"message": "slow down"}, retry_after=1.0),
    ],
    ids=["unreachable", "5xx", "429"],
)
async def test_a_status_the_upper_cluster_cannot_take_is_requeued_every_time(
    fault: Exception,
) -> None:
    upper = failing_upper(fault)
    controller = _controller(upper)
    for _ in range(100):  # far beyond any retry budget
        with pytest.raises(Requeue) as raised:
            await controller._sync_status("ns/job")
        assert raised.value.after == pods._STATUS_RETRY
    upper.heal()
    await controller._sync_status("ns/job")
    assert (upper.requests[-1].method, upper.requests[-1].path) == (
        "PATCH",
        "/api/v1/namespaces/ns/pods/job/status",
    )
    assert len(upper.requests) == 101


class Unreachable:
    """A provider whose backend does not answer: no pod below yet, and creates fail."""

    def backend_pod(self, pod: Obj) -> Obj | None:
        return None

    def vanished(self, pod: Obj) -> bool:
        return False

    async def create_pod(self, pod: Obj) -> list[Any]:
        raise provider_errors.BackendUnavailable("lower cluster: 429 too many requests")

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        pass


async def test_a_pod_the_backend_cannot_take_now_waits_and_is_never_given_up() -> None:
    """An unreachable or overloaded backend fails no pod (even restartPolicy Never: it has
    not run) and its key is handed back as Transient: retried with backoff for as long as
    that lasts, never dropped after the queue's retry budget (tests/unit/test_workqueue.py)."""
    upper = failing_upper(None)
    controller = _controller(upper, provider=Unreachable(), phase="Pending")
    written: list[dict[str, Any]] = []

    async def write_status(pod: Obj, status: dict[str, Any]) -> None:
        written.append(status)

    controller._write_status = write_status  # type: ignore[method-assign]
    with pytest.raises(Transient):
        await controller._sync_pod_now("ns/job")
    [status] = written
    assert (status["phase"], status["reason"]) == ("Pending", "ProviderFailed")
    assert "429" in status["message"]


class Started:
    """A provider whose only pod runs below, the same status at each look."""

    def backend_pod(self, pod: Obj) -> Obj | None:
        return {"status": {"phase": "Running"}}

    def pod_status(self, pod: Obj) -> dict[str, Any] | None:
        return {"phase": "Running", "podIP": "10.0.0.1"}

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        pass


async def test_a_status_sent_is_not_sent_again_while_the_cache_lags() -> None:
    """Syncs of a pod before the watch brings its status write back (a backend that tells
    of several changes, the pod added and started at once) send that status once; a status
    that says something new is still sent, and once the cache shows another version the
    pod is compared as ever."""
    upper = failing_upper(None)
    controller = _controller(upper, provider=Started(), phase="Pending")
    for _ in range(3):
        await controller._sync_status("ns/job")
    assert len(upper.requests_of("PATCH")) == 1
    controller._provider.pod_status = lambda pod: {"phase": "Running", "podIP": "10.0.0.2"}  # type: ignore[attr-defined]
    await controller._sync_status("ns/job")
    await controller._sync_status("ns/job")
    assert len(upper.requests_of("PATCH")) == 2
    # The cache moves on (the watch brought another version, not our write): written again.
    old = controller.informer.store.get("ns/job")
    assert old is not None
    new = {**old, "metadata": {**old["metadata"], "resourceVersion": "2"}}
    controller.informer.store.upsert(new)
    controller._updated(old, new)
    await controller._sync_status("ns/job")
    assert len(upper.requests_of("PATCH")) == 3
