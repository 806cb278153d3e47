"""A virtual node per lower node pool, against real clusters: one upper cluster over one
lower cluster whose kwok nodes form two pools, a CPU pool (two nodes of 1 CPU, `pool=cpu`)
and a GPU pool (two nodes of 8 CPU and 2 `nvidia.com/gpu` each, `pool=gpu`, with a GPU
product label). Two virtual nodes stand for the pools, `vn-cpu` (--lower-node-selector
pool=cpu) and `vn-gpu` (pool=gpu, copying the product and pool labels upstairs), beside each
other over the one lower cluster. The upper kube-scheduler is configured with
tensile-scheduler's extender (ignorable); tests that want it start it.

Each virtual node offers its pool only (capacity, placement summary); lower pods stay in
their node's pool (required node affinity below); the extender sends a pod that fits the
CPU pool's sum but none of its nodes to the GPU pool; without the extender such a pod waits
below, and the descheduler moves it to the pool that fits; the two nodes share their
ConfigMap copies; a GPU node relabelled out of the pool leaves the capacity at once and its
pods are reported, not killed.
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
from devcluster.deschedulers import DeschedulerProcess
from devcluster.fleet import Fleet
from devcluster.kwok import FakeNode
from devcluster.rest import RestClient
from devcluster.schedulers import SchedulerExtenderProcess
from devcluster.vnodes import VirtualNodeProcess
from tensile.placement import summary
from tests.e2e.helpers import events_for, get, pod, pod_manifest, token_kubeconfig, wait_for
from tests.fixtures import create_namespace, delete_namespace, long_lived_pids
from vnode.providers.k2k.pool import LEFT_POOL_REASON

ROOT = Path(__file__).resolve().parents[2] / "manifests"
PRODUCT_LABEL = "nvidia.com/gpu.product"
PRODUCT = "A100-SXM4-40GB"
GPU = "nvidia.com/gpu"
TOPOLOGY = FleetSettings(
    lowers=(
        LowerClusterSettings(
            nodes=2, cpu="1", memory="8Gi", node_labels={0: {"pool": "cpu"}, 1: {"pool": "cpu"}}
        ),
    ),
    metrics_server=False,
    scheduler_extender=True,
)
GPU_NODES = ("lower-gpu-0", "lower-gpu-1")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TOLERATE = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]


@dataclass(frozen=True)
class Topology:
    fleet: Fleet
    directory: Path
    nodes: dict[str, VirtualNodeProcess]

    @property
    def upper(self) -> RestClient:
        return self.fleet.upper.rest()

    @property
    def lower(self) -> RestClient:
        return self.fleet.cluster("lower").rest()


@pytest.fixture(scope="module")
def topology(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    directory = tmp_path_factory.mktemp("pools-fleet")
    fleet = Fleet.start(directory=directory / "fleet", settings=TOPOLOGY, owns_directory=True)
    pids = long_lived_pids(request.config)
    pids.update(fleet.pids())
    started: list[VirtualNodeProcess] = []
    try:
        for name in GPU_NODES:
            fleet.add_lower_node(
                FakeNode(
                    name=name,
                    cpu="8",
                    memory="32Gi",
                    labels={"pool": "gpu", PRODUCT_LABEL: PRODUCT},
                    extended={GPU: "2"},
                )
            )
        pools = {
            "vn-cpu": ["--lower-node-selector=pool=cpu"],
            "vn-gpu": [
                "--lower-node-selector=pool in (gpu)",
                f"--lower-node-labels-to-copy={PRODUCT_LABEL},pool,kubernetes.io/hostname",
            ],
        }
        for name, args in pools.items():
            node = VirtualNodeProcess(fleet, name=name, log_dir=directory, args=args)
            started.append(node)
            node.start()
            assert node.process is not None
            pids.add(node.process.pid)
        yield Topology(fleet=fleet, directory=directory, nodes={n.name: n for n in started})
    finally:
        for node in started:
            node.stop()
            if node.process is not None:
                pids.discard(node.process.pid)
        fleet.stop()
        pids.difference_update(fleet.pids())


@pytest.fixture
def ns(topology: Topology, request: pytest.FixtureRequest) -> Iterator[str]:
    clusters = [topology.fleet.upper, *topology.fleet.lowers]
    name = create_namespace(clusters[:1], prefix=request.node.name[5:30].replace("_", "-"))
    try:
        yield name
    finally:
        delete_namespace(clusters, name)
        pods = f"/api/v1/namespaces/{name}/pods"
        topology.upper.request(
            "DELETE",
            pods,
            body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
        )
        wait_for(
            f"the pods of {name} gone",
            lambda: not topology.upper.request("GET", pods).get("items"),
            timeout=60,
        )


def _node(client: RestClient, name: str) -> dict[str, Any]:
    return get(client, f"/api/v1/nodes/{name}") or {}


def _allocatable(client: RestClient, name: str) -> dict[str, str]:
    return dict(_node(client, name).get("status", {}).get("allocatable") or {})


def _summary_nodes(client: RestClient, name: str) -> list[str]:
    annotations = _node(client, name).get("metadata", {}).get("annotations") or {}
    text = annotations.get(summary.ANNOTATION)
    return sorted(row[0] for row in json.loads(text)["nodes"]) if text else []


def _bound(client: RestClient, ns: str, name: str) -> str | None:
    return ((pod(client, ns, name) or {}).get("spec") or {}).get("nodeName")


def _running(client: RestClient, ns: str, name: str) -> bool:
    return (pod(client, ns, name) or {}).get("status", {}).get("phase") == "Running"


def _prefers(node: str, *, cpu: str, name: str) -> dict[str, Any]:
    """A pod of `cpu` on one lower node, preferring virtual node `node` upstairs."""
    prefer = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": {"matchExpressions": [prefer]}}
                    ]
                }
            },
            "nodeSelector": {"type": "virtual-kubelet"},
            "tolerations": TOLERATE,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }


def test_each_virtual_node_offers_its_pool_only(topology: Topology) -> None:
    upper = topology.upper
    cpu_nodes = list(topology.fleet.cluster("lower").nodes)
    wait_for("vn-cpu's pool summary", lambda: _summary_nodes(upper, "vn-cpu") == sorted(cpu_nodes))
    wait_for("vn-gpu's pool summary", lambda: _summary_nodes(upper, "vn-gpu") == list(GPU_NODES))
    cpu_pool, gpu_pool = _allocatable(upper, "vn-cpu"), _allocatable(upper, "vn-gpu")
    print(f"vn-cpu {cpu_pool}\nvn-gpu {gpu_pool}")
    assert (cpu_pool["cpu"], cpu_pool["memory"], cpu_pool.get(GPU)) == ("2", "16Gi", None)
    assert (gpu_pool["cpu"], gpu_pool["memory"], gpu_pool[GPU]) == ("16", "64Gi", "4")
    # The labels the pool's nodes share are copied; the one they differ on is not.
    gpu_labels = _node(upper, "vn-gpu")["metadata"]["labels"]
    assert (gpu_labels[PRODUCT_LABEL], gpu_labels["pool"]) == (PRODUCT, "gpu")
    assert gpu_labels["kubernetes.io/hostname"] == "vn-gpu"
    assert PRODUCT_LABEL not in _node(upper, "vn-cpu")["metadata"]["labels"]


def test_an_upper_selector_on_a_copied_label_runs_the_pod_in_the_gpu_pool(
    topology: Topology, ns: str
) -> None:
    upper, lower = topology.upper, topology.lower
    body = pod_manifest("trainer", node="vn-gpu", requests={"cpu": "100m", GPU: "1"})
    body["spec"]["nodeSelector"] = {PRODUCT_LABEL: PRODUCT}
    body["spec"]["containers"][0]["resources"]["limits"] = {GPU: "1"}
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
    assert wait_for("trainer bound", lambda: _bound(upper, ns, "trainer")) == "vn-gpu"
    wait_for("trainer Running", lambda: _running(upper, ns, "trainer"), timeout=60)
    below = pod(lower, ns, "trainer") or {}
    assert below["spec"]["nodeName"] in GPU_NODES
    # Confined to the pool below; the upper selector, which vn-gpu satisfied, is spent.
    terms = below["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]
    assert "nodeSelector" not in below["spec"]


def test_the_extender_sends_a_pod_no_cpu_node_fits_to_the_gpu_pool(
    topology: Topology, ns: str, tmp_path: Path
) -> None:
    """1.5 CPU fits vn-cpu's sum (2 CPU) but neither of its 1 CPU nodes: the pod prefers
    vn-cpu, and the extender, reading vn-cpu's summary of its pool alone, filters it out."""
    kubeconfig = token_kubeconfig(
        topology.fleet.upper,
        ROOT / "scheduler" / "rbac.yaml",
        topology.directory / "scheduler.kubeconfig",
        service_account="tensile-scheduler",
    )
    extender = SchedulerExtenderProcess(topology.fleet, log_dir=tmp_path, kubeconfig=kubeconfig)
    extender.start()
    try:
        upper = topology.upper
        upper.request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            body=_prefers("vn-cpu", cpu="1500m", name="big"),
        )
        assert wait_for("big bound", lambda: _bound(upper, ns, "big")) == "vn-gpu"
        wait_for("big Running", lambda: _running(upper, ns, "big"), timeout=60)
        assert (pod(topology.lower, ns, "big") or {})["spec"]["nodeName"] in GPU_NODES
        assert extender.metric("tensile_scheduler_filtered_nodes_total", verdict="unfit") >= 1
    finally:
        assert extender.stop() == 0, extender.log.read_text()[-2000:]


