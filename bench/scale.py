"""Scale benchmark: 10,000 pods through one virtual node, then a crash and a lower restart.

On one local fleet (kwok nodes with room for every pod), in one run:
1. N pods created through the virtual node: create rate, p50/p99 create->Running, the
   node's CPU per pod, and its resident memory per pod ((RSS at N - RSS idle) / N);
2. the node is SIGKILLed and started again: time until the new process is ready (its own
   /readyz: the upper Node still shows Ready from before the kill) and until every pod key
   has been handled by both pod queues (target < 10 s), and what it wrote doing so
   (target: 0 lower creates and 0 lower deletes; upper writes listed);
3. while the node is paused, the lower kube-apiserver is restarted, a few lower objects
   written and etcd compacted, so the node's watches cannot resume and its lower caches
   list again: the relist counted, the time until the caches
   relisted and both queues are idle again, and again what was written (target: 0 creates,
   0 deletes);
4. the patrol: the node restarted with --patrol-period=PERIOD (default 30 s), its CPU
   during N patrol runs (from the end of one run to the end of the N-th after it) minus
   its idle CPU (measured between two runs), per run; divided by the command's default
   period (300 s) it is the patrol's average share of one core (target <= 0.3 %), and
   what the runs found in a steady state (target: nothing).

    .venv/bin/python bench/scale.py [--pods 10000] [--lower-nodes 10] [--patrol-runs 4]
        [--patrol-only] [--patrol-baseline PYTHON]

`--patrol-only` skips phases 2 and 3. `--patrol-baseline PYTHON` measures phase 4 first
with the node run by another interpreter (another checkout's virtualenv, e.g. the main
branch's), then with this one, on the same pods in the same run: a before/after that the
machine's load cannot tilt.

Uses the fleet of TENSILE_DEVCLUSTER_DIR if set, else starts (and stops) its own. Expect
about 10-20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import secrets
import time
from collections.abc import Callable

import harness
from harness import pct

from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts.objects import name_of

RECONCILE_TARGET = 10.0
DEFAULT_PATROL_PERIOD = 300.0
"""--patrol-period's default, seconds."""
PATROL_TARGET = 0.003
"""The patrol's average CPU at the default period, as a share of one core."""
WRITES = ("POST", "PUT", "PATCH", "DELETE")
NODE_ARGS = ["--kube-api-qps=500", "--kube-api-burst=1000", "--log-level=info"]


def writes(node: VirtualNodeProcess) -> dict[tuple[str, str, str], float]:
    return {k: v for k, v in harness.requests_by_verb(node.metrics()).items() if k[1] in WRITES}


def lower_pod_writes(found: dict[tuple[str, str, str], float]) -> tuple[float, float]:
    """(creates, deletes) toward the lower cluster: every POST and DELETE there (pods and
    what they need)."""
    creates = sum(
        v for (cluster, verb, _), v in found.items() if cluster == "lower" and verb == "POST"
    )
    deletes = sum(
        v for (cluster, verb, _), v in found.items() if cluster == "lower" and verb == "DELETE"
    )
    return creates, deletes


def wait_idle(node: VirtualNodeProcess, *, quiet: float = 2.0, timeout: float = 600.0) -> float:
    """Wait until both pod queues have been empty and idle for `quiet` seconds; return when
    they last moved (monotonic)."""
    deadline = time.monotonic() + timeout
    last: tuple[float, ...] = ()
    moved = time.monotonic()
    while time.monotonic() < deadline:
        text = node.metrics()
        state = tuple(
            x
            for q in ("pods_from_upper", "status_from_lower")
            for x in harness.queue_state(text, q)
        )
        if state != last:
            last, moved = state, time.monotonic()
        elif state[1] == 0 and state[3] == 0 and time.monotonic() - moved >= quiet:
            return moved
        time.sleep(0.05)
    raise TimeoutError(f"node {node.name}: queues still busy after {timeout}s")


async def upper_statuses(fleet: Fleet, namespace: str) -> dict[str, dict[str, object]]:
    async with harness.client_for(fleet.upper.kubeconfig) as client:
        found = await client.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    return {name_of(p): p.get("status") or {} for p in found["items"]}


