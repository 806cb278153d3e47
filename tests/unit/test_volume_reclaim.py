"""The reclaim decision of `VolumeProvisioner` on a lower claim whose upper claim is gone:
the upper PV's policy as cached, or as a GET reads it when the cache has not got it
(issue 21: the lower claim's own mark may be stale). Against FakeApi; the decision itself
is a table in test_services_volumes.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from vnode.providers.k2k import naming, volumes
from vnode.providers.k2k.namespaces import LowerNamespaces
from vnode.providers.k2k.provisioner import VolumeProvisioner
from vnode.testing.fakeapi import FakeApi

OWNER = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
KEY = "app/data"
UPPER_CLAIM = {
    "metadata": {"name": "data", "namespace": "app", "uid": "c-1"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


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


def with_lower_claim(lower: FakeApi, node: VolumeProvisioner, *, mark: str) -> None:
    """The lower claim of UPPER_CLAIM, marked `mark`, stored below and cached."""
    made = volumes.lower_claim(
        UPPER_CLAIM, owner=OWNER, prefix="", storage_class=None, reclaim_policy=mark
    )
    node.mirror.target.store.update(lower.put(PERSISTENT_VOLUME_CLAIMS, made))


def upper_pv(policy: str) -> dict[str, Any]:
    return volumes.upper_volume(
        UPPER_CLAIM,
        node_name=OWNER.node_name,
        lower_claim_key=KEY,
        capacity="1Gi",
        reclaim_policy=policy,
    )


@pytest.mark.parametrize(
    ("mark", "policy", "deleted"),
    [("Delete", "Retain", False), ("Retain", "Delete", True), ("Delete", "Delete", True)],
)
async def test_the_cached_upper_pv_decides(mark: str, policy: str, deleted: bool) -> None:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    node = provisioner(upper, lower)
    with_lower_claim(lower, node, mark=mark)
    node.volumes.store.update(upper.put(PERSISTENT_VOLUMES, upper_pv(policy)))
    await node.mirror.sync(KEY)  # the upper claim is gone: its source is not cached
    assert bool(lower.requests_of("DELETE")) is deleted
    assert upper.requests_of("GET") == []  # the cache had it


@pytest.mark.parametrize(
    ("policy", "deleted"), [("Retain", False), ("Delete", True), (None, False)]
)
async def test_a_pv_the_cache_has_not_got_is_read_before_anything_is_deleted(
    policy: str | None, deleted: bool, caplog: pytest.LogCaptureFixture
) -> None:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    node = provisioner(upper, lower)
    with_lower_claim(lower, node, mark="Delete")
    if policy is not None:  # in the upper cluster, not (yet) in the cache
        upper.put(PERSISTENT_VOLUMES, upper_pv(policy))
    await node.mirror.sync(KEY)
    assert lower.requests_of("DELETE") == []  # kept while the policy is not known
    read = await node.queue.get()
    assert read == f"read/pvc-c-1/{KEY}"
    await node._sync(read)
    assert [r.path for r in upper.requests_of("GET")] == ["/api/v1/persistentvolumes/pvc-c-1"]
    assert await node.mirror.queue.get() == KEY  # looked at again with what was read
    with caplog.at_level(logging.WARNING):
        await node.mirror.sync(KEY)
    assert bool(lower.requests_of("DELETE")) is deleted
    assert ("reclaim policy is unknown" in caplog.text) is (policy is None)
    assert node._read == {}  # the read was taken by the decision
