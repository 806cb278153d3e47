"""The fleet benchmark's latency phase (I/O; what is measured and reported is in
`fleet_slo`): pods through the virtual nodes at a steady rate, and the same work done by
each control plane alone, in the same run, on the same fleet.

Three rounds of `pods` pods each, at the same time, each made at `rate` pods per second
(an open loop: a slow answer does not slow the next create), then deleted at the same rate
once every one of the round runs. At the same time, pod for pod, so that every round meets
the same load of the machine at each moment: on CPUs shared with other work, rounds one
after the other measured how the background drifted more than how they differ.

1. below alone: pods bound (spec.nodeName) to the lower clusters' kwok Nodes, spread evenly
   over the lower clusters, in a namespace of their own;
2. upstairs alone: pods bound to a kwok Node of the upper cluster (tainted, so that no
   scheduler places anything else there);
3. through tensile: pods bound to the virtual nodes, spread evenly, seen upstairs and below.

The pods request nothing (the virtual nodes' offers the placement configurations wait for
stay as they were) and are watched by one informer per cluster; the time of a change is
when the benchmark's watch delivered it (`time.monotonic`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fleet_slo as slo
import harness

from devcluster import kwok
from devcluster.fleet import Fleet
from tensile.contracts.objects import (
    deletion_timestamp_of,
    name_of,
    namespace_of,
    uid_of,
)
from tensile.contracts.ownership import upper_uid_of
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import PODS

LABEL = "fleet-slo"
"""On every pod of this phase (the informers select it; the virtual nodes copy it below)."""
BASE_NAMESPACE = "fleet-slo-baseline"
"""The baselines' pods, upstairs and below."""
VIA_NAMESPACE = "fleet-slo"
"""The pods through tensile (the virtual nodes make it below)."""
UPPER_NODE = "slo-baseline"
"""The upper cluster's kwok Node of the upstairs baseline."""
UPPER_NODE_TAINT = {"key": LABEL, "value": "baseline", "effect": "NoSchedule"}
IN_FLIGHT = 64
"""Requests of one round in flight at most (the open loop's bound: a round that cannot keep
its rate falls behind rather than opening thousands of connections)."""
GRACE_SECONDS = 1
"""The pods' terminationGracePeriodSeconds: a delete is graceful (upstairs, the virtual
node sees the deletionTimestamp and deletes below), and short."""


