"""Usage of a virtual node's pods, from the lower kubelets' `/metrics/resource` (pure).

`scrape` does the I/O (which lower nodes, fetching, caching); here the decisions: parse the
Prometheus text a kubelet serves (pkg/kubelet/metrics/collectors/resource_metrics.go), keep
the series of this virtual node's lower pods, name them as upstairs (namespace, name, UID),
compute CPU rates between two measurements, keep a node CPU counter that never goes
backwards, and apply metrics-server's rules (pkg/scraper/client/resource/decode.go): a pod
with a container whose CPU or memory is zero or missing is left out entirely, and so is a
node whose CPU or memory is zero. Values a kubelet cannot mean (NaN, infinities, negative
counters, times no RFC 3339 timestamp can hold) count as missing, so whatever a lower
kubelet serves, what the node renders is well-formed. Nothing here does I/O or mutates
its inputs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Timestamp

from tensile.contracts import ownership
from tensile.contracts.objects import annotations_of, meta_of, name_of
from vnode.provider import ContainerUsage, NodeUsage, PodUsage, Usage

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
LATEST_TIME = 253_402_300_799.0
"""9999-12-31T23:59:59Z in unix seconds: the last moment an RFC 3339 timestamp (metav1.Time,
what /stats/summary writes) can hold. Later times, and times <= 0, are impossible."""
MAX_CPU_SECONDS = 2.0**64 / _NANO
"""Core-seconds beyond this do not fit the summary's uint64 usageCoreNanoSeconds."""
MAX_BYTES = 2.0**64
"""Bytes beyond this do not fit the summary's uint64 workingSetBytes."""


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
    Samples that no kubelet can mean are dropped, as if not served: a value that is NaN,
    infinite or negative (every series read here is a counter, a size or a time, none of
    which can be negative), or a timestamp that is NaN or infinite. Kept, they would stay
    in the node's CPU ledger for good (a NaN sum is NaN forever) or fail the rendering.
    Raises ValueError when `text` is not in the text format.
    """
    samples = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in _WANTED:
                    continue
                value = float(sample.value)
                if not (_finite(value) and value >= 0 and _finite(sample.timestamp)):
                    continue
                samples.append(
                    Sample(
                        name=sample.name,
                        labels=dict(sample.labels),
                        value=value,
                        time_ms=_milliseconds(sample.timestamp),
                    )
                )
    except (ValueError, IndexError, TypeError) as exc:
        # The parser reports some malformed lines as IndexError/TypeError; callers need one.
        raise ValueError(f"not Prometheus text: {exc}") from exc
    return samples


def _finite(number: float | Timestamp | None) -> bool:
    """Tell whether a value or timestamp is a number (None and Timestamp objects are)."""
    return not isinstance(number, float) or math.isfinite(number)


def _milliseconds(timestamp: float | Timestamp | None) -> int | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, Timestamp):
        return timestamp.sec * 1000 + timestamp.nsec // 1_000_000
    return round(timestamp * 1000)


def metrics_path(node: Mapping[str, Any]) -> str:
    """Return the path of a lower node's resource metrics: its PATH_ANNOTATION when that is
    a plain absolute path, else DEFAULT_PATH (as metrics-server does, minus the odd values)."""
    annotations = annotations_of(node)
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
        name = name_of(node)
        raise ValueError(f"node {name} publishes no address")
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a host name
    endpoint = (status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}
    port = endpoint.get("Port") or KUBELET_PORT
    return f"https://{host}:{port}{path}"


def owned_pods(
    pods: Iterable[Mapping[str, Any]], *, made: Callable[[Mapping[str, Any]], bool]
) -> dict[LowerKey, OwnedPod]:
    """Return this virtual node's lower pods that are placed on a lower node, by lower key.

    `pods` are lower pods as the provider caches them (`slim`); `made` tells the pods this
    node made (`LowerPodBook.made`: the ownership marks, which anyone who may create pods
    below can copy, and the lower UID the node recorded). Other pods, and pods without
    their upper UID or namespace annotations, are not included: an impostor carrying the
    marks of an upper pod never has its usage reported as that pod's.
    """
    result = {}
    for pod in pods:
        if not made(pod):
            continue
        meta = meta_of(pod)
        annotations = meta.get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        uid = ownership.upper_uid_of(pod)
        namespace = annotations.get(ownership.UPPER_NAMESPACE_ANNOTATION)
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
        seconds = dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return seconds if plausible_time(seconds) else None


def plausible_time(unix_seconds: float) -> bool:
    """Tell whether a time (unix seconds) can be real: after the epoch and no later than
    LATEST_TIME. NaN and infinities are not."""
    return 0 < unix_seconds <= LATEST_TIME


def measure(
    samples: Iterable[Sample],
    *,
    node: str,
    pods: Mapping[LowerKey, OwnedPod],
    fetched_ms: int,
) -> list[PodUsage]:
    """Return the usage of this virtual node's pods found in one lower node's `samples`.

    Only pods that `pods` places on `node` count (a pod of another virtual node, or of
    nobody, is never reported). Values are as measured, zeros included (see `complete`);
    missing values are 0. Sample times default to `fetched_ms` (unix ms; metrics-server
    uses its request time likewise). A pod's CPU and memory are its pod-level series when
    the kubelet serves them non-zero (they include the sandbox), else the sum of its
    containers.

    Impossible values are checked here, so that every later step (rates, the ledger, the
    renderers of /metrics/resource and /stats/summary) can trust what it gets: a container
    whose start time or sample time is not `plausible_time` (e.g. milliseconds served as
    seconds) gets 0 for it, and a CPU or memory value too large for the summary's uint64
    fields counts as missing (0), so `complete` leaves its pod out, as metrics-server
    leaves out a pod with a zero value. An impossible pod-level series is ignored (the
    containers' sum stands in).
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
                usage=_pod_total(measured, pod_level.get(key, {})),
            )
        )
    return sorted(result, key=lambda p: (p.namespace, p.name))


