"""The webhook's avoidance step: the replacement of a pod the descheduler evicted is kept off
the virtual nodes its controller must avoid -- on the upper pod, in every required term,
never moved into clusterSelector -- and the virtual node then leaves it out of the lower
pod (it is satisfied by the virtual node the pod was placed on)."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from tensile.contracts import avoidance, clusterselector
from tensile.placement.lower import lower_placement
from tensile.serving.flags import UsageError
from webhook import cli, patches
from webhook.mutation import Lookups, MutationSettings, PodAdmission, mutate

OWNER_UID = "0f3c2a9e-7b1d-4c55-8e2f-5a6b7c8d9e01"
VNODES = frozenset({"vn-a", "vn-b", "vn-c"})
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def lookups(avoided: dict[str, frozenset[str]] | None = None) -> Lookups:
    return Lookups(
        is_virtual_node=VNODES.__contains__,
        avoided_nodes=lambda uid: (avoided or {}).get(uid, frozenset()),
    )


AVOID_A = lookups({OWNER_UID: frozenset({"vn-a"})})


def replacement(spec: dict[str, Any] | None = None, *, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"generateName": "web-7d9f-", "labels": {"virtual-pod": "true"}}
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-7d9f",
                "uid": OWNER_UID,
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "i"}], **(spec or {})},
    }


def converted(pod: dict[str, Any], found: Lookups = AVOID_A) -> dict[str, Any]:
    before = copy.deepcopy(pod)
    decision = mutate(
        PodAdmission(operation="CREATE", namespace="shop", pod=pod),
        settings=MutationSettings(),
        lookups=found,
    )
    assert pod == before
    return patches.apply(pod, decision.patch)


def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return clusterselector.required_terms(pod["spec"].get("affinity"))


NOT_A = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["vn-a"]}


def test_a_replacement_is_kept_off_the_avoided_node_upstairs_in_every_term() -> None:
    cluster_id = {"key": "clusterID", "operator": "In", "values": ["lower-2"]}
    other_id = {"key": "clusterID", "operator": "In", "values": ["lower-3"]}
    disk = {"key": "disk", "operator": "In", "values": ["ssd"]}
    pod = replacement(
        {
            "affinity": {
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [cluster_id, disk]},
                            {"matchExpressions": [disk]},
                            {"matchExpressions": [other_id]},
                        ]
                    }
                }
            },
            "nodeSelector": {"zone": "a"},
        }
    )
    upper = converted(pod)
    # clusterID stays up (an ignore key), disk and zone go below (the second term, left
    # empty upstairs, with them); what stays, every term of it, gets the NotIn.
    assert terms(upper) == [
        {"matchExpressions": [cluster_id, NOT_A]},
        {"matchExpressions": [other_id, NOT_A]},
    ]
    below = clusterselector.parse(upper["metadata"]["annotations"][clusterselector.ANNOTATION])
    assert below is not None
    assert "kubernetes.io/hostname" not in str(below)


def test_pods_without_an_avoidance_are_left_as_they_were() -> None:
    plain = converted(replacement(), found=lookups())
    assert "affinity" not in plain["spec"]
    bare = converted(replacement(owned=False))
    assert "affinity" not in bare["spec"]
    # Pods the webhook leaves alone get nothing either (a bare pod's replacement carries
    # its own requirement: the descheduler made it).
    recreated = replacement()
    recreated["metadata"]["labels"]["create-by-descheduler"] = "true"
    assert converted(recreated) == recreated


def test_a_pod_with_no_required_affinity_gets_one_term() -> None:
    upper = converted(replacement({"nodeSelector": {"type": "virtual-kubelet"}}))
    assert upper["spec"]["nodeSelector"] == {"type": "virtual-kubelet"}
    assert terms(upper) == [{"matchExpressions": [NOT_A]}]


def test_converting_again_changes_nothing() -> None:
    many = lookups({OWNER_UID: frozenset({"vn-b", "vn-a"})})
    once = converted(replacement({"nodeSelector": {"disk": "ssd"}}), found=many)
    assert terms(once) == [{"matchExpressions": [{**NOT_A, "values": ["vn-a", "vn-b"]}]}]
    decision = mutate(
        PodAdmission(operation="CREATE", namespace="shop", pod=once),
        settings=MutationSettings(),
        lookups=many,
    )
    assert decision.patch == ()


def test_an_avoided_node_the_informer_does_not_know_is_not_moved_on_reinvocation() -> None:
    """The record may name a virtual node the webhook's node cache does not hold (deleted,
    re-registering, or not listed yet): the requirement is still the avoidance's, so a
    second call (reinvocation) must not take it for a lower-node constraint and move it
    into clusterSelector."""
    gone = lookups({OWNER_UID: frozenset({"vn-gone"})})
    once = converted(replacement({"nodeSelector": {"disk": "ssd"}}), found=gone)
    not_gone = {**NOT_A, "values": ["vn-gone"]}
    assert terms(once) == [{"matchExpressions": [not_gone]}]
    decision = mutate(
        PodAdmission(operation="CREATE", namespace="shop", pod=once),
        settings=MutationSettings(),
        lookups=gone,
    )
    assert decision.patch == ()


def test_the_nodes_it_added_are_noted_and_a_notin_of_the_pod_s_own_is_not() -> None:
    """The descheduler judges where the controller's next pod could go by this pod less
    what the webhook added: it must be able to tell a NotIn the template has (here vn-b,
    which the record names too) from the webhook's."""
    own = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["vn-b"]}
    template = replacement(
        {
            "affinity": {
                "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [own]}]}}
            }
        }
    )
    found = lookups({OWNER_UID: frozenset({"vn-a", "vn-b"})})
    once = converted(template, found=found)
    assert terms(once) == [{"matchExpressions": [{**own, "values": ["vn-b", "vn-a"]}]}]
    annotations = once["metadata"]["annotations"]
    # One patch made both annotations (the pod had none): neither replaced the other.
    assert annotations[avoidance.ADDED_ANNOTATION] == "vn-a"
    assert clusterselector.ANNOTATION in annotations
    # Taking out what was noted gives the template's affinity back.
    assert (
        avoidance.without_avoidances(once["spec"]["affinity"], avoidance.added_nodes(once))
        == template["spec"]["affinity"]
    )
    # Converting again (reinvocation) keeps the note as it is.
    again = mutate(
        PodAdmission(operation="CREATE", namespace="shop", pod=once),
        settings=MutationSettings(),
        lookups=found,
    )
    assert again.patch == ()


