"""virtual-kubelet's own provider e2e suite (test/e2e at the pinned version), unmodified,
against a virtual node deployed the way a user deploys it.

The suite assumes the node runs as a pod named after the node, beside its test pods, and
serving on 10250 (it reads /stats/summary and /metrics/resource through
`pods/https:<node>:10250/proxy`), where the manifest serves on 10450 (a real host's kubelet
holds 10250): the test moves it to 10250 as a user running the suite would. So
`manifests/vnode/virtual-node.yaml` is applied to the
upper cluster with its RBAC, the upper scheduler puts the pod on the upper cluster's host
Node (a kwok Node at its own routable address), and its container runs here as a local
process (`devcluster.podrun`) with the pod's ServiceAccount, arguments and volumes. Its
lower credentials are a token of `lower-rbac.yaml`'s ServiceAccount, which may also use the
lower apiserver's node proxy (`--lower-kubelet-access=proxy`, the command's default).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from devcluster import binaries, netns
from devcluster.fleet import Fleet
from devcluster.podrun import LocalPod
from tests.e2e.helpers import get, token_kubeconfig, wait_for

MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"
NAMESPACE = "tensile-system"
NODE = "virtual-kubelet-0"
SUITE_TESTS = 9
SUITE_PORT = 10250
"""The kubelet port virtual-kubelet's suite reads stats through (fixed in its code)."""
_RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): TestEndToEnd/(\w+)", re.MULTILINE)


def _ready(fleet: Fleet) -> bool:
    node = get(fleet.upper.rest(), f"/api/v1/nodes/{NODE}") or {}
    conditions = node.get("status", {}).get("conditions") or []
    taints = node.get("spec", {}).get("taints") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not any(
        t["key"] == "node.kubernetes.io/not-ready" for t in taints
    )


@pytest.mark.timeout(600)
def test_virtual_kubelets_provider_suite_passes(
    fleet: Fleet, private_network: netns.Network, tmp_path: Path
) -> None:
    upper, lower = fleet.upper, fleet.lower
    lower_kubeconfig = token_kubeconfig(
        lower, MANIFESTS / "lower-rbac.yaml", tmp_path / "lower.kubeconfig"
    )
    lower.kubectl("apply", "-f", str(MANIFESTS / "lower-rbac-metrics-proxy.yaml"))
    for manifest in (
        "upper-rbac.yaml",
        "upper-rbac-csr-self-approve.yaml",
        "upper-rbac-anonymous-read.yaml",
    ):
        upper.kubectl("apply", "-f", str(MANIFESTS / manifest))
    upper.kubectl(
        "create", "secret", "generic", "tensile-lower-kubeconfig", "-n", NAMESPACE,
        f"--from-file=kubeconfig={lower_kubeconfig}",
    )  # fmt: skip
    # As a user adapts the manifest: the pod proxy the suite reads stats through brings no
    # credentials, so the node lets anonymous callers in, to be authorized by RBAC (the
    # manifest above allows them this node's stats and metrics, nothing else). The suite's
    # pods are bound by name and tolerate no taint, which the node refuses as a kubelet
    # would (TaintToleration) for an effect that keeps pods off: its taint only steers here
    # (PreferNoSchedule), as virtual-kubelet's mock runs them whatever its taint.
    statefulset = yaml.safe_load((MANIFESTS / "virtual-node.yaml").read_text())
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    container["args"].append("--anonymous-auth=true")
    # The suite's own port (no host kubelet holds it here).
    [port] = [e for e in container["env"] if e["name"] == "KUBELET_PORT"]
    port["value"] = str(SUITE_PORT)
    [kubelet] = [p for p in container["ports"] if p["name"] == "kubelet"]
    kubelet["containerPort"] = SUITE_PORT
    container["env"].append({"name": "VKUBELET_TAINT_EFFECT", "value": "PreferNoSchedule"})
    upper.kubectl("apply", "-f", "-", input=yaml.safe_dump(statefulset))
    local = LocalPod(upper, namespace=NAMESPACE, name=NODE, directory=tmp_path / "pod")
    try:
        local.start()
        pod = upper.rest().request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{NODE}")
        assert pod["spec"]["nodeName"] == f"{upper.name}-host"  # placed by the scheduler
        assert pod["status"]["podIP"] == private_network.host_address(0)
        wait_for("the deployed node to be Ready", lambda: _ready(fleet), timeout=90)
        result = subprocess.run(
            [
                str(binaries.ensure(preexec_fn=netns.in_host_network())["virtual-kubelet-e2e"]),
                f"-kubeconfig={upper.kubeconfig}",
                f"-namespace={NAMESPACE}",
                f"-node-name={NODE}",
                "-test.v",
                "-test.timeout=8m",
            ],
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )
        output = result.stdout + result.stderr
        results = {name: verdict for verdict, name in _RESULT.findall(output)}
        summary = ", ".join(f"{name} {verdict}" for name, verdict in sorted(results.items()))
        print(f"virtual-kubelet e2e suite: {summary}")
        assert result.returncode == 0, output[-6000:]
        assert len(results) == SUITE_TESTS, output[-6000:]
        assert set(results.values()) == {"PASS"}, output[-6000:]
        local.check()
    finally:
        local.stop()
        upper.kubectl("delete", "statefulset", "virtual-kubelet", "-n", NAMESPACE, "--wait=false")
        upper.kubectl("delete", "secret", "tensile-lower-kubeconfig", "-n", NAMESPACE)
        upper.kubectl("delete", "node", NODE, "--ignore-not-found")
        upper.kubectl(
            "delete", "-f", str(MANIFESTS / "upper-rbac-anonymous-read.yaml"), "--ignore-not-found"
        )
        # The session's other tests expect the lower cluster without the node-proxy grant.
        lower.kubectl(
            "delete", "-f", str(MANIFESTS / "lower-rbac-metrics-proxy.yaml"), "--ignore-not-found"
        )
