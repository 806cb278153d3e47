"""`--provider mock` against the real upper cluster: pods bound to the node run with no
lower cluster, as virtual-kubelet's mock provider makes them, and a restart writes nothing."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, pod, pod_manifest, wait_for


def mock_node(fleet: Fleet, tmp_path: Path, nodes: list[VirtualNodeProcess]) -> VirtualNodeProcess:
    name = f"mock-{secrets.token_hex(3)}"
    config = tmp_path / "mock.json"
    config.write_text(json.dumps({name: {"cpu": "4", "memory": "8Gi", "pods": "7"}}))
    node = VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=tmp_path,
        args=["--provider=mock", f"--provider-config={config}"],
    )
    nodes.append(node)
    return node.start()


def upper_writes(node: VirtualNodeProcess) -> float:
    """Writes of the node's main upper client (pods and their statuses; not the Node's)."""
    total = 0.0
    for line in node.metrics().splitlines():
        if line.startswith('tensile_api_requests_total{cluster="upper",') and any(
            f'verb="{verb}"' in line for verb in ("POST", "PUT", "PATCH", "DELETE")
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_pods_run_on_a_mock_node_with_no_lower_cluster(
    fleet: Fleet, namespace: str, tmp_path: Path, nodes: list[VirtualNodeProcess]
) -> None:
    node = mock_node(fleet, tmp_path, nodes)
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    capacity = upper.request("GET", f"/api/v1/nodes/{node.name}")["status"]["capacity"]
    assert capacity == {"cpu": "4", "memory": "8Gi", "pods": "7"}

    spec = {"initContainers": [{"name": "setup", "image": "busybox"}]}
    create(upper, namespace, pod_manifest("web", node=node.name, spec=spec))
    running = wait_for(
        "Running upstairs",
        lambda: (p := pod(upper, namespace, "web")) and p["status"].get("phase") == "Running" and p,
    )
    status = running["status"]
    assert status["podIP"] == fleet.node_ip
    assert status["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert pod(lower, namespace, "web") is None, "nothing went to the lower cluster"

    # Through the upper apiserver and the node's kubelet API, as users see it.
    logs = fleet.upper.kubectl("logs", "-n", namespace, "web")
    assert logs.stdout == ""
    refused = fleet.upper.kubectl("exec", "-n", namespace, "web", "--", "ls", check=False)
    assert refused.returncode != 0
    assert "runs no containers" in refused.stderr

    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web")
    wait_for("the pod gone upstairs", lambda: pod(upper, namespace, "web") is None)


def test_a_restarted_mock_node_takes_its_pods_back_without_a_write(
    fleet: Fleet, namespace: str, tmp_path: Path, nodes: list[VirtualNodeProcess]
) -> None:
    node = mock_node(fleet, tmp_path, nodes)
    upper = fleet.upper.rest()
    for i in range(3):
        create(upper, namespace, pod_manifest(f"p-{i}", node=node.name))
    for i in range(3):
        wait_for(f"p-{i} Running", lambda i=i: (pod(upper, namespace, f"p-{i}") or {}).get(
            "status", {}).get("phase") == "Running")  # fmt: skip
    before = {i: pod(upper, namespace, f"p-{i}") for i in range(3)}

    node.kill()
    node.restart()
    wait_for("every pod looked at", lambda: handled(node) >= 3)
    after = {i: pod(upper, namespace, f"p-{i}") for i in range(3)}
    assert upper_writes(node) == 0
    for i in range(3):
        assert after[i] is not None
        assert before[i] is not None
        assert after[i]["metadata"]["resourceVersion"] == before[i]["metadata"]["resourceVersion"]

    # Still a working node: a pod bound after the restart runs too.
    create(upper, namespace, pod_manifest("late", node=node.name))
    wait_for("late Running", lambda: (pod(upper, namespace, "late") or {}).get("status", {}).get(
        "phase") == "Running")  # fmt: skip


def handled(node: VirtualNodeProcess) -> float:
    """Keys the status queue handled; 0 while the restarted process does not serve metrics
    yet (its Node still shows Ready from before the kill)."""
    prefix = 'tensile_workqueue_work_duration_seconds_count{queue="status_from_lower"}'
    try:
        text = node.metrics()
    except RuntimeError:  # nothing answers yet
        return 0.0
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