def _container(
    name: str, series: Mapping[str, Sample], *, owned: OwnedPod, fetched_ms: int
) -> ContainerUsage:
    cpu = series.get(CONTAINER_CPU)
    memory = series.get(CONTAINER_MEMORY)
    start = series.get(CONTAINER_START)
    if start is not None and start.value > 0:
        start_time = start.value if plausible_time(start.value) else 0.0
    else:
        start_time = owned.start_time or 0.0
    return ContainerUsage(
        name=name,
        start_time=start_time,
        usage=Usage(
            time_ms=_time(cpu, memory, default=fetched_ms),
            cpu_seconds=_value(cpu, limit=MAX_CPU_SECONDS),
            memory_bytes=_value(memory, limit=MAX_BYTES),
        ),
    )


def _value(sample: Sample | None, *, limit: float) -> float:
    """A sample's value, 0 when it is missing or above `limit` (parse dropped NaN, inf, < 0)."""
    if sample is None or sample.value > limit:
        return 0.0
    return sample.value


def _time(*samples: Sample | None, default: int) -> int:
    """The samples' time (unix ms): the first one's that has one (metrics-server computes
    rates over CPU time: the CPU sample comes first), `default` when none has, 0 when any
    is impossible."""
    if _impossible_time(*samples):
        return 0
    stamped = [s.time_ms for s in samples if s is not None and s.time_ms]
    return stamped[0] if stamped else default


def _impossible_time(*samples: Sample | None) -> bool:
    return any(
        s is not None and s.time_ms and not plausible_time(s.time_ms / 1000) for s in samples
    )


