"""Namespace quota slices on the real clusters.

The first test runs the slice controller in its event loop against the session fleet's
upper kube-apiserver (its informers, queue and writes are the real ones): it keeps a
quota'd namespace's `tensile.io/quota-slices` record on its ResourceQuota, computes it
again when it is cleared, keeps an administrator's, and moves slices (for new pods) when a
virtual node's capacity changes. Its virtual nodes are two Node objects the test registers
(labelled as virtual nodes plus a label of this test, which is the controller's node
selector, and tainted so that no other test's pod goes to them): their
`status.allocatable` is what the test sets, which is how a lower cluster's room shows
upstairs.

The real `tensile-scheduler` holding a quota'd namespace's pods to its slices runs in
test_scheduler.py, on that module's fleet (its upper kube-scheduler calls the extender).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from devcluster.fleet import Fleet
from scheduler.slices.controller import SliceController
from scheduler.slices.settings import SliceSettings
from tensile.contracts.labels import VIRTUAL_NODE_SELECTOR
from tensile.contracts.quotaslices import SLICES_ANNOTATION, STATUS_ANNOTATION
from tensile.kube import config, errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.serving.lifecycle import Runner

TAINT = "tensile.io/e2e-slices"


@dataclass
class Setup:
    client: ApiClient
    controller: SliceController
    namespace: str
    a: str
    b: str

    @property
    def quota(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/resourcequotas/compute"

    async def annotations(self) -> dict[str, str]:
        quota = await self.client.request("GET", self.quota)
        return dict(quota["metadata"].get("annotations") or {})

    async def annotate(self, value: str | None) -> None:
        await self.client.request(
            "PATCH",
            self.quota,
            body={"metadata": {"annotations": {SLICES_ANNOTATION: value}}},
            content_type=MERGE_PATCH,
        )

    async def set_cpu(self, node: str, cpu: str) -> None:
        await self.client.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            body={"status": {"allocatable": {"cpu": cpu}, "capacity": {"cpu": cpu}}},
            content_type=MERGE_PATCH,
        )

    async def reasons(self) -> list[str]:
        events = await self.client.request(
            "GET",
            f"/api/v1/namespaces/{self.namespace}/events",
            params={
                "fieldSelector": "involvedObject.kind=ResourceQuota,involvedObject.name=compute"
            },
        )
        return [e["reason"] for e in events.get("items", [])]

    async def settled(self) -> None:
        """Wait until the controller has nothing queued, in hand or due."""
        await until(
            "the controller idle", lambda: not self.controller.queue.pending(self.namespace)
        )


async def until(what: str, condition: Callable[[], Any], *, timeout: float = 20.0) -> Any:
    """Poll `condition` (a function or coroutine function) every 0.05 s until truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def virtual_node(name: str, *, run: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"type": "virtual-kubelet", "kubernetes.io/hostname": name, TAINT: run},
        },
        "spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "e2e"}],
        },
    }


@pytest.fixture
async def setup(fleet: Fleet) -> AsyncIterator[Setup]:
    run = secrets.token_hex(3)
    a, b, namespace = f"slices-{run}-a", f"slices-{run}-b", f"slices-{run}"
    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as client:
        for name, cpu in ((a, "4"), (b, "2")):
            node = virtual_node(name, run=run, cpu=cpu)
            await client.request("POST", "/api/v1/nodes", body=node)
            await client.request(
                "PATCH", f"/api/v1/nodes/{name}/status", body=node, content_type=MERGE_PATCH
            )
        await client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        controller = SliceController(
            client=client,
            events=client,
            settings=SliceSettings(sync_delay=0.05),
            identity="e2e",
            node_selector=f"{VIRTUAL_NODE_SELECTOR},{TAINT}={run}",
        )
        runner = Runner(startup_timeout=30, shutdown_timeout=5)
        task = asyncio.create_task(runner.run([controller]), name="slice-controller")
        try:
            yield Setup(client=client, controller=controller, namespace=namespace, a=a, b=b)
        finally:
            runner.stop()
            await task
            for path in (
                f"/api/v1/namespaces/{namespace}",
                f"/api/v1/nodes/{a}",
                f"/api/v1/nodes/{b}",
            ):
                try:
                    await client.request("DELETE", path)
                except errors.NotFound:
                    pass


async def test_a_quotad_namespace_gets_its_slices_and_keeps_them_right(setup: Setup) -> None:
    s = setup
    await s.client.request(
        "POST",
        f"/api/v1/namespaces/{s.namespace}/resourcequotas",
        body={
            "metadata": {"name": "compute"},
            "spec": {"hard": {"requests.cpu": "3", "requests.memory": "3Gi", "limits.cpu": "9"}},
        },
    )
    # 6 slices of (500m,1Gi); room for 8 on a (4 cpu), 4 on b (2 cpu): 4 and 2
    placed = f"{s.a}=4x(500m,1Gi),{s.b}=2x(500m,1Gi)"

    async def record() -> str | None:
        return (await s.annotations()).get(SLICES_ANNOTATION)

    async def record_is(value: str) -> bool:
        return await record() == value

    await until("the record placed", lambda: record_is(placed))
    # The Event is written after the record (a separate request): wait for it too.
    await until("its event", lambda: _has(s, "QuotaSlicesPlaced"))

    # cleared by hand: computed again
    await s.annotate(None)
    await until("the record computed again", lambda: record_is(placed))
    await until("its event", lambda: _has(s, "QuotaSlicesRecomputed"))

    # overwritten by hand: kept, and said so, also when capacity changes afterwards
    mine = f"{s.b}=6x(500m,1Gi)"
    await s.annotate(mine)

    async def administrators() -> bool:
        status = json.loads((await s.annotations()).get(STATUS_ANNOTATION) or "{}")
        return status.get("condition") == "SetByAdministrator"

    await until("the administrator's record acknowledged", administrators)
    await s.set_cpu(s.a, "3")
    await until("the node change seen", lambda: _allocatable(s, s.a, "3"))
    await s.settled()
    assert await record() == mine

    # cleared again, then b shrinks to nothing: its slices move to a (room for 6 of 3 cpu)
    await s.annotate(None)
    await until("the record computed again", lambda: record_is(placed))
    await s.set_cpu(s.b, "0")
    await until("the slices moved off b", lambda: record_is(f"{s.a}=6x(500m,1Gi)"))
    await until("its event", lambda: _has(s, "QuotaSlicesRedistributed"))


async def _has(s: Setup, reason: str) -> bool:
    return reason in await s.reasons()


def _allocatable(s: Setup, node: str, cpu: str) -> bool:
    found = s.controller.nodes.store.get(node)
    return found is not None and found["status"]["allocatable"]["cpu"] == cpu
