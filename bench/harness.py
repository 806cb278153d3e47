"""What the forwarding and scale benchmarks share: bench pods, timed runs through a
cluster, the CPU and memory of processes, and a virtual node's metrics.

Measures that hold on a busy machine come first: CPU seconds of each process (from /proc),
requests counted by the node itself, resident memory per pod as a slope between two pod
counts. Wall-clock times are printed too, as ratios against baselines measured in the same
run.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts.objects import name_of, namespace_of
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import NAMESPACES, PODS

NAMESPACE_PREFIX = "bench-"


def pod(name: str, *, node: str | None) -> dict[str, Any]:
    """A bench pod: one container, 10m CPU and 16Mi requested; pinned to `node` (a virtual
    node, tolerated) or left to the scheduler."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "nginx:1.27",
             "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
        ]
    }  # fmt: skip
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        spec["tolerations"] = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def new_namespace() -> str:
    return f"{NAMESPACE_PREFIX}{secrets.token_hex(3)}"


def client_for(kubeconfig: Path) -> ApiClient:
    return ApiClient(config.load(str(kubeconfig)), name="bench", qps=0, connections=64)


async def create_namespace(client: ApiClient, namespace: str) -> None:
    """Create `namespace` and wait for its `default` ServiceAccount (pods are refused
    until the ServiceAccount controller made it)."""
    await client.request("POST", NAMESPACES.path(), body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})  # fmt: skip
    while True:
        try:
            await client.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except errors.NotFound:
            await asyncio.sleep(0.1)


class PodWatch:
    """When each pod of one namespace was first seen Running (monotonic seconds)."""

    def __init__(self, client: ApiClient, namespace: str) -> None:
        self.running: dict[str, float] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._count_waiters: list[tuple[int, asyncio.Event]] = []
        self._informer = Informer(client, PODS, name=f"bench-{namespace}", namespace=namespace)
        self._informer.add_handlers(
            Handlers(on_add=self._seen, on_update=lambda _o, n: self._seen(n))
        )
        self._task: asyncio.Task[None] | None = None

    def _seen(self, obj: dict[str, Any]) -> None:
        name = name_of(obj)
        if (obj.get("status") or {}).get("phase") == "Running" and name not in self.running:
            self.running[name] = time.monotonic()
            if name in self._waiters:
                self._waiters.pop(name).set()
            for count, event in self._count_waiters:
                if len(self.running) >= count:
                    event.set()

    async def __aenter__(self) -> PodWatch:
        self._task = asyncio.create_task(self._informer.run(), name="bench-watch")
        await self._informer.wait_synced()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def running_at(self, name: str, *, timeout: float) -> float:
        if name not in self.running:
            event = self._waiters.setdefault(name, asyncio.Event())
            await asyncio.wait_for(event.wait(), timeout)
        return self.running[name]

    async def all_running(self, count: int, *, timeout: float) -> None:
        if len(self.running) < count:
            event = asyncio.Event()
            self._count_waiters.append((count, event))
            await asyncio.wait_for(event.wait(), timeout)


@dataclass
class Timed:
    """N pods created at once (bounded concurrency) until all were Running."""

    pods: int
    total: float
    """Seconds from the first create to the last pod Running."""
    latencies: list[float]
    """Per pod, create -> Running, seconds."""

    @property
    def rate(self) -> float:
        return self.pods / self.total


async def create_pods(
    kubeconfig: Path,
    *,
    namespace: str,
    pods: int,
    concurrency: int,
    node: str | None,
    timeout: float = 1800.0,
) -> Timed:
    """Create `pods` pods in the new `namespace` and return how long they took to run.
    The namespace is left in place (see `delete_namespaces`)."""
    async with client_for(kubeconfig) as client:
        await create_namespace(client, namespace)
        async with PodWatch(client, namespace) as watch:
            created: dict[str, float] = {}
            gate = asyncio.Semaphore(concurrency)

            async def create(i: int) -> None:
                name = f"p-{i:05d}"
                async with gate:
                    created[name] = time.monotonic()
                    await client.request(
                        "POST", PODS.path(namespace=namespace), body=pod(name, node=node)
                    )

            start = time.monotonic()
            await asyncio.gather(*(create(i) for i in range(pods)))
            await watch.all_running(pods, timeout=timeout)
            total = max(watch.running.values()) - start
            return Timed(
                pods=pods,
                total=total,
                latencies=[watch.running[n] - created[n] for n in created],
            )


