"""Fleet benchmark: placement across many lower clusters, with and without a fit-aware
scheduler extender (issue 23).

One upper cluster over L lower clusters (one etcd; lower clusters run only the controllers
they need) of N kwok Nodes of mixed sizes each, one virtual node per lower cluster. Every
other lower cluster is *fragmented*: a filler pod on each Node leaves 1 CPU free there, so
its virtual node offers much CPU in total and no room for a 2-CPU pod; the others keep 4
CPU holes on every other Node (`fleet_plan`). The same workload runs in each
configuration, one after the other on the same fleet:

  (a) webhook + descheduler (the safety net only),
  (b) + the tensile-scheduler extender,
  (c) + the extender with namespace quota slices.

The workload (P pods, `fleet_plan.mix`): Deployments of small (50m) and large (2 CPU)
pods, bare pods (a quarter large), a StatefulSet of large pods with a volume each (on
lower Nodes reserved for it by a taint), and two namespaces with a ResourceQuota on
cpu/memory whose Deployments are small. Every object is made first; then the benchmark
starts its own upper kube-scheduler (in place of the fleet's, with or without the
extender), so its throughput is measured on a full queue. Reported per configuration, with ratios
against (a): pods Running; pods stranded (still Pending once nothing changed for two
descheduling rounds past --unschedulable-timeout); evictions, bare pods re-created and
moves (the descheduler's own metrics); seconds from the scheduler's start until every pod
ran; the upper scheduler's binds per second over the pods that existed at its start; the
extender's call latency p50/p99 (its metrics); CPU seconds (from the first create on) and
resident memory (at the end) of each component, from /proc.

Before the configurations, the latency objectives (`fleet_latency`, reported by
`fleet_slo`): --slo-pods pods through the virtual nodes at --slo-rate pods per second, and
the same done by each control plane alone at the same time; p50/p99 per lower cluster and
overall of upper bind -> lower pod created, lower Running -> upper Running, upper delete ->
lower pod gone, against the baseline, with the objective p99 <= 1 s beyond it; beside
them the upper's own delivery of the writes to its watchers, and the virtual nodes' queue
waits, handling and request durations meanwhile (`fleet_inside`: what of a stage is
tensile's). With an extender, where its calls' time goes: its CPU per call, its event
loop's lag, its garbage collector's pauses, the loop lag of a process doing nothing (the
machine's share), and a baseline extender kube-scheduler calls for every pod right after
it: the same program judging nothing (`fleet_scheduler.baseline_extender`); the target,
p99 <= 5 ms, is met by the extender's p99 alone or by what it adds to the baseline's.

    .venv/bin/python bench/fleet.py [--lower-clusters 10] [--nodes-per-cluster 1000]
        [--pods 10000] [--configs a,b,c] [--slo-pods 2000] [--slo-rate 40] [--quick]

On 2 cores, 10 x 200 Nodes with 2,000 pods took 14 minutes; the defaults (10,000 kwok
Nodes) take well over half an hour; the smallest run (2 x 20 Nodes, 200 pods) about three;
--quick (that scale, configuration b only, 100 pods a latency round) about four.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fleet_build as build
import fleet_inside as inside
import fleet_latency as latency
import fleet_plan as plan
import fleet_scheduler as upper_scheduler
import fleet_slo as slo
import harness

from devcluster import processes
from devcluster.deschedulers import DeschedulerProcess
from devcluster.fleet import Fleet
from devcluster.programs import Program
from devcluster.vnodes import VirtualNodeProcess
from devcluster.webhooks import WebhookProcess
from tensile.contracts.objects import deletion_timestamp_of, name_of, namespace_of, uid_of
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import PODS

FLEET_SCHEDULER = "upper-scheduler"


@dataclass(frozen=True, kw_only=True)
class Config:
    name: str
    title: str
    extender: bool = False
    slices: bool = False


CONFIGS = {
    "a": Config(name="a", title="webhook + descheduler"),
    "b": Config(
        name="b", title="+ extender (quota'd namespaces exempted from slices)", extender=True
    ),
    "c": Config(name="c", title="+ extender + slices", extender=True, slices=True),
}


@dataclass(kw_only=True)
class Result:
    config: Config
    pods: int
    running: int = 0
    stranded: int = 0
    evicted: float = 0.0
    recreated: float = 0.0
    moved: float = 0.0
    left_alone: float = 0.0
    all_running: float | None = None
    """Seconds from the upper scheduler's start until every pod ran (None: never)."""
    last_running: float | None = None
    """Seconds from the upper scheduler's start until the last pod that ran did."""
    throughput: float | None = None
    extender_p50: float | None = None
    extender_p99: float | None = None
    extender_cpu_p99: float | None = None
    """The extender's own CPU time per call (its duration less this: waiting)."""
    loop_lag_p99: float | None = None
    """The extender's event loop lag."""
    gc_slow_pauses: float | None = None
    """The extender's garbage collector pauses over 5 ms."""
    probe_lag_p99: float | None = None
    """The event loop lag of a process doing nothing meanwhile: the machine's share."""
    baseline_p50: float | None = None
    baseline_p99: float | None = None
    """The baseline extender's calls (`fleet_scheduler.baseline_extender`): the same
    program and calls, judging nothing."""
    baseline_cpu_p99: float | None = None
    slice_admitted: float | None = None
    slice_refused: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    """MiB, summed per component group, at the end."""
    stranded_pods: list[str] = field(default_factory=list)