def pod(name: str, *, node: str, round_: str) -> dict[str, Any]:
    """A pod bound to `node`, requesting nothing, tolerating every taint."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: round_.replace(" ", "-")}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "containers": [{"name": "main", "image": "nginx:1.27"}],
        },
    }


@dataclass
class Seen:
    """The timelines one cluster's watch fills in: pods by name (baselines) and crossings by
    upper UID (through tensile)."""

    cluster: str
    side: str
    """"upper" or "lower"."""
    by_name: dict[str, slo.Timeline] = field(default_factory=dict)
    crossings: dict[str, slo.Crossing] = field(default_factory=dict)
    """Shared by every cluster's watch: upper UID -> crossing."""
    clusters_of: Mapping[str, str] = field(default_factory=dict)
    """Upstairs: virtual node -> its lower cluster."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def timeline(self, pod: Mapping[str, Any]) -> slo.Timeline | None:
        if namespace_of(pod) == BASE_NAMESPACE:
            return self.by_name.setdefault(name_of(pod), slo.Timeline())
        if namespace_of(pod) != VIA_NAMESPACE:
            return None
        if self.side == "upper":
            crossing = self.crossings.setdefault(uid_of(pod), slo.Crossing(cluster=""))
            if not crossing.cluster:
                crossing.cluster = self.clusters_of.get(pod["spec"].get("nodeName", ""), "")
            return crossing.upper
        uid = upper_uid_of(pod)
        if uid is None:
            return None
        crossing = self.crossings.setdefault(uid, slo.Crossing(cluster=self.cluster))
        crossing.cluster = self.cluster
        return crossing.lower

    def seen(self, pod: Mapping[str, Any]) -> None:
        t = self.timeline(pod)
        if t is None:
            return
        now = time.monotonic()
        if t.seen is None:
            t.seen = now
        if t.running is None and (pod.get("status") or {}).get("phase") == "Running":
            t.running = now
        if t.deleting is None and deletion_timestamp_of(pod):
            t.deleting = now
        self.changed.set()

    def gone(self, pod: Mapping[str, Any]) -> None:
        t = self.timeline(pod)
        if t is not None and t.gone is None:
            t.gone = time.monotonic()
            self.changed.set()


class Watches:
    """The pod informers of this phase, as an async context: one per lower cluster; upstairs
    one for the baseline's pods and one per virtual node for the pods bound to it, selected
    as the virtual node selects its own (spec.nodeName), so that the benchmark learns of a
    bind about when the virtual node does: one watch carrying every pod of the phase lagged
    seconds behind the virtual nodes' own on a loaded machine, and a stage begun at its
    sight would have credited that lag to tensile."""

    def __init__(
        self,
        clients: Mapping[str, ApiClient],
        seen: Mapping[str, Seen],
        *,
        upper: str,
        virtual_nodes: Sequence[str],
    ) -> None:
        self._informers = []
        for cluster, client in clients.items():
            selections: list[tuple[str, str | None, str | None]]
            if cluster != upper:
                selections = [(f"slo-{cluster}", None, None)]
            else:
                selections = [(f"slo-{cluster}-baseline", BASE_NAMESPACE, None)] + [
                    (f"slo-{cluster}-{node}", VIA_NAMESPACE, f"spec.nodeName={node}")
                    for node in virtual_nodes
                ]
            s = seen[cluster]
            for name, namespace, field_selector in selections:
                informer = Informer(
                    client,
                    PODS,
                    name=name,
                    namespace=namespace,
                    label_selector=LABEL,
                    field_selector=field_selector,
                )
                informer.add_handlers(
                    Handlers(
                        on_add=s.seen, on_update=lambda _o, n, s=s: s.seen(n), on_delete=s.gone
                    )
                )
                self._informers.append(informer)
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Watches:
        self._tasks = [
            asyncio.create_task(i.run(), name=f"fleet-bench-{i.name}") for i in self._informers
        ]
        await asyncio.gather(*(i.wait_synced() for i in self._informers))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def open_loop(
    jobs: Sequence[Callable[[], Awaitable[Any]]],
    *,
    rate: float,
    started: Callable[[int, float], None],
    answered: Callable[[int, float, Any], None] = lambda _i, _t, _a: None,
) -> None:
    """Start job i at i / `rate` seconds (at most IN_FLIGHT at once); `started(i, t)` is
    told the monotonic time its request is sent, `answered(i, t, answer)` when it is
    answered."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    t0 = time.monotonic()

    async def one(i: int, job: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            started(i, time.monotonic())
            answer = await job()
            answered(i, time.monotonic(), answer)

    tasks = []
    for i, job in enumerate(jobs):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, job), name=f"fleet-slo-{i}"))
    await asyncio.gather(*tasks)


async def wait_for(
    what: str, done: Callable[[], bool], seen: Sequence[Seen], timeout: float
) -> None:
    """Wait until `done()` holds, looking again whenever a watch saw a change. Raises
    TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"fleet SLO: {what}: not after {timeout:.0f}s")
        for s in seen:
            s.changed.clear()
        waits = [asyncio.ensure_future(s.changed.wait()) for s in seen]
        try:
            await asyncio.wait(waits, timeout=min(left, 1.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


async def _delete(client: ApiClient, namespace: str, name: str) -> None:
    try:
        await client.request("DELETE", PODS.path(namespace=namespace, name=name))
    except errors.NotFound:
        pass


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where one pod of a round goes: its cluster (whose client makes it) and Node."""

    cluster: str
    node: str
    name: str