def _unschedulable(client: RestClient, ns: str, name: str) -> str | None:
    conditions = (pod(client, ns, name) or {}).get("status", {}).get("conditions") or []
    for condition in conditions:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "Unschedulable")
    return None


def test_a_pod_its_pool_cannot_place_waits_below_and_the_descheduler_moves_it(
    topology: Topology, ns: str, tmp_path: Path
) -> None:
    """Without the extender the upper scheduler takes vn-cpu's word (2 CPU free) for a
    1.5 CPU pod; below, the pod is confined to the CPU pool, so the GPU nodes' room does not
    place it there: it waits, and the descheduler moves it to vn-gpu."""
    upper = topology.upper
    upper.request(
        "POST", f"/api/v1/namespaces/{ns}/pods", body=_prefers("vn-cpu", cpu="1500m", name="solo")
    )
    assert wait_for("solo bound", lambda: _bound(upper, ns, "solo")) == "vn-cpu"
    message = wait_for(
        "solo unschedulable below", lambda: _unschedulable(upper, ns, "solo"), timeout=60
    )
    print(message)
    assert "2 Insufficient cpu" in message
    assert "2 node(s) didn't match Pod's node affinity/selector" in message
    kubeconfig = token_kubeconfig(
        topology.fleet.upper,
        ROOT / "descheduler" / "rbac.yaml",
        tmp_path / "descheduler.kubeconfig",
        service_account="tensile-descheduler",
    )
    descheduler = DeschedulerProcess(
        topology.fleet,
        log_dir=tmp_path,
        name="descheduler",
        kubeconfig=kubeconfig,
        args=["--unschedulable-timeout=3s", "--descheduling-interval=1s"],
    ).start()
    try:
        wait_for("solo-d1 bound", lambda: _bound(upper, ns, "solo-d1"), timeout=60)
        assert _bound(upper, ns, "solo-d1") == "vn-gpu"
        wait_for("solo-d1 Running", lambda: _running(upper, ns, "solo-d1"), timeout=60)
        assert (pod(topology.lower, ns, "solo-d1") or {})["spec"]["nodeName"] in GPU_NODES
    finally:
        assert descheduler.stop() == 0