class PodTracker:
    """The benchmark's pods of one configuration upstairs, as an informer sees them: when
    each was first seen bound and first seen Running (monotonic seconds)."""

    def __init__(self, client: ApiClient, config: str) -> None:
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.informer = Informer(
            client, PODS, name=f"fleet-{config}", label_selector=f"{plan.BENCH_LABEL}={config}"
        )
        self.informer.add_handlers(
            Handlers(on_add=self._seen, on_update=lambda _o, n: self._seen(n))
        )
        self._task: asyncio.Task[None] | None = None

    def _seen(self, pod: dict[str, Any]) -> None:
        uid, now = uid_of(pod), time.monotonic()
        if pod["spec"].get("nodeName") and uid not in self.bound:
            self.bound[uid] = now
        if (pod.get("status") or {}).get("phase") == "Running" and uid not in self.running:
            self.running[uid] = now

    async def __aenter__(self) -> PodTracker:
        self._task = asyncio.create_task(self.informer.run(), name="fleet-bench-pods")
        await self.informer.wait_synced()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def live(self) -> list[dict[str, Any]]:
        """Pods not being deleted."""
        return [p for p in self.informer.store if not deletion_timestamp_of(p)]

    def state(self) -> tuple[int, int, frozenset[str], int]:
        """(pods, Running pods, names of the Pending ones, pods ever bound)."""
        pods = self.live()
        running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        pending = frozenset(
            f"{namespace_of(p)}/{name_of(p)}"
            for p in pods
            if (p.get("status") or {}).get("phase", "Pending") == "Pending"
        )
        return len(pods), running, pending, len(self.bound)


# -- processes and their cost ------------------------------------------------------------------


def group(name: str) -> str | None:
    """The component group a process is counted in (None: not counted)."""
    return plan.component_group(name)


@dataclass
class Meter:
    """CPU seconds of processes between `start` and `stop`, by component group; a process
    started in between counts from its start."""

    start_cpu: dict[int, float] = field(default_factory=dict)

    def start(self, pids: Mapping[str, int]) -> None:
        self.start_cpu = {pid: harness.cpu_seconds(pid) for pid in pids.values()}

    def stop(self, pids: Mapping[str, int]) -> tuple[dict[str, float], dict[str, float]]:
        cpu: dict[str, float] = {}
        rss: dict[str, float] = {}
        for name, pid in pids.items():
            kind = group(name)
            if kind is None:
                continue
            try:
                used = harness.cpu_seconds(pid) - self.start_cpu.get(pid, 0.0)
                resident = harness.rss_kib(pid) / 1024
            except (OSError, RuntimeError):  # it exited just now: its check says why
                continue
            cpu[kind] = cpu.get(kind, 0.0) + used
            rss[kind] = rss.get(kind, 0.0) + resident
        return cpu, rss