def changed_fields(
    before: dict[str, dict[str, object]], after: dict[str, dict[str, object]]
) -> dict[str, int]:
    """Which status fields differ, counted over the pods."""
    counts: dict[str, int] = {}
    for name, old in before.items():
        new = after.get(name, {})
        for field in sorted(set(old) | set(new)):
            if old.get(field) != new.get(field):
                counts[field] = counts.get(field, 0) + 1
    return counts


def wait_process_ready(node: VirtualNodeProcess, *, timeout: float = 600.0) -> float:
    """Wait until the node process's own /readyz answers 200; return when (monotonic)."""
    deadline = time.monotonic() + timeout
    while node.get("/readyz")[0] != 200:
        node.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node.name}: /readyz not 200 after {timeout}s")
        time.sleep(0.05)
    return time.monotonic()


async def churn(fleet: Fleet, namespace: str, *, objects: int = 5) -> None:
    """Write a few lower ConfigMaps, so etcd's revision moves past the node's watches."""
    async with harness.client_for(fleet.lower.kubeconfig) as client:
        for i in range(objects):
            await client.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/configmaps",
                body={
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"churn-{secrets.token_hex(3)}-{i}"},
                },
            )


def synced_after(node: VirtualNodeProcess, *, since: int) -> float | None:
    """Seconds from the restarted node's first log line to its "caches synced" line."""
    with node.log.open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    stamps = [_stamp(line) for line in lines]
    first = next((s for s in stamps if s is not None), None)
    synced = next(
        (s for line, s in zip(lines, stamps, strict=True) if "caches synced" in line), None
    )
    return None if first is None or synced is None else synced - first


def _stamp(line: str) -> float | None:
    try:
        return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def patrol_runs(node: VirtualNodeProcess) -> float:
    return sum(harness.samples(node.metrics(), "tensile_patrol_runs_total").values())


POLL = 1.0
"""Seconds between two reads of the node's metrics while its CPU is measured: a read costs
the node some CPU, so the idle window and the measured one read at the same pace."""


def wait_runs(node: VirtualNodeProcess, *, at_least: float, timeout: float) -> float:
    """Wait until the node completed `at_least` patrol runs; return the count."""
    deadline = time.monotonic() + timeout
    while (runs := patrol_runs(node)) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {at_least:.0f} patrol runs after {timeout:.0f}s")
        time.sleep(POLL)
    return runs


