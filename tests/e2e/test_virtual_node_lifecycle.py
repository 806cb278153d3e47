"""The virtual node across restarts, beside another node, as capacity changes, and as a command."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster.fleet import Fleet
from devcluster.kwok import FakeNode
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tensile.kube.quantity import parse_quantity
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for


def _lower_pods(fleet: Fleet, namespace: str) -> dict[str, str]:
    items = fleet.lower.rest().request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in items}


def test_a_restart_adopts_pods_recreates_missing_ones_and_deletes_orphans(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    node.start()
    try:
        for name in ("keep", "lose", "orphan"):
            create(upper, namespace, pod_manifest(name, node=node.name))
        for name in ("keep", "lose", "orphan"):
            wait_for(f"{name} Running", lambda n=name: phase(upper, namespace, n) == "Running")
        before = _lower_pods(fleet, namespace)
        assert node.stop() == 0

        # While the node is down: its lower pod "lose" disappears, and the upper pod of
        # "orphan" is force-deleted.
        lower.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/lose",
            body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
        upper.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/orphan",
            body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
        wait_for("lose gone below", lambda: pod(lower, namespace, "lose") is None)

        node.start()
        wait_for("orphan deleted below", lambda: pod(lower, namespace, "orphan") is None)
        wait_for("lose re-created below", lambda: pod(lower, namespace, "lose") is not None)
        wait_for("lose Running", lambda: phase(upper, namespace, "lose") == "Running")
        after = _lower_pods(fleet, namespace)
        assert after["keep"] == before["keep"], "an existing lower pod must be adopted"
        assert set(after) == {"keep", "lose"}
    finally:
        node.stop()
        node.delete_node()


def test_two_virtual_nodes_share_a_lower_cluster_without_touching_each_other(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    a = VirtualNodeProcess(fleet, name=f"vn-a-{secrets.token_hex(3)}", log_dir=tmp_path)
    b = VirtualNodeProcess(fleet, name=f"vn-b-{secrets.token_hex(3)}", log_dir=tmp_path)
    a.start()
    b.start()
    try:
        create(upper, namespace, pod_manifest("on-a", node=a.name))
        create(upper, namespace, pod_manifest("on-b", node=b.name))
        for name in ("on-a", "on-b"):
            wait_for(f"{name} Running", lambda n=name: phase(upper, namespace, n) == "Running")
        owner = {
            n: (pod(lower, namespace, n) or {})["metadata"]["annotations"][
                ownership.NODE_ANNOTATION
            ]
            for n in ("on-a", "on-b")
        }
        assert owner == {"on-a": a.name, "on-b": b.name}
        b_uid = _lower_pods(fleet, namespace)["on-b"]

        # A restart of a must leave b's pod alone (tensile-kube deleted it as dangling).
        assert a.stop() == 0
        a.start()
        wait_for("on-a Running again", lambda: phase(upper, namespace, "on-a") == "Running")
        assert _lower_pods(fleet, namespace)["on-b"] == b_uid
        # b's pod holds lower resources, so it counts against a's capacity and not b's.
        cpu_a = _allocatable(fleet, a.name)["cpu"]
        cpu_b = _allocatable(fleet, b.name)["cpu"]
        assert cpu_a == cpu_b
    finally:
        for node in (a, b):
            node.stop()
            node.delete_node()


def _allocatable(fleet: Fleet, name: str) -> dict[str, Any]:
    node = get(fleet.upper.rest(), f"/api/v1/nodes/{name}") or {}
    return {k: parse_quantity(v) for k, v in node["status"]["allocatable"].items()}


def _steady_allocatable(fleet: Fleet, name: str, *, quiet: float = 2.0) -> dict[str, Any]:
    """The virtual node's allocatable once it has not changed for `quiet` seconds: a pod
    gone below just before shows upstairs a moment later, and a count started before that
    is off by one (seen once on a quiet machine)."""
    seen = _allocatable(fleet, name)
    since = time.monotonic()
    deadline = since + 30.0
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"allocatable of {name} never held still: {seen}"
        time.sleep(0.2)
        now = _allocatable(fleet, name)
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def _nothing_terminating(fleet: Fleet) -> bool:
    lower = fleet.lower.rest()
    namespaces = lower.request("GET", "/api/v1/namespaces")["items"]
    pods = lower.request("GET", "/api/v1/pods")["items"]
    return not any(n["status"].get("phase") == "Terminating" for n in namespaces) and not any(
        p["metadata"].get("deletionTimestamp") for p in pods
    )


def test_capacity_follows_the_lower_cluster(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    lower = fleet.lower.rest()
    # Earlier tests' namespaces may still be emptying below, which frees pod slots while this
    # test counts them: start from a lower cluster where nothing is going away.
    wait_for("the lower cluster to settle", lambda: _nothing_terminating(fleet), timeout=60)
    start = _steady_allocatable(fleet, virtual_node.name)

    # A lower pod that is not ours takes its requests away from the virtual node...
    hog = pod_manifest("hog", node="unused", requests={"cpu": "5", "memory": "10Gi"})
    hog["spec"].pop("nodeSelector")
    create(lower, namespace, hog)
    wait_for(
        "capacity to drop",
        lambda: _allocatable(fleet, virtual_node.name)["cpu"] == start["cpu"] - 5,
        timeout=15,
    )
    now = _allocatable(fleet, virtual_node.name)
    assert now["memory"] == start["memory"] - 10 * 2**30
    assert now["pods"] == start["pods"] - 1

    # ... a new lower node adds its allocatable, and cordoning it takes it away again.
    extra = FakeNode(name=f"extra-{secrets.token_hex(3)}", cpu="8", memory="16Gi", pods="20")
    fleet.add_lower_node(extra)
    try:
        wait_for(
            "capacity to grow",
            lambda: _allocatable(fleet, virtual_node.name)["cpu"] == now["cpu"] + 8,
            timeout=15,
        )
        lower.request(
            "PATCH",
            f"/api/v1/nodes/{extra.name}",
            body={"spec": {"unschedulable": True}},
            content_type="application/merge-patch+json",
        )
        wait_for(
            "capacity back after a cordon",
            lambda: _allocatable(fleet, virtual_node.name)["cpu"] == now["cpu"],
            timeout=15,
        )
    finally:
        lower.request("DELETE", f"/api/v1/nodes/{extra.name}")


def test_a_lower_node_going_not_ready_leaves_the_capacity_within_seconds(
    fleet: Fleet, virtual_node: VirtualNodeProcess
) -> None:
    lower = fleet.lower.rest()
    # As above: the previous test's pods (a 5-CPU one) may still be going away below.
    wait_for("the lower cluster to settle", lambda: _nothing_terminating(fleet), timeout=60)
    start = _allocatable(fleet, virtual_node.name)
    # A node kwok does not manage, whose Ready condition the test sets by hand.
    name = f"manual-{secrets.token_hex(3)}"
    lower.request("POST", "/api/v1/nodes", body={
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                   "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"}},
    })  # fmt: skip
    try:
        for ready, cpu in (("True", start["cpu"] + 4), ("False", start["cpu"])):
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            condition = {"type": "Ready", "status": ready, "reason": "Test",
                         "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
            lower.request("PATCH", f"/api/v1/nodes/{name}/status",
                          body={"status": {"conditions": [condition]}},
                          content_type="application/strategic-merge-patch+json")  # fmt: skip
            flipped = time.monotonic()
            wait_for(f"capacity with the node Ready={ready}",
                     lambda c=cpu: _allocatable(fleet, virtual_node.name)["cpu"] == c,
                     timeout=10)  # fmt: skip
            assert time.monotonic() - flipped < 5
    finally:
        lower.request("DELETE", f"/api/v1/nodes/{name}")


def test_a_namespace_prefix_maps_namespaces_below(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    prefix = f"p{secrets.token_hex(2)}-"
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--namespace-prefix={prefix}"],
    )
    node.start()
    try:
        manifest = pod_manifest("web", node=node.name)
        manifest["spec"]["containers"][0]["env"] = [
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
        ]
        create(upper, namespace, manifest)
        wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
        below = pod(lower, prefix + namespace, "web")
        assert below is not None
        assert below["spec"]["containers"][0]["env"] == [{"name": "NS", "value": namespace}]
        assert pod(lower, namespace, "web") is None
    finally:
        node.stop()
        node.delete_node()
        lower.request("DELETE", f"/api/v1/namespaces/{prefix}{namespace}")


def _virtual_node(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # Run from a scratch directory: the default --cert-dir is relative to it.
    with tempfile.TemporaryDirectory() as scratch:
        return subprocess.run(
            [sys.executable, "-m", "vnode", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
            cwd=scratch,
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--client-kubeconfig"),
        (["--client-kubeconfig=x", "--os=Plan9"], "--os must be Linux or Windows"),
        (["--client-kubeconfig=x", "--enable-controllers=Nope"], "unknown Nope"),
        (["--client-kubeconfig=x", "--pod-sync-workers=0"], "--pod-sync-workers must be >= 1"),
        (["--client-kubeconfig=x", "--metrics-addr=nowhere"], "--metrics-addr must be host:port"),
        (["--client-kubeconfig=x", "--full-resync-period=soon"], "not a duration"),
        (["--client-kubeconfig=/does/not/exist"], "kubeconfig /does/not/exist does not exist"),
    ],
)
def test_invalid_flags_exit_2_with_one_clear_message(
    fleet: Fleet, args: list[str], message: str
) -> None:
    result = _virtual_node(f"--kubeconfig={fleet.upper.kubeconfig}", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_environment_exits_2(fleet: Fleet) -> None:
    for var, value, message in (
        ("VKUBELET_TAINT_EFFECT", "Sometimes", "VKUBELET_TAINT_EFFECT must be one of"),
        ("VKUBELET_POD_IP", "not-an-ip", "VKUBELET_POD_IP must be an IP address"),
        ("KUBELET_PORT", "http", "KUBELET_PORT must be a port number"),
        ("VKUBELET_NODE_LABEL", "novalue", "VKUBELET_NODE_LABEL must be key:value"),
    ):
        result = _virtual_node(
            f"--kubeconfig={fleet.upper.kubeconfig}",
            f"--client-kubeconfig={fleet.lower.kubeconfig}",
            env={**os.environ, var: value},
        )
        assert result.returncode == 2, var
        assert message in result.stderr


def test_an_unreachable_lower_cluster_is_a_clear_error(fleet: Fleet, tmp_path: Path) -> None:
    text = fleet.lower.kubeconfig.read_text()
    dead = tmp_path / "dead.kubeconfig"
    port = fleet.ports["lower-apiserver"]
    dead.write_text(text.replace(f"127.0.0.1:{port}", "127.0.0.1:1"))
    result = _virtual_node(
        f"--kubeconfig={fleet.upper.kubeconfig}",
        f"--client-kubeconfig={dead}",
        "--nodename=unreachable",
        "--log-format=json",
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    error = entries[-1]
    assert error["level"] == "error"
    assert "cannot reach the lower cluster at https://127.0.0.1:1" in error["msg"]
    assert get(fleet.upper.rest(), "/api/v1/nodes/unreachable") is None


def test_metrics_show_queues_syncs_and_api_calls(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper = fleet.upper.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    text = virtual_node.metrics()
    for series in (
        'tensile_workqueue_depth{queue="pods_from_upper"}',
        'tensile_workqueue_work_duration_seconds_count{queue="pods_from_upper"}',
        'tensile_workqueue_work_duration_seconds_count{queue="status_from_lower"}',
        'tensile_workqueue_queue_duration_seconds_bucket{le="0.01",queue="status_from_lower"}',
        'tensile_api_requests_total{cluster="lower",code="201",verb="POST"}',
        'tensile_informer_cached_objects{informer="lower-pods"}',
    ):
        assert series in text, series


def _web_deployment(nodes: list[str]) -> dict[str, Any]:
    """Three nginx pods allowed on the virtual nodes `nodes` only (tolerating their taint)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "web", "image": "nginx:1.27"}],
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes},
                        ]}]},
                    }},
                },
            },
        },
    }  # fmt: skip