def process_ids(fleet: Fleet, programs: Mapping[str, Program | None]) -> dict[str, int]:
    pids = {name: ref.pid for name, ref in fleet.refs.items() if processes.recorded_alive(ref)}
    for name, program in programs.items():
        if program is not None and program.process is not None and program.process.alive():
            pids[name] = program.process.pid
    return pids


# -- one configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Bench:
    fleet: Fleet
    scale: plan.Scale
    mix: plan.Mix
    nodes: dict[str, list[plan.NodePlan]]
    """Lower cluster -> its Nodes."""
    virtual_nodes: list[VirtualNodeProcess]
    webhook: WebhookProcess
    offers: dict[str, int]
    log_dir: Path
    args: argparse.Namespace

    @property
    def settle(self) -> float:
        """Seconds without change after which Pending pods count as stranded: two rounds
        past the unschedulable timeout, and a margin."""
        return 2 * (self.args.unschedulable_timeout + self.args.descheduling_interval) + 10.0


async def run_config(bench: Bench, config: Config, say: Any, *, last: bool) -> Result:
    """Run configuration `config` on the bench's fleet and measure it; then (unless it is
    the `last`) remove what it made."""
    fleet, args = bench.fleet, bench.args
    # tensile-scheduler always runs its slice controller: without slices, the quota'd
    # namespaces are exempted by an administrator's record (as a user would do it).
    exempt = config.extender and not config.slices
    work = plan.workload(
        config.name, bench.mix, exempt_on=[n.name for n in bench.virtual_nodes] if exempt else ()
    )
    result = Result(config=config, pods=work.pods)
    descheduler = DeschedulerProcess(
        fleet,
        log_dir=bench.log_dir,
        name=f"descheduler-{config.name}",
        args=[
            f"--unschedulable-timeout={args.unschedulable_timeout:g}s",
            f"--descheduling-interval={args.descheduling_interval:g}s",
            f"--eviction-rate={args.eviction_rate:g}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--log-level=info",
        ],
    )
    extender = (
        upper_scheduler.extender(
            fleet, config=config.name, slices=config.slices, log_dir=bench.log_dir
        )
        if config.extender
        else None
    )
    baseline = (
        upper_scheduler.baseline_extender(fleet, config=config.name, log_dir=bench.log_dir)
        if config.extender
        else None
    )
    scheduler: upper_scheduler.UpperScheduler | None = None
    probe = upper_scheduler.LagProbe()
    programs: dict[str, Program | None] = {
        **{f"virtual node {n.name}": n for n in bench.virtual_nodes},
        "webhook": bench.webhook,
        "descheduler": descheduler,
        "extender": extender,
        "extender baseline": baseline,  # the benchmark's yardstick: in no group's CPU
    }
    try:
        descheduler.start(timeout=args.timeout)
        if extender is not None:
            extender.start(timeout=args.timeout)
        if baseline is not None:
            baseline.start(timeout=args.timeout)
        await make_volumes(bench, config.name)
        async with (
            harness.client_for(fleet.upper.kubeconfig) as client,
            PodTracker(client, config.name) as tracker,
        ):
            meter = Meter()
            meter.start(process_ids(fleet, programs))
            started = time.monotonic()
            await make_workload(client, work, config.name)
            await build.wait_until(
                f"({config.name}) {work.pods} pods made",
                _count_at_least(tracker, work.pods),
                timeout=args.timeout,
            )
            say(f"  ({config.name}) {work.pods} pods made in {time.monotonic() - started:.0f} s")
            # Pods with a claim wait for their volume (provisioned by a virtual node) before
            # they are bound: the scheduler's throughput is measured without them.
            first_wave = {uid_of(p) for p in tracker.live() if not _claims(p)}
            scheduler = upper_scheduler.UpperScheduler(
                fleet,
                config=config.name,
                extender=config.extender,
                log_dir=bench.log_dir,
                baseline_port=None if baseline is None else baseline.port,
            )
            t0 = time.monotonic()
            programs["upper scheduler"] = scheduler
            if extender is not None:
                probe.start()
            scheduler.start()
            result.all_running = await settle(
                bench, tracker, work.pods, t0=t0, say=say, config=config
            )
            result.probe_lag_p99 = probe.stop().get("p99")
            cpu, rss = meter.stop(process_ids(fleet, programs))
            result.cpu, result.rss = cpu, rss
            _, running, pending, _ = tracker.state()
            if tracker.running:
                result.last_running = max(tracker.running.values()) - t0
            result.running, result.stranded = running, len(pending)
            result.stranded_pods = sorted(pending)[:10]
            result.throughput = plan.bind_rate(
                [tracker.bound[u] for u in first_wave if u in tracker.bound]
            )
        text = descheduler.metrics()
        result.evicted = sum(
            harness.samples(text, "tensile_descheduler_pods_evicted_total").values()
        )
        result.recreated = sum(
            harness.samples(text, "tensile_descheduler_pods_recreated_total").values()
        )
        moves = harness.samples(text, "tensile_descheduler_moves_total")
        result.moved = sum(v for k, v in moves.items() if ("outcome", "moved") in k)
        result.left_alone = sum(v for k, v in moves.items() if ("outcome", "exhausted") in k)
        if extender is not None:
            text = extender.metrics()
            result.extender_p50, result.extender_p99 = upper_scheduler.extender_latency(text)
            _, result.extender_cpu_p99 = upper_scheduler.extender_latency(
                text, upper_scheduler.EXTENDER_CPU
            )
            _, result.loop_lag_p99 = upper_scheduler.extender_latency(
                text, upper_scheduler.LOOP_LAG
            )
            result.gc_slow_pauses = upper_scheduler.slow_pauses(text)
            if baseline is not None:
                text_of_baseline = baseline.metrics()
                result.baseline_p50, result.baseline_p99 = upper_scheduler.extender_latency(
                    text_of_baseline
                )
                _, result.baseline_cpu_p99 = upper_scheduler.extender_latency(
                    text_of_baseline, upper_scheduler.EXTENDER_CPU
                )
            admissions = harness.samples(text, "tensile_scheduler_quota_slice_admissions_total")
            result.slice_admitted = sum(
                v for k, v in admissions.items() if ("outcome", "admitted") in k
            )
            result.slice_refused = sum(
                v for k, v in admissions.items() if ("outcome", "refused") in k
            )
    finally:
        probe.stop()
        for program in (scheduler, extender, baseline, descheduler):
            if program is not None:
                program.stop()
    if not last:  # after the last one the fleet goes anyway
        started = time.monotonic()
        await teardown(bench, work, config.name)
        say(f"  ({config.name}) removed in {time.monotonic() - started:.0f} s")
    return result


