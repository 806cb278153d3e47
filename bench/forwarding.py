"""Forwarding benchmark: the two-cluster limit, the virtual node's share, memory, fairness.

On one local fleet, in one run:
1. the limit: N pods created directly in the lower cluster (direct-lower), N pods through
   a virtual node with the mock provider, which makes them Running with no lower cluster
   (upper-only: the upper cluster's own create, schedule, bind and status), and N pods
   through a virtual node forwarding to the lower cluster (via). Both baselines saturate
   the same cores, so forwarding cannot beat their sum: `via / limit` (limit time / via
   time) is the headline. The modes take turns for --rounds rounds; the best of each counts.
   The same ratio from CPU seconds (all components of the limit runs / of the via run)
   holds on a busy machine, where times do not.
2. the virtual node's share: CPU per forwarded pod of every component, and the node's
   requests per pod by cluster, verb and code.
3. memory: the node's RSS per forwarded pod in steady state (slope between N and 2N pods)
   and after a restart's relist (the same slope, each after a SIGKILL and restart), with the
   restart's convergence and the writes it made.
4. fairness: while one namespace creates --burst pods, single pods in another namespace
   are created one after another; their create->Running latency (p50/p99) against the
   same single pod on an idle node.

    .venv/bin/python bench/forwarding.py [--pods 500] [--rounds 2] [--burst 2000]
                                         [--profile FILE] [--trace] [--baseline PYTHON]

--baseline PYTHON (another checkout's venv python, e.g. ../before/.venv/bin/python) adds
a before/after comparison that a busy machine does not blur: this code's forwarding node and
one started by PYTHON run side by side, --pairs times (3), each sent --pods pods at the same
time, whose creates start first alternating; each node's CPU per pod and the ratio are
printed (both pay alike for the machine's load, and each for the other's pods where it
watches them).

--trace runs the via node with `--trace-exporter otlp` (every pod sampled) sending to a
receiver in this process (devcluster.otlp), and says how many spans and traces came: the
node's CPU per pod then includes tracing's cost.

Uses the fleet of TENSILE_DEVCLUSTER_DIR if set, else starts (and stops) its own. Figures
from a machine shared with other work are noisy in time, not in CPU seconds or requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import CpuMeter, Timed, pct

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.otlp import OtlpReceiver
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts.objects import meta_of
from tensile.kube.client import ApiClient

TARGETS = {
    "via / limit": 0.95,
    "node CPU per pod (ms)": 1.5,
    "RSS per pod (KB)": 10.0,
    "single pod p99 during a burst (s)": 2.0,
}
MODES = ("direct-lower", "upper-only", "via tensile")
NODE_ARGS = ["--kube-api-qps=500", "--kube-api-burst=1000", "--log-level=info"]


@dataclass
class Run:
    """One mode's run: timing, CPU seconds per process, the node's requests."""

    timed: Timed
    cpu: dict[str, float]
    requests: dict[tuple[str, str, str], float] = field(default_factory=dict)

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu.values())


def run_mode(
    mode: str,
    *,
    fleet: Fleet,
    mock: VirtualNodeProcess,
    node: VirtualNodeProcess,
    args: argparse.Namespace,
) -> Run:
    meter = CpuMeter(lambda: harness.fleet_pids(fleet, mock, node))
    target = {"direct-lower": None, "upper-only": mock, "via tensile": node}[mode]
    kubeconfig = fleet.lower.kubeconfig if target is None else fleet.upper.kubeconfig
    before = harness.requests_by_verb(target.metrics()) if target else {}
    namespace = harness.new_namespace()
    meter.start()
    timed = asyncio.run(
        harness.create_pods(
            kubeconfig,
            namespace=namespace,
            pods=args.pods,
            concurrency=args.concurrency,
            node=target.name if target else None,
        )
    )
    cpu = meter.stop()
    after = harness.requests_by_verb(target.metrics()) if target else {}
    asyncio.run(harness.delete_namespaces(fleet, [namespace]))
    return Run(timed=timed, cpu=cpu, requests=harness.difference(after, before))


def side_by_side(
    *,
    fleet: Fleet,
    ours: VirtualNodeProcess,
    theirs: VirtualNodeProcess,
    args: argparse.Namespace,
    ours_first: bool,
) -> tuple[float, float]:
    """Send --pods pods to each of two forwarding nodes at the same time (a namespace
    each, the creates of `ours` started first when `ours_first`: rounds alternate, as
    whichever goes first runs first); return each node's CPU per pod in ms (ours, theirs)."""
    meter = CpuMeter(lambda: harness.fleet_pids(fleet, ours, theirs))
    namespaces = [harness.new_namespace(), harness.new_namespace()]
    order = (ours, theirs) if ours_first else (theirs, ours)

    async def both() -> None:
        await asyncio.gather(
            *(
                harness.create_pods(
                    fleet.upper.kubeconfig,
                    namespace=namespace,
                    pods=args.pods,
                    concurrency=max(1, args.concurrency // 2),
                    node=vn.name,
                )
                for namespace, vn in zip(namespaces, order, strict=True)
            )
        )

    meter.start()
    asyncio.run(both())
    cpu = meter.stop()
    asyncio.run(harness.delete_namespaces(fleet, namespaces))
    return tuple(  # type: ignore[return-value]
        cpu[f"virtual node {vn.name}"] * 1000 / args.pods for vn in (ours, theirs)
    )


@dataclass
class Memory:
    idle_kib: int
    steady: tuple[int, int]
    """RSS (KiB) with N and 2N pods, the same process."""
    relisted: tuple[int, int]
    """RSS (KiB) with N and 2N pods, each right after a SIGKILL, restart and relist."""
    converged_s: float
    """Restart with 2N pods: from the new process to every key handled."""
    restart_writes: dict[tuple[str, str, str], float]


def restart_and_measure(node: VirtualNodeProcess, *, keys: int) -> tuple[int, float, dict]:
    node.kill()
    started = time.monotonic()
    node.restart(timeout=300)
    done = harness.wait_reconciled(node, keys=keys)
    time.sleep(2)  # let in-flight work settle before reading RSS
    assert node.process is not None
    writes = {
        k: v
        for k, v in harness.requests_by_verb(node.metrics()).items()
        if k[1] in ("POST", "PUT", "PATCH", "DELETE")
    }
    return harness.rss_kib(node.process.pid), done - started, writes


def memory(fleet: Fleet, node: VirtualNodeProcess, args: argparse.Namespace) -> Memory:
    # A fresh process, so earlier rounds' high-water marks do not hide the growth.
    node.kill()
    node.restart(timeout=300)
    assert node.process is not None
    time.sleep(2)
    idle = harness.rss_kib(node.process.pid)
    first, second = harness.new_namespace(), harness.new_namespace()

    def add(namespace: str) -> int:
        asyncio.run(
            harness.create_pods(
                fleet.upper.kubeconfig,
                namespace=namespace,
                pods=args.pods,
                concurrency=args.concurrency,
                node=node.name,
            )
        )
        harness.wait_reconciled(node, keys=0)
        time.sleep(2)
        assert node.process is not None
        return harness.rss_kib(node.process.pid)

    steady_n = add(first)
    steady_2n = add(second)
    relisted_2n, converged, writes = restart_and_measure(node, keys=2 * args.pods)
    asyncio.run(harness.delete_namespaces(fleet, [second]))
    relisted_n, _, _ = restart_and_measure(node, keys=args.pods)
    asyncio.run(harness.delete_namespaces(fleet, [first]))
    return Memory(
        idle_kib=idle,
        steady=(steady_n, steady_2n),
        relisted=(relisted_n, relisted_2n),
        converged_s=converged,
        restart_writes=writes,
    )


@dataclass
class Fairness:
    idle: list[float]
    during: list[float]
    burst: Timed
    stages: list[dict[str, float]]
    """Per single pod during the burst: seconds spent in each stage (`STAGES`)."""


STAGES = ("upper scheduler", "virtual node", "lower scheduler", "lower start", "status up")


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _condition_time(obj: dict[str, Any], kind: str) -> float | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return _seconds(c.get("lastTransitionTime"))
    return None


async def stages(
    upper: ApiClient, lower: ApiClient, namespace: str, name: str, *, running_at: float
) -> dict[str, float]:
    """Where a single pod's time went, from the objects' own timestamps (whole seconds):
    bound upstairs, created below by the node, bound below, running below, Running
    upstairs (`running_at`, wall clock)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    up, down = await upper.request("GET", path), await lower.request("GET", path)
    marks = [
        _seconds(meta_of(up).get("creationTimestamp")),
        _condition_time(up, "PodScheduled"),
        _seconds(meta_of(down).get("creationTimestamp")),
        _condition_time(down, "PodScheduled"),
        _condition_time(down, "Ready"),
        running_at,
    ]
    return {
        stage: max(0.0, b - a)
        for stage, a, b in zip(STAGES, marks[:-1], marks[1:], strict=True)
        if a is not None and b is not None
    }


async def fairness(fleet: Fleet, node: VirtualNodeProcess, args: argparse.Namespace) -> Fairness:
    greedy, modest = harness.new_namespace(), harness.new_namespace()
    async with (
        harness.client_for(fleet.upper.kubeconfig) as client,
        harness.client_for(fleet.lower.kubeconfig) as lower,
    ):
        await harness.create_namespace(client, modest)
        async with harness.PodWatch(client, modest) as watch:
            count = 0

            breakdown: list[dict[str, float]] = []

            async def single(*, explain: bool = False) -> float:
                nonlocal count
                name = f"single-{count:04d}"
                count += 1
                created = time.monotonic()
                await client.request(
                    "POST",
                    f"/api/v1/namespaces/{modest}/pods",
                    body=harness.pod(name, node=node.name),
                )
                latency = await watch.running_at(name, timeout=600) - created
                if explain:
                    running_at = time.time()
                    breakdown.append(
                        await stages(client, lower, modest, name, running_at=running_at)
                    )
                return latency

            idle = [await single() for _ in range(5)]
            burst = asyncio.create_task(
                harness.create_pods(
                    fleet.upper.kubeconfig,
                    namespace=greedy,
                    pods=args.burst,
                    concurrency=args.concurrency,
                    node=node.name,
                ),
                name="bench-burst",
            )
            await asyncio.sleep(1.0)  # the burst's namespace exists and its creates are flowing
            during = []
            while not burst.done():
                during.append(await single(explain=True))
                await asyncio.sleep(0.2)
            timed = await burst
    await harness.delete_namespaces(fleet, [greedy, modest])
    return Fairness(idle=idle, during=during, burst=timed, stages=breakdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--rounds", type=int, default=2, help="turns of the three modes (0: skip them)"
    )
    parser.add_argument("--burst", type=int, default=2000, help="fairness burst (0: skip)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory part")
    parser.add_argument(
        "--profile", type=Path, help="record the via node with py-spy (raw collapsed stacks)"
    )
    parser.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="also run this code's forwarding node and one of PYTHON's checkout side by side",
    )
    parser.add_argument("--pairs", type=int, default=3, help="side-by-side rounds with --baseline")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="the via node traces every pod to a receiver in this process (--trace-exporter otlp)",
    )
    args = parser.parse_args()
    if args.baseline:
        # Each interpreter imports the checkout it was installed from, not the one in the
        # working directory (which `python -m` would otherwise put first on sys.path).
        os.environ["PYTHONSAFEPATH"] = "1"
    if args.profile and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy on PATH: .venv/bin/pip install -e '.[bench]'")
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    room = max(2 * args.pods, args.burst + 200)
    if existing:
        fleet = Fleet.attach(Path(existing))
        fleet.join_network()
    else:
        fleet = Fleet.start(
            directory=Path(tempfile.mkdtemp(prefix="tensile-bench-")),
            settings=FleetSettings(
                lowers=(LowerClusterSettings(nodes=5, pods=str(room // 5 + 110)),),
                metrics_server=False,
            ),
            owns_directory=True,
        )
    suffix = secrets.token_hex(3)
    log_dir = fleet.directory / "logs"
    mock_name = f"bench-mock-{suffix}"
    mock_config = fleet.directory / f"{mock_name}.json"
    # As much room as the lower cluster offers the via node: the two runs place alike.
    mock_config.write_text(
        json.dumps({mock_name: {"cpu": "1000", "memory": "4Ti", "pods": str(10 * room)}})
    )
    mock = VirtualNodeProcess(
        fleet,
        name=mock_name,
        log_dir=log_dir,
        args=[*NODE_ARGS, "--provider=mock", f"--provider-config={mock_config}"],
    )
    receiver = OtlpReceiver()
    stack = contextlib.ExitStack()
    traced: list[str] = []
    env: dict[str, str] = {}
    if args.trace:
        endpoint = stack.enter_context(receiver.in_thread())
        traced = ["--trace-exporter=otlp", "--trace-sample-rate=always"]
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    node = VirtualNodeProcess(
        fleet, name=f"bench-via-{suffix}", log_dir=log_dir, args=[*NODE_ARGS, *traced], env=env
    )
    baseline = None
    if args.baseline:
        baseline = VirtualNodeProcess(
            fleet, name=f"bench-baseline-{suffix}", log_dir=log_dir, args=NODE_ARGS
        )
        baseline.argv[0] = args.baseline
    paired: list[tuple[float, float]] = []
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    mem: Memory | None = None
    fair: Fairness | None = None
    try:
        print(
            f"forwarding benchmark: {args.pods} pods, {args.concurrency} concurrent creates, "
            f"{args.rounds} round(s)",
            flush=True,
        )
        mock.start(timeout=300)
        node.start(timeout=300)
        time.sleep(2)
        profiler = None
        for round_ in range(args.rounds):
            for mode in MODES:
                if mode == "via tensile" and args.profile and profiler is None:
                    assert node.process is not None
                    profiler = subprocess.Popen(
                        ["py-spy", "record", "--pid", str(node.process.pid), "--format", "raw",
                         "--rate", "200", "-o", str(args.profile)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                    time.sleep(1)
                run = run_mode(mode, fleet=fleet, mock=mock, node=node, args=args)
                runs[mode].append(run)
                print(
                    f"  round {round_ + 1} {mode:14} {run.timed.total:7.2f} s  "
                    f"CPU {run.cpu_total:6.1f} s",
                    flush=True,
                )
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        if baseline is not None:
            baseline.start(timeout=300)
            time.sleep(2)
            for round_ in range(args.pairs):
                paired.append(
                    side_by_side(
                        fleet=fleet,
                        ours=node,
                        theirs=baseline,
                        args=args,
                        ours_first=round_ % 2 == 0,
                    )
                )
                print(
                    f"  round {round_ + 1} side by side: node CPU per pod "
                    f"{paired[-1][0]:.2f} ms (this code), {paired[-1][1]:.2f} ms (baseline)",
                    flush=True,
                )
            baseline.stop()
            baseline.delete_node()
            baseline = None
        if not args.no_memory:
            mem = memory(fleet, node, args)
            report_memory(args, mem)  # now too: the fairness part takes long
        if args.burst:
            fair = asyncio.run(fairness(fleet, node, args))
    finally:
        for vn in (mock, node, *([baseline] if baseline is not None else [])):
            vn.stop()
            vn.delete_node()
        if not existing:
            fleet.stop()
        stack.close()
    report(args, runs, mem, fair, node=node.name, mock=mock.name)
    if paired:
        report_side_by_side(args, paired)
    if args.trace:
        spans = receiver.spans()
        roots = [s for s in spans if not s.parent_span_id]
        print(
            f"\ntracing: {len(spans)} spans in {len(roots)} traces received "
            f"({len(spans) / max(1, len(roots)):.1f} spans per trace)"
        )


def report(
    args: argparse.Namespace,
    runs: dict[str, list[Run]],
    mem: Memory | None,
    fair: Fairness | None,
    *,
    node: str,
    mock: str,
) -> None:
    if all(runs[mode] for mode in MODES):
        report_runs(args, runs, node=node, mock=mock)
    if mem is not None:
        report_memory(args, mem)
    if fair is not None:
        report_fairness(args, fair)


def report_runs(
    args: argparse.Namespace, runs: dict[str, list[Run]], *, node: str, mock: str
) -> None:
    n = args.pods
    best = {mode: min(runs[mode], key=lambda r: r.timed.total) for mode in MODES}
    cheapest = {mode: min(runs[mode], key=lambda r: r.cpu_total) for mode in MODES}
    direct, upper, via = (best[m] for m in MODES)
    limit = direct.timed.total + upper.timed.total
    print(f"\n{'':30}" + "".join(f"{m:>16}" for m in MODES) + f"{'limit':>16}")
    rows = [
        ("time to all Running (s)", [r.timed.total for r in best.values()], limit),
        ("throughput (pods/s)", [r.timed.rate for r in best.values()], n / limit),
        ("latency p50 (s)", [pct(r.timed.latencies, 0.5) for r in best.values()], None),
        ("latency p99 (s)", [pct(r.timed.latencies, 0.99) for r in best.values()], None),
        ("CPU, all processes (s)", [r.cpu_total for r in cheapest.values()],
         cheapest["direct-lower"].cpu_total + cheapest["upper-only"].cpu_total),
    ]  # fmt: skip
    for label, values, lim in rows:
        cells = "".join(f"{v:16.3f}" for v in values)
        print(f"{label:30}{cells}{'' if lim is None else f'{lim:16.3f}'}")

    cpu_limit = cheapest["direct-lower"].cpu_total + cheapest["upper-only"].cpu_total
    print("\nthe two-cluster limit")
    ratio = limit / via.timed.total
    print(f"  via / limit (time)          {ratio:.2f}x   [>= {TARGETS['via / limit']}x]")
    cpu_ratio = cpu_limit / cheapest["via tensile"].cpu_total
    print(f"  via / limit (CPU seconds)   {cpu_ratio:.2f}x   (holds on a busy machine)")

    print("\nCPU per pod (ms), by process (cheapest run of each mode)")
    names = sorted(
        {k for r in cheapest.values() for k in r.cpu},
        key=lambda k: -max(r.cpu.get(k, 0) for r in cheapest.values()),
    )
    print(f"  {'':34}" + "".join(f"{m:>14}" for m in MODES))
    for name in names:
        label = name.replace(f"virtual node {node}", "virtual node (via)").replace(
            f"virtual node {mock}", "virtual node (mock)"
        )
        cells = "".join(f"{cheapest[m].cpu.get(name, 0) * 1000 / n:14.2f}" for m in MODES)
        print(f"  {label:34}{cells}")
    node_cpu = cheapest["via tensile"].cpu.get(f"virtual node {node}", 0) * 1000 / n
    print(
        f"  virtual node CPU per forwarded pod: {node_cpu:.2f} ms   "
        f"[<= {TARGETS['node CPU per pod (ms)']} ms]"
    )

    for mode, name in (("via tensile", "via"), ("upper-only", "mock")):
        print(f"\nrequests per pod of the {name} node (cluster verb code), {mode} run")
        for (cluster, verb, code), value in sorted(best[mode].requests.items()):
            print(f"  {cluster:16}{verb:8}{code:5}{value / n:8.3f}")


def report_side_by_side(args: argparse.Namespace, paired: list[tuple[float, float]]) -> None:
    print(
        f"\nside by side with {args.baseline} ({args.pods} pods to each node at once), "
        "node CPU per forwarded pod (ms)"
    )
    print(f"  {'round':14}{'this code':>12}{'baseline':>12}{'ratio':>10}")
    for i, (ours, theirs) in enumerate(paired, 1):
        first = "this first" if i % 2 else "base first"
        print(f"  {i} {first:12}{ours:12.2f}{theirs:12.2f}{ours / theirs:9.2f}x")
    ours, theirs = (min(p[i] for p in paired) for i in (0, 1))
    print(
        f"  {'cheapest':14}{ours:12.2f}{theirs:12.2f}{ours / theirs:9.2f}x   "
        f"[<= {TARGETS['node CPU per pod (ms)']} ms]"
    )


def report_memory(args: argparse.Namespace, mem: Memory) -> None:
    n = args.pods
    steady = (mem.steady[1] - mem.steady[0]) * 1024 / n / 1000
    relisted = (mem.relisted[1] - mem.relisted[0]) * 1024 / n / 1000
    budget = TARGETS["RSS per pod (KB)"]
    print(f"\nvirtual node memory (idle {mem.idle_kib // 1024} MiB)")
    print(
        f"  steady state   {steady:6.1f} KB per pod   [<= {budget} KB] "
        f"({mem.steady[0] // 1024} MiB at {n} pods, {mem.steady[1] // 1024} MiB at {2 * n})"
    )
    print(
        f"  after relist   {relisted:6.1f} KB per pod   [<= {budget} KB] "
        f"({mem.relisted[0] // 1024} MiB at {n} pods, {mem.relisted[1] // 1024} MiB at {2 * n},"
        " each after SIGKILL and restart)"
    )
    print(
        f"  restart with {2 * n} pods: every key handled {mem.converged_s:.1f} s after the "
        f"new process started; writes: {dict(mem.restart_writes) or 'none'}"
    )


def report_fairness(args: argparse.Namespace, fair: Fairness) -> None:
    print(f"\nfairness: a single pod in one namespace while another creates {args.burst}")
    print(
        f"  idle node      p50 {pct(fair.idle, 0.5):6.2f} s   max {max(fair.idle):6.2f} s "
        f"({len(fair.idle)} pods)"
    )
    print(
        f"  during burst   p50 {pct(fair.during, 0.5):6.2f} s   p99 "
        f"{pct(fair.during, 0.99):6.2f} s   max {max(fair.during):6.2f} s "
        f"({len(fair.during)} pods)   "
        f"[p99 <= {TARGETS['single pod p99 during a burst (s)']} s]"
    )
    print(
        f"  the burst      {fair.burst.total:6.1f} s to all Running, p50 "
        f"{pct(fair.burst.latencies, 0.5):6.2f} s, p99 {pct(fair.burst.latencies, 0.99):6.2f} s"
    )
    slowdown = statistics.mean(fair.during) / statistics.mean(fair.idle)
    print(f"  mean single latency during / idle: {slowdown:.2f}x")
    print("  where the single pods' time went during the burst (p50 / max; whole seconds):")
    for stage in STAGES:
        values = [s[stage] for s in fair.stages if stage in s]
        if values:
            print(f"    {stage:18} {pct(values, 0.5):6.1f} / {max(values):6.1f} s")


if __name__ == "__main__":
    main()
