"""The fleet: one upper cluster over two lower ones, two upper clusters over one lower one,
and what a routable node address makes possible: the apiservers' node proxy, metrics-server
and `kubectl top` through a virtual node.
"""

from __future__ import annotations

import errno
import json
import re
import secrets
import socket
from pathlib import Path
from typing import Any

import pytest

from devcluster import kwok, netns
from devcluster.cluster import Cluster, host_node_name
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.kube.quantity import parse_quantity
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for
from tests.fixtures import create_namespace, delete_namespace


def _allocatable(cluster: Cluster, node: str) -> dict[str, str]:
    found = get(cluster.rest(), f"/api/v1/nodes/{node}") or {}
    return dict(found.get("status", {}).get("allocatable") or {})


def _internal_ip(cluster: Cluster, node: str) -> str:
    found = cluster.rest().request("GET", f"/api/v1/nodes/{node}")
    [address] = [a["address"] for a in found["status"]["addresses"] if a["type"] == "InternalIP"]
    return str(address)


def _start(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, **kwargs: Any
) -> VirtualNodeProcess:
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path, **kwargs)
    nodes.append(node)
    return node.start()


def test_one_upper_cluster_over_two_lower_clusters(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    upper, first, second = fleet.upper, fleet.lower, fleet.cluster("lower-2")
    namespace = create_namespace((upper, first, second), prefix="one-over-two")
    try:
        node_a = _start(fleet, nodes, tmp_path, lower="lower")
        node_b = _start(fleet, nodes, tmp_path, lower="lower-2")
        client = upper.rest()
        create(client, namespace, pod_manifest("a", node=node_a.name))
        create(client, namespace, pod_manifest("b", node=node_b.name))
        for name in ("a", "b"):
            wait_for(
                f"{name} Running", lambda name=name: phase(client, namespace, name) == "Running"
            )

        # Each pod runs in its own lower cluster only, on that cluster's kwok nodes and
        # with a pod IP of that cluster's range.
        below_a = pod(first.rest(), namespace, "a")
        below_b = pod(second.rest(), namespace, "b")
        assert below_a is not None
        assert below_b is not None
        assert pod(second.rest(), namespace, "a") is None
        assert pod(first.rest(), namespace, "b") is None
        assert below_a["spec"]["nodeName"] in first.nodes
        assert below_b["spec"]["nodeName"] in second.nodes
        assert below_b["status"]["podIP"].startswith("10.245.")
        upper_b = client.request("GET", f"/api/v1/namespaces/{namespace}/pods/b")
        assert upper_b["status"]["podIP"] == below_b["status"]["podIP"]

        # Each node's capacity is its own lower cluster's: lower-2 has two 32-CPU nodes and
        # nothing else runs there; a node added to lower-2 grows node B's only.
        wait_for("B's capacity", lambda: _allocatable(upper, node_b.name).get("cpu") == "64")
        before_a = _allocatable(upper, node_a.name)
        assert parse_quantity(before_a["pods"]) <= 3 * 110
        extra = kwok.FakeNode(name=f"lower-2-extra-{secrets.token_hex(2)}", cpu="8")
        fleet.add_lower_node(extra, cluster="lower-2")
        try:
            wait_for("B grows", lambda: _allocatable(upper, node_b.name).get("cpu") == "72")
            assert _allocatable(upper, node_a.name)["cpu"] == before_a["cpu"]
        finally:
            second.rest().request("DELETE", f"/api/v1/nodes/{extra.name}")
        wait_for("B shrinks", lambda: _allocatable(upper, node_b.name).get("cpu") == "64")
    finally:
        delete_namespace((upper, first, second), namespace)


def test_two_upper_clusters_over_one_lower_cluster(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    first, second, lower = fleet.upper, fleet.cluster("upper-2"), fleet.lower
    namespace = create_namespace((first, second), prefix="two-over-one")
    prefixes = {"upper": f"u1{secrets.token_hex(2)}-", "upper-2": f"u2{secrets.token_hex(2)}-"}
    try:
        node_a = _start(
            fleet, nodes, tmp_path, upper="upper", args=[f"--namespace-prefix={prefixes['upper']}"]
        )
        node_b = _start(
            fleet,
            nodes,
            tmp_path,
            upper="upper-2",
            args=[f"--namespace-prefix={prefixes['upper-2']}"],
        )
        # Same namespace, same pod name, in both upper clusters.
        for cluster, node in ((first, node_a), (second, node_b)):
            create(cluster.rest(), namespace, pod_manifest("web", node=node.name))
        for cluster in (first, second):
            wait_for(
                f"web Running in {cluster.name}",
                lambda cluster=cluster: phase(cluster.rest(), namespace, "web") == "Running",
            )
        # Each upper cluster sees its own virtual node only.
        assert get(first.rest(), f"/api/v1/nodes/{node_b.name}") is None
        assert get(second.rest(), f"/api/v1/nodes/{node_a.name}") is None
        # Below, each in the namespace its node maps to, both Running.
        uids = set()
        for name, prefix in prefixes.items():
            below = pod(lower.rest(), prefix + namespace, "web")
            assert below is not None
            assert below["status"]["phase"] == "Running"
            uids.add(below["metadata"]["uid"])
            upper_pod = (
                fleet.cluster(name)
                .rest()
                .request("GET", f"/api/v1/namespaces/{namespace}/pods/web")
            )
            assert upper_pod["status"]["podIP"] == below["status"]["podIP"]
        assert len(uids) == 2
    finally:
        delete_namespace((first, second), namespace)
        delete_namespace((lower,), prefixes["upper"] + namespace)
        delete_namespace((lower,), prefixes["upper-2"] + namespace)


# -- the routable address -----------------------------------------------------------------


def test_nothing_leaves_the_private_network(private_network: netns.Network) -> None:
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    for address in ("198.51.100.1", "10.0.0.1", "203.0.113.7"):
        with socket.socket() as s:
            s.settimeout(2)
            code = s.connect_ex((address, 443))
        assert code == errno.ENETUNREACH, (address, errno.errorcode.get(code))


def test_nodes_publish_documentation_addresses_the_node_proxy_reaches(
    fleet: Fleet, private_network: netns.Network
) -> None:
    for lower in fleet.lowers:
        for node in lower.nodes:
            assert _internal_ip(lower, node) == private_network.node_ip
    for index, upper in enumerate(fleet.uppers):
        assert _internal_ip(upper, host_node_name(upper.name)) == private_network.host_address(
            index
        )
    # The lower apiserver proxies to kwok's kubelet endpoint (and verifies its certificate).
    node = fleet.lower.nodes[0]
    text = fleet.lower.kubectl(
        "get", "--raw", f"/api/v1/nodes/{node}/proxy{kwok.resource_metrics_path(node)}"
    ).stdout
    assert "scrape_error 0" in text


def test_the_upper_apiserver_proxies_to_the_virtual_node(
    fleet: Fleet,
    private_network: netns.Network,
    virtual_node: VirtualNodeProcess,
    namespace: str,
    running_pod: str,
) -> None:
    base = f"/api/v1/nodes/{virtual_node.name}/proxy"
    pods = json.loads(fleet.upper.kubectl("get", "--raw", f"{base}/pods").stdout)
    assert pods["kind"] == "PodList"
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods["items"]] == [
        (namespace, running_pod)
    ]
    summary = json.loads(fleet.upper.kubectl("get", "--raw", f"{base}/stats/summary").stdout)
    assert summary["node"]["nodeName"] == virtual_node.name
    # The same through `kubectl get --raw` with the apiserver's own kubelet credentials:
    # an unknown route is the node's 404, not the proxy's refusal.
    missing = fleet.upper.kubectl("get", "--raw", f"{base}/no-such-route", check=False)
    assert missing.returncode != 0
    assert "address not allowed" not in missing.stderr
    assert "NotFound" in missing.stderr or "404" in missing.stderr


# `kubectl top pod`: NAME CPU MEMORY; `kubectl top node` adds a percentage after each.
_TOP_LINE = re.compile(
    r"^(?P<name>\S+)\s+(?P<cpu>\d+)m\s+(?:\S+%\s+)?(?P<memory>\d+)Mi(?:\s+\S+%)?\s*$"
)


def _top(cluster: Cluster, *args: str) -> dict[str, tuple[int, int]]:
    """`kubectl top ... --no-headers` as {name: (millicores, MiB)} ({} until available)."""
    result = cluster.kubectl("top", *args, "--no-headers", check=False)
    rows: dict[str, tuple[int, int]] = {}
    for line in result.stdout.splitlines():
        match = _TOP_LINE.match(line)
        if match:
            rows[match["name"]] = (int(match["cpu"]), int(match["memory"]))
    return rows


@pytest.mark.timeout(240)
def test_kubectl_top_through_metrics_server_and_the_lower_node_proxy(
    fleet: Fleet,
    private_network: netns.Network,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
    namespace: str,
) -> None:
    # The node reads the lower kubelets through the lower apiserver's node proxy (the
    # command's default, and its only way to them here: the usage below can only come
    # from kwok through it); metrics-server scrapes the node at its InternalIP with its
    # ServiceAccount token, which the node checks with a TokenReview and a SAR.
    node = _start(fleet, nodes, tmp_path, lower_kubelet_access="proxy")
    upper = fleet.upper.rest()
    manifest = pod_manifest("web", node=node.name)
    manifest["metadata"]["annotations"] = {
        kwok.USAGE_CPU_ANNOTATION: "200m",
        kwok.USAGE_MEMORY_ANNOTATION: "48Mi",
    }
    manifest["spec"]["containers"].append({"name": "side", "image": "busybox"})
    create(upper, namespace, manifest)
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")

    # metrics-server needs two scrapes (10 s apart) for a CPU rate.
    pods = wait_for(
        "kubectl top pod", lambda: _top(fleet.upper, "pod", "-n", namespace), timeout=120
    )
    cpu, memory = pods["web"]
    assert memory == 96  # two containers of 48Mi
    assert 300 <= cpu <= 500  # two containers of 200m
    containers = fleet.upper.kubectl(
        "top", "pod", "web", "-n", namespace, "--containers", "--no-headers"
    ).stdout
    assert {line.split()[1] for line in containers.splitlines()} == {"main", "side"}
    node_row = wait_for(
        "kubectl top node", lambda: _top(fleet.upper, "node", node.name).get(node.name)
    )
    assert node_row[1] >= 96
    # What metrics-server itself reports, through the aggregation layer.
    metrics = json.loads(
        fleet.upper.kubectl(
            "get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/web"
        ).stdout
    )
    assert {c["name"] for c in metrics["containers"]} == {"main", "side"}