async def _round(
    targets: Sequence[Target],
    *,
    namespace: str,
    round_: str,
    clients: Mapping[str, ApiClient],
    lines: Callable[[Target], slo.Timeline],
    everything: Sequence[Seen],
    rate: float,
    timeout: float,
    say: Callable[[str], None],
) -> None:
    """Create `targets` at `rate`, wait until all run, delete them at `rate`, wait until all
    are gone (below too: `lines` gives the timeline that must see it gone)."""

    def created(i: int, t: float) -> None:
        lines(targets[i]).sent = t

    started = time.monotonic()
    await open_loop(
        [
            lambda t=t: clients[t.cluster].request(
                "POST", PODS.path(namespace=namespace), body=pod(t.name, node=t.node, round_=round_)
            )
            for t in targets
        ],
        rate=rate,
        started=created,
    )
    await wait_for(
        f"{round_}: {len(targets)} pods Running",
        lambda: all(lines(t).running is not None for t in targets),
        everything,
        timeout,
    )
    say(f"  {round_}: {len(targets)} pods Running after {time.monotonic() - started:.0f} s")

    def deleting(i: int, t: float) -> None:
        lines(targets[i]).delete_sent = t

    started = time.monotonic()
    await open_loop(
        [lambda t=t: _delete(clients[t.cluster], namespace, t.name) for t in targets],
        rate=rate,
        started=deleting,
    )
    await wait_for(
        f"{round_}: {len(targets)} pods gone",
        lambda: all(lines(t).gone is not None for t in targets),
        everything,
        timeout,
    )
    say(f"  {round_}: {len(targets)} pods gone after {time.monotonic() - started:.0f} s")


async def _namespace(client: ApiClient, name: str) -> None:
    try:
        await harness.create_namespace(client, name)
    except errors.AlreadyExists:
        pass


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What the phase measured: stage -> cluster -> seconds, and the baselines the same."""

    stages: dict[str, dict[str, list[float]]]
    baselines: dict[str, dict[str, list[float]]]
    delivery: dict[str, dict[str, list[float]]]
    """The upper's own part before the stages (`fleet_slo.upper_delivery`)."""
    pods: int
    own_lag: list[float]
    """The benchmark's own event loop lag meanwhile (seconds, ten samples a second): how
    late its watches may have seen a change, the error bar of every time above."""


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _sample_lag(into: list[float], *, interval: float = 0.1) -> None:
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + interval
        await asyncio.sleep(interval)
        into.append(max(0.0, loop.time() - asked))