def patrol(
    node: VirtualNodeProcess,
    *,
    pods: int,
    period: float,
    runs: int,
    say: Callable[[str], None],
    label: str = "",
) -> None:
    """Phase 4 (see the module docstring); `label` names the node's interpreter when two
    are compared."""
    node.stop()
    if f"--patrol-period={period:g}s" not in node.argv:
        node.argv.append(f"--patrol-period={period:g}s")  # the last one wins
    node.start(timeout=300)
    wait_process_ready(node)
    harness.wait_reconciled(node, keys=pods)
    wait_idle(node)
    assert node.process is not None
    pid = node.process.pid
    while True:  # idle CPU: a window between two runs
        done = wait_runs(node, at_least=patrol_runs(node) + 1, timeout=3 * period + 600)
        cpu0, t0 = harness.cpu_seconds(pid), time.monotonic()
        quiet = True
        while time.monotonic() - t0 < min(10.0, period / 3):
            time.sleep(POLL)
            quiet = quiet and patrol_runs(node) == done
        cpu1, t1 = harness.cpu_seconds(pid), time.monotonic()
        if quiet:
            break
    idle = (cpu1 - cpu0) / (t1 - t0)
    start = wait_runs(node, at_least=done + 1, timeout=3 * period + 600)
    cpu0, t0 = harness.cpu_seconds(pid), time.monotonic()
    text0 = node.metrics()
    wait_runs(node, at_least=start + runs, timeout=runs * (period + 600))
    cpu1, t1 = harness.cpu_seconds(pid), time.monotonic()
    text1 = node.metrics()
    per_run = ((cpu1 - cpu0) - idle * (t1 - t0)) / runs
    during = (
        harness.samples(text1, "tensile_patrol_cpu_seconds_total")[()]
        - harness.samples(text0, "tensile_patrol_cpu_seconds_total")[()]
    ) / runs
    duration = harness.samples(text1, "tensile_patrol_duration_seconds_sum")[()] / max(
        1.0, harness.samples(text1, "tensile_patrol_duration_seconds_count")[()]
    )
    found = harness.samples(text1, "tensile_patrol_mismatches_found_total")
    requests = harness.difference(harness.requests_by_verb(text1), harness.requests_by_verb(text0))
    patrol_requests = sum(v for (c, _, _), v in requests.items() if c.endswith("-patrol"))
    share = per_run / DEFAULT_PATROL_PERIOD
    verdict = "met" if share <= PATROL_TARGET and not found else "MISSED"
    say(f"\npatrol ({runs} runs every {period:g} s over {pods} pods){label}")
    say(f"  idle node CPU             {idle * 100:6.2f} % of one core")
    say(f"  CPU per run               {per_run:6.2f} s (minus idle), {duration:.2f} s wall")
    say(f"  CPU while a run was on    {during:6.2f} s per run (its own metric, a cross-check)")
    say(f"  API requests per run      {patrol_requests / runs:6.1f} (the patrol's clients)")
    say(
        f"  average at {DEFAULT_PATROL_PERIOD:g} s (default) {share * 100:6.2f} % of one core; "
        f"at {period:g} s {per_run / period * 100:.2f} %   [<= {PATROL_TARGET:.1%}, "
        f"nothing found: {verdict}]"
    )
    say(f"  mismatches found (kind, reason: n)  {dict(found) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--lower-nodes", type=int, default=10)
    parser.add_argument("--patrol-period", type=float, default=30.0, help="seconds, phase 4")
    parser.add_argument("--patrol-runs", type=int, default=4, help="runs measured, phase 4")
    parser.add_argument("--patrol-only", action="store_true", help="skip phases 2 and 3")
    parser.add_argument(
        "--patrol-baseline",
        metavar="PYTHON",
        help="measure phase 4 first with the node run by this interpreter (a baseline)",
    )
    args = parser.parse_args()
    if args.patrol_baseline:
        # Each interpreter imports the checkout it was installed from, not the one in the
        # working directory (which `python -m` would otherwise put first on sys.path).
        os.environ["PYTHONSAFEPATH"] = "1"
    fleet, attached = harness.fleet_for_pods(
        pods=args.pods, lower_nodes=args.lower_nodes, prefix="tensile-scale-"
    )
    node = VirtualNodeProcess(
        fleet,
        name=f"scale-{secrets.token_hex(3)}",
        log_dir=fleet.directory / "logs",
        args=NODE_ARGS,
    )
    namespace = harness.new_namespace()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        say(
            f"scale benchmark: {args.pods} pods through one virtual node, "
            f"{args.lower_nodes} kwok nodes"
        )
        node.start(timeout=300)
        assert node.process is not None
        time.sleep(2)
        idle = harness.rss_kib(node.process.pid)
        cpu0 = harness.cpu_seconds(node.process.pid)
        timed = asyncio.run(
            harness.create_pods(
                fleet.upper.kubeconfig,
                namespace=namespace,
                pods=args.pods,
                concurrency=args.concurrency,
                node=node.name,
                timeout=3600,
            )
        )
        cpu = harness.cpu_seconds(node.process.pid) - cpu0
        harness.wait_reconciled(node, keys=0)
        time.sleep(2)
        full = harness.rss_kib(node.process.pid)
        say(
            f"\ncreate: {timed.total:.1f} s to all Running, {timed.rate:.1f} pods/s, "
            f"p50 {pct(timed.latencies, 0.5):.2f} s, p99 {pct(timed.latencies, 0.99):.2f} s"
        )
        say(f"  virtual node CPU {cpu:.1f} s, {cpu * 1000 / args.pods:.2f} ms per pod")
        say(
            f"  virtual node RSS {idle // 1024} MiB idle, {full // 1024} MiB with {args.pods} "
            f"pods: {(full - idle) * 1024 / args.pods / 1000:.1f} KB per pod"
        )

        if not args.patrol_only:
            restarts(node, fleet=fleet, namespace=namespace, pods=args.pods, idle=idle, say=say)

        # -- the patrol --------------------------------------------------------------------
        measure = {"period": args.patrol_period, "runs": args.patrol_runs, "say": say}
        if args.patrol_baseline:
            here = node.argv[0]
            node.argv[0] = args.patrol_baseline
            patrol(node, pods=args.pods, label=f" [baseline: {args.patrol_baseline}]", **measure)
            node.argv[0] = here
        patrol(
            node,
            pods=args.pods,
            label=f" [{node.argv[0]}]" if args.patrol_baseline else "",
            **measure,
        )
    finally:
        node.stop()
        node.delete_node()
        harness.release_fleet(fleet, attached=attached, namespaces=[namespace])


