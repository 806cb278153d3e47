"""The fleet benchmark's fleet: lower clusters of mixed kwok Nodes, their free capacity
fragmented by filler pods, local volumes and StorageClasses, one virtual node per lower
cluster, and the webhook. I/O only; what is built is decided in `fleet_plan`.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import fleet_plan as plan
import harness

from devcluster import kwok, webhooks
from devcluster.cluster import LOWER_CONTROLLERS, Cluster, FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from devcluster.webhooks import WebhookProcess
from tensile.contracts.labels import NODE_TYPE_LABEL, VIRTUAL_NODE_SELECTOR, VIRTUAL_NODE_TYPE
from tensile.contracts.objects import name_of
from tensile.kube import errors
from tensile.kube.client import ApiClient

LOWER_LEASE_SECONDS = 3600
"""kwok Node Leases of the lower clusters: 10,000 Nodes renewing every 10 s would be most
of the fleet's load; the node lifecycle controllers wait NODE_GRACE for a renewal."""
NODE_GRACE = "2h"
NODE_ARGS = ["--kube-api-qps=500", "--kube-api-burst=1000", "--log-level=info"]
WEBHOOK = "tensile-fleet-bench"
SYSTEM_NAMESPACE = "tensile-system"
CONCURRENCY = 32
POLL = 5.0
"""Seconds between two lists of a lower cluster's Nodes or fillers while they start: each
list of 1,000 is megabytes to parse."""


def start_fleet(scale: plan.Scale, *, startup_timeout: float) -> Fleet:
    """One upper cluster and `scale.lower_clusters` lower ones on one etcd, no kwok Node
    yet (`add_lower_nodes` makes them, many at once), lower clusters with only the
    controllers they need; removed when stopped."""
    lower = LowerClusterSettings(
        nodes=0, controllers=LOWER_CONTROLLERS, node_lease_seconds=LOWER_LEASE_SECONDS
    )
    return Fleet.start(
        directory=Path(tempfile.mkdtemp(prefix="tensile-fleet-")),
        settings=FleetSettings(
            lowers=(lower,) * scale.lower_clusters,
            metrics_server=False,
            startup_timeout=startup_timeout,
            node_monitor_grace_period=NODE_GRACE,
            scheduler_extender=True,  # its port and certificate (the bench runs it)
        ),
        owns_directory=True,
    )


async def gather_bounded(jobs: Iterable[Awaitable[Any]], *, limit: int = CONCURRENCY) -> None:
    """Await `jobs`, at most `limit` at a time."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Awaitable[Any]) -> None:
        async with gate:
            await job

    await asyncio.gather(*(one(j) for j in jobs))


async def create(client: ApiClient, path: str, body: dict[str, Any]) -> None:
    """POST `body` to `path`; one that exists already is fine."""
    try:
        await client.request("POST", path, body=body)
    except (errors.AlreadyExists, errors.Conflict):
        pass


async def wait_until(
    what: str, condition: Callable[[], Awaitable[bool]], *, timeout: float, every: float = 0.5
) -> None:
    """Poll `condition` until true. Raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s")
        await asyncio.sleep(every)


