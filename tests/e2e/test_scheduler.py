"""tensile-scheduler against real clusters: one upper cluster over two lower ones, a virtual
node for each, the upper kube-scheduler configured with the extender (ignorable). Lower
cluster A has four nodes of 1 CPU (its virtual node advertises 4 CPU), B one node of 8 CPU.
A pod of 1.5 CPU that prefers A's virtual node fits no single node of A: with the extender
it is bound to B's virtual node at once (without it, the upper scheduler picks A and the
pod waits below, Unschedulable, until the descheduler moves it: test_descheduler.py).

The extender runs with the token of manifests/scheduler/rbac.yaml's account.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.schedulers import SchedulerExtenderProcess
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import clusterselector
from tensile.contracts.quotaslices import SLICES_ANNOTATION
from tensile.kube.client import MERGE_PATCH
from tensile.placement import summary
from tests.e2e.helpers import events_for, get, pod, token_kubeconfig, wait_for
from tests.fixtures import create_namespace, delete_namespace, long_lived_pids

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"
TOPOLOGY = FleetSettings(
    lowers=(
        LowerClusterSettings(nodes=4, cpu="1", memory="8Gi"),
        LowerClusterSettings(nodes=1, cpu="8", memory="32Gi"),
    ),
    metrics_server=False,
    scheduler_extender=True,
)


@dataclass(frozen=True)
class Topology:
    fleet: Fleet
    kubeconfig: Path
    """The tensile-scheduler ServiceAccount's kubeconfig (manifests/scheduler/rbac.yaml)."""
    log_dir: Path

    @property
    def upper(self) -> RestClient:
        return self.fleet.upper.rest()


def _summarized(client: RestClient, name: str) -> bool:
    node = get(client, f"/api/v1/nodes/{name}") or {}
    return summary.ANNOTATION in (node.get("metadata", {}).get("annotations") or {})


@pytest.fixture(scope="module")
def topology(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    directory = tmp_path_factory.mktemp("sched-fleet")
    fleet = Fleet.start(directory=directory / "fleet", settings=TOPOLOGY, owns_directory=True)
    pids = long_lived_pids(request.config)
    pids.update(fleet.pids())
    started: list[VirtualNodeProcess] = []
    try:
        for name, lower in (("vn-a", "lower"), ("vn-b", "lower-2")):
            node = VirtualNodeProcess(fleet, name=name, lower=lower, log_dir=directory)
            started.append(node)
            node.start()
            assert node.process is not None
            pids.add(node.process.pid)
        upper = fleet.upper.rest()
        for name in ("vn-a", "vn-b"):
            wait_for(f"{name}'s placement summary", lambda n=name: _summarized(upper, n))
        kubeconfig = token_kubeconfig(
            fleet.upper,
            MANIFESTS / "rbac.yaml",
            directory / "scheduler.kubeconfig",
            service_account="tensile-scheduler",
        )
        yield Topology(fleet=fleet, kubeconfig=kubeconfig, log_dir=directory)
    finally:
        for node in started:
            node.stop()
            if node.process is not None:
                pids.discard(node.process.pid)
        fleet.stop()
        pids.difference_update(fleet.pids())


@pytest.fixture
def extender(topology: Topology, tmp_path: Path) -> Iterator[SchedulerExtenderProcess]:
    """tensile-scheduler on the port the upper kube-scheduler calls; must exit 0."""
    process = SchedulerExtenderProcess(
        topology.fleet, log_dir=tmp_path, kubeconfig=topology.kubeconfig
    )
    process.start()
    try:
        yield process
    finally:
        if process.process is not None and process.process.alive():
            assert process.stop() == 0, process.log.read_text()[-2000:]


@pytest.fixture
def ns(topology: Topology, request: pytest.FixtureRequest) -> Iterator[str]:
    clusters = [topology.fleet.upper, *topology.fleet.lowers]
    name = create_namespace(clusters[:1], prefix=request.node.name[5:30].replace("_", "-"))
    try:
        yield name
    finally:
        delete_namespace(clusters, name)


def big_pod(name: str, *, cluster_selector: dict[str, Any] | None = None) -> dict[str, Any]:
    """1.5 CPU on one lower node, preferring vn-a upstairs (a preferred node affinity)."""
    annotations = (
        {clusterselector.ANNOTATION: json.dumps(cluster_selector)} if cluster_selector else {}
    )
    prefer = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["vn-a"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
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
                {"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "1500m"}}}
            ],
        },
    }


def _bound(client: RestClient, ns: str, name: str) -> str | None:
    return ((pod(client, ns, name) or {}).get("spec") or {}).get("nodeName")


def test_a_pod_no_node_of_a_fits_goes_straight_to_b(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    upper = topology.upper
    started = time.monotonic()
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=big_pod("big"))
    node = wait_for("the pod bound", lambda: _bound(upper, ns, "big"))
    print(f"bound to {node} after {time.monotonic() - started:.1f}s")
    assert node == "vn-b"
    wait_for(
        "the pod Running",
        lambda: (pod(upper, ns, "big") or {}).get("status", {}).get("phase") == "Running",
    )
    print(f"Running after {time.monotonic() - started:.1f}s")
    assert extender.metric("tensile_scheduler_filtered_nodes_total", verdict="unfit") >= 1


def test_the_failed_scheduling_event_says_why_no_lower_node_fits(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    upper = topology.upper
    first = topology.fleet.cluster("lower").nodes[0]
    only_there = {"nodeSelector": {"kubernetes.io/hostname": first}}
    upper.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body=big_pod("nowhere", cluster_selector=only_there),
    )

    def failed() -> str | None:
        for event in events_for(upper, ns, "nowhere"):
            if event.get("reason") == "FailedScheduling" and "lower cluster" in event["message"]:
                return str(event["message"])
        return None

    message = wait_for("a FailedScheduling event", failed)
    print(message)
    assert "lower cluster of vn-a: 0/4 nodes are available: 1 Insufficient cpu" in message
    assert "lower cluster of vn-b: 0/1 nodes are available: 1 node(s) didn't match" in message
    assert _bound(upper, ns, "nowhere") is None


def test_scheduling_goes_on_while_the_extender_is_down(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    assert extender.stop() == 0
    upper = topology.upper
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=big_pod("anyway"))
    node = wait_for("the pod bound without the extender", lambda: _bound(upper, ns, "anyway"))
    print(f"bound to {node} without the extender")


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


def test_a_quotad_namespaces_pods_go_only_where_its_slices_are(
    topology: Topology, tmp_path: Path
) -> None:
    """The real tensile-scheduler with its slice controller: a quota'd namespace's pods go
    only where its slices are, within their budget, and the program writes the record of
    a namespace no administrator set."""
    upper, clusters = topology.upper, [topology.fleet.upper, *topology.fleet.lowers]
    extender = SchedulerExtenderProcess(
        topology.fleet,
        log_dir=tmp_path,
        kubeconfig=topology.kubeconfig,
        args=["--slice-sync-delay=100ms"],
    )
    extender.start()
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
        # 3 slices by room: vn-b's lower cluster has 8 CPU free, vn-a's 4 (D'Hondt: b, then
        # a before b's second at an equal 4, ties by name, then b).
        assert record == "vn-a=1x(500m,-),vn-b=2x(500m,-)"
        assert (
            extender.metric("tensile_scheduler_quota_slice_admissions_total", outcome="refused")
            >= 1
        )
    finally:
        delete_namespace(clusters, held)
        delete_namespace(clusters, placed)
        assert extender.stop() == 0, extender.log.read_text()[-2000:]