def _claims(pod: Mapping[str, Any]) -> bool:
    return any("persistentVolumeClaim" in v for v in pod["spec"].get("volumes") or ())


def _count_at_least(tracker: PodTracker, count: int) -> Any:
    async def check() -> bool:
        return len(tracker.live()) >= count

    return check


async def settle(
    bench: Bench, tracker: PodTracker, pods: int, *, t0: float, say: Any, config: Config
) -> float | None:
    """Wait until every pod runs (return the seconds since `t0`), or until nothing changed
    for `bench.settle` seconds (return None: what is Pending is stranded)."""
    last: tuple[int, int, frozenset[str], int] | None = None
    changed = time.monotonic()
    reported = 0.0
    deadline = t0 + bench.args.timeout
    while True:
        now = time.monotonic()
        state = tracker.state()
        count, running, pending, _ = state
        if count == pods and running == pods and not pending:
            return max(tracker.running.values()) - t0
        if state != last:
            last, changed = state, now
        elif now - changed >= bench.settle:
            return None
        if now > deadline:
            say(f"  ({config.name}) gave up after {bench.args.timeout:.0f} s")
            return None
        if now - reported >= 15:
            say(
                f"  ({config.name}) {now - t0:5.0f} s: {running}/{pods} Running, "
                f"{len(pending)} Pending"
            )
            reported = now
        for node in bench.virtual_nodes:
            node.check()
        for name in bench.fleet.refs:
            if name != FLEET_SCHEDULER:
                bench.fleet.component(name).check()
        await asyncio.sleep(0.5)


