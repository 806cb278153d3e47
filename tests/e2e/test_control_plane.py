"""The local fleet behaves like real clusters: what every other e2e test stands on."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import urllib.request
from typing import Any

import pytest

from devcluster import binaries, cluster
from devcluster.fleet import Fleet
from tests.e2e.helpers import wait_for


def _pod_manifest(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox:1.36", "ports": [{"containerPort": 8080}]}
            ]
        },
    }


@pytest.fixture
def running_lower_pod(fleet: Fleet, namespace: str) -> str:
    """A pod scheduled by the lower kube-scheduler onto a kwok node and Running there."""
    fleet.lower.kubectl("apply", "-f", "-", input=json.dumps(_pod_manifest("p", namespace)))

    def running() -> bool:
        pod = json.loads(
            fleet.lower.kubectl("get", "pod", "p", "-n", namespace, "-o", "json").stdout
        )
        return pod["status"].get("phase") == "Running"

    wait_for("the lower pod to run", running)
    return "p"


def test_both_apiservers_answer_with_the_pinned_version(fleet: Fleet) -> None:
    pinned = binaries.load_versions()["KUBERNETES_VERSION"]
    for c in (fleet.upper, fleet.lower):
        assert c.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        version = json.loads(c.kubectl("version", "-o", "json").stdout)
        assert version["serverVersion"]["gitVersion"] == pinned


def test_the_clusters_are_separate(fleet: Fleet, namespace: str) -> None:
    fleet.upper.kubectl("create", "configmap", "only-upper", "-n", namespace)
    got = fleet.lower.kubectl("get", "configmap", "only-upper", "-n", namespace, check=False)
    assert got.returncode != 0
    assert "NotFound" in got.stderr
    upper_nodes = fleet.upper.kubectl("get", "nodes", "-o", "name").stdout.split()
    assert not [n for n in upper_nodes if n.startswith("node/lower-node-")]


def test_deployment_in_the_lower_cluster_runs_on_kwok_nodes(fleet: Fleet, namespace: str) -> None:
    lower = fleet.lower
    lower.kubectl(
        "create", "deployment", "web", "--image=nginx:1.27", "--replicas=3", "-n", namespace
    )

    def running_pods() -> list[dict[str, Any]] | None:
        pods = json.loads(
            lower.kubectl("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json").stdout
        )["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == 3 else None

    pods = wait_for("3 Running pods", running_pods)
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("lower-node-")
        assert pod["status"]["podIP"].startswith("10.244.")
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True"
    lower.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")


def test_kubectl_logs_on_a_lower_pod(fleet: Fleet, namespace: str, running_lower_pod: str) -> None:
    lower = fleet.lower
    out = lower.kubectl("logs", running_lower_pod, "-n", namespace).stdout
    assert out.splitlines() == list(cluster.LOG_LINES)
    tail = lower.kubectl("logs", running_lower_pod, "-n", namespace, "--tail=2").stdout
    assert tail.splitlines() == list(cluster.LOG_LINES[-2:])
    previous = lower.kubectl("logs", running_lower_pod, "-n", namespace, "--previous").stdout
    assert previous.splitlines() == list(cluster.PREVIOUS_LOG_LINES)


@pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket", "spdy"])
def test_kubectl_exec_returns_output_and_exit_code(
    fleet: Fleet, namespace: str, running_lower_pod: str, websockets: str
) -> None:
    result = fleet.lower.kubectl(
        "exec", running_lower_pod, "-n", namespace, "--", "sh", "-c", "echo hello; exit 3",
        check=False,
        env={**_base_env(), "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets},
    )  # fmt: skip
    assert result.stdout == "hello\n"
    assert result.returncode == 3, result.stderr


def test_kubectl_exec_runs_in_the_scratch_directory(
    fleet: Fleet, namespace: str, running_lower_pod: str
) -> None:
    result = fleet.lower.kubectl("exec", running_lower_pod, "-n", namespace, "--", "pwd")
    assert result.stdout.strip() == str(fleet.exec_dir)


def test_port_forward_reaches_the_local_test_server(
    fleet: Fleet, namespace: str, running_lower_pod: str
) -> None:
    proc = subprocess.Popen(
        [cluster.kubectl_binary(), f"--kubeconfig={fleet.lower.kubeconfig}",
         "port-forward", "-n", namespace, f"pod/{running_lower_pod}", ":8080"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "kubectl port-forward printed nothing in 30s"
        line = proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
        assert match, f"unexpected port-forward output: {line!r}"
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/", timeout=10) as r:
            assert r.read().decode() == cluster.FORWARD_TARGET_TEXT
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def _base_env() -> dict[str, str]:
    return dict(os.environ)
