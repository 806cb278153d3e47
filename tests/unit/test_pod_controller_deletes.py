"""A deletion of an upper pod is state until the lower cluster confirms it.

The pod controller runs here with the k2k provider on fake upper and lower APIs (the
informers do not run: their stores and handlers are fed as they would be). What a real
lower outage does end to end is in tests/e2e/test_partitions.py.
"""

from __future__ import annotations

import pytest

from tensile.contracts.objects import Obj
from tensile.kube.events import EventRecorder
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import PODS
from tensile.kube.workqueue import Transient
from tests.unit.test_k2k_provider import POLICY, Setup, upper_pod
from vnode.controllers.pods import PodController
from vnode.providers.k2k import translate
from vnode.testing.fakeapi import server_error, unreachable

KEY = "team/web"


def _controller(setup: Setup) -> PodController:
    return PodController(
        upper=setup.upper,
        informers=InformerFactory(),
        provider=setup.provider,
        node_name="vn-1",
        namespace=None,
        workers=1,
        recorder=EventRecorder(setup.upper, component="vn-1/pod-controller", host="vn-1"),
        status_coalesce=0.0,
    )


def _force_deleted(controller: PodController, pod: Obj) -> None:
    """What the upper informer does with a pod deleted with grace period 0."""
    controller.informer.store.delete(KEY)
    controller._deleted({**pod, "metadata": {**pod["metadata"], "deletionGracePeriodSeconds": 0}})


async def _create_in_doubt(setup: Setup) -> PodController:
    """A controller whose lower POST of the upper pod was answered 503: it may have landed."""
    controller = _controller(setup)
    controller.informer.store.upsert(upper_pod())
    setup.lower.fail("POST", "pods", error=server_error(503), times=1)
    with pytest.raises(Transient):
        await controller._sync_pod_now(KEY)
    return controller


def _lower(setup: Setup) -> Obj | None:
    return setup.lower.get(PODS, "web", namespace="team")


async def _running_below(setup: Setup, controller: PodController) -> Obj:
    controller.informer.store.upsert(upper_pod())
    await controller._sync_pod_now(KEY)
    lower = _lower(setup)
    assert lower is not None
    setup.lower_pod_seen(lower)
    return lower


@pytest.mark.parametrize("fault", [server_error(503), unreachable()], ids=["503", "unreachable"])
async def test_a_failed_lower_delete_is_retried_until_it_succeeds(fault: Exception) -> None:
    setup = Setup()
    controller = _controller(setup)
    lower = await _running_below(setup, controller)
    _force_deleted(controller, upper_pod())
    setup.lower.fail("DELETE", "pods", error=fault)
    for _ in range(30):  # beyond the queue's retry budget: Transient is never dropped
        with pytest.raises(Transient):
            await controller._sync_pod_now(KEY)
    queued = await controller.pods_from_upper.get()  # the key the deletion event queued
    controller.pods_from_upper.done(queued)
    assert len(controller.pods_from_upper) == 0
    controller.resync()
    assert len(controller.pods_from_upper) == 1, "a deletion waiting is queued on resync"
    setup.lower.heal()
    await controller._sync_pod_now(KEY)
    assert _lower(setup) is None
    setup.provider.lower_pod_deleted(lower)  # the informer shows it gone
    await controller._sync_pod_now(KEY)
    assert controller._gone == {}
    assert setup.provider.book.writes() == []


async def test_a_pod_deleted_while_its_create_is_in_doubt_leaves_no_lower_pod() -> None:
    setup = Setup()
    controller = await _create_in_doubt(setup)
    landed = setup.lower.put(PODS, translate.lower_pod(upper_pod(), policy=POLICY))
    _force_deleted(controller, upper_pod())
    await controller._sync_pod_now(KEY)
    assert _lower(setup) is None, "the landed POST is found and deleted"
    assert KEY in controller._gone, "until the informer shows it gone"
    setup.provider.lower_pod_changed(landed)
    setup.provider.lower_pod_deleted(landed)
    await controller._sync_pod_now(KEY)
    assert controller._gone == {}
    assert setup.provider.book.writes() == []


async def test_a_create_that_lands_after_its_upper_pod_was_finalized_is_deleted() -> None:
    setup = Setup()
    controller = await _create_in_doubt(setup)
    _force_deleted(controller, upper_pod())
    await controller._sync_pod_now(KEY)  # nothing below yet: done upstairs
    assert controller._gone == {}
    # The POST lands now; the lower informer shows the pod, whose upper pod is gone.
    setup.lower_pod_seen(setup.lower.put(PODS, translate.lower_pod(upper_pod(), policy=POLICY)))
    await controller._sync_status(KEY)
    assert len(controller.pods_from_upper) == 1
    await controller._sync_pod_now(KEY)
    assert _lower(setup) is None


async def test_a_pod_terminating_upstairs_whose_lower_delete_fails_waits_as_transient() -> None:
    setup = Setup()
    controller = _controller(setup)
    await _running_below(setup, controller)
    terminating = upper_pod()
    terminating["metadata"] |= {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    controller.informer.store.upsert(terminating)
    setup.lower.fail("DELETE", "pods", error=server_error(500))
    with pytest.raises(Transient, match="lower cluster"):
        await controller._sync_pod_now(KEY)
    assert setup.upper.requests_of("DELETE", "pods") == [], "not finalized upstairs"


@pytest.mark.parametrize("how", ["deletion event", "orphan key"])
async def test_a_pod_the_cache_lost_but_the_api_has_keeps_its_lower_pod(how: str) -> None:
    """A cache that no longer shows a pod (a deletion it made up, an orphan the patrol
    queued from it) while the upper cluster still has it bound here, not being deleted:
    nothing is deleted below. A cache cannot be made to lose a pod on a real server on
    demand, hence the fakes. Once the API no longer has it, the lower pod goes."""
    setup = Setup()
    controller = _controller(setup)
    await _running_below(setup, controller)
    setup.upper.put(PODS, upper_pod())  # the API has it, bound to vn-1
    controller.informer.store.delete(KEY)
    if how == "deletion event":
        controller._deleted(upper_pod())
    await controller._sync_pod_now(KEY)
    assert _lower(setup) is not None, "the lower pod of a live upper pod stays"
    assert setup.lower.requests_of("DELETE", "pods") == []
    assert controller._gone == {}

    setup.upper.remove(PODS, "web", namespace="team")
    if how == "deletion event":
        controller._deleted(upper_pod())
    await controller._sync_pod_now(KEY)
    assert _lower(setup) is None


async def test_an_upper_cluster_that_cannot_say_defers_the_deletion_below() -> None:
    setup = Setup()
    controller = _controller(setup)
    await _running_below(setup, controller)
    controller.informer.store.delete(KEY)
    setup.upper.fail("GET", "pods", error=unreachable())
    with pytest.raises(Transient):
        await controller._sync_pod_now(KEY)
    assert _lower(setup) is not None
