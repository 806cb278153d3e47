"""Namespace quota slices on the real clusters.

The first test runs the slice controller in its event loop against the session fleet's
upper kube-apiserver (its informers, queue and writes are the real ones): it keeps a
quota'd namespace's `tensile.io/quota-slices` record, computes it again when it is
cleared, keeps an administrator's, and moves slices (for new pods) when a virtual node's
capacity changes. Its virtual nodes are two Node objects the test registers (labelled as
virtual nodes plus a label of this test, which is the controller's node selector, and
tainted so that no other test's pod goes to them): their `status.allocatable` is what the
test sets, which is how a lower cluster's room shows upstairs.

The second runs the real `tensile-scheduler` (with the token of manifests/scheduler's
account) as the extender of a fleet's upper kube-scheduler, over two real virtual nodes
sharing one lower cluster: a quota'd namespace's pods go only where its slices are, within
their budget, and the program's own slice controller writes the record.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.schedulers import SchedulerExtenderProcess
from devcluster.vnodes import VirtualNodeProcess
from scheduler.slices_controller import VIRTUAL_NODES, SliceController
from scheduler.slices_settings import SliceSettings
from tests.e2e.helpers import events_for, get, pod, token_kubeconfig, wait_for
from tests.fixtures import create_namespace, delete_namespace, long_lived_pids
from vnode.contracts.quotaslices import SLICES_ANNOTATION, STATUS_ANNOTATION
from vnode.kube import config, errors
from vnode.kube.client import MERGE_PATCH, ApiClient
from vnode.placement import summary
from vnode.serving.lifecycle import Runner

TAINT = "tensile.io/e2e-slices"


@dataclass
class Setup:
    client: ApiClient
    controller: SliceController
    namespace: str
    a: str
    b: str

    async def annotations(self) -> dict[str, str]:
        ns = await self.client.request("GET", f"/api/v1/namespaces/{self.namespace}")
        return dict(ns["metadata"].get("annotations") or {})

    async def annotate(self, value: str | None) -> None:
        await self.client.request(
            "PATCH",
            f"/api/v1/namespaces/{self.namespace}",
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
            "/api/v1/events",
            params={
                "fieldSelector": "involvedObject.kind=Namespace,"
                f"involvedObject.name={self.namespace}"
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
            node_selector=f"{VIRTUAL_NODES},{TAINT}={run}",
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
    assert "QuotaSlicesPlaced" in await s.reasons()

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


MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"
WIRED = FleetSettings(
    lowers=(LowerClusterSettings(nodes=1, cpu="8", memory="16Gi"),),
    metrics_server=False,
    scheduler_extender=True,
)
"""One lower cluster behind two virtual nodes (vn-a, vn-b): the same room on both."""


@dataclass(frozen=True)
class Wired:
    fleet: Fleet
    extender: SchedulerExtenderProcess

    @property
    def upper(self) -> RestClient:
        return self.fleet.upper.rest()


@pytest.fixture(scope="module")
def wired(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Wired]:
    directory = tmp_path_factory.mktemp("slices-fleet")
    fleet = Fleet.start(directory=directory / "fleet", settings=WIRED, owns_directory=True)
    pids = long_lived_pids(request.config)
    pids.update(fleet.pids())
    started: list[VirtualNodeProcess | SchedulerExtenderProcess] = []
    try:
        upper = fleet.upper.rest()
        for name in ("vn-a", "vn-b"):
            node = VirtualNodeProcess(fleet, name=name, lower="lower", log_dir=directory)
            started.append(node)
            node.start()
        for name in ("vn-a", "vn-b"):
            wait_for(f"{name}'s placement summary", lambda n=name: _summarized(upper, n))
        kubeconfig = token_kubeconfig(
            fleet.upper,
            MANIFESTS / "rbac.yaml",
            directory / "scheduler.kubeconfig",
            service_account="tensile-scheduler",
        )
        extender = SchedulerExtenderProcess(
            fleet, log_dir=directory, kubeconfig=kubeconfig, args=["--slice-sync-delay=100ms"]
        )
        started.append(extender)
        extender.start()
        for program in started:
            assert program.process is not None
            pids.add(program.process.pid)
        yield Wired(fleet=fleet, extender=extender)
    finally:
        codes = []
        for program in reversed(started):
            codes.append((program.name, program.stop()))
            if program.process is not None:
                pids.discard(program.process.pid)
        fleet.stop()
        pids.difference_update(fleet.pids())
    assert all(code == 0 for _, code in codes), codes  # every program stopped cleanly


def _summarized(client: RestClient, name: str) -> bool:
    node = get(client, f"/api/v1/nodes/{name}") or {}
    return summary.ANNOTATION in (node.get("metadata", {}).get("annotations") or {})


def small_pod(name: str) -> dict[str, Any]:
    """500m, preferring vn-a (a preferred node affinity): where the scheduler goes unless
    something filters vn-a out."""
    prefer = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["vn-a"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": {"matchExpressions": [prefer]}}
                    ]
                }
            },
            "nodeSelector": {"type": "virtual-kubelet"},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "500m"}}}
            ],
        },
    }


def _quota(client: RestClient, ns: str, cpu: str) -> None:
    client.request(
        "POST",
        f"/api/v1/namespaces/{ns}/resourcequotas",
        body={"metadata": {"name": "compute"}, "spec": {"hard": {"requests.cpu": cpu}}},
    )


def _record(client: RestClient, ns: str) -> str | None:
    found = get(client, f"/api/v1/namespaces/{ns}") or {}
    return (found.get("metadata", {}).get("annotations") or {}).get(SLICES_ANNOTATION)


def test_a_quotad_namespaces_pods_go_only_where_its_slices_are(wired: Wired) -> None:
    upper, clusters = wired.upper, [wired.fleet.upper, wired.fleet.lower]
    held = create_namespace(clusters[:1], prefix="slices-held")
    placed = create_namespace(clusters[:1], prefix="slices-placed")
    try:
        # An administrator's record (no status: set by hand): 1 cpu, all on vn-b.
        upper.request(
            "PATCH",
            f"/api/v1/namespaces/{held}",
            body={"metadata": {"annotations": {SLICES_ANNOTATION: "vn-b=2x(500m,-)"}}},
            content_type=MERGE_PATCH,
        )
        _quota(upper, held, "2")
        bound = []
        for name in ("p1", "p2"):
            upper.request("POST", f"/api/v1/namespaces/{held}/pods", body=small_pod(name))
            bound.append(
                wait_for(
                    f"{name} bound",
                    lambda n=name: (pod(upper, held, n) or {}).get("spec", {}).get("nodeName"),
                )
            )
        print(f"bound to {bound} (they prefer vn-a)")
        assert bound == ["vn-b", "vn-b"]
        # The quota allows a third, the slices do not: it waits, saying why.
        upper.request("POST", f"/api/v1/namespaces/{held}/pods", body=small_pod("p3"))

        def refused() -> str | None:
            for event in events_for(upper, held, "p3"):
                if event.get("reason") == "FailedScheduling" and "slices" in event["message"]:
                    return str(event["message"])
            return None

        message = wait_for("p3's FailedScheduling", refused)
        print(message)
        assert "its namespace holds no quota slices on vn-a" in message
        assert "quota slices on vn-b (2x(500m,-)) allow 1 cpu: 1 in use" in message
        # unresolvable: preemption looks for no victims there (they would go for nothing)
        assert "No preemption victims" not in message
        assert (pod(upper, held, "p3") or {}).get("spec", {}).get("nodeName") is None
        assert _record(upper, held) == "vn-b=2x(500m,-)"  # the administrator's, kept
        # The program's own slice controller places a quota'd namespace's slices.
        _quota(upper, placed, "1500m")
        record = wait_for("the record placed", lambda: _record(upper, placed))
        print(f"{placed}: {record}")
        assert record == "vn-a=2x(500m,-),vn-b=1x(500m,-)"
        assert (
            wired.extender.metric(
                "tensile_scheduler_quota_slice_admissions_total", outcome="refused"
            )
            >= 1
        )
    finally:
        delete_namespace(clusters, held)
        delete_namespace(clusters, placed)