async def make_volumes(bench: Bench, config: str) -> None:
    """Lower local volumes of this configuration, one per disk Node of every lower cluster."""
    for cluster in bench.fleet.lowers:
        async with harness.client_for(cluster.kubeconfig) as client:
            await build.gather_bounded(
                build.create(
                    client,
                    "/api/v1/persistentvolumes",
                    plan.local_volume(f"fleet-{config}-{n.name}", node=n.name),
                )
                for n in bench.nodes[cluster.name]
                if n.disk
            )


async def make_workload(client: ApiClient, work: plan.Workload, config: str) -> None:
    for namespace, quota in work.namespaces.items():
        await client.request(
            "POST",
            "/api/v1/namespaces",
            body={
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": namespace,
                    "labels": {plan.BENCH_LABEL: config},
                },
            },
        )
        if quota is not None:
            await client.request(
                "POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body=quota
            )
    for namespace in work.namespaces:
        while True:
            try:
                await client.request(
                    "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
                )
                break
            except errors.NotFound:
                await asyncio.sleep(0.1)
    await build.gather_bounded(
        client.request("POST", path.format(ns=namespace), body=obj)
        for namespace, path, obj in work.objects
    )


async def teardown(bench: Bench, work: plan.Workload, config: str) -> None:
    """Delete what the configuration made, upstairs and below; return once no pod of it is
    left anywhere, the avoidance record is gone and the virtual nodes offer what they did
    before (the next configuration starts from the same fleet). Upstairs the pods are
    deleted at once (grace period 0: what they were for is over); the virtual nodes delete
    their lower pods."""
    fleet = bench.fleet
    timeout = bench.args.timeout
    async with harness.client_for(fleet.upper.kubeconfig) as client:
        for namespace in work.namespaces:
            await client.request("DELETE", f"/api/v1/namespaces/{namespace}")
        await _ignore_missing(
            client.request(
                "DELETE", f"/api/v1/namespaces/{build.SYSTEM_NAMESPACE}/configmaps/tensile-avoid"
            )
        )

        async def upper_gone() -> bool:
            if not await _any_pod(client, work.namespaces):
                return True
            left = await _pods(client, work.namespaces)
            now = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
            await build.gather_bounded(
                _ignore_missing(client.request("DELETE", path, body=now)) for path in left
            )
            return False

        await build.wait_until(
            f"upper: the pods of ({config}) gone", upper_gone, timeout=timeout, every=2.0
        )
    for cluster in fleet.lowers:
        async with harness.client_for(cluster.kubeconfig) as client:

            async def gone(client: ApiClient = client) -> bool:
                return not await _any_pod(client, work.namespaces)

            await build.wait_until(
                f"{cluster.name}: the pods of ({config}) gone", gone, timeout=timeout, every=2.0
            )
            await build.gather_bounded(
                _ignore_missing(
                    client.request("DELETE", f"/api/v1/persistentvolumes/fleet-{config}-{n.name}")
                )
                for n in bench.nodes[cluster.name]
                if n.disk
            )
    await build.wait_offers(fleet, bench.offers, timeout=timeout)