def restarts(
    node: VirtualNodeProcess,
    *,
    fleet: Fleet,
    namespace: str,
    pods: int,
    idle: int,
    say: Callable[[str], None],
) -> None:
    """Phases 2 and 3 (see the module docstring); `idle` is the node's RSS before the pods
    were created, in KiB."""
    # -- a crash ---------------------------------------------------------------------
    wait_idle(node)  # nothing pending: whatever the restart writes, it should not have
    statuses = asyncio.run(upper_statuses(fleet, namespace))
    node.kill()
    started = time.monotonic()
    log_size = node.log.stat().st_size
    assert node.process is not None
    node.process.restart()
    # The upper Node still shows Ready from before the kill (its Lease has not lapsed):
    # the new process is ready when its own /readyz says so (caches synced, controllers
    # running).
    ready = wait_process_ready(node) - started
    reconciled = harness.wait_reconciled(node, keys=pods) - started
    synced = synced_after(node, since=log_size)
    wait_idle(node)
    assert node.process is not None
    written = writes(node)
    creates, deletes = lower_pod_writes(written)
    changed = changed_fields(statuses, asyncio.run(upper_statuses(fleet, namespace)))
    rss = harness.rss_kib(node.process.pid)
    verdict = "met" if reconciled < RECONCILE_TARGET and not creates and not deletes else "MISSED"
    say("\nSIGKILL and restart")
    say(f"  node ready (its /readyz)  {ready:6.1f} s after the new process started")
    if synced is not None:
        say(f"  caches synced             {synced:6.1f} s after (the lists done)")
    say(
        f"  every key reconciled      {reconciled:6.1f} s   [< {RECONCILE_TARGET:.0f} s, "
        f"0 creates, 0 deletes: {verdict}]"
    )
    say(f"  lower creates / deletes   {creates:.0f} / {deletes:.0f}")
    say(f"  writes (cluster verb code: n)  {dict(written) or 'none'}")
    say(f"  upper pod status fields the restart changed (field: pods)  {changed or 'none'}")
    say(
        f"  RSS after the relist      {rss // 1024} MiB: "
        f"{(rss - idle) * 1024 / pods / 1000:.1f} KB per pod"
    )

    # -- the lower apiserver restarts; its watches cannot resume ---------------------
    relisted_before = harness.relists(node, "lower-pods")
    handled_before = harness.queue_state(node.metrics(), "pods_from_upper")[0]
    before = writes(node)
    assert node.process is not None
    # While the node is paused, the lower apiserver restarts, history moves on and is
    # compacted: when the node wakes, its watches' resourceVersions are gone (410), so
    # its lower caches must list again (a restart alone could let them resume).
    node.process.pause()
    try:
        fleet.stop_component("lower-apiserver")
        fleet.start_component("lower-apiserver", timeout=300)
        asyncio.run(churn(fleet, namespace))
        fleet.compact_etcd()
    finally:
        node.process.resume()
    back = time.monotonic()
    deadline = back + 600
    while harness.relists(node, "lower-pods") <= relisted_before:
        if time.monotonic() > deadline:
            raise TimeoutError("the lower pod cache did not list again")
        time.sleep(0.05)
    relisted = time.monotonic() - back
    settled = wait_idle(node) - back
    handled = harness.queue_state(node.metrics(), "pods_from_upper")[0] - handled_before
    after = harness.difference(writes(node), before)
    creates, deletes = lower_pod_writes(after)
    verdict = "met" if not creates and not deletes else "MISSED"
    say("\nlower apiserver restart (etcd compacted: the watches must list again)")
    say(f"  lower pods listed again   {relisted:6.1f} s after the node woke")
    say(f"  queues idle again         {settled:6.1f} s after ({handled:.0f} pod keys handled)")
    say(f"  lower creates / deletes   {creates:.0f} / {deletes:.0f}   [0 / 0: {verdict}]")
    say(f"  writes (cluster verb code: n)  {dict(after) or 'none'}")


if __name__ == "__main__":
    main()
