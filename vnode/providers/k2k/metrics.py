"""Usage of a virtual node's pods, from the lower kubelets' `/metrics/resource` (pure).

`scrape` does the I/O (which lower nodes, fetching, caching); here the decisions: parse the
Prometheus text a kubelet serves (pkg/kubelet/metrics/collectors/resource_metrics.go), keep
the series of this virtual node's lower pods, name them as upstairs (namespace, name, UID),
compute CPU rates between two measurements, keep a node CPU counter that never goes
backwards, and apply metrics-server's rules (pkg/scraper/client/resource/decode.go): a pod
with a container whose CPU or memory is zero or missing is left out entirely, and so is a
node whose CPU or memory is zero. Nothing here does I/O or mutates its inputs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Timestamp

from vnode.provider import ContainerUsage, NodeUsage, PodUsage, Usage
from vnode.providers.k2k import naming

DEFAULT_PATH = "/metrics/resource"
PATH_ANNOTATION = "metrics.k8s.io/resource-metrics-path"
"""Node annotation naming another path for the node's resource metrics (metrics-server >= 0.7
reads it; kwok's simulated nodes use it, as they all share one port)."""

CONTAINER_CPU = "container_cpu_usage_seconds_total"
CONTAINER_MEMORY = "container_memory_working_set_bytes"
CONTAINER_START = "container_start_time_seconds"
POD_CPU = "pod_cpu_usage_seconds_total"
POD_MEMORY = "pod_memory_working_set_bytes"
_WANTED = frozenset({CONTAINER_CPU, CONTAINER_MEMORY, CONTAINER_START, POD_CPU, POD_MEMORY})
"""Node-level series of the lower kubelets are not read: they count pods of others."""

_NANO = 1e9


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One sample of a series the lower kubelet served."""

    name: str
    labels: Mapping[str, str]
    value: float
    time_ms: int | None
    """The sample's own timestamp (unix ms), or None when the kubelet gave none."""


@dataclass(frozen=True, kw_only=True)
class OwnedPod:
    """A lower pod of this virtual node, with the upper names it stands for."""

    node: str
    """The lower node it runs on."""
    namespace: str
    """Upper namespace."""
    name: str
    uid: str
    """Upper UID."""
    start_time: float | None
    """status.startTime in unix seconds, or None."""


LowerKey = tuple[str, str]
"""(lower namespace, lower name) of a pod."""


def parse(text: str) -> list[Sample]:
    """Return the samples of the series this module reads from Prometheus text (format
    0.0.4, as kubelets serve it); other series are skipped.

    Sample timestamps are milliseconds in the text (converted from the parser's seconds).
    Raises ValueError when `text` is not in the text format.
    """
    samples = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in _WANTED:
                    continue
                samples.append(
                    Sample(
                        name=sample.name,
                        labels=dict(sample.labels),
                        value=float(sample.value),
                        time_ms=_milliseconds(sample.timestamp),
                    )
                )
    except (ValueError, IndexError, TypeError) as exc:
        # The parser reports some malformed lines as IndexError/TypeError; callers need one.
        raise ValueError(f"not Prometheus text: {exc}") from exc
    return samples


def _milliseconds(timestamp: float | Timestamp | None) -> int | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, Timestamp):
        return timestamp.sec * 1000 + timestamp.nsec // 1_000_000
    return round(timestamp * 1000)


def metrics_path(node: Mapping[str, Any]) -> str:
    """Return the path of a lower node's resource metrics: its PATH_ANNOTATION when that is
    a plain absolute path, else DEFAULT_PATH (as metrics-server does, minus the odd values)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    path = annotations.get(PATH_ANNOTATION)
    if (
        isinstance(path, str)
        and path.startswith("/")
        and not path.startswith("//")
        and ".." not in path.split("/")
        and not any(c in path for c in "?#%\\ ")
        and path.isprintable()
    ):
        return path
    return DEFAULT_PATH


KUBELET_PORT = 10250
_ADDRESS_TYPES = ("InternalIP", "ExternalIP", "Hostname")
"""metrics-server's default --kubelet-preferred-address-types, in order."""


def kubelet_url(node: Mapping[str, Any], path: str) -> str:
    """Return the https URL of `path` on a lower node's kubelet (for direct access).

    The address is the node's first of InternalIP, ExternalIP, Hostname; the port its
    status.daemonEndpoints.kubeletEndpoint.Port, else 10250. Raises ValueError when the node
    publishes no address.
    """
    status = node.get("status") or {}
    addresses = {
        a.get("type"): a.get("address")
        for a in reversed(status.get("addresses") or [])
        if isinstance(a, Mapping) and a.get("address")
    }
    host = next((str(addresses[t]) for t in _ADDRESS_TYPES if t in addresses), None)
    if host is None:
        name = (node.get("metadata") or {}).get("name")
        raise ValueError(f"node {name} publishes no address")
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a host name
    endpoint = (status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}
    port = endpoint.get("Port") or KUBELET_PORT
    return f"https://{host}:{port}{path}"