async def run(
    fleet: Fleet,
    *,
    pods: int,
    rate: float,
    lower_nodes: Mapping[str, Sequence[str]],
    virtual_nodes: Mapping[str, str],
    timeout: float,
    say: Callable[[str], None],
) -> Measured:
    """Run the three rounds (see the module docstring) on `fleet`; `lower_nodes`: lower
    cluster -> kwok Nodes the baseline pods may be bound to; `virtual_nodes`: virtual node
    -> its lower cluster. Removes what it made but the namespaces."""
    lowers = sorted(lower_nodes)
    fleet.add_lower_node(
        kwok.FakeNode(name=UPPER_NODE, pods=str(pods + 10), taints=(UPPER_NODE_TAINT,)),
        cluster=fleet.upper.name,
        timeout=timeout,
    )
    crossings: dict[str, slo.Crossing] = {}
    seen = {
        fleet.upper.name: Seen(
            cluster=fleet.upper.name, side="upper", crossings=crossings, clusters_of=virtual_nodes
        ),
        **{c: Seen(cluster=c, side="lower", crossings=crossings) for c in lowers},
    }
    everything = list(seen.values())
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            c: await stack.enter_async_context(harness.client_for(fleet.cluster(c).kubeconfig))
            for c in seen
        }
        stack.push_async_callback(_delete_node, clients[fleet.upper.name])
        for client in clients.values():
            await _namespace(client, BASE_NAMESPACE)
        await _namespace(clients[fleet.upper.name], VIA_NAMESPACE)
        upper = fleet.upper.name
        below = [
            Target(
                cluster=lowers[i % len(lowers)],
                node=_pick(lower_nodes[lowers[i % len(lowers)]], i // len(lowers)),
                name=f"below-{i:05d}",
            )
            for i in range(pods)
        ]
        above = [Target(cluster=upper, node=UPPER_NODE, name=f"above-{i:05d}") for i in range(pods)]
        nodes = sorted(virtual_nodes)
        via = [
            Target(cluster=upper, node=nodes[i % len(nodes)], name=f"via-{i:05d}")
            for i in range(pods)
        ]
        say(
            f"  at the same time, {pods} pods each at {rate:g}/s: below alone (over "
            f"{len(lowers)} lower clusters), upstairs alone (kwok Node {UPPER_NODE}), through "
            f"tensile (over {len(nodes)} virtual nodes)"
        )
        own_lag: list[float] = []
        sampler = asyncio.create_task(_sample_lag(own_lag), name="fleet-slo-own-lag")
        stack.push_async_callback(_cancelled, sampler)
        async with Watches(clients, seen, upper=upper, virtual_nodes=nodes):
            await asyncio.gather(
                _round(
                    below,
                    namespace=BASE_NAMESPACE,
                    round_="below alone",
                    clients=clients,
                    lines=lambda t: seen[t.cluster].by_name.setdefault(t.name, slo.Timeline()),
                    everything=everything,
                    rate=rate,
                    timeout=timeout,
                    say=say,
                ),
                _round(
                    above,
                    namespace=BASE_NAMESPACE,
                    round_="upstairs alone",
                    clients=clients,
                    lines=lambda t: seen[upper].by_name.setdefault(t.name, slo.Timeline()),
                    everything=everything,
                    rate=rate,
                    timeout=timeout,
                    say=say,
                ),
                _via_round(
                    via,
                    client=clients[upper],
                    seen=seen,
                    everything=everything,
                    rate=rate,
                    timeout=timeout,
                    say=say,
                ),
            )
        lower_lines = {c: list(seen[c].by_name.values()) for c in lowers}
        upper_lines = {upper: list(seen[upper].by_name.values())}
        return Measured(
            stages=slo.stage_samples(list(crossings.values())),
            delivery=slo.upper_delivery(list(crossings.values())),
            baselines={
                **slo.baseline_samples(lower_lines, side="lower"),
                **slo.baseline_samples(upper_lines, side="upper"),
            },
            pods=pods,
            own_lag=own_lag,
        )


async def _via_round(
    targets: Sequence[Target],
    *,
    client: ApiClient,
    seen: Mapping[str, Seen],
    everything: Sequence[Seen],
    rate: float,
    timeout: float,
    say: Callable[[str], None],
) -> None:
    """The round through tensile: made and deleted upstairs; done when every upper pod runs
    (created: when every lower one is gone, and the upper ones with them)."""
    upper = seen[targets[0].cluster]
    by_name: dict[str, str] = {}
    """Upper pod name -> UID (from the create's answer)."""

    def crossing(uid: str, node: str) -> slo.Crossing:
        found = upper.crossings.setdefault(uid, slo.Crossing(cluster=""))
        found.cluster = found.cluster or upper.clusters_of.get(node, "")
        return found

    def made(i: int, t: float, answer: Any) -> None:
        by_name[targets[i].name] = uid_of(answer)
        crossing(uid_of(answer), targets[i].node).upper.committed = t

    def deleted(i: int, t: float, _answer: Any) -> None:
        crossing(by_name[targets[i].name], targets[i].node).upper.delete_committed = t

    def crossings() -> list[slo.Crossing]:
        return [upper.crossings[u] for u in by_name.values() if u in upper.crossings]

    def make(t: Target) -> Awaitable[Any]:
        body = pod(t.name, node=t.node, round_="via")
        return client.request("POST", PODS.path(namespace=VIA_NAMESPACE), body=body)

    started = time.monotonic()
    await open_loop(
        [lambda t=t: make(t) for t in targets],
        rate=rate,
        started=lambda _i, _t: None,
        answered=made,
    )
    await wait_for(
        f"through tensile: {len(targets)} upper pods Running",
        lambda: (
            len(by_name) == len(targets)
            and all(c.upper.running is not None for c in crossings())
            and len(crossings()) == len(targets)
        ),
        everything,
        timeout,
    )
    say(f"  through tensile: {len(targets)} pods Running after {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    await open_loop(
        [lambda t=t: _delete(client, VIA_NAMESPACE, t.name) for t in targets],
        rate=rate,
        started=lambda _i, _t: None,
        answered=deleted,
    )
    await wait_for(
        f"through tensile: {len(targets)} pods gone upstairs and below",
        lambda: all(c.lower.gone is not None and c.upper.gone is not None for c in crossings()),
        everything,
        timeout,
    )
    say(f"  through tensile: {len(targets)} pods gone after {time.monotonic() - started:.0f} s")


def _pick(nodes: Sequence[str], i: int) -> str:
    return nodes[i % len(nodes)]


async def _delete_node(client: ApiClient) -> None:
    try:
        await client.request("DELETE", f"/api/v1/nodes/{UPPER_NODE}")
    except errors.NotFound:
        pass
