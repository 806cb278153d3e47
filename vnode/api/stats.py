"""What `/metrics/resource`, `/stats/summary` and `/runningpods/` answer (pure renderers).

`/metrics/resource` is the kubelet's resource metrics endpoint
(pkg/kubelet/metrics/collectors/resource_metrics.go): Prometheus text format 0.0.4 with the
series metrics-server reads (pkg/scraper/client/resource/decode.go), labelled `namespace`,
`pod`, `container` in that order, CPU and memory samples stamped with their measurement time in unix
milliseconds, plus `scrape_error` / `resource_scrape_error` (1 when part of the backend
could not be measured). `/stats/summary` is the Summary API (k8s.io/kubelet
pkg/apis/stats/v1alpha1) reduced to CPU and memory, which is all older metrics-server asks
for (`only_cpu_and_memory=true`). `/runningpods/` lists the pods with a running container,
as the kubelet's runtime sees them: name, namespace, UID and the running containers.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from typing import Any

from tensile.contracts.objects import meta_of, name_of, namespace_of
from tensile.kube.timestamps import rfc3339
from vnode.provider import NodeUsage, Usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_HELP = {
    "container_cpu_usage_seconds_total": (
        "counter",
        "[STABLE] CPU time a container used since it started, in core-seconds",
    ),
    "container_memory_working_set_bytes": (
        "gauge",
        "[STABLE] Working set of a container, in bytes",
    ),
    "container_start_time_seconds": (
        "gauge",
        "[STABLE] When a container started, in seconds since the unix epoch",
    ),
    "node_cpu_usage_seconds_total": (
        "counter",
        "[STABLE] CPU time the node's pods used, in core-seconds",
    ),
    "node_memory_working_set_bytes": (
        "gauge",
        "[STABLE] Working set of the node's pods, in bytes",
    ),
    "pod_cpu_usage_seconds_total": (
        "counter",
        "[STABLE] CPU time a pod used, in core-seconds",
    ),
    "pod_memory_working_set_bytes": ("gauge", "[STABLE] Working set of a pod, in bytes"),
    "resource_scrape_error": (
        "gauge",
        "[STABLE] 1 if part of the node's usage could not be measured, 0 otherwise",
    ),
    "scrape_error": (
        "gauge",
        "[ALPHA] 1 if part of the node's usage could not be measured, 0 otherwise",
    ),
}


def resource_metrics(usage: NodeUsage) -> str:
    """Return the `/metrics/resource` text of `usage` (families sorted by name, as the
    kubelet's registry writes them; only values > 0 are ever present, see
    `vnode.provider.MetricsProvider`)."""
    lines: dict[str, list[str]] = {name: [] for name in _HELP}
    if usage.node is not None:
        _usage_lines(lines, "node", {}, usage.node)
    for pod in usage.pods:
        # Label order: namespace, pod, container. Parsers that index labels by position
        # (virtual-kubelet's provider e2e suite reads the pod name at index 1) expect it;
        # those that read them by name (metrics-server) do not care.
        pod_labels = {"namespace": pod.namespace, "pod": pod.name}
        for container in pod.containers:
            labels = {**pod_labels, "container": container.name}
            lines["container_start_time_seconds"].append(
                _line("container_start_time_seconds", labels, container.start_time, None)
            )
            _usage_lines(lines, "container", labels, container.usage)
        _usage_lines(lines, "pod", pod_labels, pod.usage)
    error = 0.0 if usage.complete else 1.0
    for name in ("scrape_error", "resource_scrape_error"):
        lines[name].append(_line(name, {}, error, None))
    out = []
    for name in sorted(lines):
        if lines[name]:
            kind, help_text = _HELP[name]
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines[name]]
    return "\n".join(out) + "\n"


def _usage_lines(
    lines: dict[str, list[str]], prefix: str, labels: Mapping[str, str], usage: Usage
) -> None:
    cpu, memory = f"{prefix}_cpu_usage_seconds_total", f"{prefix}_memory_working_set_bytes"
    lines[cpu].append(_line(cpu, labels, usage.cpu_seconds, usage.time_ms))
    lines[memory].append(_line(memory, labels, usage.memory_bytes, usage.time_ms))


def _line(name: str, labels: Mapping[str, str], value: float, time_ms: int | None) -> str:
    label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    series = f"{name}{{{label_text}}}" if label_text else name
    stamp = f" {time_ms}" if time_ms is not None else ""
    return f"{series} {_number(value)}{stamp}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def summary(usage: NodeUsage, *, node_name: str) -> dict[str, Any]:
    """Return the `/stats/summary` JSON of `usage` (stats/v1alpha1 Summary, CPU and memory).

    Times are RFC 3339 in whole seconds (metav1.Time); usageCoreNanoSeconds and
    workingSetBytes are integers; usageNanoCores is present once the provider has two
    measurements to derive it from.
    """
    node: dict[str, Any] = {"nodeName": node_name}
    if usage.node is not None:
        node.update(_cpu_and_memory(usage.node))
    pods = []
    for pod in usage.pods:
        starts = [c.start_time for c in pod.containers]
        pods.append(
            {
                "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
                "startTime": _time(pod.start_time if pod.start_time else min(starts)),
                "containers": [
                    {"name": c.name, "startTime": _time(c.start_time), **_cpu_and_memory(c.usage)}
                    for c in pod.containers
                ],
                **_cpu_and_memory(pod.usage),
            }
        )
    return {"node": node, "pods": pods}


def _cpu_and_memory(usage: Usage) -> dict[str, Any]:
    when = _time(usage.time_ms / 1000)
    cpu: dict[str, Any] = {"time": when, "usageCoreNanoSeconds": round(usage.cpu_seconds * 1e9)}
    if usage.cpu_nano_cores is not None:
        cpu["usageNanoCores"] = round(usage.cpu_nano_cores)
    return {"cpu": cpu, "memory": {"time": when, "workingSetBytes": round(usage.memory_bytes)}}


def _time(unix_seconds: float) -> str:
    return rfc3339(dt.datetime.fromtimestamp(int(unix_seconds), tz=dt.UTC))


def running_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Return the `/runningpods/` PodList: each pod with at least one running container
    (by its status), reduced to what a container runtime knows of it (name, namespace,
    UID; name and image of the running containers)."""
    items: list[dict[str, Any]] = []
    for pod in pods:
        meta = meta_of(pod)
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        running = [
            {"name": s.get("name"), "image": s.get("image")}
            for s in statuses
            if isinstance(s, Mapping) and "running" in (s.get("state") or {})
        ]
        if running:
            items.append(
                {
                    "metadata": {
                        "name": meta.get("name"),
                        "namespace": meta.get("namespace"),
                        "uid": meta.get("uid"),
                    },
                    "spec": {"containers": running},
                    "status": {},
                }
            )
    items.sort(key=lambda p: (namespace_of(p), name_of(p)))
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