def _pod_total(containers: Sequence[ContainerUsage], series: Mapping[str, Sample]) -> Usage:
    cpu, memory = series.get(POD_CPU), series.get(POD_MEMORY)
    if _impossible_time(cpu, memory):
        cpu = memory = None  # the containers' sum stands in
    pod_time = _time(cpu, memory, default=0)
    summed_cpu = sum(c.usage.cpu_seconds for c in containers)
    summed_memory = sum(c.usage.memory_bytes for c in containers)
    pod_cpu, pod_memory = _value(cpu, limit=MAX_CPU_SECONDS), _value(memory, limit=MAX_BYTES)
    return Usage(
        time_ms=max([pod_time] + [c.usage.time_ms for c in containers]),
        cpu_seconds=pod_cpu or summed_cpu,
        memory_bytes=pod_memory or summed_memory,
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
    node's CPU ledger (so the node's counter never goes backwards).

    The ledger is kept per container, not per pod: when the kubelet serves no pod-level
    series, a pod's CPU is the sum of its containers, and a restart of one container
    must carry only that container's previous total, not its whole pod's.
    """

    cpu: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    """Last reported (cumulative core-seconds, unix ms) by "uid" (pod) and "uid/container"."""
    node_cpu: tuple[float, int] | None = None
    """The node's last (cumulative core-seconds, unix ms)."""
    containers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Pod UID -> container name -> its last non-zero cumulative core-seconds, for every
    container seen while the pod lives (one that stopped being served, e.g. a finished
    init container, keeps counting with its last value)."""
    restarted: Mapping[str, float] = field(default_factory=dict)
    """Pod UID -> core-seconds of its containers' earlier runs (before they restarted)."""
    counted: Mapping[str, float] = field(default_factory=dict)
    """Pod UID -> the pod's cumulative core-seconds as counted in the node's CPU (never
    decreasing while the pod lives)."""
    carried: float = 0.0
    """Core-seconds of pods that are gone: still the node's."""


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
    that is gone leaves its CPU there for good); `now_ms`: unix ms, the node's time when no
    pod has one. The node is the sum of its pods: CPU by the ledger in `History`, memory
    of the pods measured now; it is None when either is 0. A pod's reported CPU is its
    ledger total: like the kubelet's pod cgroup counter, it includes what its restarted
    containers used before, so it never goes backwards either. Rates (nanocores) are set
    where the previous measurement is older and not larger.
    """
    ledger = _advance_ledger(history, measured=measured, alive=alive)
    cpu = {k: v for k, v in history.cpu.items() if k.partition("/")[0] in alive}
    pods = []
    for pod in measured:
        containers = tuple(
            dataclasses.replace(
                c, usage=_with_rate(c.usage, history.cpu.get(f"{pod.uid}/{c.name}"))
            )
            for c in pod.containers
        )
        pod_usage = dataclasses.replace(pod.usage, cpu_seconds=ledger.counted[pod.uid])
        pods.append(
            dataclasses.replace(
                pod,
                containers=containers,
                usage=_with_rate(pod_usage, history.cpu.get(pod.uid)),
            )
        )
        cpu[pod.uid] = (pod_usage.cpu_seconds, pod_usage.time_ms)
        for c in pod.containers:
            cpu[f"{pod.uid}/{c.name}"] = (c.usage.cpu_seconds, c.usage.time_ms)
    node_cpu = ledger.carried + sum(ledger.counted.values())
    node_memory = sum(p.usage.memory_bytes for p in measured)
    node_time = max((p.usage.time_ms for p in measured), default=0) or now_ms
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
        containers=ledger.containers,
        restarted=ledger.restarted,
        counted=ledger.counted,
        carried=ledger.carried,
    )
    return usage, following


@dataclass(frozen=True, kw_only=True)
class _Ledger:
    """The ledger fields of the next History (see there)."""

    containers: dict[str, dict[str, float]]
    restarted: dict[str, float]
    counted: dict[str, float]
    carried: float


def _advance_ledger(
    history: History, *, measured: Sequence[PodUsage], alive: Collection[str]
) -> _Ledger:
    carried = history.carried + sum(v for u, v in history.counted.items() if u not in alive)
    counted = {u: v for u, v in history.counted.items() if u in alive}
    restarted = {u: v for u, v in history.restarted.items() if u in alive}
    containers = {u: dict(c) for u, c in history.containers.items() if u in alive}
    for pod in measured:
        seen = containers.setdefault(pod.uid, {})
        earlier = restarted.get(pod.uid, 0.0)
        for c in pod.containers:
            now = c.usage.cpu_seconds
            if now <= 0:
                continue  # not measured (a zero is no restart): its last value holds
            before = seen.get(c.name)
            if before is not None and now < before:
                earlier += before  # this container started again: its previous run stays
            seen[c.name] = now
        if earlier:
            restarted[pod.uid] = earlier
        # The pod-level series, when served, is the pod cgroup's counter: it already keeps
        # what exited containers used, so it is at least the containers' ledger sum. The
        # max also holds the pod's counter where a series went back (samples of the pod
        # and its containers taken at slightly different times; a recreated sandbox, whose
        # new counter starts again: then the node undercounts by at most the old sandbox's
        # own share until the pod catches up, rather than counting the pod twice).
        counted[pod.uid] = max(
            counted.get(pod.uid, 0.0), pod.usage.cpu_seconds, earlier + sum(seen.values())
        )
    return _Ledger(containers=containers, restarted=restarted, counted=counted, carried=carried)


def lacks_rates(usage: NodeUsage) -> bool:
    """Tell whether some reported CPU has no rate (usageNanoCores): the node's, or that of
    a pod or container it reports."""
    if usage.node is not None and usage.node.cpu_nano_cores is None:
        return True
    return any(
        u.cpu_nano_cores is None
        for pod in usage.pods
        for u in (pod.usage, *(c.usage for c in pod.containers))
    )


def _with_rate(usage: Usage, previous: tuple[float, int] | None) -> Usage:
    if previous is None:
        return usage
    cpu_before, time_before = previous
    if usage.time_ms <= time_before or usage.cpu_seconds < cpu_before:
        return usage
    rate = (usage.cpu_seconds - cpu_before) / ((usage.time_ms - time_before) / 1000) * _NANO
    return dataclasses.replace(usage, cpu_nano_cores=rate)