def test_a_note_the_pod_came_with_counts_only_for_nodes_avoided_now() -> None:
    copied = replacement({"affinity": avoidance.avoiding(None, ["vn-b"])})
    copied["metadata"]["annotations"] = {avoidance.ADDED_ANNOTATION: "vn-b"}
    upper = converted(copied)  # the record avoids vn-a only
    assert upper["metadata"]["annotations"][avoidance.ADDED_ANNOTATION] == "vn-a"
    unowned = converted(copied, found=lookups())
    assert avoidance.ADDED_ANNOTATION not in unowned["metadata"]["annotations"]


def test_the_lower_pod_does_not_carry_it() -> None:
    disk = {"key": "disk", "operator": "In", "values": ["ssd"]}
    upper = converted(
        replacement(
            {
                "affinity": {
                    "nodeAffinity": {
                        REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [disk]}]}
                    }
                }
            }
        )
    )
    below = lower_placement(
        upper["spec"],
        cluster_selector=clusterselector.parse(
            upper["metadata"]["annotations"][clusterselector.ANNOTATION]
        ),
        node_name="vn-b",
        node_labels={"type": "virtual-kubelet", "kubernetes.io/hostname": "vn-b"},
    )
    assert clusterselector.required_terms(below.get("affinity")) == [{"matchExpressions": [disk]}]


def test_the_record_is_read_by_owner_uid_and_expiry() -> None:
    now = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    owner = avoidance.Owner(
        uid=OWNER_UID, api_version="apps/v1", kind="ReplicaSet", namespace="shop", name="web-7d9f"
    )
    data = avoidance.with_avoidance(
        None, owner=owner, nodes=["vn-a"], until=now + dt.timedelta(minutes=5), now=now
    )
    found = Lookups(avoided_nodes=lambda uid: avoidance.avoided_nodes(data, owner_uid=uid, now=now))
    assert terms(converted(replacement(), found=found)) == [{"matchExpressions": [NOT_A]}]
    expired = Lookups(
        avoided_nodes=lambda uid: avoidance.avoided_nodes(
            data, owner_uid=uid, now=now + dt.timedelta(minutes=6)
        )
    )
    assert "affinity" not in converted(replacement(), found=expired)["spec"]


def test_the_record_is_the_descheduler_flag_s_configmap() -> None:
    assert cli.parse([], env={}).avoid_configmap == ("tensile-system", "tensile-avoid")
    assert cli.parse(["--avoid-configmap=ops/avoid"], env={}).avoid_configmap == ("ops", "avoid")
    with pytest.raises(UsageError, match="--avoid-configmap must be namespace/name"):
        cli.parse(["--avoid-configmap=avoid"], env={})
