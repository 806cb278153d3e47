"""The `clusterSelector` contract between the webhook (writer) and the virtual node (reader)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tensile.contracts import clusterselector

ZONE = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
NODE3 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["lower-node-3"]}]}
NOT_READY_300 = {
    "key": "node.kubernetes.io/not-ready",
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": 300,
}


def test_the_annotation_is_tensile_kubes_compact_json_in_go_field_order() -> None:
    value = clusterselector.render(
        node_selector={"disk": "ssd"},
        affinity=clusterselector.with_required_terms(None, [ZONE, NODE3]),
        tolerations=[NOT_READY_300],
    )
    assert value == (
        '{"nodeSelector":{"disk":"ssd"},"affinity":{"nodeAffinity":'
        '{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":['
        '{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]},'
        '{"matchFields":[{"key":"metadata.name","operator":"In","values":["lower-node-3"]}]}]}}},'
        '"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists",'
        '"effect":"NoExecute","tolerationSeconds":300}]}'
    )
    assert clusterselector.parse(value) == json.loads(value)
    assert clusterselector.required_terms(json.loads(value)["affinity"]) == [ZONE, NODE3]


def test_empty_parts_are_left_out() -> None:
    assert clusterselector.render(node_selector={}, affinity={}, tolerations=[]) == "{}"
    assert clusterselector.render(node_selector={"disk": "ssd"}, affinity=None, tolerations=()) == (
        '{"nodeSelector":{"disk":"ssd"}}'
    )
    assert clusterselector.parse("{}") == {}
    assert clusterselector.required_terms({}) == []
    assert clusterselector.required_terms(None) == []


def test_required_terms_are_replaced_and_the_rest_of_an_affinity_kept() -> None:
    preferred = [{"weight": 1, "preference": ZONE}]
    pod_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "z"}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [ZONE]},
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAffinity": pod_affinity,
    }
    before = json.dumps(affinity)
    assert clusterselector.with_required_terms(affinity, [NODE3]) == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [NODE3]},
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAffinity": pod_affinity,
    }
    assert clusterselector.with_required_terms(affinity, []) == {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAffinity": pod_affinity,
    }
    assert json.dumps(affinity) == before  # not mutated
    only = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    assert clusterselector.with_required_terms(only, []) == {}


def test_the_added_tolerations_are_recognised_by_the_reader() -> None:
    for seconds in (None, 0, 300, 86400):
        added = clusterselector.added_tolerations(
            not_ready_seconds=seconds, unreachable_seconds=seconds
        )
        assert all(clusterselector.is_added_toleration(t) for t in added)
    assert clusterselector.added_tolerations(not_ready_seconds=60, unreachable_seconds=None) == [
        {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
        {**NOT_READY_300, "tolerationSeconds": 60},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]
    custom = clusterselector.added_tolerations(
        taint_key="example.com/vk", not_ready_seconds=None, unreachable_seconds=None
    )
    assert custom[0] == {"key": "example.com/vk", "operator": "Exists"}
    assert clusterselector.is_added_toleration(custom[0], taint_key="example.com/vk")
    assert not clusterselector.is_added_toleration(custom[0])
    for theirs in (
        {"key": "gpu", "operator": "Exists"},
        {**NOT_READY_300, "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Equal", "value": "x"},
        {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "k8s"},
        "not a toleration",
    ):
        assert not clusterselector.is_added_toleration(theirs)


labels = st.text(st.sampled_from("abz09-./"), min_size=1, max_size=8)
requirements = st.fixed_dictionaries(
    {"key": labels, "operator": st.sampled_from(["In", "NotIn"]), "values": st.lists(labels)}
)
terms = st.fixed_dictionaries({"matchExpressions": st.lists(requirements, min_size=1)})
tolerations = st.fixed_dictionaries(
    {"key": labels, "operator": st.just("Exists")},
    optional={"effect": st.sampled_from(["NoSchedule", "NoExecute"])},
)


@given(
    node_selector=st.dictionaries(labels, labels, max_size=3),
    node_selector_terms=st.lists(terms, max_size=3),
    tolerations=st.lists(tolerations, max_size=3),
)
def test_what_the_writer_renders_the_reader_parses_back(
    node_selector: dict[str, str],
    node_selector_terms: list[dict[str, Any]],
    tolerations: list[dict[str, Any]],
) -> None:
    value = clusterselector.render(
        node_selector=node_selector,
        affinity=clusterselector.with_required_terms(None, node_selector_terms),
        tolerations=tolerations,
    )
    parsed = clusterselector.parse(value)
    assert parsed is not None
    assert parsed.get("nodeSelector", {}) == node_selector
    assert clusterselector.required_terms(parsed.get("affinity")) == node_selector_terms
    assert parsed.get("tolerations", []) == tolerations


def test_union_keeps_the_first_list_and_adds_what_it_lacks_once() -> None:
    gpu = {"key": "gpu", "operator": "Exists"}
    nested = {"key": "zone", "operator": "In", "values": ["a", "b"]}
    first = [gpu, dict(gpu)]  # the first list is kept as it is, repeats included
    merged = clusterselector.union(first, [dict(gpu), nested, dict(nested), {"key": "x"}])
    assert merged == [gpu, gpu, nested, {"key": "x"}]
    assert merged[0] is gpu  # the items themselves, not copies
    # Key order does not make another item; a different value does.
    reordered = {"values": ["a", "b"], "operator": "In", "key": "zone"}
    assert clusterselector.union([nested], [reordered, {**nested, "values": ["b", "a"]}]) == [
        nested,
        {**nested, "values": ["b", "a"]},
    ]