async def _pods(client: ApiClient, namespaces: Iterable[str]) -> list[str]:
    """The paths of the pods left in `namespaces`."""
    paths = []
    for namespace in namespaces:
        found = await client.request("GET", f"/api/v1/namespaces/{namespace}/pods")
        paths += [f"/api/v1/namespaces/{namespace}/pods/{name_of(p)}" for p in found["items"]]
    return paths


async def _any_pod(client: ApiClient, namespaces: Iterable[str]) -> bool:
    """Whether a pod is left in `namespaces` (one item listed per namespace: cheap)."""
    for namespace in namespaces:
        found = await client.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", params={"limit": "1"}
        )
        if found["items"]:
            return True
    return False


async def _ignore_missing(request: Awaitable[Any]) -> None:
    try:
        await request
    except errors.NotFound:
        pass


# -- the report ------------------------------------------------------------------------------


def report(results: list[Result], say: Any) -> None:
    names = [f"({r.config.name})" for r in results]
    rows: list[tuple[str, list[float | None], str]] = [
        ("pods", [r.pods for r in results], ".0f"),
        ("pods Running", [r.running for r in results], ".0f"),
        ("pods stranded", [r.stranded for r in results], ".0f"),
        ("evictions", [r.evicted for r in results], ".0f"),
        ("bare pods re-created", [r.recreated for r in results], ".0f"),
        ("moves", [r.moved for r in results], ".0f"),
        ("left alone (no node left)", [r.left_alone for r in results], ".0f"),
        ("s until all Running", [r.all_running for r in results], ".1f"),
        ("s until the last Running", [r.last_running for r in results], ".1f"),
        ("upper binds/s", [r.throughput for r in results], ".1f"),
        ("extender p50 ms", [_ms(r.extender_p50) for r in results], ".2f"),
        ("extender p99 ms", [_ms(r.extender_p99) for r in results], ".2f"),
        ("extender CPU per call p99 ms", [_ms(r.extender_cpu_p99) for r in results], ".2f"),
        ("extender loop lag p99 ms", [_ms(r.loop_lag_p99) for r in results], ".2f"),
        ("extender GC pauses > 5 ms", [r.gc_slow_pauses for r in results], ".0f"),
        ("baseline extender p50 ms", [_ms(r.baseline_p50) for r in results], ".2f"),
        ("baseline extender p99 ms", [_ms(r.baseline_p99) for r in results], ".2f"),
        ("baseline CPU per call p99 ms", [_ms(r.baseline_cpu_p99) for r in results], ".2f"),
        ("idle process loop lag p99 ms", [_ms(r.probe_lag_p99) for r in results], ".2f"),
        ("slice admissions", [r.slice_admitted for r in results], ".0f"),
        ("slice refusals", [r.slice_refused for r in results], ".0f"),
    ]
    groups = [g for g in plan.GROUPS if any(g in r.cpu for r in results)]
    for g in groups:
        rows.append((f"CPU s {g}", [r.cpu.get(g) for r in results], ".1f"))
    rows.append(("CPU s total", [sum(r.cpu.values()) for r in results], ".1f"))
    for g in groups:
        rows.append((f"RSS MiB {g}", [r.rss.get(g) for r in results], ".0f"))
    say("")
    for r in results:
        say(f"({r.config.name}) {r.config.title}")
    say("")
    for line in plan.table(rows, names):
        say(line)
    for r in results:
        if r.extender_p99 is not None:
            say(f"({r.config.name}) {upper_scheduler.verdict(r.extender_p99, r.baseline_p99)}")
    for r in results:
        if r.stranded_pods:
            say(
                f"({r.config.name}) stranded, first {len(r.stranded_pods)}: "
                + ", ".join(r.stranded_pods)
            )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


