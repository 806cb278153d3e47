"""The pure parts of the mirror mechanism: specs of the dependency copies, keys both ways,
shared informers, and store indexes added by a sharer. (The engine itself runs against the
real apiservers in tests/e2e/test_mirror.py.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.informer import compact
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.mirror.siblings import SiblingPolicy
from tensile.kube.mirror.spec import KindSpec, Patch, Replace
from tensile.kube.resources import CONFIG_MAPS, PODS
from tensile.kube.store import Store
from vnode.providers.k2k import dependencies, naming, slim

A = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
A2 = ownership.NodeIdentity(node_name="vn-a2", cluster_id=A.cluster_id)
B = ownership.NodeIdentity(node_name="vn-a", cluster_id="bbbbbbbb-0000-4000-8000-000000000002")


def config_map(data: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "app", "uid": "u1", "labels": {"l": "1"}},
        "data": data,
        **extra,
    }


def copy_by(owner: ownership.NodeIdentity) -> KindSpec:
    return dependencies.copy_spec(
        kind="ConfigMap", tenancy=naming.NodeTenancy(owner=owner, prefix="")
    )


def test_a_copy_carries_the_owner_and_its_upper_namespace_and_nothing_server_set() -> None:
    tenancy = naming.NodeTenancy(owner=A, prefix="t1-")
    spec = dependencies.copy_spec(kind="ConfigMap", tenancy=tenancy)
    upper = config_map({"k": "v"})
    before = copy.deepcopy(upper)
    lower = spec.translate(upper)
    assert upper == before
    assert lower["metadata"]["namespace"] == "t1-app"
    assert "uid" not in lower["metadata"]
    assert lower["metadata"]["labels"]["l"] == "1"
    assert ownership.is_owned(lower, owner=A)
    assert tenancy.owned(lower)
    assert tenancy.source_key(lower) == "app/cfg"
    assert tenancy.target_key("app/cfg") == "t1-app/cfg"
    assert lower["data"] == {"k": "v"}


def test_copies_are_patched_replaced_when_immutable_or_left_alone() -> None:
    spec = copy_by(A)
    current = spec.translate(config_map({"k": "v"}))
    assert spec.compare(current, spec.translate(config_map({"k": "v"}))) is None
    change = spec.compare(current, spec.translate(config_map({"k": "w"})))
    assert change == Patch({"data": {"k": "w"}, "binaryData": None, "immutable": None})
    frozen = {**current, "immutable": True}
    assert isinstance(
        spec.compare(frozen, spec.translate(config_map({"k": "w"}, immutable=True))), Replace
    )


def test_service_account_token_secrets_are_never_selected() -> None:
    spec = dependencies.copy_spec(kind="Secret", tenancy=naming.NodeTenancy(owner=A, prefix=""))
    token = {
        "metadata": {"name": "t", "namespace": "app"},
        "type": "kubernetes.io/service-account-token",
    }
    assert not spec.selects(token)
    assert spec.selects({"metadata": {"name": "s", "namespace": "app"}, "type": "Opaque"})


def test_a_sibling_copy_of_the_same_upper_cluster_is_shared_and_kept_not_another_clusters() -> None:
    """A copy another virtual node of the same upper cluster made serves our pods too and is
    brought up to date in its maker's name (that node may be gone); another cluster's is
    a conflict."""
    upper = config_map({"k": "v"})
    tenancy = naming.NodeTenancy(owner=A, prefix="")
    mine = dependencies.copy_spec(kind="ConfigMap", tenancy=tenancy)
    siblings = SiblingPolicy.of(mine, tenancy=tenancy)
    sibling = copy_by(A2).translate(upper)
    stranger = copy_by(B).translate(upper)
    assert not tenancy.owned(sibling)
    assert siblings.keeps("app/cfg", sibling)
    assert not siblings.keeps("app/cfg", stranger)
    changed = siblings.in_makers_name(mine.translate(config_map({"k": "other"})), sibling)
    assert ownership.is_owned(changed, owner=A2)
    assert mine.compare(sibling, changed) == Patch(
        {"data": {"k": "other"}, "binaryData": None, "immutable": None}
    )


def test_a_copy_in_its_owners_name_changes_only_the_owner_marks() -> None:
    ours = copy_by(A).translate(config_map({"k": "v"}))
    theirs = copy_by(A2).translate(config_map({"k": "old"}))
    before = copy.deepcopy(ours)
    renamed = naming.in_name_of(ours, theirs)
    assert ours == before
    assert renamed["data"] == {"k": "v"}
    assert renamed["metadata"]["labels"] == theirs["metadata"]["labels"]
    assert renamed["metadata"]["annotations"] == {
        **ours["metadata"]["annotations"],
        ownership.NODE_ANNOTATION: "vn-a2",
    }
    assert ownership.cluster_selector(A) == f"{ownership.CLUSTER_LABEL}={A.cluster_id}"


def test_upper_keys_come_from_the_annotation_or_the_prefix() -> None:
    annotated = {
        "metadata": {
            "name": "x",
            "namespace": "t1-app",
            "annotations": {ownership.UPPER_NAMESPACE_ANNOTATION: "app"},
        }
    }
    assert naming.upper_key_of(annotated, prefix="t1-") == "app/x"
    older = {"metadata": {"name": "x", "namespace": "t1-app"}}
    assert naming.upper_key_of(older, prefix="t1-") == "app/x"
    assert naming.upper_key_of(older, prefix="t2-") is None
    # An annotation naming a namespace that does not map to the object's own is not
    # believed: anyone who can write an object below can write it.
    elsewhere = {
        "metadata": {
            "name": "x",
            "namespace": "someone-else",
            "annotations": {ownership.UPPER_NAMESPACE_ANNOTATION: "app"},
        }
    }
    assert naming.upper_key_of(elsewhere, prefix="t1-") is None
    assert naming.upper_key_of(elsewhere, prefix="") is None
    assert naming.upper_key_of(annotated, prefix="") is None  # t1-app is not app
    assert naming.lower_key("app/x", prefix="t1-") == "t1-app/x"


def test_a_store_indexes_existing_objects_when_an_index_is_added() -> None:
    store = Store()
    pod = {"metadata": {"name": "p", "namespace": "ns"}, slim.REFS: [["ConfigMap", "cfg"]]}
    store.upsert(pod)
    store.add_indexer(dependencies.REFS_INDEX, dependencies._ref_index)
    assert store.by_index(dependencies.REFS_INDEX, "ns/ConfigMap/cfg") == [pod]
    store.delete("ns/p")
    assert store.by_index(dependencies.REFS_INDEX, "ns/ConfigMap/cfg") == []
    with pytest.raises(ValueError, match="exists"):
        store.add_indexer(dependencies.REFS_INDEX, dependencies._ref_index)


def test_the_factory_shares_one_informer_per_selection_and_refuses_another_form() -> None:
    upper = ApiClient(ConnectionInfo(server="https://192.0.2.1", ssl_context=None), name="upper")
    lower = ApiClient(ConnectionInfo(server="https://192.0.2.2", ssl_context=None), name="lower")
    factory = InformerFactory()
    pods = factory.informer(lower, PODS, name="lower-pods", transform=slim.SlimLowerPods(A))
    assert factory.informer(lower, PODS, transform=slim.SlimLowerPods(A)) is pods
    assert factory.informer(upper, PODS) is not pods
    assert factory.informer(lower, PODS, label_selector="a=b") is not pods
    with pytest.raises(ValueError, match="lower-pods is shared with another cache form"):
        factory.informer(lower, PODS, transform=compact)
    maps = factory.informer(upper, CONFIG_MAPS, encoded=True)
    with pytest.raises(ValueError, match="another cache form"):
        factory.informer(upper, CONFIG_MAPS)
    assert maps.name == "upper-configmaps"
    assert len(factory.informers()) == 4