def test_the_two_virtual_nodes_share_a_config_map_copy(topology: Topology, ns: str) -> None:
    upper, lower = topology.upper, topology.lower
    upper.request(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        body={"metadata": {"name": "shared"}, "data": {"k": "1"}},
    )
    volume = {"volumes": [{"name": "c", "configMap": {"name": "shared"}}]}
    for node in ("vn-cpu", "vn-gpu"):
        body = pod_manifest(f"on-{node}", node=node, spec=volume, requests={"cpu": "100m"})
        upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
    for node in ("vn-cpu", "vn-gpu"):
        wait_for(f"on-{node} Running", lambda n=node: _running(upper, ns, f"on-{n}"), timeout=60)
    copy = f"/api/v1/namespaces/{ns}/configmaps/shared"
    assert (get(lower, copy) or {}).get("data") == {"k": "1"}
    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{ns}/pods/on-vn-cpu",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    wait_for("on-vn-cpu gone below", lambda: pod(lower, ns, "on-vn-cpu") is None, timeout=60)
    upper.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/configmaps/shared",
        body={"data": {"k": "2"}},
        content_type="application/merge-patch+json",
    )
    # The copy still serves the pod on vn-gpu, and is kept up to date.
    wait_for("the copy updated", lambda: (get(lower, copy) or {}).get("data") == {"k": "2"})
    time.sleep(3)
    assert (get(lower, copy) or {}).get("data") == {"k": "2"}
    assert _running(upper, ns, "on-vn-gpu")


