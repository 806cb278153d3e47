"""e2e tests run against the real local fleet."""

import pytest

from tests.e2e import timing

E2E_TIMEOUT = 180  # seconds; each test also bounds its own waits below this


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(timing.FileClock(), "e2e-file-clock")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))
    timing.longest_first(items)


import secrets  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

from devcluster.fleet import Fleet  # noqa: E402
from devcluster.vnodes import VirtualNodeProcess  # noqa: E402
from tests.e2e.helpers import Storage, delete_if_present  # noqa: E402
from vnode.providers.k2k import volumes  # noqa: E402


@pytest.fixture
def nodes() -> Iterator[list[VirtualNodeProcess]]:
    """Virtual nodes a test starts (appended by it); stopped and deregistered afterwards,
    each of them having exited 0."""
    started: list[VirtualNodeProcess] = []
    try:
        yield started
    finally:
        codes = [(node.name, node.stop()) for node in started]
        for node in started:
            node.delete_node()
        assert all(code == 0 for _, code in codes), codes


@pytest.fixture
def virtual_node(fleet: Fleet, tmp_path: Path) -> Iterator[VirtualNodeProcess]:
    """A running `virtual-node` between the fleet's clusters, with a name of its own.

    Stopped with SIGTERM afterwards; a node that does not exit 0 fails the test.
    """
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    node.start()
    try:
        yield node
    finally:
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


@pytest.fixture
def running_pod(fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str) -> str:
    """A pod named "web" forwarded by `virtual_node` and Running upstairs."""
    from tests.e2e.helpers import create, phase, pod_manifest, wait_for  # noqa: PLC0415

    upper = fleet.upper.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    return "web"


@pytest.fixture
def storage(fleet: Fleet) -> Iterator[Storage]:
    """StorageClasses upstairs (the virtual nodes' own, and an ordinary one: tensile-kube's
    migration path) and below (local PVs pinned to the lower kwok nodes); removed after."""
    suffix = secrets.token_hex(3)
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    classes = "/apis/storage.k8s.io/v1/storageclasses"
    made = Storage(
        upper_class=f"tensile-{suffix}",
        retain_class=f"retain-{suffix}",
        legacy_class=f"legacy-{suffix}",
        lower_class=f"local-{suffix}",
        volumes={f"local-{suffix}-{i}": f"lower-node-{i}" for i in range(3)},
    )
    for name, policy in ((made.upper_class, "Delete"), (made.retain_class, "Retain")):
        upper.request(
            "POST",
            classes,
            body={
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": name},
                "provisioner": volumes.PROVISIONER,
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": policy,
                "allowVolumeExpansion": True,
                # Only virtual nodes can provision it: the scheduler checks this per node.
                "allowedTopologies": [
                    {"matchLabelExpressions": [{"key": "type", "values": ["virtual-kubelet"]}]}
                ],
            },
        )
    upper.request(
        "POST",
        classes,
        body={
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": made.legacy_class},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    lower.request(
        "POST",
        classes,
        body={
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": made.lower_class},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True,
        },
    )
    for name, node in made.volumes.items():
        lower.request(
            "POST",
            "/api/v1/persistentvolumes",
            body={
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "5Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": made.lower_class,
                    "local": {"path": f"/mnt/disks/{name}"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            },
        )
    try:
        yield made
    finally:
        for name in made.volumes:
            delete_if_present(lower, f"/api/v1/persistentvolumes/{name}")
        for name in (made.upper_class, made.retain_class, made.legacy_class):
            delete_if_present(upper, f"{classes}/{name}")
        delete_if_present(lower, f"{classes}/{made.lower_class}")
