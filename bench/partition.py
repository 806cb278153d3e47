"""Partition benchmark: each row of the partition contract (docs/operations/partitions.md)
with N pods, what it cost.

On one local fleet of its own, for each case: a fresh virtual node, a ReplicaSet of N pods
on it (pinned to it, as a workload with nowhere else to go), all Running; then the fault,
for the case's duration, then the fault undone. Printed per case:
- what the Node showed (Ready states and taints seen, polled every second);
- upper pods seen NotReady (their Ready condition False: Services upstairs drop them);
- upper pods evicted (of the N, gone upstairs at the end) and failed (phase Failed);
- lower pods deleted (of the N lower pods, gone at the end) and lower pods restarted (lower
  pods of the workload at the end that are new: the workload ran again elsewhere or anew);
- the outage as measured: from the fault's start until it was undone (a control plane
  answering again, a network thawed, a process started again; under load a 5 s outage of a
  control plane lasts as long as its apiserver takes to start);
- seconds from the fault's end until consistent: the Node Ready and untainted, the N pods
  Running upstairs, none being deleted, exactly their N lower pods below;
- what the node wrote meanwhile, by cluster and verb (its tensile_api_requests_total).

Cases (real durations; --quick scales them, and the fleet's node-monitor-grace-period to 20 s,
the pods' not-ready/unreachable toleration to 5 s and --lower-outage-grace to 240 s, the
outages to 60 s and 100 s, so that every outage but lower-5s outlasts a Lease renewal
interval, the grace period and the toleration together, and the "10 min" outage, with the
time its control plane takes to start again, stays within --lower-outage-grace, as 10 min
is within the default 15 min):
lower-5s, lower-2m, lower-10m (the lower control plane stopped), lower-cut (the network
between node and lower apiserver cut, 2 min), node-down (the process killed, 2 min),
leader-killed (two replicas, the leader killed), upper-down (the upper control plane stopped,
2 min), upper-cut (the network between node and upper apiserver cut, 2 min, the node run
with --leader-elect as shipped), lower-node-lost (a lower node and its pods gone). Real
durations take about 35 minutes; --quick about 25 on two loaded cores.

    .venv/bin/python bench/partition.py [--pods 200] [--quick] [--cases lower-2m,lower-10m]
        [--policy keep|evict] [--baseline]

--baseline runs the node without the outage policy flags, for code older than them: run
from a checkout of that code as the working directory (`python -m vnode` imports from
it), e.g. `cd ../main && python ../tensile/bench/partition.py --baseline`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import secrets
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.faults import kubeconfig_through, lose_lower_node
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient
from devcluster.tcpproxy import FreezableProxy
from devcluster.vnodes import VirtualNodeProcess

WRITES = ("POST", "PUT", "PATCH", "DELETE")
NODE_ARGS = ["--kube-api-qps=500", "--kube-api-burst=1000", "--log-level=info"]
ELECTION = [
    "--leader-elect",
    "--leader-elect-lease-duration=15s",
    "--leader-elect-renew-deadline=10s",
    "--leader-elect-retry-period=2s",
]
NODE_TAINTS = {
    "node.kubernetes.io/not-ready": "not-ready",
    "node.kubernetes.io/unreachable": "unreachable",
    "tensile.io/lower-unreachable": "lower-unreachable",
}


@dataclass(frozen=True)
class Case:
    name: str
    fault: str
    seconds: float
    quick_seconds: float


CASES = (
    Case("lower-5s", "lower-down", 5, 5),
    Case("lower-2m", "lower-down", 120, 60),
    Case("lower-10m", "lower-down", 600, 100),
    Case("lower-cut", "lower-cut", 120, 60),
    Case("node-down", "node-down", 120, 60),
    Case("leader-killed", "leader-killed", 0, 0),
    Case("upper-down", "upper-down", 120, 60),
    Case("upper-cut", "upper-cut", 120, 60),
    Case("lower-node-lost", "lower-node-lost", 0, 0),
)


@dataclass
class Result:
    case: str
    seconds: float
    node: str = ""
    not_ready_pods: int = 0
    evicted: int = 0
    failed: int = 0
    lower_deleted: int = 0
    lower_restarted: int = 0
    consistent: float | None = None
    writes: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)


# -- the fleet's faults ------------------------------------------------------------------------


def stop_control_plane(fleet: Fleet, cluster: str) -> None:
    """Stop a cluster's apiserver, controller manager and scheduler (and a lower one's kwok,
    its kubelets' connection: started again with it instead of waiting out client-go's
    reconnect backoff; its pods stay Running in etcd meanwhile)."""
    names = ["scheduler", "controller-manager", "apiserver"]
    if cluster == "lower":
        names.insert(0, "kwok")
    for name in names:
        fleet.stop_component(f"{cluster}-{name}")


def start_control_plane(fleet: Fleet, cluster: str) -> None:
    """Start them again; the controller manager restarts fresh, as a real one that lost its
    leader election does, giving every Node a fresh grace period."""
    names = ["apiserver", "controller-manager", "scheduler"]
    if cluster == "lower":
        names.append("kwok")
    for name in names:
        fleet.start_component(f"{cluster}-{name}")


# -- the workload ------------------------------------------------------------------------------


def replica_set(node: str, *, pods: int, toleration: int | None) -> dict[str, Any]:
    spec = harness.pod("x", node=node)["spec"]
    if toleration is not None:
        spec["tolerations"] += [
            {
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": toleration,
            }
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "work"},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": {"app": "work"}},
            "template": {"metadata": {"labels": {"app": "work"}}, "spec": spec},
        },
    }


def pods_of(client: RestClient, namespace: str) -> list[dict[str, Any]]:
    return list(client.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"])


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def node_view(upper: RestClient, name: str) -> tuple[str, str, set[str]]:
    """(Ready status, LowerControlPlaneReachable status, taint keys) of Node `name`."""
    try:
        node = upper.request("GET", f"/api/v1/nodes/{name}")
    except (ApiStatusError, OSError):
        return "", "", set()
    conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
    taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
    return conditions.get("Ready", ""), conditions.get("LowerControlPlaneReachable", ""), taints


class Sampler:
    """Every second, the Node (Ready, taints); every 3 s, which of the original pods show
    Ready False. In a thread, within a `with` block."""

    def __init__(self, upper: RestClient, *, node: str, namespace: str, original: set[str]):
        self.ready: set[str] = set()
        self.reachable: set[str] = set()
        self.taints: set[str] = set()
        self.not_ready: set[str] = set()
        self._upper, self._node, self._namespace, self._original = upper, node, namespace, original
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        beat = 0
        while not self._stop.wait(1.0):
            ready, reachable, taints = node_view(self._upper, self._node)
            if ready:
                self.ready.add(ready)
                self.reachable.add(reachable or "-")
                self.taints.update(NODE_TAINTS[t] for t in taints if t in NODE_TAINTS)
            beat += 1
            if beat % 3:
                continue
            try:
                pods = pods_of(self._upper, self._namespace)
            except (ApiStatusError, OSError):
                continue
            for pod in pods:
                conditions = (pod.get("status") or {}).get("conditions") or []
                if pod["metadata"]["uid"] in self._original and any(
                    c.get("type") == "Ready" and c.get("status") == "False" for c in conditions
                ):
                    self.not_ready.add(pod["metadata"]["uid"])

    def shown(self) -> str:
        states = "/".join(sorted(self.ready, key=["True", "False", "Unknown"].index))
        taints = ", ".join(sorted(self.taints)) or "no taint"
        lower = "LCPR False; " if "False" in self.reachable else ""
        return f"Ready {states}; {lower}{taints}"


# -- one case ------------------------------------------------------------------------------------


class Bench:
    def __init__(self, fleet: Fleet, args: argparse.Namespace) -> None:
        self.fleet, self.args = fleet, args
        self.upper, self.lower = fleet.upper.rest(), fleet.lower.rest()
        self.logs = fleet.directory / "logs" / "partition"
        self.logs.mkdir(parents=True, exist_ok=True)

    def node_args(self, *extra: str) -> list[str]:
        args = [*NODE_ARGS, *extra]
        if not self.args.baseline:
            args.append(f"--lower-outage-policy={self.args.policy}")
            if self.args.quick:
                args.append("--lower-outage-grace=240s")
        return args

    def new_node(self, case: str, *extra: str, name: str = "", **kwargs: Any) -> VirtualNodeProcess:
        log_dir = self.logs / f"{case}-{secrets.token_hex(2)}"
        log_dir.mkdir()
        return VirtualNodeProcess(
            self.fleet,
            name=name or f"vn-{case}-{secrets.token_hex(2)}",
            log_dir=log_dir,
            args=self.node_args(*extra),
            **kwargs,
        )

    def run(self, case: Case) -> Result:
        seconds = case.quick_seconds if self.args.quick else case.seconds
        with contextlib.ExitStack() as stack:
            nodes: list[VirtualNodeProcess] = []
            stack.callback(self.retire, nodes)
            proxy: FreezableProxy | None = None
            kwargs: dict[str, Any] = {}
            extra: list[str] = []
            if case.fault == "lower-cut":
                proxy = stack.enter_context(FreezableProxy(self.fleet.lower.server))
                path = self.logs / f"lower-{secrets.token_hex(2)}.kubeconfig"
                kwargs["lower_kubeconfig"] = kubeconfig_through(
                    self.fleet.lower.kubeconfig, proxy.url, path
                )
            elif case.fault == "upper-cut":
                proxy = stack.enter_context(FreezableProxy(self.fleet.upper.server))
                path = self.logs / f"upper-{secrets.token_hex(2)}.kubeconfig"
                kwargs["upper_kubeconfig"] = kubeconfig_through(
                    self.fleet.upper.kubeconfig, proxy.url, path
                )
                extra = ELECTION
            elif case.fault == "leader-killed":
                extra = ELECTION
            node = self.new_node(case.name, *extra, **kwargs)
            nodes.append(node)
            node.start(timeout=300)
            standby = None
            if case.fault == "leader-killed":
                standby = self.new_node(case.name, *extra, name=node.name)
                nodes.append(standby)
                standby.start(wait=False)
                harness_wait(lambda: standby.get("/readyz")[0] == 200, "the standby ready", 300)
            namespace = harness.new_namespace()
            stack.callback(self.clean, namespace)
            asyncio.run(self.workload(node.name, namespace))
            harness.wait_reconciled(node, keys=self.args.pods)
            upper_before = pods_of(self.upper, namespace)
            lower_before = pods_of(self.lower, namespace)
            counted = [(node, writes(node))] + ([(standby, writes(standby))] if standby else [])
            result = Result(case=case.name, seconds=seconds)
            with Sampler(
                self.upper, node=node.name, namespace=namespace, original=uids(upper_before)
            ) as sampler:
                started = time.monotonic()
                restarted = self.fault(case, seconds, node=node, standby=standby, proxy=proxy)
                back = time.monotonic()
                result.seconds = back - started
                result.consistent = self.wait_consistent(
                    node.name, namespace, timeout=self.args.timeout
                )
                if result.consistent is not None:
                    result.consistent -= back
            upper_after = pods_of(self.upper, namespace)
            lower_after = pods_of(self.lower, namespace)
            result.node = sampler.shown()
            result.not_ready_pods = len(sampler.not_ready)
            gone = uids(upper_before) - uids(upper_after)
            result.evicted = len(gone)
            result.failed = sum(
                1
                for p in upper_after
                if p["metadata"]["uid"] in uids(upper_before)
                and (p.get("status") or {}).get("phase") == "Failed"
            )
            result.lower_deleted = len(uids(lower_before) - uids(lower_after))
            result.lower_restarted = len(uids(running(lower_after)) - uids(lower_before))
            total: Counter[tuple[str, str]] = Counter()
            for counted_node, before in counted:
                now = (
                    writes(counted_node)
                    if counted_node.process and counted_node.process.alive()
                    else {}
                )
                # A process started again counts from zero: all of its writes are new.
                base = {} if counted_node in restarted else before
                for (cluster, verb, code), n in now.items():
                    if code != "0":
                        total[(cluster.split("-")[0], verb)] += n - base.get(
                            (cluster, verb, code), 0.0
                        )
            result.writes = {k: v for k, v in total.items() if v > 0}
            return result

    @staticmethod
    def retire(nodes: list[VirtualNodeProcess]) -> None:
        """Stop the case's nodes and delete their Nodes: a stopped node left behind would
        count as a not Ready Node of the zone, and past 55 % of them the node lifecycle
        controller stops evicting (--unhealthy-zone-threshold), which later cases measure."""
        for node in nodes:
            node.stop()
        for node in nodes:
            node.delete_node()

    async def workload(self, node: str, namespace: str) -> None:
        toleration = 5 if self.args.quick else None
        async with harness.client_for(self.fleet.upper.kubeconfig) as client:
            await harness.create_namespace(client, namespace)
            await client.request(
                "POST",
                f"/apis/apps/v1/namespaces/{namespace}/replicasets",
                body=replica_set(node, pods=self.args.pods, toleration=toleration),
            )
        harness_wait(
            lambda: len(running(pods_of(self.upper, namespace))) == self.args.pods,
            f"{self.args.pods} pods Running",
            900,
        )

    def fault(
        self,
        case: Case,
        seconds: float,
        *,
        node: VirtualNodeProcess,
        standby: VirtualNodeProcess | None,
        proxy: FreezableProxy | None,
    ) -> set[VirtualNodeProcess]:
        """Apply the case's fault for `seconds` and undo it; return the processes started
        again."""
        if case.fault == "lower-down":
            stop_control_plane(self.fleet, "lower")
            time.sleep(seconds)
            start_control_plane(self.fleet, "lower")
        elif case.fault == "upper-down":
            stop_control_plane(self.fleet, "upper")
            time.sleep(seconds)
            start_control_plane(self.fleet, "upper")
        elif case.fault in ("lower-cut", "upper-cut"):
            assert proxy is not None
            proxy.freeze()
            time.sleep(seconds)
            proxy.thaw()
            if node.process is not None and not node.process.alive():
                node.process.restart()  # stopped at its renew deadline: its StatefulSet's
                return {node}
        elif case.fault == "node-down":
            node.kill()
            time.sleep(seconds)
            assert node.process is not None
            node.process.restart()
            return {node}
        elif case.fault == "leader-killed":
            assert standby is not None
            node.kill()
            harness_wait(
                lambda: standby.metric("tensile_leader_election_is_leader") == 1,
                "the standby leads",
                120,
            )
        elif case.fault == "lower-node-lost":
            lose_lower_node(self.lower, self.fleet_lower_nodes()[0])
        return set()

    def fleet_lower_nodes(self) -> list[str]:
        found = self.lower.request("GET", "/api/v1/nodes")["items"]
        return sorted(n["metadata"]["name"] for n in found)

    def wait_consistent(self, node: str, namespace: str, *, timeout: float) -> float | None:
        """When (monotonic) the Node was Ready and untainted, the workload's N pods Running
        upstairs and none being deleted, and exactly their N lower pods below; None if not
        within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, reachable, taints = node_view(self.upper, node)
            if ready == "True" and reachable != "False" and not taints & set(NODE_TAINTS):
                try:
                    upper = pods_of(self.upper, namespace)
                    lower = pods_of(self.lower, namespace)
                except (ApiStatusError, OSError):
                    upper, lower = [], []
                live = [p for p in upper if (p.get("status") or {}).get("phase") != "Failed"]
                if len(running(upper)) == self.args.pods == len(live) and len(
                    running(lower)
                ) == self.args.pods == len(lower):
                    return time.monotonic()
            time.sleep(1.0)
        return None

    def clean(self, namespace: str) -> None:
        with contextlib.suppress(Exception):
            asyncio.run(harness.delete_namespaces(self.fleet, [namespace], timeout=600))


