"""`kubectl port-forward` through the upper cluster (SPDY portforward.k8s.io to the virtual node,
WebSocket port-forward to the lower pod), as kubectl does by default (WebSocket tunnel to the
apiserver) and with KUBECTL_PORT_FORWARD_WEBSOCKETS=false (SPDY end to end).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import urllib.request

import pytest

from devcluster import cluster
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, phase, pod_manifest, wait_for


@pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket", "spdy"])
def test_port_forward_carries_several_connections(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, websockets: str
) -> None:
    upper = fleet.upper.rest()
    create(upper, namespace, pod_manifest("web", node=virtual_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    proc = subprocess.Popen(
        [cluster.kubectl_binary(), f"--kubeconfig={fleet.upper.kubeconfig}",
         "port-forward", "-n", namespace, "pod/web", ":8080"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "KUBECTL_PORT_FORWARD_WEBSOCKETS": websockets},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "kubectl port-forward printed nothing in 30s"
        match = re.search(r"127\.0\.0\.1:(\d+) -> 8080", proc.stdout.readline())
        assert match
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/", timeout=10) as r:
                assert r.read().decode() == cluster.FORWARD_TARGET_TEXT
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "error" not in err.lower(), err
