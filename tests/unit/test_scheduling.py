"""The scheduler's node filters as tensile reads them (tensile.contracts.scheduling): which
taints a pod's tolerations tolerate, and why a node is ruled out for a pod. The term
semantics themselves are tests/unit/test_translate.py's and test_avoidance.py's."""

from __future__ import annotations

from typing import Any

import pytest

from tensile.contracts.scheduling import tolerates, unfit

GPU = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "gpu"}, True),  # no operator: Equal; no effect: any
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # no key, Exists: every taint
        ({"key": "dedicated", "value": "cpu"}, False),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "dedicated", "operator": "Gt", "value": "1"}, False),  # unknown: nothing
        ("not a toleration", False),
    ],
)
def test_tolerations_tolerate_as_kubernetes_does(toleration: Any, tolerated: bool) -> None:
    assert tolerates([toleration], GPU) is tolerated


def test_an_empty_value_is_equal_to_no_value() -> None:
    assert tolerates([{"key": "k", "operator": "Equal"}], {"key": "k", "effect": "NoSchedule"})


def node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "vn-b", "labels": labels}, "spec": {}}


def test_why_a_node_is_ruled_out() -> None:
    plain = node(clusterID="b", zone="x")
    assert unfit({}, plain) is None
    assert unfit({"nodeSelector": {"clusterID": "b"}}, plain) is None
    assert unfit({"nodeSelector": {"clusterID": "a"}}, plain) == (
        "its nodeSelector clusterID=a does not match"
    )
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["y"]}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    assert unfit({"affinity": affinity}, plain) == "its required node affinity does not select it"
    # Preferred terms only steer.
    preferred = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": term}]
        }
    }
    assert unfit({"affinity": preferred}, plain) is None
    tainted = {**plain, "spec": {"taints": [GPU, {"key": "soft", "effect": "PreferNoSchedule"}]}}
    assert unfit({}, tainted) == "it does not tolerate the taint dedicated=gpu:NoSchedule"
    assert unfit({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, tainted) is None