QUICK = (
    "--lower-clusters=2",
    "--nodes-per-cluster=20",
    "--pods=200",
    "--configs=b",
    "--slo-pods=100",
    "--slo-rate=20",
)
"""--quick: two lower clusters, the extender's configuration, 100 pods a latency round."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/fleet.py", description=__doc__.split("\n")[0])
    parser.add_argument("--lower-clusters", type=int, default=10)
    parser.add_argument("--nodes-per-cluster", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10_000, help="workload pods per configuration")
    parser.add_argument(
        "--configs", default="a,b,c", help="configurations to run, in order (a first: the baseline)"
    )
    parser.add_argument(
        "--unschedulable-timeout", type=float, default=5.0, help="descheduler, seconds"
    )
    parser.add_argument(
        "--descheduling-interval", type=float, default=2.0, help="descheduler, seconds"
    )
    parser.add_argument(
        "--eviction-rate", type=float, default=20.0, help="descheduler moves per second"
    )
    parser.add_argument(
        "--slo-pods",
        type=int,
        default=2000,
        help="pods of each round of the latency objectives (below alone, upstairs alone, "
        "through tensile); 0: not measured",
    )
    parser.add_argument(
        "--slo-rate", type=float, default=40.0, help="pods per second the latency rounds make"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"the smallest run, as a smoke test: {' '.join(QUICK)} (flags given win)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound of each wait, seconds")
    parser.add_argument(
        "--keep-logs", type=Path, default=None, help="copy every log here at the end"
    )
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    if args.quick:  # the flags given on the command line win over the quick run's
        args = parser.parse_args([*QUICK, *given])
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or len(set(configs)) != len(configs) or not (configs or args.slo_pods):
        parser.error(
            f"--configs: a comma-separated list of distinct a, b, c (empty only with "
            f"--slo-pods); got {args.configs!r}"
        )
    if args.slo_pods < 0 or args.slo_rate <= 0:
        parser.error("--slo-pods must be >= 0 and --slo-rate > 0")
    args.configs = configs
    for flag in ("unschedulable_timeout", "descheduling_interval", "timeout"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be > 0")
    try:
        plan.check_fits(
            plan.Scale(
                lower_clusters=args.lower_clusters,
                nodes_per_cluster=args.nodes_per_cluster,
                pods=args.pods,
            )
        )
    except ValueError as exc:
        parser.error(str(exc))
    if any(CONFIGS[c].extender for c in configs):
        missing = upper_scheduler.extender_missing()
        if missing:
            parser.error(f"--configs {','.join(configs)}: {missing}")
    return args


async def run(
    fleet: Fleet, scale: plan.Scale, args: argparse.Namespace, say: Any, *, started: float
) -> list[Result]:
    """Build the lower clusters, virtual nodes and webhook on `fleet`, run each
    configuration; stop what it started (not the fleet)."""
    m = plan.mix(args.pods)
    programs: list[Program] = []
    try:
        log_dir = fleet.directory / "logs"
        nodes = {
            lower.name: plan.lower_nodes(
                lower.name, i, count=scale.nodes_per_cluster, disks=m.statefulset
            )
            for i, lower in enumerate(fleet.lowers)
        }
        say(
            f"fleet: 1 upper + {scale.lower_clusters} lower clusters up in "
            f"{time.monotonic() - started:.0f} s"
        )
        await asyncio.gather(
            *(build.build_lower(c, nodes[c.name], timeout=args.timeout) for c in fleet.lowers)
        )
        await build.upper_storage(fleet)
        say(
            f"lower clusters: {scale.nodes_per_cluster} Nodes each, filled, after "
            f"{time.monotonic() - started:.0f} s"
        )
        virtual_nodes = build.start_virtual_nodes(fleet, log_dir=log_dir, timeout=args.timeout)
        programs += virtual_nodes
        offers = {
            f"vn-{name}": sum(n.free[0] for n in cluster_nodes)
            for name, cluster_nodes in nodes.items()
        }
        await build.wait_offers(fleet, offers, timeout=args.timeout)
        webhook = build.start_webhook(fleet, log_dir=log_dir, timeout=args.timeout)
        programs.append(webhook)
        say(
            f"virtual nodes and webhook ready after {time.monotonic() - started:.0f} s; "
            "offers (CPU): " + ", ".join(f"{k} {v / 1000:.0f}" for k, v in offers.items())
        )
        fleet.stop_component(FLEET_SCHEDULER)  # the benchmark runs its own, per configuration
        slo_lines: list[str] = []
        if args.slo_pods:
            say(f"\nlatency objectives: {args.slo_pods} pods each round, at {args.slo_rate:g}/s")
            inside_before = [n.metrics() for n in virtual_nodes]
            measured = await latency.run(
                fleet,
                pods=args.slo_pods,
                rate=args.slo_rate,
                lower_nodes={
                    name: [n.name for n in cluster_nodes if not n.disk]
                    for name, cluster_nodes in nodes.items()
                },
                virtual_nodes={f"vn-{lower.name}": lower.name for lower in fleet.lowers},
                timeout=args.timeout,
                say=say,
            )
            inside_after = [n.metrics() for n in virtual_nodes]
            slo_lines = slo.report(
                measured.stages,
                measured.baselines,
                pods=measured.pods,
                delivery=measured.delivery,
            )
            slo_lines += ["", *inside.report(inside_before, inside_after), ""]
            slo_lines.append(
                f"the benchmark's own event loop lag meanwhile (how late it may have seen a "
                f"change): p50 {slo.ms(slo.quantile(measured.own_lag, 0.5))} ms, p99 "
                f"{slo.ms(slo.quantile(measured.own_lag, 0.99))} ms"
            )
            say("")
            for line in slo_lines:
                say(line)
        bench = Bench(
            fleet=fleet,
            scale=scale,
            mix=m,
            nodes=nodes,
            virtual_nodes=virtual_nodes,
            webhook=webhook,
            offers=offers,
            log_dir=log_dir,
            args=args,
        )
        results = []
        for name in args.configs:
            config = CONFIGS[name]
            say(f"\n({name}) {config.title}")
            last = name == args.configs[-1]
            results.append(await run_config(bench, config, say, last=last))
            report(results, say)  # so far: a run cut short still shows what it measured
        if slo_lines and results:  # again at the end, beside the placement table
            say("")
            for line in slo_lines:
                say(line)
        return results
    finally:
        for program in programs:
            program.stop()


def main() -> None:
    args = parse()

    def say(line: str) -> None:
        print(line, flush=True)

    m = plan.mix(args.pods)
    say(
        f"fleet benchmark: {args.lower_clusters} lower clusters x {args.nodes_per_cluster} kwok "
        f"Nodes, {m.total} pods per configuration ({m.small} small in Deployments, {m.large} large "
        f"in Deployments, {m.bare} bare ({m.bare_large} large), StatefulSet {m.statefulset} large "
        f"with volumes, {plan.QUOTA_NAMESPACES} quota'd namespaces x {m.quota} small); "
        f"configurations {','.join(args.configs)}; command: {' '.join(sys.argv)}"
    )
    scale = plan.Scale(
        lower_clusters=args.lower_clusters, nodes_per_cluster=args.nodes_per_cluster, pods=args.pods
    )
    started = time.monotonic()
    # Outside the event loop: entering the private network uses a loop of its own.
    fleet = build.start_fleet(scale, startup_timeout=args.timeout)
    try:
        asyncio.run(run(fleet, scale, args, say, started=started))
    finally:
        if args.keep_logs is not None:
            shutil.copytree(fleet.directory / "logs", args.keep_logs, dirs_exist_ok=True)
        fleet.stop()


if __name__ == "__main__":
    main()