def _relabel(client: RestClient, node: str, pool: str) -> None:
    client.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"metadata": {"labels": {"pool": pool}}},
        content_type="application/merge-patch+json",
    )


def test_a_node_that_leaves_the_pool_leaves_the_capacity_and_its_pods_are_reported(
    topology: Topology, ns: str, request: pytest.FixtureRequest
) -> None:
    upper, lower = topology.upper, topology.lower
    leaving = GPU_NODES[1]
    body = pod_manifest("stays", node="vn-gpu", requests={"cpu": "100m"})
    body["metadata"]["annotations"] = {
        "clusterSelector": json.dumps({"nodeSelector": {"kubernetes.io/hostname": leaving}})
    }
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
    wait_for("stays Running", lambda: _running(upper, ns, "stays"), timeout=60)
    assert (pod(lower, ns, "stays") or {})["spec"]["nodeName"] == leaving
    lower_uid = (pod(lower, ns, "stays") or {})["metadata"]["uid"]
    _relabel(lower, leaving, "retired")
    try:
        wait_for(
            "vn-gpu without the node",
            lambda: _allocatable(upper, "vn-gpu").get(GPU) == "2",
        )
        assert _allocatable(upper, "vn-gpu")["cpu"] == "8"
        wait_for("vn-gpu's summary", lambda: _summary_nodes(upper, "vn-gpu") == [GPU_NODES[0]])

        def reported() -> str | None:
            for event in events_for(upper, ns, "stays"):
                if event.get("reason") == LEFT_POOL_REASON:
                    return str(event["message"])
            return None

        message = wait_for("the LowerNodeLeftPool Event", reported)
        print(message)
        assert message.startswith(f"lower node {leaving} no longer matches --lower-node-selector")
        # Reported, not killed: the same lower pod runs on.
        time.sleep(2)
        assert (pod(lower, ns, "stays") or {})["metadata"]["uid"] == lower_uid
        assert _running(upper, ns, "stays")
        # A restart finds the pod outside the pool and reports it again.
        node = topology.nodes["vn-gpu"]
        node.stop()
        assert node.process is not None
        long_lived_pids(request.config).discard(node.process.pid)
        node.start()
        assert node.process is not None
        long_lived_pids(request.config).add(node.process.pid)

        def reported_twice() -> bool:
            reasons = [e.get("reason") for e in events_for(upper, ns, "stays")]
            return reasons.count(LEFT_POOL_REASON) >= 2

        wait_for("the Event of the restarted node", reported_twice)
        assert (pod(lower, ns, "stays") or {})["metadata"]["uid"] == lower_uid
        # The whole pool gone: no GPU is offered any more (0, not the last figure kept).
        _relabel(lower, GPU_NODES[0], "retired")
        wait_for("vn-gpu empty", lambda: _allocatable(upper, "vn-gpu").get(GPU) == "0")
        assert _allocatable(upper, "vn-gpu")["cpu"] == "0"
    finally:
        for node_name in GPU_NODES:
            _relabel(lower, node_name, "gpu")
    wait_for("vn-gpu with the node again", lambda: _allocatable(upper, "vn-gpu").get(GPU) == "4")
