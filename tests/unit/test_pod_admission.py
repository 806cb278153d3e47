"""The virtual node's own admission of pods no scheduler saw (`vnode.controllers.pod_admission`):
the taint check as a table, and the quota slices counted first come first served. The quota
cache is filled by hand and its client is `FakeApi` (nothing is written): the moment this
checks, two pods of one namespace admitted one after the other with nothing in between, is
not one a real cluster holds open on demand. (On the real clusters: the virtual node
refusing pods bound by spec.nodeName, tests/e2e/test_scheduler.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tensile.contracts.quotaslices import SLICES_ANNOTATION
from tensile.kube.informer_factory import InformerFactory
from vnode.controllers.pod_admission import PlacedPods, SliceAdmission, untolerated
from vnode.controllers.pod_decisions import admission_rejected_status
from vnode.testing.fakeapi import FakeApi

TAINT = {"key": "virtual-kubelet.io/provider", "value": "tensile", "effect": "NoSchedule"}


def pod(name: str, cpu: str = "500m", *, ns: str = "t", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": "vn",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    ("tolerations", "taints", "refused"),
    [
        (None, [TAINT], True),
        ([{"key": "virtual-kubelet.io/provider", "operator": "Exists"}], [TAINT], False),
        ([{"key": "virtual-kubelet.io/provider", "value": "tensile"}], [TAINT], False),
        ([{"key": "virtual-kubelet.io/provider", "value": "other"}], [TAINT], True),
        ([{"operator": "Exists"}], [TAINT], False),  # tolerates everything
        ([{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoExecute"}],
         [TAINT], True),  # another effect
        (None, [{**TAINT, "effect": "NoExecute"}], True),
        (None, [{**TAINT, "effect": "PreferNoSchedule"}], False),  # only steers
        (None, [], False),  # --disable-taint
    ],
)  # fmt: skip
def test_untolerated(
    tolerations: list[dict[str, str]] | None, taints: list[dict[str, str]], refused: bool
) -> None:
    spec = {"tolerations": tolerations} if tolerations is not None else {}
    assert untolerated(pod("p", **spec), taints) is refused


def test_a_refusal_reads_as_a_kubelets() -> None:
    status = admission_rejected_status(pod("p"), reason="TaintToleration", message="because")
    assert status == {
        "phase": "Failed",
        "reason": "TaintToleration",
        "message": "Pod was rejected: because",
    }


def test_placed_pods_are_summed_by_namespace() -> None:
    placed = PlacedPods()
    placed.add("t/a", "t", {"cpu": 500})
    placed.add("t/a", "t", {"cpu": 500})  # once
    placed.add("t/b", "t", {"cpu": 250, "memory": 1})
    placed.add("u/c", "u", {"cpu": 1000})
    assert placed.usage("t") == {"cpu": 750, "memory": 1}
    placed.discard("t/a")
    placed.discard("t/a")
    placed.discard("t/b")
    assert placed.usage("t") == {}
    assert "u/c" in placed


def quota(ns: str, record: str | None) -> dict[str, Any]:
    annotations = {SLICES_ANNOTATION: record} if record is not None else {}
    return {
        "metadata": {
            "name": "compute",
            "namespace": ns,
            "resourceVersion": "1",
            "annotations": annotations,
        },
        "spec": {"hard": {"requests.cpu": "4"}},
    }


def admission(*quotas: dict[str, Any]) -> SliceAdmission:
    gate = SliceAdmission(
        client=FakeApi(), informers=InformerFactory(), node_name="vn", namespace=None
    )
    for q in quotas:
        gate.quotas.store.update(q)
    return gate


def test_pods_are_admitted_first_come_first_served_within_the_slices() -> None:
    gate = admission(quota("t", "vn=2x(500m,-)"), quota("free", None))
    below = [("t/old", pod("old", "400m"))]  # created below before the node started
    assert gate.admit("t/a", pod("a", "500m"), below=lambda ns: below) is None
    # 400m below + 500m admitted: 100m left of 1 cpu
    assert gate.admit("t/b", pod("b", "200m"), below=lambda ns: []) == (
        "its namespace's quota slices on vn (2x(500m,-)) allow 1 cpu: 900m in use, "
        "the pod requests 200m"
    )
    assert gate.admit("t/c", pod("c", "100m"), below=lambda ns: []) is None
    gate.forget("t/a")  # finished: its room is free again
    assert gate.admit("t/b", pod("b", "200m"), below=lambda ns: []) is None
    # another namespace without a record is not held, and its pods count for nothing here
    assert gate.admit("free/x", pod("x", "64", ns="free"), below=lambda ns: []) is None


def test_a_record_that_cannot_be_read_admits_nothing() -> None:
    gate = admission(quota("t", "vn=lots"))
    why = gate.admit("t/a", pod("a", "1m"), below=lambda ns: [])
    assert str(why).startswith(
        "its namespace's quota slices are refused: the tensile.io/quota-slices record of "
        "ResourceQuota compute cannot be read"
    )
    assert "t/a" not in gate.placed  # refused: it counts for nothing
