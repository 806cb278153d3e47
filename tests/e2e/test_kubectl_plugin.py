"""`kubectl tensile` through the real kubectl (which finds `kubectl-tensile` on PATH) against
the session fleet: a virtual node, a pod running below, a pod the lower cluster cannot place
(its clusterSelector, as the webhook writes it, asks for a label no lower node has), a pod
too big for the upper scheduler, and an avoidance record naming the virtual node."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from devcluster.cluster import kubectl_binary
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import avoidance, clusterselector
from tests.e2e.helpers import create, get, pod, pod_manifest, wait_for


def _kubectl_tensile(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    # The upper cluster as kubectl finds it ($KUBECONFIG), the plugin on PATH beside python.
    # Each call starts Python (1-2 s on a loaded machine): the test makes as few as it can.
    env = {
        **os.environ,
        "KUBECONFIG": str(fleet.upper.kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [kubectl_binary(), "tensile", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _fits(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, f"lines wider than 80 columns: {wide}"


def _unplaceable_below(found: dict[str, Any] | None) -> bool:
    conditions = ((found or {}).get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def test_status_and_why(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    upper = fleet.upper.rest()
    node = virtual_node.name
    owner = create(
        upper,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}},
    )
    stuck = pod_manifest("stuck", node=node)
    stuck["metadata"]["annotations"] = {
        clusterselector.ANNOTATION: json.dumps({"nodeSelector": {"disk": "none-has-it"}}),
        avoidance.ADDED_ANNOTATION: "vn-elsewhere",
    }
    stuck["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
         "uid": owner["metadata"]["uid"], "controller": True},
    ]  # fmt: skip
    create(upper, namespace, stuck)
    create(upper, namespace, pod_manifest("big", node=node, requests={"cpu": "100000"}))
    until = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    entry = avoidance.Avoidance(
        owner=avoidance.Owner(
            uid=owner["metadata"]["uid"], api_version="v1", kind="ConfigMap",
            namespace=namespace, name="owner",
        ),
        nodes={node: until},
    )  # fmt: skip
    create(
        upper,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "avoid"},
            "data": {owner["metadata"]["uid"]: avoidance.render_entry(entry)},
        },
    )
    record = f"--avoid-configmap={namespace}/avoid"
    wait_for(
        "the lower scheduler's verdict on stuck, mirrored upstairs",
        lambda: _unplaceable_below(pod(upper, namespace, "stuck")),
    )

    table = _kubectl_tensile(fleet, "status", record)
    assert table.returncode == 0, table.stderr
    print(table.stdout)
    _fits(table.stdout)
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(node)]
    assert row.split()[1] == "ok"
    assert f"{namespace}/stuck on {node}: unplaceable below" in table.stdout
    assert f"ConfigMap {namespace}/owner avoids {node} for 59m more" in table.stdout

    report = json.loads(_kubectl_tensile(fleet, "status", record, "-o", "json").stdout)
    (mine,) = [n for n in report["nodes"] if n["name"] == node]
    assert mine["lower"]["state"] == "ok"
    assert mine["pods"] == 2  # web and stuck; big is not bound
    assert mine["pendingMoves"] == 1
    assert mine["used"]["pods"] == "2"

    lower_kubeconfig = str(fleet.lower.kubeconfig)
    web = _kubectl_tensile(
        fleet, "why", running_pod, "-n", namespace, f"--lower={node}={lower_kubeconfig}"
    )
    assert web.returncode == 0, web.stderr
    print(web.stdout)
    _fits(web.stdout)
    assert f"runs on virtual node {node} (phase Running)" in web.stdout
    lower_pod = get(fleet.lower.rest(), f"/api/v1/namespaces/{namespace}/pods/{running_pod}")
    assert lower_pod is not None
    assert (
        f"Lower: pod {namespace}/{running_pod} on node {lower_pod['spec']['nodeName']} (Running)"
        in web.stdout
    )
    assert "Lower events:" in web.stdout

    why_stuck = _kubectl_tensile(fleet, "why", "stuck", "-n", namespace, record)
    print(why_stuck.stdout)
    _fits(why_stuck.stdout)
    text = " ".join(why_stuck.stdout.split())
    assert f"bound to virtual node {node}, whose lower cluster cannot place it" in text
    assert "nodeSelector moved below (for the lower scheduler): disk=none-has-it" in text
    assert "kept off virtual node(s) vn-elsewhere" in text
    assert f"ConfigMap owner avoids {node} until" in text

    big = _kubectl_tensile(fleet, "why", "big", "-n", namespace, "-o", "json")
    assert json.loads(big.stdout)["placement"]["state"] == "unscheduled"
    assert (
        "not scheduled upstairs (Unschedulable"
        in _kubectl_tensile(fleet, "why", "big", "-n", namespace).stdout
    )

    missing = _kubectl_tensile(fleet, "why", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert f"pod nope not found in namespace {namespace}" in missing.stderr
    bad = _kubectl_tensile(fleet, "status", "-o", "table")
    assert bad.returncode == 2
    assert "argument -o/--output: invalid choice: 'table'" in bad.stderr


def test_version(fleet: Fleet) -> None:
    # --version is the same code (tests/unit/test_pflag.py); here kubectl's dispatch.
    done = _kubectl_tensile(fleet, "version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kubectl-tensile ")
    assert "Kubernetes v" in done.stdout
