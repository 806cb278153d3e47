"""Generic ephemeral volumes of a virtual-node class (issue 22): which claim is the volume's,
whether it is the pod's, and what `VolumeProvisioner.ensure_for_pod` makes of them.

The provisioner runs against FakeApi here, its caches filled by hand: a claim owned by some
other pod, or a pod whose claim is not there yet, are states the real upper cluster's
ephemeral volume controller never leaves for long enough to test. The real path (a pod
Running with such a volume, its lower claim gone with it) is tests/e2e/test_volumes.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from vnode import provider_errors
from vnode.providers.k2k import naming, volumes
from vnode.providers.k2k.namespaces import LowerNamespaces
from vnode.providers.k2k.provisioner import VolumeProvisioner
from vnode.testing.fakeapi import FakeApi

OWNER = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
POD = {
    "metadata": {"name": "web", "namespace": "app", "uid": "p-1"},
    "spec": {
        "volumes": [
            {"name": "cache", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            {"name": "config", "configMap": {"name": "web"}},
        ]
    },
}


def owned_by(uid: str, *, controller: bool = True, kind: str = "Pod") -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": kind, "name": "web", "uid": uid, "controller": controller}]


@pytest.mark.parametrize(
    ("volume", "name"),
    [
        ({"name": "cache", "ephemeral": {}}, "web-cache"),
        ({"name": "cache", "persistentVolumeClaim": {"claimName": "x"}}, None),
        ({"name": "cache", "emptyDir": {}}, None),
    ],
)
def test_an_ephemeral_volumes_claim_is_named_pod_dash_volume(
    volume: dict[str, Any], name: str | None
) -> None:
    assert volumes.ephemeral_claim_name(POD, volume) == name


@pytest.mark.parametrize(
    ("references", "mine"),
    [
        (owned_by("p-1"), True),
        (owned_by("p-2"), False),  # another pod's (an earlier pod of the same name)
        (owned_by("p-1", controller=False), False),
        (owned_by("p-1", kind="StatefulSet"), False),
        ([], False),
        (None, False),
        (["x"], False),
    ],
)
def test_a_claim_is_the_pods_when_the_pod_is_its_controller(references: Any, mine: bool) -> None:
    claim = {"metadata": {"name": "web-cache", "ownerReferences": references}}
    assert volumes.is_claim_of_pod(claim, POD) is mine
    assert volumes.is_claim_of_pod(claim, {"metadata": {"name": "web"}}) is False  # no UID


def provisioner(upper: FakeApi, lower: FakeApi) -> VolumeProvisioner:
    return VolumeProvisioner(
        upper=upper,
        upper_events=upper,
        lower=lower,
        informers=InformerFactory(),
        tenancy=naming.NodeTenancy(owner=OWNER, prefix=""),
        namespaces=LowerNamespaces(
            lower=lower, owner=OWNER, prefix="", pod_security_level="privileged"
        ),
        classes=volumes.StorageClassMap(),
        on_resolved=lambda _key: None,
    )


def upper_claim(*, storage_class: str, owner: str = "p-1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-cache", "namespace": "app", "uid": "c-1",
            "ownerReferences": owned_by(owner),
        },
        "spec": {
            "storageClassName": storage_class, "volumeName": "pvc-c-1",
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
        },
        "status": {"phase": "Bound"},
    }  # fmt: skip


def with_classes(node: VolumeProvisioner) -> None:
    node.storage_classes.store.update(
        {"metadata": {"name": "tensile"}, "provisioner": volumes.PROVISIONER}
    )
    node.storage_classes.store.update({"metadata": {"name": "local"}, "provisioner": "other"})


async def test_an_ephemeral_volume_of_our_class_is_provisioned_and_mounted_below() -> None:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    node = provisioner(upper, lower)
    with_classes(node)
    claim = upper_claim(storage_class="tensile")
    node.claims.store.update(claim)
    volume = volumes.upper_volume(
        claim, node_name="vn-a", lower_claim_key="app/web-cache", capacity="1Gi",
        reclaim_policy="Delete",
    )  # fmt: skip
    node.volumes.store.update(upper.put(PERSISTENT_VOLUMES, volume))
    made = volumes.lower_claim(
        claim, owner=OWNER, prefix="", storage_class=None, reclaim_policy="Delete"
    )
    node.mirror.target.store.update(lower.put(PERSISTENT_VOLUME_CLAIMS, made))
    assert await node.ensure_for_pod(POD) == frozenset({"cache"})


async def test_an_ephemeral_volume_of_another_class_is_left_to_the_lower_cluster() -> None:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    node = provisioner(upper, lower)
    with_classes(node)
    node.claims.store.update(upper_claim(storage_class="local"))
    assert await node.ensure_for_pod(POD) == frozenset()
    assert lower.requests_of("POST") == []


async def test_the_pod_waits_for_its_claim_and_refuses_another_pods() -> None:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    node = provisioner(upper, lower)
    with_classes(node)
    with pytest.raises(provider_errors.MissingDependency) as missing:
        await node.ensure_for_pod(POD)
    assert 'persistentvolumeclaim "web-cache" not found' in str(missing.value)
    assert node._waiting == {"app/web-cache": {"app/web"}}  # looked at again when it comes
    node.claims.store.update(upper_claim(storage_class="tensile", owner="p-0"))
    with pytest.raises(provider_errors.InvalidPod) as refused:
        await node.ensure_for_pod(POD)
    assert "was not created for pod app/web (pod is not owner)" in str(refused.value)