def harness_wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.5)


def writes(node: VirtualNodeProcess) -> dict[tuple[str, str, str], float]:
    try:
        text = node.metrics()
    except (OSError, RuntimeError):
        return {}
    return {k: v for k, v in harness.requests_by_verb(text).items() if k[1] in WRITES}


def table(results: list[Result]) -> Iterator[str]:
    yield (
        "| case | fault lasted | the Node showed | pods NotReady | evicted upstairs "
        "| failed upstairs | lower pods deleted | lower pods restarted | s to consistent "
        "| writes (node) |"
    )
    yield "|---|---|---|---|---|---|---|---|---|---|"
    for r in results:
        written = ", ".join(
            f"{cluster} {verb} {n:.0f}" for (cluster, verb), n in sorted(r.writes.items())
        )
        consistent = f"{r.consistent:.0f}" if r.consistent is not None else "never"
        yield (
            f"| {r.case} | {r.seconds:.0f} s | {r.node} | {r.not_ready_pods} | {r.evicted} "
            f"| {r.failed} | {r.lower_deleted} | {r.lower_restarted} | {consistent} "
            f"| {written or 'none'} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="scaled durations (see above)")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--policy", default="keep", choices=("keep", "evict"))
    parser.add_argument("--baseline", action="store_true", help="no outage policy flags")
    parser.add_argument("--lower-nodes", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0, help="wait for consistency, s")
    args = parser.parse_args()
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(chosen) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; known: {[c.name for c in CASES]}")
    # The lost lower node is gone for good: that case comes last.
    cases = sorted(
        (c for c in CASES if c.name in chosen), key=lambda c: c.fault == "lower-node-lost"
    )
    fleet = Fleet.start(
        directory=Path(tempfile.mkdtemp(prefix="tensile-partition-")),
        settings=FleetSettings(
            lowers=(
                LowerClusterSettings(
                    nodes=args.lower_nodes,
                    pods=str(args.pods // max(1, args.lower_nodes - 1) + 110),
                ),
            ),
            metrics_server=False,
            node_monitor_grace_period="20s" if args.quick else "50s",
        ),
        owns_directory=True,
    )
    mode = "quick (scaled)" if args.quick else "real durations"
    flags = "none (--baseline)" if args.baseline else f"--lower-outage-policy={args.policy}"
    print(
        f"partition benchmark: {args.pods} pods per case, {mode}, node flags: {flags}", flush=True
    )
    results: list[Result] = []
    try:
        bench = Bench(fleet, args)
        for case in cases:
            started = time.monotonic()
            results.append(bench.run(case))
            print(f"  {case.name} done in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        fleet.stop()
        print()
        for line in table(results):
            print(line)


if __name__ == "__main__":
    main()
