"""kwok in the fleet's clusters: its command line, its simulation rules, and its fake Nodes.

One kwok per cluster (sigs.k8s.io/kwok) plays the kubelet of every Node annotated
`kwok.x-k8s.io/node=fake` there: the lower clusters' worker Nodes, and each upper cluster's
host Node (where hostNetwork pods, e.g. a deployed virtual node, are "run"). The
lifecycle stages built beside the binary make pods Running and Ready with a pod IP and
remove deleted pods; the ClusterLogs / ClusterExec / ClusterPortForward rules below make
`kubectl logs`, `exec` and `port-forward` reach local files, commands and a TCP server; the
Metric and ClusterResourceUsage documents make every Node serve kubelet-style resource
metrics (`/metrics/resource` series) at its own path, which the Node's
`metrics.k8s.io/resource-metrics-path` annotation names (as metrics-server >= 0.7 reads it);
the resize stage plays a kubelet's side of in-place pod resize (`resize_stage`).
Everything here is pure: values in, argv / documents out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.pki import KeyPair
from devcluster.ports import LOOPBACK

MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
NODE_INDEX_LABEL = "tensile.io/lower-node-index"
DEFAULT_NODE_LEASE_SECONDS = 40
"""kwok's --node-lease-duration-seconds: the kubelet's default Lease duration."""
POD_CIDR = "10.244.0.0/16"
"""Pod IPs of the first lower cluster (the others get 10.245.0.0/16, 10.246.0.0/16, ...)."""
RESOURCE_METRICS_PATH_ANNOTATION = "metrics.k8s.io/resource-metrics-path"
RESOURCE_METRICS_PATH = "/metrics/nodes/{nodeName}/metrics/resource"
"""kwok serves every Node on one port, so each Node's metrics live under a path of its own
(kwok requires it to start with /metrics; `{nodeName}` is filled in per request)."""
USAGE_CPU_ANNOTATION = "kwok.x-k8s.io/usage-cpu"
USAGE_MEMORY_ANNOTATION = "kwok.x-k8s.io/usage-memory"
DEFAULT_USAGE_CPU = "10m"
"""CPU each simulated container uses unless its pod's USAGE_CPU_ANNOTATION says otherwise."""
DEFAULT_USAGE_MEMORY = "16Mi"
"""Working set of each simulated container unless USAGE_MEMORY_ANNOTATION says otherwise."""


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
    taints: tuple[Mapping[str, str], ...] = ()
    """`spec.taints` of the Node (key, value, effect)."""


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
            "annotations": {
                MANAGED_ANNOTATION: MANAGED_VALUE,
                RESOURCE_METRICS_PATH_ANNOTATION: resource_metrics_path(node.name),
            },
        },
        "spec": {"taints": [dict(t) for t in node.taints]} if node.taints else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def resource_metrics_path(node_name: str) -> str:
    """Return the path (on kwok's server, so also below the node proxy) of a Node's metrics."""
    return RESOURCE_METRICS_PATH.replace("{nodeName}", node_name)


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
    - port-forward: every pod port reaches 127.0.0.1:`forward_port`;
    - resource metrics: see `resource_metrics_documents`;
    - in-place resize: see `resize_stage`.
    """
    return [
        *resource_metrics_documents(),
        resize_stage(),
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


def resource_metrics_documents() -> list[dict[str, Any]]:
    """Return the kwok Metric and ClusterResourceUsage documents of kubelet resource metrics.

    Every container uses DEFAULT_USAGE_CPU / DEFAULT_USAGE_MEMORY, or what its pod's
    USAGE_CPU_ANNOTATION / USAGE_MEMORY_ANNOTATION say (Kubernetes quantities). The Metric
    serves, at RESOURCE_METRICS_PATH, the series and labels the kubelet's
    `/metrics/resource` has (pkg/kubelet/metrics/collectors/resource_metrics.go): cumulative
    CPU in core-seconds (kwok integrates the usage between scrapes, so it is 0 at a
    container's first scrape), working sets in bytes, container start times in unix
    seconds (the pod's creation time: stable, as metrics-server needs), `scrape_error`.
    """

    def usage(annotation: str, default: str) -> dict[str, str]:
        expression = (
            f'"{annotation}" in pod.metadata.annotations'
            f' ? Quantity(pod.metadata.annotations["{annotation}"])'
            f' : Quantity("{default}")'
        )
        return {"expression": expression}

    container = [
        {"name": "container", "value": "container.name"},
        {"name": "namespace", "value": "pod.metadata.namespace"},
        {"name": "pod", "value": "pod.metadata.name"},
    ]
    pod = container[1:]

    def series(name: str, dimension: str, kind: str, value: str) -> dict[str, Any]:
        labels = {"container": container, "pod": pod, "node": []}[dimension]
        doc: dict[str, Any] = {"name": name, "dimension": dimension, "kind": kind}
        if labels:
            doc["labels"] = labels
        doc["value"] = value
        return doc

    return [
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterResourceUsage",
            "metadata": {"name": "tensile-usage"},
            "spec": {
                "usages": [
                    {
                        "usage": {
                            "cpu": usage(USAGE_CPU_ANNOTATION, DEFAULT_USAGE_CPU),
                            "memory": usage(USAGE_MEMORY_ANNOTATION, DEFAULT_USAGE_MEMORY),
                        }
                    }
                ]
            },
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Metric",
            "metadata": {"name": "tensile-resource-metrics"},
            "spec": {
                "path": RESOURCE_METRICS_PATH,
                "metrics": [
                    series("scrape_error", "node", "gauge", "0"),
                    series(
                        "container_start_time_seconds",
                        "container",
                        "gauge",
                        "pod.metadata.creationTimestamp.UnixSecond()",
                    ),
                    series(
                        "container_cpu_usage_seconds_total",
                        "container",
                        "counter",
                        'pod.CumulativeUsage("cpu", container.name)',
                    ),
                    series(
                        "container_memory_working_set_bytes",
                        "container",
                        "gauge",
                        'pod.Usage("memory", container.name)',
                    ),
                    series(
                        "pod_cpu_usage_seconds_total",
                        "pod",
                        "counter",
                        'pod.CumulativeUsage("cpu")',
                    ),
                    series("pod_memory_working_set_bytes", "pod", "gauge", 'pod.Usage("memory")'),
                    series(
                        "node_cpu_usage_seconds_total",
                        "node",
                        "counter",
                        'node.CumulativeUsage("cpu")',
                    ),
                    series(
                        "node_memory_working_set_bytes", "node", "gauge", 'node.Usage("memory")'
                    ),
                ],
            },
        },
    ]


RESIZE_STAGE = "tensile-pod-resize"
"""The Stage that reports and actuates a Running pod's container resources."""
_RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")
# jq (kwok's selector language, gojq), true when the kubelet has something to report: a
# resize not yet observed (the pod's generation moved past status.observedGeneration), or a
# running container without its resources (a pod that just started). Only pods with
# resources are looked at: a kubelet reports them for every pod, but a pod without any
# cannot be resized (its QoS class would change), and leaving it alone keeps a plain pod's
# start at one status write.
_JQ_PENDING = (
    '([.spec.containers[]?, (.spec.initContainers[]? | select(.restartPolicy == "Always"))'
    " | select((.resources // {}) != {})] | length > 0)"
    " and (((.status.observedGeneration // 0) != .metadata.generation)"
    " or ([.status.containerStatuses[]? | select(.state.running != null"
    " and .resources == null)] | length > 0))"
)
# Go template (kwok's, with sprig): the pod's status with its conditions but the resize's,
# each container status given its container's resources and requests (allocatedResources),
# and the pod's generation observed.
_ACTUATED = (
    "observedGeneration: {{ .metadata.generation }}\n"
    "conditions:\n"
    "{{ range .status.conditions }}"
    + "".join(f'{{{{ if ne .type "{t}" }}}}' for t in _RESIZE_CONDITIONS)
    + "\n- {{ toJson . }}"
    + "{{ end }}" * len(_RESIZE_CONDITIONS)
    + "{{ end }}\n"
    "containerStatuses:\n"
    "{{ $spec := .spec.containers }}"
    "{{ range $s := .status.containerStatuses }}"
    "{{ $new := deepCopy $s }}"
    "{{ range $spec }}{{ if eq .name $s.name }}"
    '{{ $_ := set $new "resources" (default (dict) .resources) }}'
    "{{ with .resources }}{{ with .requests }}"
    '{{ $_ := set $new "allocatedResources" . }}'
    "{{ end }}{{ end }}"
    "{{ end }}{{ end }}"
    "\n- {{ toJson $new }}"
    "{{ end }}\n"
)


def resize_stage() -> dict[str, Any]:
    """Return the kwok Stage that plays a kubelet's side of in-place pod resize.

    What the apiserver and a user see of a kubelet with InPlacePodVerticalScaling (GA in
    Kubernetes 1.35; pkg/kubelet/allocation and pkg/kubelet/status): every running container
    of a Running pod reports `status.containerStatuses[*].resources` (the apiserver refuses a
    resize of a pod whose running containers do not: "Pod running on node without support
    for resize", pkg/apis/core/validation `isPodResizeRequestSupported`) and
    `allocatedResources` (its requests); a resize is actuated at once (resources follow the
    spec, no PodResizeInProgress in between, PodResizePending removed), and
    `status.observedGeneration` follows `metadata.generation`. A resize whose requests exceed
    the node's allocatable never gets here: the apiserver's PodResizeValidator admission
    (plugin/pkg/admission/podresize, Kubernetes 1.37) refuses it. Not simulated: Deferred
    (a node that has room later), resize policies that restart a container, pods without
    any resources (they cannot be resized; left as kwok's pod-ready stage made them).
    """
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": RESIZE_STAGE},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                    {"key": _JQ_PENDING, "operator": "In", "values": ["true"]},
                ]
            },
            "next": {
                "patches": [
                    {
                        "subresource": "status",
                        "root": "status",
                        "type": "merge",
                        "template": _ACTUATED,
                    }
                ]
            },
        },
    }


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
    address: str,
    port: int,
    serving: KeyPair,
    cidr: str = POD_CIDR,
    lease_seconds: int = DEFAULT_NODE_LEASE_SECONDS,
) -> list[str]:
    """Return kwok's argv: manage annotated Nodes, which publish `address` as InternalIP and
    `port` as kubelet port, and serve their kubelet API there over TLS with `serving` (a
    certificate of the cluster's CA for `address`, so apiservers and metrics-server verify
    it as they verify a kubelet's); pod IPs come from `cidr`; each Node's Lease lasts
    `lease_seconds` (kwok renews it a few times per duration, as a kubelet does)."""
    argv = [str(binary), f"--kubeconfig={kubeconfig}"]
    argv += [f"--config={c}" for c in configs]
    argv += [
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={MANAGED_VALUE}",
        f"--node-ip={address}",
        f"--node-port={port}",
        f"--server-address={address}:{port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        # The heartbeat-with-lease stage expects kwok to renew node Leases, as a kubelet does.
        f"--node-lease-duration-seconds={lease_seconds}",
        f"--cidr={cidr}",
    ]
    return argv