def owned_pods(pods: Iterable[Mapping[str, Any]], *, node_name: str) -> dict[LowerKey, OwnedPod]:
    """Return this virtual node's lower pods that are placed on a lower node, by lower key.

    `pods` are lower pods as the provider caches them (`slim`); pods of others, and pods
    without their upper UID or namespace annotations, are not included.
    """
    result = {}
    for pod in pods:
        if not naming.is_owned(pod, node_name=node_name):
            continue
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        uid = annotations.get(naming.UPPER_UID_ANNOTATION)
        namespace = annotations.get(naming.UPPER_NAMESPACE_ANNOTATION)
        if not (node and uid and namespace):
            continue
        result[(str(meta.get("namespace")), str(meta.get("name")))] = OwnedPod(
            node=str(node),
            namespace=str(namespace),
            name=str(meta.get("name")),
            uid=str(uid),
            start_time=_unix_seconds((pod.get("status") or {}).get("startTime")),
        )
    return result


def _unix_seconds(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def measure(
    samples: Iterable[Sample],
    *,
    node: str,
    pods: Mapping[LowerKey, OwnedPod],
    fetched_ms: int,
) -> list[PodUsage]:
    """Return the usage of this virtual node's pods found in one lower node's `samples`.

    Only pods that `pods` places on `node` count (a pod of another virtual node, or of
    nobody, is never reported). Values are as measured, zeros included (see `keep`);
    missing values are 0. Sample times default to `fetched_ms` (metrics-server uses its
    request time likewise). A pod's CPU and memory are its pod-level series when the
    kubelet serves them non-zero (they include the sandbox), else the sum of its containers.
    """
    containers: dict[LowerKey, dict[str, dict[str, Sample]]] = {}
    pod_level: dict[LowerKey, dict[str, Sample]] = {}
    for sample in samples:
        key = (sample.labels.get("namespace", ""), sample.labels.get("pod", ""))
        owned = pods.get(key)
        if owned is None or owned.node != node:
            continue
        if sample.name in (POD_CPU, POD_MEMORY):
            pod_level.setdefault(key, {})[sample.name] = sample
        elif container := sample.labels.get("container"):
            containers.setdefault(key, {}).setdefault(container, {})[sample.name] = sample
    result = []
    for key, by_name in containers.items():
        owned = pods[key]
        measured = tuple(
            _container(name, series, owned=owned, fetched_ms=fetched_ms)
            for name, series in sorted(by_name.items())
        )
        result.append(
            PodUsage(
                namespace=owned.namespace,
                name=owned.name,
                uid=owned.uid,
                start_time=owned.start_time,
                containers=measured,
                usage=_pod_total(measured, pod_level.get(key, {}), fetched_ms=fetched_ms),
            )
        )
    return sorted(result, key=lambda p: (p.namespace, p.name))


def _container(
    name: str, series: Mapping[str, Sample], *, owned: OwnedPod, fetched_ms: int
) -> ContainerUsage:
    cpu = series.get(CONTAINER_CPU)
    memory = series.get(CONTAINER_MEMORY)
    start = series.get(CONTAINER_START)
    start_time = start.value if start is not None and start.value > 0 else owned.start_time
    return ContainerUsage(
        name=name,
        start_time=start_time or 0.0,
        usage=Usage(
            time_ms=_time(cpu, memory, fetched_ms=fetched_ms),
            cpu_seconds=cpu.value if cpu is not None else 0.0,
            memory_bytes=memory.value if memory is not None else 0.0,
        ),
    )


def _time(*samples: Sample | None, fetched_ms: int) -> int:
    # metrics-server computes rates over CPU time: the CPU sample's time comes first.
    for sample in samples:
        if sample is not None and sample.time_ms:
            return sample.time_ms
    return fetched_ms


def _pod_total(
    containers: Sequence[ContainerUsage], series: Mapping[str, Sample], *, fetched_ms: int
) -> Usage:
    cpu, memory = series.get(POD_CPU), series.get(POD_MEMORY)
    summed_cpu = sum(c.usage.cpu_seconds for c in containers)
    summed_memory = sum(c.usage.memory_bytes for c in containers)
    return Usage(
        time_ms=max([_time(cpu, memory, fetched_ms=0)] + [c.usage.time_ms for c in containers]),
        cpu_seconds=cpu.value if cpu is not None and cpu.value > 0 else summed_cpu,
        memory_bytes=memory.value if memory is not None and memory.value > 0 else summed_memory,
    )


def complete(pod: PodUsage) -> bool:
    """Tell whether metrics-server would keep `pod`: every value of every container > 0."""
    return bool(pod.containers) and all(
        _positive(c.usage) and c.start_time > 0 for c in pod.containers
    )


def _positive(usage: Usage) -> bool:
    return usage.time_ms > 0 and usage.cpu_seconds > 0 and usage.memory_bytes > 0


@dataclass(frozen=True, kw_only=True)
class History:
    """What one snapshot leaves to the next: the last CPU measurements, for rates, and the
    node's CPU ledger (so the node's counter never goes backwards)."""

    cpu: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    """Last (cumulative core-seconds, unix ms) by "uid" (pod) and "uid/container"."""
    node_cpu: tuple[float, int] | None = None
    """The node's last (cumulative core-seconds, unix ms)."""
    counted: Mapping[str, float] = field(default_factory=dict)
    """Last cumulative core-seconds of each pod (by UID) counted in the node's CPU."""
    carried: float = 0.0
    """Core-seconds of pods that are gone, or whose counter restarted: still the node's."""


def snapshot(
    measured: Sequence[PodUsage],
    *,
    history: History,
    alive: Collection[str],
    complete_scrape: bool,
    now_ms: int,
) -> tuple[NodeUsage, History]:
    """Turn one round of measurements into what the node reports, and the next history.

    `measured`: every pod measured this round (zeros included); `alive`: UIDs of the pods
    the virtual node still has below, measured or not (an alive pod that was not measured,
    e.g. its lower node did not answer, keeps its last CPU in the node's counter; a pod
    that is gone leaves its CPU there for good). The node is the sum of its pods: CPU by
    the ledger in `History`, memory of the pods measured now; it is None when either is 0.
    Rates (nanocores) are set where the previous measurement is older and not larger.
    """
    cpu = {k: v for k, v in history.cpu.items() if k.partition("/")[0] in alive}
    pods = []
    for pod in measured:
        containers = tuple(
            dataclasses.replace(
                c, usage=_with_rate(c.usage, history.cpu.get(f"{pod.uid}/{c.name}"))
            )
            for c in pod.containers
        )
        pods.append(
            dataclasses.replace(
                pod, containers=containers, usage=_with_rate(pod.usage, history.cpu.get(pod.uid))
            )
        )
        cpu[pod.uid] = (pod.usage.cpu_seconds, pod.usage.time_ms)
        for c in pod.containers:
            cpu[f"{pod.uid}/{c.name}"] = (c.usage.cpu_seconds, c.usage.time_ms)
    counted, carried = _advance_ledger(history, measured=measured, alive=alive)
    node_cpu = carried + sum(counted.values())
    node_memory = sum(p.usage.memory_bytes for p in measured)
    node_time = max([p.usage.time_ms for p in measured], default=now_ms)
    node: Usage | None = None
    if node_cpu > 0 and node_memory > 0:
        node = _with_rate(
            Usage(time_ms=node_time, cpu_seconds=node_cpu, memory_bytes=node_memory),
            history.node_cpu,
        )
    usage = NodeUsage(
        pods=tuple(p for p in pods if complete(p)), node=node, complete=complete_scrape
    )
    following = History(
        cpu=cpu,
        node_cpu=(node_cpu, node_time) if node is not None else history.node_cpu,
        counted=counted,
        carried=carried,
    )
    return usage, following


def _advance_ledger(
    history: History, *, measured: Sequence[PodUsage], alive: Collection[str]
) -> tuple[dict[str, float], float]:
    now = {p.uid: p.usage.cpu_seconds for p in measured}
    carried = history.carried
    counted: dict[str, float] = {}
    for uid, before in history.counted.items():
        if uid in now:
            if now[uid] < before:
                carried += before  # its counter started again (a container restarted)
        elif uid in alive:
            counted[uid] = before  # not measured this round: keep what it had
        else:
            carried += before  # gone: what it used stays the node's
    counted.update(now)
    return counted, carried


def _with_rate(usage: Usage, previous: tuple[float, int] | None) -> Usage:
    if previous is None:
        return usage
    cpu_before, time_before = previous
    if usage.time_ms <= time_before or usage.cpu_seconds < cpu_before:
        return usage
    rate = (usage.cpu_seconds - cpu_before) / ((usage.time_ms - time_before) / 1000) * _NANO
    return dataclasses.replace(usage, cpu_nano_cores=rate)
