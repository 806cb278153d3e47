"""kwok in the lower cluster: its command line, its simulation rules, and its fake Nodes.

kwok (sigs.k8s.io/kwok) plays the kubelet of every Node annotated `kwok.x-k8s.io/node=fake`:
the lifecycle stages built beside the binary make pods Running and Ready with a pod IP and
remove deleted pods; the ClusterLogs / ClusterExec / ClusterPortForward rules below make
`kubectl logs`, `exec` and `port-forward` reach local files, commands and a TCP server.
Everything here is pure: values in, argv / documents out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnode.testing.ports import LOOPBACK

MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
NODE_INDEX_LABEL = "tensile.io/lower-node-index"
POD_CIDR = "10.244.0.0/16"


@dataclass(frozen=True, kw_only=True)
class FakeNode:
    """A kwok-managed Node of the lower cluster (quantities as Kubernetes strings)."""

    name: str
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"
    ephemeral_storage: str = "1Ti"
    labels: Mapping[str, str] = field(default_factory=dict)
    extended: Mapping[str, str] = field(default_factory=dict)
    """Extra allocatable resources, e.g. {"nvidia.com/gpu": "4"}."""


def node_manifest(node: FakeNode) -> dict[str, Any]:
    """Return the Node object to create for `node`.

    No `status.addresses`: kwok fills InternalIP from `--node-ip`, and an InternalIP
    without a Hostname address would make its node-initialize stage drop the addresses.
    """
    resources = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": node.pods,
        "ephemeral-storage": node.ephemeral_storage,
        **node.extended,
    }
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **node.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {MANAGED_ANNOTATION: MANAGED_VALUE},
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def simulation_documents(
    *,
    logs_file: Path,
    previous_logs_file: Path,
    attach_file: Path,
    exec_dir: Path,
    forward_port: int,
) -> list[dict[str, Any]]:
    """Return kwok rules that apply to every pod of every namespace.

    - logs: every container's log is `logs_file` (CRI log format), its previous log
      `previous_logs_file`;
    - attach: a container's attached output is what is appended to `attach_file` (CRI log
      format) while attached; kwok ignores stdin;
    - exec: the command runs locally, unchanged, in `exec_dir`;
    - port-forward: every pod port reaches 127.0.0.1:`forward_port`.
    """
    return [
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterLogs",
            "metadata": {"name": "tensile-logs"},
            "spec": {
                "logs": [
                    {
                        "logsFile": str(logs_file),
                        "previousLogsFile": str(previous_logs_file),
                        "follow": True,
                    }
                ]
            },
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterAttach",
            "metadata": {"name": "tensile-attach"},
            "spec": {"attaches": [{"logsFile": str(attach_file)}]},
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterExec",
            "metadata": {"name": "tensile-exec"},
            "spec": {"execs": [{"local": {"workDir": str(exec_dir)}}]},
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterPortForward",
            "metadata": {"name": "tensile-port-forward"},
            "spec": {"forwards": [{"target": {"address": LOOPBACK, "port": forward_port}}]},
        },
    ]


def cri_log_lines(lines: Sequence[str], *, start: dt.datetime, stream: str = "stdout") -> str:
    """Format `lines` as a CRI container log (one second apart from `start`), as kwok reads it."""
    out = []
    for i, line in enumerate(lines):
        stamp = (start + dt.timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        out.append(f"{stamp} {stream} F {line}\n")
    return "".join(out)


def kwok_argv(
    *,
    binary: Path,
    kubeconfig: Path,
    configs: Sequence[Path],
    port: int,
) -> list[str]:
    """Return kwok's argv: manage annotated Nodes, serve the kubelet API on loopback `port`."""
    argv = [str(binary), f"--kubeconfig={kubeconfig}"]
    argv += [f"--config={c}" for c in configs]
    argv += [
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={MANAGED_VALUE}",
        f"--node-ip={LOOPBACK}",
        f"--node-port={port}",
        f"--server-address={LOOPBACK}:{port}",
        # The heartbeat-with-lease stage expects kwok to renew node Leases, as a kubelet does.
        "--node-lease-duration-seconds=40",
        f"--cidr={POD_CIDR}",
    ]
    return argv