def _node(node: plan.NodePlan) -> kwok.FakeNode:
    taint = {"key": plan.DISK_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    return kwok.FakeNode(
        name=node.name,
        cpu=node.cpu,
        memory=f"{node.memory_gib}Gi",
        pods=str(plan.PODS_PER_NODE),
        labels={plan.DISK_TAINT_KEY: "true"} if node.disk else {},
        taints=(taint,) if node.disk else (),
    )


async def build_lower(cluster: Cluster, nodes: Sequence[plan.NodePlan], *, timeout: float) -> None:
    """Create `nodes` in `cluster`, wait until they are Ready, then bind a filler to each
    (below, no scheduler) and wait until every filler runs; and the lower StorageClass."""
    async with harness.client_for(cluster.kubeconfig) as client:
        await gather_bounded(
            create(client, "/api/v1/nodes", kwok.node_manifest(_node(n))) for n in nodes
        )

        async def ready() -> bool:
            found = (await client.request("GET", "/api/v1/nodes"))["items"]
            return sum(1 for n in found if _ready(n)) >= len(nodes)

        await wait_until(
            f"{cluster.name}: {len(nodes)} Nodes Ready", ready, timeout=timeout, every=POLL
        )
        await harness.create_namespace(client, plan.FILLER_NAMESPACE)
        pods = f"/api/v1/namespaces/{plan.FILLER_NAMESPACE}/pods"
        fillers = [n for n in nodes if n.filler[0] > 0 or n.filler[1] > 0]
        await gather_bounded(create(client, pods, plan.filler_pod(n)) for n in fillers)

        async def running() -> bool:
            found = (await client.request("GET", pods))["items"]
            return sum(1 for p in found if p["status"].get("phase") == "Running") >= len(fillers)

        await wait_until(
            f"{cluster.name}: {len(fillers)} fillers Running", running, timeout=timeout, every=POLL
        )
        await create(
            client,
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": plan.LOWER_STORAGE_CLASS},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
            },
        )


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def upper_storage(fleet: Fleet) -> None:
    """The virtual nodes' StorageClass upstairs (tensile.io/virtual-node provisions it)."""
    async with harness.client_for(fleet.upper.kubeconfig) as client:
        await create(
            client,
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": plan.UPPER_STORAGE_CLASS},
                "provisioner": "tensile.io/virtual-node",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
                "allowedTopologies": [
                    {
                        "matchLabelExpressions": [
                            {"key": NODE_TYPE_LABEL, "values": [VIRTUAL_NODE_TYPE]}
                        ]
                    }
                ],
            },
        )
        await create(
            client,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}},
        )


def start_virtual_nodes(fleet: Fleet, *, log_dir: Path, timeout: float) -> list[VirtualNodeProcess]:
    """One virtual node per lower cluster ("vn-lower", "vn-lower-2", ...), started together;
    returns once every one is Ready upstairs."""
    nodes = [
        VirtualNodeProcess(
            fleet,
            name=f"vn-{lower.name}",
            lower=lower.name,
            log_dir=log_dir,
            args=[
                *NODE_ARGS,
                f"--lower-storage-class={plan.UPPER_STORAGE_CLASS}={plan.LOWER_STORAGE_CLASS}",
            ],
        )
        for lower in fleet.lowers
    ]
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready(timeout=timeout)
    return nodes


async def offered_cpu(fleet: Fleet) -> dict[str, int]:
    """Allocatable CPU (millicores) of each virtual node upstairs."""
    async with harness.client_for(fleet.upper.kubeconfig) as client:
        found = (
            await client.request(
                "GET", "/api/v1/nodes", params={"labelSelector": VIRTUAL_NODE_SELECTOR}
            )
        )["items"]
    return {name_of(n): _millicores(n["status"]["allocatable"]["cpu"]) for n in found}


def _millicores(text: str) -> int:
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


async def wait_offers(fleet: Fleet, expected: dict[str, int], *, timeout: float) -> None:
    """Wait until every virtual node offers exactly its expected CPU (the fillers counted,
    nothing of the benchmark's left below)."""
    seen: dict[str, int] = {}

    async def settled() -> bool:
        nonlocal seen
        seen = await offered_cpu(fleet)
        return all(seen.get(name) == cpu for name, cpu in expected.items())

    try:
        await wait_until(
            "virtual nodes offering their lower clusters' room", settled, timeout=timeout
        )
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}: offered {seen}, expected {expected} (millicores)") from None


def start_webhook(fleet: Fleet, *, log_dir: Path, timeout: float) -> WebhookProcess:
    """tensile-webhook for pods of every namespace labelled plan.BENCH_LABEL, admitting."""
    hook = WebhookProcess(
        fleet,
        name=WEBHOOK,
        log_dir=log_dir,
        secret_namespace=SYSTEM_NAMESPACE,
        configuration=WEBHOOK,
        args=["--log-level=info"],
    )
    manifest = webhooks.configuration(WEBHOOK, url=hook.url, namespace="unused")
    manifest["webhooks"][0]["namespaceSelector"] = {
        "matchExpressions": [{"key": plan.BENCH_LABEL, "operator": "Exists"}]
    }
    webhooks.register(fleet.upper, manifest)
    hook.start(timeout=timeout)
    probe = "fleet-bench-probe"
    fleet.upper.rest().request(
        "POST",
        "/api/v1/namespaces",
        body={
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": probe, "labels": {plan.BENCH_LABEL: "probe"}},
        },
    )
    webhooks.wait_admitting(fleet.upper, namespace=probe, timeout=timeout)
    return hook