def _web_pods(fleet: Fleet, namespace: str) -> list[dict[str, Any]]:
    pods = fleet.upper.rest().request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": "app=web"}
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _ready_on(pods: list[dict[str, Any]], node: str) -> int:
    return sum(
        1
        for p in pods
        if p["spec"].get("nodeName") == node
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions") or []
        )
    )


def _drain(fleet: Fleet, node: str, *, timeout: str) -> subprocess.CompletedProcess[str]:
    """The real `kubectl drain` (the kubectl of the test extra, beside this Python)."""
    kubectl = Path(sys.executable).parent / "kubectl"
    return subprocess.run(
        [str(kubectl), "--kubeconfig", str(fleet.upper.kubeconfig), "drain", node,
         "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout}"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_kubectl_drain_of_a_virtual_node_keeps_the_pod_disruption_budget(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    """docs/operations/drain.md: drain cordons the virtual node and evicts within the
    budget; replacements that have nowhere to go stay Pending and stop the drain, those
    that have another virtual node go there, and the drained node's lower pods go."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    suffix = secrets.token_hex(3)
    a = VirtualNodeProcess(fleet, name=f"vn-drain-a-{suffix}", log_dir=tmp_path / "a")
    b = VirtualNodeProcess(fleet, name=f"vn-drain-b-{suffix}", log_dir=tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    started = [a]
    a.start()
    try:
        upper.request(
            "POST",
            f"/apis/apps/v1/namespaces/{namespace}/deployments",
            body=_web_deployment([a.name, b.name]),
        )
        upper.request(
            "POST",
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
            body={
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "web"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
            },
        )
        wait_for(
            "3 web pods Ready on a",
            lambda: _ready_on(_web_pods(fleet, namespace), a.name) == 3,
            timeout=90,
        )
        wait_for(
            "the budget allows one disruption",
            lambda: (get(upper, f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/web")
                     or {}).get("status", {}).get("disruptionsAllowed") == 1,
        )  # fmt: skip
        before = set(_lower_pods(fleet, namespace).values())

        # Only a can take the pods: one is evicted, its replacement stays Pending (a is
        # cordoned), and the budget stops the rest.
        done = _drain(fleet, a.name, timeout="20s")
        assert done.returncode != 0, done.stdout + done.stderr
        assert "disruption budget" in done.stdout + done.stderr, done.stdout + done.stderr
        node = upper.request("GET", f"/api/v1/nodes/{a.name}")
        assert node["spec"].get("unschedulable") is True, "drain cordons the virtual node"
        pods = _web_pods(fleet, namespace)
        assert _ready_on(pods, a.name) == 2, [p["metadata"]["name"] for p in pods]
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        assert len(pending) == 1, pods
        assert pending[0]["status"]["phase"] == "Pending"
        wait_for(
            "the evicted pod's lower pod gone",
            lambda: len(set(_lower_pods(fleet, namespace).values()) & before) == 2,
        )
        time.sleep(3)  # the virtual node keeps the Node cordoned while it updates it
        node = upper.request("GET", f"/api/v1/nodes/{a.name}")
        assert node["spec"].get("unschedulable") is True, "the virtual node uncordoned itself"

        # With a second virtual node, the replacements go there and the drain completes.
        started.append(b)
        b.start()
        done = _drain(fleet, a.name, timeout="120s")
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(
            "3 web pods Ready on b",
            lambda: _ready_on(_web_pods(fleet, namespace), b.name) == 3,
            timeout=90,
        )
        assert _ready_on(_web_pods(fleet, namespace), a.name) == 0
        wait_for(
            "a's lower pods gone", lambda: not set(_lower_pods(fleet, namespace).values()) & before
        )
        assert len(_lower_pods(fleet, namespace)) == 3
        assert all(
            p["metadata"]["labels"].get(ownership.NODE_LABEL) == b.name
            for p in lower.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        )
    finally:
        upper.request("DELETE", f"/apis/apps/v1/namespaces/{namespace}/deployments/web")
        for node_process in started:
            node_process.stop()
            node_process.delete_node()
