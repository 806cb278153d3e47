"""The webhook's conversion matrix (`webhook.mutation`): what moves into `clusterSelector`,
what stays upstairs, tolerations, volume pinning, idempotence, and the round trip through
the virtual node's restoration (`tensile.placement.lower`)."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensile.contracts import clusterselector, selectors
from tensile.placement.lower import lower_placement
from tests.unit.bounds import within
from webhook import caches, mutation, patches
from webhook.mutation import (
    Lookups,
    Mutation,
    MutationSettings,
    PodAdmission,
    mutate,
    skip_reason,
)

VNODES = frozenset({"vk-lower-1", "vk-lower-2"})
LOOKUPS = Lookups(is_virtual_node=VNODES.__contains__)
SETTINGS = MutationSettings()
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
HOSTNAME = "kubernetes.io/hostname"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
VNODE_TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
NOT_READY_300 = {
    "key": "node.kubernetes.io/not-ready",
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": 300,
}
UNREACHABLE_300 = {**NOT_READY_300, "key": "node.kubernetes.io/unreachable"}
GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
ADDED = [VNODE_TOLERATION, NOT_READY_300, UNREACHABLE_300]


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


CLUSTER_ID = expr("clusterID", "In", "lower-1")


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}


def pod(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    metadata = {"name": "web", "labels": {"virtual-pod": "true", "app": "web"}, **meta}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "main", "image": "nginx"}], **(spec or {})},
    }


def run(
    obj: dict[str, Any],
    *,
    operation: str = "CREATE",
    namespace: str = "shop",
    config: MutationSettings = SETTINGS,
    lookups: Lookups = LOOKUPS,
) -> tuple[Mutation, dict[str, Any]]:
    """Mutate `obj`, check the input was not changed, and return the decision and the pod
    with its patch applied."""
    before = copy.deepcopy(obj)
    admission = PodAdmission(operation=operation, namespace=namespace, pod=obj)
    decision = mutate(admission, settings=config, lookups=lookups)
    assert obj == before
    return decision, patches.apply(obj, decision.patch)


def selector_of(obj: dict[str, Any]) -> dict[str, Any]:
    parsed = clusterselector.parse(obj["metadata"]["annotations"][clusterselector.ANNOTATION])
    assert parsed is not None
    return parsed


# -- which pods -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "namespace", "labels", "reason"),
    [
        ("UPDATE", "shop", {"virtual-pod": "true"}, "operation UPDATE: only CREATE is converted"),
        ("CREATE", "kube-system", {"virtual-pod": "true"}, "namespace kube-system is excluded"),
        ("CREATE", "shop", None, "labels do not match 'virtual-pod=true'"),
        ("CREATE", "shop", {"virtual-pod": "false"}, "labels do not match 'virtual-pod=true'"),
        (
            "CREATE",
            "shop",
            {"virtual-pod": "true", "create-by-descheduler": "true"},
            "re-created by the descheduler: converted already",
        ),
    ],
)
def test_pods_left_alone(
    operation: str, namespace: str, labels: dict[str, str] | None, reason: str
) -> None:
    obj = pod({"nodeSelector": {"disk": "ssd"}})
    if labels is None:
        del obj["metadata"]["labels"]  # tensile-kube converted pods without labels
    else:
        obj["metadata"]["labels"] = labels
    decision, _ = run(obj, operation=operation, namespace=namespace)
    assert decision == Mutation(skipped=reason)


def test_the_namespace_comes_from_the_request_not_the_object() -> None:
    obj = pod({"nodeSelector": {"disk": "ssd"}}, namespace="shop")
    decision, _ = run(obj, namespace="kube-system")
    assert decision.skipped == "namespace kube-system is excluded"
    obj = pod({"nodeSelector": {"disk": "ssd"}}, namespace="kube-system")
    decision, _ = run(obj, namespace="shop")
    assert decision.skipped is None
    assert decision.patch


def test_the_selector_and_excluded_namespaces_are_settings() -> None:
    config = MutationSettings(
        pod_selector=selectors.parse("tier in (batch),!legacy"),
        excluded_namespaces=frozenset({"ops"}),
    )
    obj = pod()
    obj["metadata"]["labels"] = {"tier": "batch"}
    assert (
        skip_reason(PodAdmission(operation="CREATE", namespace="shop", pod=obj), settings=config)
        is None
    )
    assert skip_reason(PodAdmission(operation="CREATE", namespace="ops", pod=obj), settings=config)
    obj["metadata"]["labels"]["legacy"] = "1"
    assert skip_reason(PodAdmission(operation="CREATE", namespace="shop", pod=obj), settings=config)


# -- nodeSelector -----------------------------------------------------------------------------


def test_node_selector_entries_for_lower_nodes_move_and_those_for_virtual_nodes_stay() -> None:
    selector = {
        "disk": "ssd",
        "clusterID": "lower-1",  # --ignore-selector-keys
        "type": "virtual-kubelet",
        "kubernetes.io/hostname": "lower-node-3",  # a lower node
        "zone": "a",
    }
    _, out = run(pod({"nodeSelector": selector}))
    assert out["spec"]["nodeSelector"] == {"clusterID": "lower-1", "type": "virtual-kubelet"}
    assert selector_of(out)["nodeSelector"] == {
        "disk": "ssd",
        "kubernetes.io/hostname": "lower-node-3",
        "zone": "a",
    }
    _, out = run(pod({"nodeSelector": {"kubernetes.io/hostname": "vk-lower-2"}}))
    assert out["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "vk-lower-2"}
    assert "nodeSelector" not in selector_of(out)


def test_ignore_keys_are_a_setting() -> None:
    config = MutationSettings(ignore_selector_keys=frozenset({"region", "clusterID"}))
    _, out = run(pod({"nodeSelector": {"region": "eu", "disk": "ssd"}}), config=config)
    assert out["spec"]["nodeSelector"] == {"region": "eu"}
    assert selector_of(out)["nodeSelector"] == {"disk": "ssd"}


def test_a_node_selector_that_moves_entirely_is_removed() -> None:
    decision, out = run(pod({"nodeSelector": {"disk": "ssd"}}))
    assert "nodeSelector" not in out["spec"]
    assert {"op": "remove", "path": "/spec/nodeSelector"} in decision.patch


# -- required node affinity ---------------------------------------------------------------


def test_requirements_move_per_term_and_kept_ones_stay() -> None:
    first = {
        "matchExpressions": [CLUSTER_ID, expr("disk", "In", "ssd")],
        "matchFields": [expr("metadata.name", "In", "lower-node-3")],
    }
    second = {"matchExpressions": [expr("zone", "In", "a", "b")]}
    preferred = [{"weight": 5, "preference": {"matchExpressions": [expr("zone", "In", "a")]}}]
    pod_affinity = {REQUIRED: [{"topologyKey": "kubernetes.io/hostname"}]}
    affinity = required(first, second)
    affinity["nodeAffinity"][PREFERRED] = preferred
    affinity["podAntiAffinity"] = pod_affinity
    _, out = run(pod({"affinity": affinity}))
    assert out["spec"]["affinity"] == {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [{"matchExpressions": [expr("clusterID", "In", "lower-1")]}]
            },
            PREFERRED: preferred,  # stays upstairs, not copied (tensile-kube's rule)
        },
        "podAntiAffinity": pod_affinity,
    }
    assert selector_of(out)["affinity"] == required(
        {
            "matchExpressions": [expr("disk", "In", "ssd")],
            "matchFields": [expr("metadata.name", "In", "lower-node-3")],
        },
        second,
    )


def test_matchfields_are_split_by_their_own_index() -> None:
    # tensile-kube removed matchFields with the matchExpressions counter (wrong element).
    term = {
        "matchExpressions": [expr("clusterID", "In", "c1"), expr("a", "Exists")],
        "matchFields": [
            expr("metadata.name", "In", "vk-lower-1"),  # a virtual node: stays
            expr("metadata.name", "NotIn", "lower-node-0"),  # a lower node: moves
        ],
    }
    _, out = run(pod({"affinity": required(term)}))
    assert clusterselector.required_terms(out["spec"]["affinity"]) == [
        {
            "matchExpressions": [expr("clusterID", "In", "c1")],
            "matchFields": [expr("metadata.name", "In", "vk-lower-1")],
        }
    ]
    assert clusterselector.required_terms(selector_of(out)["affinity"]) == [
        {
            "matchExpressions": [expr("a", "Exists")],
            "matchFields": [expr("metadata.name", "NotIn", "lower-node-0")],
        }
    ]


@pytest.mark.parametrize(
    ("requirement", "kept"),
    [
        (expr("kubernetes.io/hostname", "In", "vk-lower-1", "vk-lower-2"), True),
        (expr("kubernetes.io/hostname", "NotIn", "vk-lower-1"), True),  # a descheduler's
        (expr("kubernetes.io/hostname", "In", "vk-lower-1", "lower-node-0"), False),
        (expr("kubernetes.io/hostname", "Exists"), False),
        (expr("type", "In", "virtual-kubelet"), True),
        (expr("type", "In", "virtual-kubelet", "kwok"), False),
        (expr("type", "NotIn", "virtual-kubelet"), False),
        (expr("clusterID", "DoesNotExist"), True),
    ],
)
def test_what_targets_virtual_nodes_stays(requirement: dict[str, Any], kept: bool) -> None:
    term = {"matchExpressions": [requirement, expr("disk", "In", "ssd")]}
    _, out = run(pod({"affinity": required(term)}))
    upper = clusterselector.required_terms(out["spec"].get("affinity"))
    lower = clusterselector.required_terms(selector_of(out)["affinity"])
    if kept:
        assert upper == [{"matchExpressions": [requirement]}]
        assert lower == [{"matchExpressions": [expr("disk", "In", "ssd")]}]
    else:
        assert upper == []
        assert lower == [term]


def test_terms_emptied_upstairs_are_dropped_and_none_left_removes_the_requirement() -> None:
    kept = {"matchExpressions": [expr("clusterID", "In", "c1"), expr("disk", "In", "ssd")]}
    moved = {"matchExpressions": [expr("zone", "In", "a")]}
    _, out = run(pod({"affinity": required(kept, moved)}))
    assert clusterselector.required_terms(out["spec"]["affinity"]) == [
        {"matchExpressions": [expr("clusterID", "In", "c1")]}
    ]
    _, out = run(pod({"affinity": required(moved)}))
    assert "affinity" not in out["spec"]
    assert clusterselector.required_terms(selector_of(out)["affinity"]) == [moved]


def test_a_term_without_requirements_is_left_as_it_was() -> None:
    _, out = run(pod({"affinity": required({}, {"matchExpressions": [expr("z", "Exists")]})}))
    assert clusterselector.required_terms(out["spec"]["affinity"]) == [{}]


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"nodeSelector": None, "affinity": None, "tolerations": None},
        {"nodeSelector": {}, "affinity": {}, "tolerations": []},
        {"affinity": {"nodeAffinity": None}},
        {"affinity": {"nodeAffinity": {REQUIRED: None}}},
        {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": None}}}},
        {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [None, "x"]}}}},
        {"affinity": {"podAffinity": {REQUIRED: [{"topologyKey": "zone"}]}}},
    ],
)
def test_empty_and_null_fields(spec: dict[str, Any]) -> None:
    decision, out = run(pod(spec))
    assert out["spec"]["tolerations"] == [
        VNODE_TOLERATION,
        *clusterselector.node_problem_tolerations(not_ready_seconds=300, unreachable_seconds=300),
    ]
    assert out["metadata"]["annotations"][clusterselector.ANNOTATION] == "{}"
    assert not out["spec"].get("nodeSelector")
    assert decision.warnings == ()
    if (spec.get("affinity") or {}).get("podAffinity"):
        assert out["spec"]["affinity"] == spec["affinity"]


# -- tolerations ------------------------------------------------------------------------------


def test_tolerations_are_copied_below_and_replaced_upstairs() -> None:
    forever = {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}  # every effect
    no_schedule = {**NOT_READY_300, "effect": "NoSchedule"}
    del no_schedule["tolerationSeconds"]
    own = [NOT_READY_300, forever, GPU, no_schedule]
    _, out = run(pod({"tolerations": own}))
    assert selector_of(out)["tolerations"] == own  # verbatim, defaults included
    assert out["spec"]["tolerations"] == [
        GPU,
        no_schedule,  # not an eviction: stays
        VNODE_TOLERATION,
        NOT_READY_300,
        UNREACHABLE_300,
    ]


@pytest.mark.parametrize(("seconds", "shown"), [(None, None), (0, 0), (3600, 3600)])
def test_toleration_seconds_are_settings(seconds: int | None, shown: int | None) -> None:
    config = MutationSettings(
        not_ready_seconds=seconds, unreachable_seconds=60, taint_key="example.com/vk"
    )
    _, out = run(pod({"tolerations": [VNODE_TOLERATION]}), config=config)
    by_key = {t["key"]: t for t in out["spec"]["tolerations"]}
    assert by_key["node.kubernetes.io/not-ready"].get("tolerationSeconds") == shown
    assert by_key["node.kubernetes.io/unreachable"]["tolerationSeconds"] == 60
    assert by_key["example.com/vk"] == {"key": "example.com/vk", "operator": "Exists"}
    assert by_key["virtual-kubelet.io/provider"] == VNODE_TOLERATION  # the user's own


def test_the_virtual_node_toleration_is_added_once() -> None:
    _, out = run(pod({"tolerations": [VNODE_TOLERATION]}))
    assert out["spec"]["tolerations"].count(VNODE_TOLERATION) == 1


# -- volumes ----------------------------------------------------------------------------------


def claim(
    node: str | None, *, phase: str = "Bound", volume: str | None = "pvc-1"
) -> dict[str, Any]:
    """A PVC as the webhook caches it: `selected-node` (None: none), phase, volumeName."""
    found: dict[str, Any] = {"metadata": {"name": "c", "namespace": "shop"}}
    if node is not None:
        found["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": node}
    if volume is not None:
        found["spec"] = {"volumeName": volume}
    if phase:
        found["status"] = {"phase": phase}
    return found


def pvc_lookups(**claims: str | dict[str, Any]) -> Lookups:
    """Lookups knowing PVCs of namespace shop: a node name stands for a bound claim whose
    `selected-node` is that node."""
    known = {k: claim(v) if isinstance(v, str) else v for k, v in claims.items()}
    return Lookups(
        is_virtual_node=VNODES.__contains__,
        claim=lambda namespace, name: known.get(name) if namespace == "shop" else None,
    )


def volumes(*claims: str) -> list[dict[str, Any]]:
    return [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": claim}}
        for i, claim in enumerate(claims)
    ]


def test_a_pod_with_a_pvc_bound_to_a_node_is_pinned_there_by_required_affinity() -> None:
    lookups = pvc_lookups(data="vk-lower-2")
    spec = {"volumes": volumes("data"), "nodeSelector": {"disk": "ssd"}}
    decision, out = run(pod(spec), lookups=lookups)
    pin = expr("kubernetes.io/hostname", "In", "vk-lower-2")
    assert "nodeName" not in out["spec"]  # the upper scheduler still places it
    assert clusterselector.required_terms(out["spec"]["affinity"]) == [{"matchExpressions": [pin]}]
    assert selector_of(out)["nodeSelector"] == {"disk": "ssd"}
    assert "affinity" not in selector_of(out)
    assert decision.warnings == ()
    # Every term gets the pin; what moved below does not.
    terms = required(
        {"matchExpressions": [expr("clusterID", "In", "c1"), expr("zone", "In", "a")]},
        {"matchExpressions": [expr("clusterID", "In", "c2")]},
    )
    _, out = run(pod({"volumes": volumes("data"), "affinity": terms}), lookups=lookups)
    assert clusterselector.required_terms(out["spec"]["affinity"]) == [
        {"matchExpressions": [expr("clusterID", "In", "c1"), pin]},
        {"matchExpressions": [expr("clusterID", "In", "c2"), pin]},
    ]


def test_pinning_follows_the_request_namespace_and_skips_bound_pods() -> None:
    lookups = pvc_lookups(data="vk-lower-2")
    _, out = run(pod({"volumes": volumes("data")}), lookups=lookups, namespace="other")
    assert "affinity" not in out["spec"]
    _, out = run(pod({"volumes": volumes("data"), "nodeName": "vk-lower-1"}), lookups=lookups)
    assert "affinity" not in out["spec"]
    _, out = run(pod({"volumes": volumes("missing")}), lookups=lookups)
    assert "affinity" not in out["spec"]


@pytest.mark.parametrize(
    "affinity",
    [
        {"nodeAffinity": "x"},
        {"nodeAffinity": ["ab"]},
        {"nodeAffinity": {REQUIRED: "x"}},
        {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": "x"}]}}},
    ],
)
def test_a_pin_replaces_node_affinity_of_the_wrong_shape(affinity: dict[str, Any]) -> None:
    decision, out = run(
        pod({"volumes": volumes("data"), "affinity": affinity}),
        lookups=pvc_lookups(data="vk-lower-2"),
    )
    assert out["spec"]["affinity"] == required(
        {"matchExpressions": [expr("kubernetes.io/hostname", "In", "vk-lower-2")]}
    )
    assert decision.warnings == ()


def test_volumes_of_different_nodes_pin_to_the_first_with_a_warning() -> None:
    lookups = pvc_lookups(a="vk-lower-1", b="vk-lower-2")
    decision, out = run(pod({"volumes": volumes("a", "b")}), lookups=lookups)
    assert clusterselector.required_terms(out["spec"]["affinity"]) == [
        {"matchExpressions": [expr("kubernetes.io/hostname", "In", "vk-lower-1")]}
    ]
    assert decision.warnings == (
        "tensile-webhook: the pod's volumes were provisioned for different nodes "
        "(vk-lower-1, vk-lower-2); it is pinned to vk-lower-1",
    )


@pytest.mark.parametrize(
    ("found", "node"),
    [
        (claim("vk-lower-2"), "vk-lower-2"),
        # Selected but not bound: the scheduler's choice in progress, which a failed
        # provisioning takes back; a pin would keep the pod there for good.
        (claim("vk-lower-2", phase="Pending", volume=None), None),
        (claim("vk-lower-2", phase="Pending", volume="pvc-1"), None),  # being bound
        (claim("vk-lower-2", phase="Bound", volume=None), None),  # not a bound claim's shape
        (claim("vk-lower-2", phase="Lost"), None),  # its volume is gone
        (claim("vk-lower-2", phase=""), None),
        (claim(None), None),  # bound, nothing says a node (a PV's affinity pins, if any)
        (claim(""), None),
        (None, None),
        ({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": 7}},
          "spec": {"volumeName": "v"}, "status": {"phase": "Bound"}}, None),
        ({"metadata": "x", "spec": [], "status": 3}, None),
    ],
)  # fmt: skip
def test_only_a_bound_claim_pins_the_pod_to_its_node(
    found: dict[str, Any] | None, node: str | None
) -> None:
    assert mutation.claim_node(found) == node
    lookups = pvc_lookups() if found is None else pvc_lookups(data=found)
    decision, out = run(pod({"volumes": volumes("data")}), lookups=lookups)
    terms = clusterselector.required_terms(out["spec"].get("affinity") or {})
    pins = [] if node is None else [{"matchExpressions": [expr(HOSTNAME, "In", node)]}]
    assert terms == pins
    assert decision.warnings == ()


@pytest.mark.parametrize(("phase", "node"), [("Bound", "vk-lower-2"), ("Pending", None)])
def test_the_claims_cache_keeps_what_tells_a_bound_claim(phase: str, node: str | None) -> None:
    full = {
        "metadata": {
            "name": "data", "namespace": "shop", "resourceVersion": "7", "uid": "u",
            "annotations": {"volume.kubernetes.io/selected-node": "vk-lower-2", "x": "y"},
        },
        "spec": {"volumeName": "pvc-u", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": phase, "capacity": {"storage": "1Gi"}},
    }  # fmt: skip
    slim = caches._slim_claim(full)
    assert mutation.claim_node(slim) == node
    assert slim == {
        "metadata": {
            "name": "data", "namespace": "shop", "resourceVersion": "7",
            "annotations": {"volume.kubernetes.io/selected-node": "vk-lower-2"},
        },
        "spec": {"volumeName": "pvc-u"},
        "status": {"phase": phase},
    }  # fmt: skip


def test_a_pin_to_a_node_the_informer_does_not_know_is_not_moved_on_reinvocation() -> None:
    lookups = pvc_lookups(data="not-yet-seen")
    _, once = run(pod({"volumes": volumes("data")}), lookups=lookups)
    decision, twice = run(once, lookups=lookups)
    assert decision.patch == ()
    assert twice == once


# -- the annotation ---------------------------------------------------------------------------


def test_the_annotation_is_compact_json_in_tensile_kubes_shape() -> None:
    spec = {
        "nodeSelector": {"disk": "ssd"},
        "affinity": required({"matchExpressions": [expr("zone", "In", "a")]}),
        "tolerations": [NOT_READY_300],
    }
    _, out = run(pod(spec, annotations={"team": "x"}))
    assert out["metadata"]["annotations"] == {
        "team": "x",
        "clusterSelector": '{"nodeSelector":{"disk":"ssd"},"affinity":{"nodeAffinity":'
        '{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":'
        '[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}},'
        '"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists",'
        '"effect":"NoExecute","tolerationSeconds":300}]}',
    }


def test_patch_paths_are_json_pointers() -> None:
    """RFC 6901: `~` and `/` in a key are `~0` and `~1` (annotation keys have slashes)."""
    assert patches.pointer(("metadata", "annotations", "example.com/a~b")) == (
        "/metadata/annotations/example.com~1a~0b"
    )
    document = {"metadata": {"annotations": {"example.com/a~b": "old"}}}
    operations = patches.set_member(document, ("metadata", "annotations", "example.com/a~b"), "new")
    assert operations == [
        {"op": "add", "path": "/metadata/annotations/example.com~1a~0b", "value": "new"}
    ]
    assert patches.apply(document, operations) == {
        "metadata": {"annotations": {"example.com/a~b": "new"}}
    }


def test_an_annotation_written_by_hand_is_merged_into() -> None:
    given_selector = {
        "nodeSelector": {"disk": "hdd", "rack": "r1"},
        "affinity": required({"matchExpressions": [expr("zone", "In", "a")]}),
        "tolerations": [GPU],
    }
    spec = {
        "nodeSelector": {"disk": "ssd"},
        "affinity": required(
            {"matchExpressions": [expr("cpu", "In", "x86")]},
            {"matchExpressions": [expr("cpu", "In", "arm")]},
        ),
    }
    annotations = {clusterselector.ANNOTATION: json.dumps(given_selector)}
    _, out = run(pod(spec, annotations=annotations))
    merged = selector_of(out)
    assert merged["nodeSelector"] == {"disk": "ssd", "rack": "r1"}  # the pod's own wins
    assert clusterselector.required_terms(merged["affinity"]) == [  # ANDed
        {"matchExpressions": [expr("zone", "In", "a"), expr("cpu", "In", "x86")]},
        {"matchExpressions": [expr("zone", "In", "a"), expr("cpu", "In", "arm")]},
    ]
    assert merged["tolerations"] == [GPU]


def test_an_and_too_large_leaves_the_pod_unchanged_with_a_warning() -> None:
    many = required(*({"matchExpressions": [expr("a", "In", str(i))]} for i in range(9)))
    annotations = {clusterselector.ANNOTATION: json.dumps({"affinity": many})}
    decision, _ = run(pod({"affinity": many}, annotations=annotations))
    assert decision.patch == ()
    assert decision.warnings == (
        "tensile-webhook: pod left unchanged: its clusterSelector has 9 node-affinity terms "
        "and 9 more would be ANDed to them (over 64 terms)",
    )


def test_an_unusable_annotation_is_replaced_with_a_warning() -> None:
    annotations = {clusterselector.ANNOTATION: "{broken"}
    decision, out = run(pod({"nodeSelector": {"disk": "ssd"}}, annotations=annotations))
    assert selector_of(out) == {"nodeSelector": {"disk": "ssd"}}
    assert "is not valid" in decision.warnings[0]


# -- size -------------------------------------------------------------------------------------


def test_a_pod_with_very_many_tolerations_is_decided_in_linear_time() -> None:
    """An AdmissionReview may hold a 3 MiB pod, and the apiserver validates no count of
    tolerations: the decision must not compare every pair (100,000 tolerations took ten
    minutes of the event loop, every other caller waiting; the apiserver gives up after 30 s)."""
    own = [{"key": f"t{i}"} for i in range(100_000)]
    with within(30, "deciding on a pod with 100,000 tolerations"):
        _, out = run(pod({"tolerations": own}))
    assert selector_of(out)["tolerations"] == own
    assert out["spec"]["tolerations"] == [*own, *ADDED]


def test_an_annotation_and_a_pod_with_very_many_requirements_are_anded_in_linear_time() -> None:
    many = [expr(f"k{i}", "Exists") for i in range(40_000)]
    annotations = {
        clusterselector.ANNOTATION: json.dumps({"affinity": required({"matchExpressions": many})})
    }
    spec = {"affinity": required({"matchExpressions": many[::-1]})}
    with within(30, "ANDing two terms of 40,000 requirements"):
        _, out = run(pod(spec, annotations=annotations))
    assert clusterselector.required_terms(selector_of(out)["affinity"]) == [
        {"matchExpressions": many}
    ]


# -- properties -------------------------------------------------------------------------------

names = st.sampled_from(["disk", "zone", "rack", "clusterID", "type", "kubernetes.io/hostname"])
values = st.sampled_from(["ssd", "a", "b", "c1", "virtual-kubelet", "vk-lower-1", "lower-node-0"])
requirements = st.builds(
    lambda key, operator, vals: {"key": key, "operator": operator, "values": vals},
    names,
    st.sampled_from(["In", "NotIn"]),
    st.lists(values, min_size=1, max_size=2, unique=True),
) | st.builds(lambda key: {"key": key, "operator": "Exists"}, names)
fields = st.builds(
    lambda operator, node: {"key": "metadata.name", "operator": operator, "values": [node]},
    st.sampled_from(["In", "NotIn"]),
    st.sampled_from(["vk-lower-1", "lower-node-0"]),
)
terms = st.builds(
    lambda e, f: {k: v for k, v in (("matchExpressions", e), ("matchFields", f)) if v},
    st.lists(requirements, max_size=3),
    st.lists(fields, max_size=1),
)
tolerations = st.lists(
    st.sampled_from([NOT_READY_300, UNREACHABLE_300, GPU, VNODE_TOLERATION, {"key": "x"}]),
    max_size=4,
)
specs = st.fixed_dictionaries(
    {},
    optional={
        "nodeSelector": st.dictionaries(names, values, max_size=3),
        "affinity": st.lists(terms, min_size=1, max_size=3).map(lambda t: required(*t)),
        "tolerations": tolerations,
        "volumes": st.lists(st.sampled_from(["data", "logs"]), max_size=2).map(
            lambda claims: volumes(*claims)
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(spec=specs, avoided=st.frozensets(st.sampled_from(["vk-lower-1", "vk-gone"])))
def test_mutating_a_mutated_pod_changes_nothing(
    spec: dict[str, Any], avoided: frozenset[str]
) -> None:
    """Also for the replacement of a moved pod (its controller avoids virtual nodes, one of
    them perhaps not in the node cache: deleted, or not listed yet)."""
    lookups = dataclasses.replace(
        pvc_lookups(data="vk-lower-2", logs="elsewhere"), avoided_nodes=lambda _uid: avoided
    )
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-1"}
    obj = pod(spec, ownerReferences=[{**owner, "controller": True}])
    _, once = run(obj, lookups=lookups)
    decision, twice = run(once, lookups=lookups)
    assert decision.patch == ()
    assert twice == once


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(
    spec=st.dictionaries(
        st.sampled_from(["nodeSelector", "affinity", "tolerations", "volumes", "nodeName"]),
        json_values,
    ),
    pinned=st.booleans(),
    annotations=st.none() | json_values.map(lambda v: {clusterselector.ANNOTATION: json.dumps(v)}),
)
def test_any_json_shaped_pod_gives_a_decision(
    spec: dict[str, Any], pinned: bool, annotations: dict[str, str] | None
) -> None:
    """Whatever the spec holds, and whether the annotations are null (JSON's "none") or hold
    any clusterSelector: a decision whose patch applies, never an exception."""
    if pinned:
        spec["volumes"] = volumes("data")  # the pin step rewrites whatever affinity there is
    obj = pod(spec, annotations=annotations)
    decision, out = run(obj, lookups=pvc_lookups(data="vk-lower-2"))
    assert isinstance(decision, Mutation)
    if decision.patch:
        assert clusterselector.ANNOTATION in out["metadata"]["annotations"]


NODE = "vk-lower-1"
NODE_LABELS = {
    "type": "virtual-kubelet",
    "kubernetes.io/hostname": NODE,
    "clusterID": "c1",
    "kubernetes.io/os": "linux",
}
lower_names = st.sampled_from(["disk", "zone", "rack", "kubernetes.io/hostname"])
lower_values = st.sampled_from(["ssd", "a", "b", "lower-node-0"])
lower_requirements = st.builds(
    lambda key, operator, vals: {"key": key, "operator": operator, "values": vals},
    lower_names,
    st.sampled_from(["In", "NotIn"]),
    st.lists(lower_values, min_size=1, max_size=2, unique=True),
) | st.builds(lambda key: {"key": key, "operator": "Exists"}, lower_names)
# What the upper scheduler satisfied by placing the pod on NODE.
upper_requirements = st.sampled_from(
    [
        expr("clusterID", "In", "c1"),
        expr("type", "In", "virtual-kubelet"),
        expr("kubernetes.io/hostname", "In", NODE),
        expr("kubernetes.io/hostname", "NotIn", "vk-lower-2"),
    ]
)
lower_terms = st.builds(
    lambda lower, upper, fields: {
        k: v for k, v in (("matchExpressions", upper + lower), ("matchFields", fields)) if v
    },
    st.lists(lower_requirements, min_size=1, max_size=3),
    st.lists(upper_requirements, max_size=2),
    st.lists(
        st.just({"key": "metadata.name", "operator": "NotIn", "values": ["lower-node-0"]}),
        max_size=1,
    ),
)


def without_upper(term: dict[str, Any]) -> dict[str, Any]:
    kept = {
        name: [r for r in term.get(name, []) if r not in [expr("clusterID", "In", "c1")]]
        for name in ("matchExpressions", "matchFields")
    }
    upper = [
        expr("type", "In", "virtual-kubelet"),
        expr("kubernetes.io/hostname", "In", NODE),
        expr("kubernetes.io/hostname", "NotIn", "vk-lower-2"),
    ]
    kept["matchExpressions"] = [r for r in kept["matchExpressions"] if r not in upper]
    return {name: reqs for name, reqs in kept.items() if reqs}


@settings(max_examples=300, deadline=None)
@given(
    lower_selector=st.dictionaries(lower_names, lower_values, max_size=3),
    upper_selector=st.sampled_from([{}, {"clusterID": "c1"}, {"type": "virtual-kubelet"}]),
    terms=st.lists(lower_terms, max_size=3),
    own_tolerations=tolerations,
)
def test_the_webhook_then_the_virtual_node_give_back_the_lower_constraints(
    lower_selector: dict[str, str],
    upper_selector: dict[str, str],
    terms: list[dict[str, Any]],
    own_tolerations: list[dict[str, Any]],
) -> None:
    """Constraints meant for the lower cluster reach the lower pod unchanged, for a pod the
    upper scheduler placed on the virtual node (so what stayed upstairs is satisfied)."""
    spec: dict[str, Any] = {
        "nodeSelector": {**lower_selector, **upper_selector},
        "tolerations": own_tolerations,
    }
    if terms:
        spec["affinity"] = required(*terms)
    _, upper = run(pod(spec))
    below = lower_placement(
        upper["spec"],
        cluster_selector=clusterselector.parse(
            upper["metadata"]["annotations"][clusterselector.ANNOTATION]
        ),
        node_name=NODE,
        node_labels=NODE_LABELS,
    )
    assert below.get("nodeSelector", {}) == lower_selector
    assert clusterselector.required_terms(below.get("affinity")) == [
        without_upper(t) for t in terms
    ]
    canonical = sorted({json.dumps(t, sort_keys=True) for t in own_tolerations})
    assert (
        sorted({json.dumps(t, sort_keys=True) for t in below.get("tolerations", [])}) == canonical
    )