async def delete_namespaces(
    fleet: Fleet, namespaces: Iterable[str], *, timeout: float = 900
) -> None:
    """Delete bench namespaces upstairs and below, and wait until none of their pods is left
    in any cluster (so the next measurement does not pay for this one's deletions)."""
    namespaces = list(namespaces)
    for cluster in (fleet.upper, fleet.lower):
        async with client_for(cluster.kubeconfig) as client:
            for namespace in namespaces:
                try:
                    await client.request("DELETE", NAMESPACES.path(name=namespace))
                except errors.NotFound:
                    pass
    deadline = time.monotonic() + timeout
    for cluster in (fleet.upper, fleet.lower):
        async with client_for(cluster.kubeconfig) as client:
            while True:
                items = (await client.request("GET", "/api/v1/pods"))["items"]
                if not [p for p in items if namespace_of(p) in namespaces]:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"bench pods of {namespaces} still there after {timeout}s")
                await asyncio.sleep(0.5)


# -- processes --------------------------------------------------------------------------------


def fleet_for_pods(*, pods: int, lower_nodes: int, prefix: str) -> tuple[Fleet, bool]:
    """(fleet, attached): the fleet of TENSILE_DEVCLUSTER_DIR if set (its network
    joined), else a new one (removed when stopped) with one lower cluster of `lower_nodes`
    kwok nodes that together take `pods` pods with room to spare, and no metrics-server (it
    would only add load);
    `attached` says which (an attached fleet is left running, only what the bench made goes)."""
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        fleet = Fleet.attach(Path(existing))
        fleet.join_network()
        return fleet, True
    per_node = pods // lower_nodes + 110
    fleet = Fleet.start(
        directory=Path(tempfile.mkdtemp(prefix=prefix)),
        settings=FleetSettings(
            lowers=(LowerClusterSettings(nodes=lower_nodes, pods=str(per_node)),),
            metrics_server=False,
        ),
        owns_directory=True,
    )
    return fleet, False


def release_fleet(fleet: Fleet, *, attached: bool, namespaces: list[str]) -> None:
    """Undo `fleet_for_pods`: an attached fleet keeps running and loses only the bench's
    `namespaces`; a fleet the bench started is stopped and its state removed."""
    if attached:
        asyncio.run(delete_namespaces(fleet, namespaces, timeout=3600))
    else:
        fleet.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process used so far (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@dataclass
class CpuMeter:
    """CPU seconds of named processes between `start` and `stop`."""

    pids: Callable[[], Mapping[str, int]]
    used: dict[str, float] = field(default_factory=dict)
    _start: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids().items()}

    def stop(self) -> dict[str, float]:
        now = {name: cpu_seconds(pid) for name, pid in self.pids().items()}
        self.used = {name: now[name] - self._start.get(name, now[name]) for name in now}
        return self.used


def fleet_pids(fleet: Fleet, *nodes: VirtualNodeProcess) -> dict[str, int]:
    pids = {name: ref.pid for name, ref in fleet.refs.items()}
    for node in nodes:
        if node.process is not None:
            pids[f"virtual node {node.name}"] = node.process.pid
    return pids


# -- a virtual node's metrics -----------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Return the samples of metric `name` in Prometheus text, by their sorted labels."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name:
            labels = tuple(sorted(_LABEL.findall(match["labels"] or "")))
            found[labels] = float(match["value"])
    return found


def requests_by_verb(text: str) -> dict[tuple[str, str, str], float]:
    """(cluster, verb, code) -> requests, from a node's metrics text."""
    result = {}
    for labels, value in samples(text, "tensile_api_requests_total").items():
        got = dict(labels)
        result[(got["cluster"], got["verb"], got["code"])] = value
    return result


def difference(after: Mapping[Any, float], before: Mapping[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def queue_state(text: str, queue: str) -> tuple[float, float]:
    """(keys processed, keys waiting) of a node's work queue."""
    done = samples(text, "tensile_workqueue_work_duration_seconds_count").get(
        (("queue", queue),), 0.0
    )
    depth = samples(text, "tensile_workqueue_depth").get((("queue", queue),), 0.0)
    return done, depth


def wait_reconciled(node: VirtualNodeProcess, *, keys: int, timeout: float = 600.0) -> float:
    """Wait until both pod queues of `node` have handled at least `keys` keys and are empty
    (every pod looked at since the node started); return when that was (monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        node.check()
        try:
            text = node.metrics()
        except (OSError, RuntimeError):  # nothing answers yet (a restart)
            text = ""
        states = [queue_state(text, q) for q in ("pods_from_upper", "status_from_lower")]
        if text and all(done >= keys and depth == 0 for done, depth in states):
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node.name}: queues {states} after {timeout}s")
        time.sleep(0.05)


def relists(node: VirtualNodeProcess, informer: str) -> float:
    return samples(node.metrics(), "tensile_reflector_relists_total").get(
        (("informer", informer),), 0.0
    )


def pct(values: list[float], q: float) -> float:
    """Return the nearest-rank percentile `q` (0 < q <= 1) of `values`: the smallest value
    with at least q * n of the n values at or below it (p99 of 100 samples is the 99th
    smallest, not the largest; p50 of an even count is the lower middle)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
