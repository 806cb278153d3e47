"""The slice controller's logic in isolation: its caches are filled by hand and its client is
`FakeApi`. A fake because these cases live in the moment between a write and its watch
event, which a real cluster does not hold open on demand: a namespace decided right after
another must count the slices just written for it (capped at its quota), and the
extender's admission must sum what the caches say is bound. (The controller against the
real cluster: e2e/test_slices.)"""

from __future__ import annotations

from typing import Any

from scheduler.slices.controller import SliceController
from scheduler.slices.placement import PodUse
from scheduler.slices.pods import BoundPods, pod_use, slim_pod
from scheduler.slices.settings import SliceSettings
from tensile.contracts.quotaslices import SLICES_ANNOTATION
from tensile.kube.informer import Informer
from tensile.kube.resources import RESOURCE_QUOTAS
from vnode.testing.fakeapi import FakeApi


def quota(ns: str, cpu: str, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "q",
            "namespace": ns,
            "resourceVersion": "1",
            "annotations": annotations,
        },
        "spec": {"hard": {"requests.cpu": cpu}},
    }


NODE = {
    "metadata": {"name": "a", "resourceVersion": "1", "labels": {"type": "virtual-kubelet"}},
    "status": {
        "allocatable": {"cpu": "4", "memory": "8Gi"},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


def pod(ns: str, name: str, cpu: str, node: str | None = "a") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


def fill(informer: Informer, *objects: dict[str, Any]) -> None:
    """Put objects in the store and tell the handlers, as a first list would."""
    informer.hold_handlers()
    for obj in objects:
        informer.store.update(obj)
    informer.release_handlers()


def controller(api: FakeApi) -> SliceController:
    return SliceController(client=api, events=api, settings=SliceSettings(), identity="test")


def written(api: FakeApi) -> dict[str, str]:
    return {
        q["metadata"]["namespace"]: q["metadata"]["annotations"][SLICES_ANNOTATION]
        for q in api.objects(RESOURCE_QUOTAS)
    }


async def test_a_namespace_decided_next_counts_the_slices_just_written() -> None:
    api = FakeApi()
    for q in (quota("one", "2"), quota("two", "4")):
        api.put(RESOURCE_QUOTAS, q)
    c = controller(api)
    fill(c.quotas, *api.objects(RESOURCE_QUOTAS))
    fill(c.nodes, NODE)
    await c.reconcile("one")  # 4 of the node's 8 slices
    await c.reconcile("two")  # the cache still shows "one" without its record
    assert written(api) == {"one": "a=4x(500m,-)", "two": "a=4x(500m,-)"}


async def test_an_administrators_record_counts_against_others_no_more_than_its_quota() -> None:
    api = FakeApi()
    # 8 slices of 4 cpu set by hand on a node of 4 cpu, for a quota of 1 cpu
    big = quota("big", "1", **{SLICES_ANNOTATION: "a=8x(4,-)"})
    for q in (big, quota("two", "4")):
        api.put(RESOURCE_QUOTAS, q)
    c = controller(api)
    fill(c.quotas, *api.objects(RESOURCE_QUOTAS))
    fill(c.nodes, NODE)
    await c.reconcile("two")
    assert written(api)["two"] == "a=6x(500m,-)"  # 4 cpu less the 1 cpu "big" may use there


async def test_admission_sums_the_namespaces_bound_pods() -> None:
    c = controller(FakeApi())
    fill(
        c.quotas,
        quota("held", "8", **{SLICES_ANNOTATION: "a=2x(500m,-)"}),
        quota("free", "8"),
        quota("typo", "8", **{SLICES_ANNOTATION: "a=lots"}),
    )
    fill(
        c.pods,
        pod("held", "p1", "600m"),
        pod("held", "p2", "100m", node="b"),  # another node: not counted on a
        pod("free", "p3", "3"),  # another namespace: not counted
    )

    def refused(p: dict[str, Any], node: str) -> str | None:
        return c.refusals(p, [node]).get(node)

    assert refused(pod("held", "new", "400m", node=None), "a") is None
    assert refused(pod("held", "new", "401m", node=None), "a") == (
        "its namespace's quota slices on a (2x(500m,-)) allow 1 cpu: 600m in use, "
        "the pod requests 401m"
    )
    assert "holds no quota slices on b" in str(refused(pod("held", "n", "1m", None), "b"))
    assert c.refusals(pod("held", "n", "1m", None), ["a", "b"]).keys() == {"b"}
    assert refused(pod("free", "n", "64", None), "a") is None
    # unreadable: refused everywhere (fail closed), saying why
    assert str(refused(pod("typo", "n", "1m", None), "a")).startswith(
        "its namespace's quota slices are refused: the tensile.io/quota-slices record of "
        "ResourceQuota q cannot be read: entry 'a=lots' is not"
    )
    assert refused(pod("nowhere", "n", "64", None), "a") is None


def test_bound_pods_are_summed_as_they_come_change_and_go() -> None:
    bound = BoundPods()
    assert bound.put(pod("t", "p1", "600m"))
    assert not bound.put(pod("t", "p1", "600m"))  # the same again: nothing to look at
    assert bound.put(pod("t", "p2", "1"))
    assert bound.usage == {("t", "a"): {"cpu": 1600, "memory": 0}}
    assert bound.put(pod("t", "p2", "2"))  # resized
    assert bound.usage == {("t", "a"): {"cpu": 2600, "memory": 0}}
    assert bound.remove(pod("t", "p1", "600m"))
    assert bound.remove(pod("t", "p2", "2"))
    assert not bound.remove(pod("t", "p2", "2"))
    assert bound.usage == {}
    assert not bound.put(pod("t", "unbound", "1", node=None))
    bad = pod("t", "bad", "lots")  # a quantity the apiserver would refuse: not counted
    assert not bound.put(bad)


def test_the_slim_pod_kept_requests_what_the_pod_requests() -> None:
    full = {
        "metadata": {"name": "p", "namespace": "t", "resourceVersion": "7", "labels": {"a": "b"}},
        "spec": {
            "nodeName": "a",
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}},
                {"name": "d", "resources": {"limits": {"memory": "1Gi"}}},
            ],
            "initContainers": [
                {
                    "name": "side",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "2"}},
                },
                {"name": "init", "resources": {"requests": {"cpu": "5", "memory": "3Gi"}}},
            ],
            "overhead": {"cpu": "100m"},
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
        "status": {"phase": "Running", "conditions": []},
    }
    slim = slim_pod(full)
    assert pod_use(slim) == pod_use(full)
    assert pod_use(full) == PodUse(
        namespace="t", node="a", requests={"cpu": 7100, "memory": 3 << 30}
    )  # init 5 + sidecar 2 beats 1 + 2; overhead on top
    assert "volumes" not in slim["spec"]
    assert "status" not in slim
