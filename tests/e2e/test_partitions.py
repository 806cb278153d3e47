"""The partition contract (docs/operations/partitions.md), one test per row, on real clusters.

One fleet for the module (an upper cluster and a lower one of two kwok nodes); each row has
virtual nodes of its own, and rows whose faults do not touch each other run during one
fault window (the lower control plane down; the partitions of single nodes; the upper
control plane down), each test asserting its row from what the window recorded. The
durations are scaled down so that the module takes about four minutes:

- kube-controller-manager --node-monitor-grace-period is 20 s (Kubernetes: 50 s): a Node
  whose Lease is not renewed for that long is marked Unknown;
- the pods tolerate node.kubernetes.io/not-ready and /unreachable for `TOLERATION` = 5 s
  (the webhook's default, as kube-apiserver's: 300 s);
- the "2 min" and "10 min" lower outages are one outage longer than the grace period and
  the toleration together, under --lower-outage-grace=300s (standing for the default 15 min:
  the outage is within it); an outage that outlasts the grace is the same outage, for a
  node run with --lower-outage-grace=5s;
- leader election runs with a 4 s lease (the shipped 15 s).

The lower control plane's own clients (its scheduler, kwok standing for its kubelets) are
restarted with its apiserver instead of waiting out client-go's reconnect backoff (up to
~45 s here), and its controller manager too, as a real one would restart having lost its
own leader election: the lower cluster's business, not the row's. A lost lower node's pods
are force-deleted at once, as the lower pod garbage collector does 40 s after the Node is
gone.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import FleetSettings, LowerClusterSettings, lower_node_name
from devcluster.faults import kubeconfig_through, lose_lower_node
from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.tcpproxy import FreezableProxy
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import clusterselector, lowerhealth
from tests.e2e.helpers import create, get, pod_manifest, wait_for
from tests.fixtures import create_namespace, long_lived_pids

NODE_GRACE = 20.0
"""kube-controller-manager --node-monitor-grace-period of the module's fleet, seconds."""
TOLERATION = 5
"""Seconds the pods tolerate node.kubernetes.io/not-ready and /unreachable."""
PODS = 3
"""Pods per row."""
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
KEPT_BELOW = lower_node_name("lower", 0)
"""The lower node every row's pods run on, but the lost node's."""
LOST_BELOW = lower_node_name("lower", 1)
"""The lower node that is lost (its row's pods run there)."""
ELECTION = (
    "--leader-elect",
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=500ms",
)


# -- the fleet, the nodes, the pods ----------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    directory = Path(tempfile.mkdtemp(prefix="tensile-fleet-"))
    started = Fleet.start(
        directory=directory,
        settings=FleetSettings(
            lowers=(LowerClusterSettings(nodes=2),),
            metrics_server=False,
            node_monitor_grace_period=f"{NODE_GRACE:g}s",
        ),
        owns_directory=True,
    )
    try:
        yield started
    finally:
        started.stop()
        long_lived_pids(request.config).difference_update(_MODULE_PIDS)


_MODULE_PIDS: set[int] = set()
"""The processes of the module's fleet and nodes, restarted ones included."""


@pytest.fixture(autouse=True)
def _module_processes(request: pytest.FixtureRequest, fleet: Fleet, nodes: Nodes) -> Iterator[None]:
    """The fleet's and the nodes' processes live for the module: after each test (and
    before the suite's check for leaked children) those running now are long-lived."""
    yield
    running = set(fleet.pids()) | {
        n.process.pid for n in nodes.started if n.process is not None and n.process.alive()
    }
    _MODULE_PIDS.update(running)
    long_lived_pids(request.config).update(running)


@pytest.fixture(scope="module")
def namespace(fleet: Fleet) -> str:
    return create_namespace((fleet.upper, fleet.lower), prefix="part")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("partitions")


class Nodes:
    """The virtual nodes the module started; stopped and deregistered at its end."""

    def __init__(self, fleet: Fleet, logs: Path) -> None:
        self.fleet, self.logs = fleet, logs
        self.started: list[VirtualNodeProcess] = []

    def new(self, row: str, *args: str, **kwargs: Any) -> VirtualNodeProcess:
        """A node for `row` (not started yet), with `args` beyond the test defaults."""
        log_dir = self.logs / f"{row}-{len(self.started)}"
        log_dir.mkdir()
        node = VirtualNodeProcess(
            self.fleet,
            name=kwargs.pop("name", None) or f"vn-{row}-{secrets.token_hex(2)}",
            log_dir=log_dir,
            args=list(args),
            **kwargs,
        )
        self.started.append(node)
        return node

    def stop(self) -> None:
        for node in self.started:
            node.stop()
        for node in {n.name: n for n in self.started}.values():
            node.delete_node()


@pytest.fixture(scope="module")
def nodes(fleet: Fleet, logs: Path) -> Iterator[Nodes]:
    made = Nodes(fleet, logs)
    try:
        yield made
    finally:
        made.stop()


def _start_all(*started: VirtualNodeProcess) -> None:
    for node in started:
        node.start(wait=False)
    for node in started:
        node.wait_ready(timeout=90)


def _row_pod(
    name: str, node: str, *, lower_node: str | None = KEPT_BELOW, bind: bool = False, **spec: Any
) -> dict[str, Any]:
    """A pod for virtual node `node` tolerating its not-ready/unreachable taints for
    TOLERATION seconds, running below on `lower_node` (None: anywhere); `bind`: bound
    directly (spec.nodeName), else placed by the upper scheduler."""
    manifest = pod_manifest(name, node=node, labels={"row": node}, spec=spec)
    manifest["spec"]["tolerations"] += [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION}
        for key in (NOT_READY, UNREACHABLE)
    ]
    if lower_node is not None:
        selector = {"nodeSelector": {"kubernetes.io/hostname": lower_node}}
        manifest["metadata"]["annotations"] = {clusterselector.ANNOTATION: json.dumps(selector)}
    if bind:
        manifest["spec"]["nodeName"] = node
    return manifest


def _upper_pods(upper: RestClient, namespace: str, node: str) -> dict[str, dict[str, Any]]:
    found = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=row%3D{node}")
    return {p["metadata"]["name"]: p for p in found["items"]}


def _lower_pods(lower: RestClient, namespace: str, node: str) -> dict[str, str]:
    """Name -> UID of the lower pods of the upper pods of `node` (label row=<node>)."""
    found = lower.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=row%3D{node}")
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in found["items"]}


def _running(upper: RestClient, namespace: str, node: str, count: int = PODS) -> bool:
    pods = _upper_pods(upper, namespace, node)
    return len(pods) == count and all(
        (p.get("status") or {}).get("phase") == "Running" for p in pods.values()
    )


def _eventually(condition: Callable[[], bool], *, timeout: float) -> bool:
    """Poll `condition` every 0.2 s until it holds (True) or `timeout` s have passed
    (False): for waits whose outcome a row's test judges, not the fixture."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _wait_running(upper: RestClient, namespace: str, *rows: VirtualNodeProcess) -> None:
    wait_for(
        "every row's pods Running",
        lambda: all(_running(upper, namespace, node.name) for node in rows),
        timeout=90,
    )


def _evicted(upper: RestClient, namespace: str, node: str) -> bool:
    """Every upper pod of `node` is being deleted, or gone."""
    return all(
        p["metadata"].get("deletionTimestamp") for p in _upper_pods(upper, namespace, node).values()
    )


def _create_row(upper: RestClient, namespace: str, node: str, **kwargs: Any) -> None:
    for i in range(PODS):
        create(upper, namespace, _row_pod(f"{node}-{i}", node, **kwargs))


# -- what the Nodes showed -------------------------------------------------------------------


@dataclass
class Seen:
    """What one Node showed while sampled: Ready statuses, LowerControlPlaneReachable
    statuses, taint keys (each as a set of what was seen)."""

    ready: set[str] = field(default_factory=set)
    reachable: set[str] = field(default_factory=set)
    taints: set[str] = field(default_factory=set)


class Sampler:
    """Reads the Nodes every 0.5 s in a thread while in a `with` block."""

    def __init__(self, upper: RestClient, names: list[str]) -> None:
        self.seen = {name: Seen() for name in names}
        self._upper = upper
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="node-sampler")

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            for name, seen in self.seen.items():
                try:
                    node = get(self._upper, f"/api/v1/nodes/{name}") or {}
                except OSError:
                    continue  # the upper apiserver is down: nothing to see
                conditions = {
                    c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []
                }
                seen.ready.add(conditions.get("Ready", "missing"))
                seen.reachable.add(conditions.get(lowerhealth.LOWER_REACHABLE_CONDITION, "missing"))
                seen.taints.update(t["key"] for t in node.get("spec", {}).get("taints") or [])


def _node_now(upper: RestClient, name: str) -> tuple[str, str, set[str]]:
    node = get(upper, f"/api/v1/nodes/{name}") or {}
    conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
    taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
    return (
        conditions.get("Ready", ""),
        conditions.get(lowerhealth.LOWER_REACHABLE_CONDITION, ""),
        taints,
    )


def _healthy(upper: RestClient, name: str) -> bool:
    ready, reachable, taints = _node_now(upper, name)
    return (
        ready == "True"
        and reachable == "True"
        and not taints & {lowerhealth.LOWER_UNREACHABLE_TAINT, NOT_READY, UNREACHABLE}
    )


def _stop_control_plane(fleet: Fleet, cluster: str) -> None:
    for component in ("kwok", "scheduler", "controller-manager", "apiserver"):
        if component != "kwok" or cluster == "lower":
            fleet.stop_component(f"{cluster}-{component}")


def _start_control_plane(fleet: Fleet, cluster: str) -> None:
    for component in ("apiserver", "controller-manager", "scheduler", "kwok"):
        if component != "kwok" or cluster == "lower":
            fleet.start_component(f"{cluster}-{component}")


# -- the lower apiserver down: 5 s -----------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_5s_lower_outage_changes_nothing_that_runs(
    fleet: Fleet, namespace: str, nodes: Nodes
) -> None:
    """A lower apiserver away for about 5 s (stopped, started again: what a restart
    takes). The Node stays Ready; it may say LowerControlPlaneReachable False and carry
    the NoSchedule taint for one ping interval; nothing is evicted, deleted or restarted,
    and it is all as before within a ping interval (10 s) of the return."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = nodes.new("five")
    _start_all(node)
    _create_row(upper, namespace, node.name)
    wait_for("the pods Running", lambda: _running(upper, namespace, node.name), timeout=60)
    below = _lower_pods(lower, namespace, node.name)

    with Sampler(upper, [node.name]) as sampler:
        _stop_control_plane(fleet, "lower")
        time.sleep(5)
        _start_control_plane(fleet, "lower")
        back = time.monotonic()
        wait_for("the Node as before", lambda: _healthy(upper, node.name), timeout=30)
        consistent = time.monotonic() - back
    print(f"5 s outage: the Node as before {consistent:.1f}s after the return; saw {sampler.seen}")
    assert sampler.seen[node.name].ready == {"True"}
    assert not sampler.seen[node.name].taints & {NOT_READY, UNREACHABLE}
    assert _running(upper, namespace, node.name)
    assert _lower_pods(lower, namespace, node.name) == below
    node.check()


# -- the lower apiserver down: 2 min and 10 min, within and past the grace --------------------


@dataclass
class LowerOutage:
    """What one long lower outage did to three nodes: `kept` (keep, within its grace),
    `moved` (keep, past its grace), `evict` (--lower-outage-policy=evict)."""

    kept: VirtualNodeProcess
    moved: VirtualNodeProcess
    evict: VirtualNodeProcess
    seen: dict[str, Seen]
    below: dict[str, dict[str, str]]
    """Node name -> its lower pods' UIDs before the outage."""
    lasted: float
    consistent: dict[str, float] = field(default_factory=dict)
    """Node name -> seconds from the return until its row was consistent."""
    pending_reason: str = ""
    """Why the pod created for `kept` during the outage was not scheduled (its event; ""
    when it was bound during the outage)."""


@pytest.fixture(scope="module")
def lower_outage(fleet: Fleet, namespace: str, nodes: Nodes) -> LowerOutage:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    kept = nodes.new("kept", "--lower-outage-grace=300s")
    moved = nodes.new("moved", "--lower-outage-grace=5s")
    evict = nodes.new("evict", "--lower-outage-policy=evict")
    _start_all(kept, moved, evict)
    for node in (kept, moved, evict):
        _create_row(upper, namespace, node.name)
    _wait_running(upper, namespace, kept, moved, evict)
    below = {n.name: _lower_pods(lower, namespace, n.name) for n in (kept, moved, evict)}
    create(upper, namespace, _row_pod("doomed", kept.name, bind=True))
    wait_for(
        "doomed Running below",
        lambda: _lower_pods(lower, namespace, kept.name).get("doomed"),
        timeout=60,
    )

    with Sampler(upper, [kept.name, moved.name, evict.name]) as sampler:
        _stop_control_plane(fleet, "lower")
        stopped = time.monotonic()
        # Created during the outage: bound directly (as a controller that sets nodeName
        # would), they run once the lower cluster is back, the one that may never restart
        # too; placed by the scheduler, one waits (the taint), and runs once it is gone.
        create(upper, namespace, _row_pod("during", kept.name, bind=True))
        create(upper, namespace, _row_pod("once", kept.name, bind=True, restartPolicy="Never"))
        _eventually(
            lambda: lowerhealth.LOWER_UNREACHABLE_TAINT in _node_now(upper, kept.name)[2],
            timeout=30,
        )
        create(upper, namespace, _row_pod("later", kept.name))
        # Force-deleted (kubectl delete --force): gone upstairs at once, its lower pod goes
        # when the lower cluster can take the delete.
        upper.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/doomed",
            body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
        # Until the pods of today's behaviour are evicted, and longer than the grace period
        # and the toleration together (a kept pod would have been evicted by then).
        _eventually(
            lambda: (
                _evicted(upper, namespace, evict.name) and _evicted(upper, namespace, moved.name)
            ),
            timeout=90,
        )
        time.sleep(max(0.0, NODE_GRACE + TOLERATION + 10 - (time.monotonic() - stopped)))
        reason = _scheduling_refusal(upper, namespace, "later")
        unbound = not (get(upper, f"/api/v1/namespaces/{namespace}/pods/later") or {})["spec"].get(
            "nodeName"
        )
        _start_control_plane(fleet, "lower")
        back = time.monotonic()
        lasted = back - stopped
        consistent: dict[str, float] = {}

        def settled() -> bool:
            done = {
                kept.name: _healthy(upper, kept.name)
                and _running(upper, namespace, kept.name, PODS + 3)
                and "doomed" not in _lower_pods(lower, namespace, kept.name),
                moved.name: _healthy(upper, moved.name)
                and not _upper_pods(upper, namespace, moved.name)
                and not _lower_pods(lower, namespace, moved.name),
                evict.name: _healthy(upper, evict.name)
                and not _upper_pods(upper, namespace, evict.name)
                and not _lower_pods(lower, namespace, evict.name),
            }
            for name, ok in done.items():
                if ok:
                    consistent.setdefault(name, time.monotonic() - back)
            return all(done.values())

        _eventually(settled, timeout=120)  # each row's test says which one was not
    print(f"lower outage of {lasted:.0f}s: consistent after {consistent}; saw {sampler.seen}")
    for node in (kept, moved, evict):
        node.check()
    return LowerOutage(
        kept=kept,
        moved=moved,
        evict=evict,
        seen=sampler.seen,
        below=below,
        lasted=lasted,
        consistent=consistent,
        pending_reason=reason if unbound else "",
    )


def _scheduling_refusal(upper: RestClient, namespace: str, name: str) -> str:
    """The message of the upper scheduler's FailedScheduling event of pod `name`."""
    found = upper.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}",
    )
    return " ".join(
        e.get("message", "") for e in found["items"] if e.get("reason") == "FailedScheduling"
    )


@pytest.mark.timeout(300)
def test_a_lower_outage_within_the_grace_keeps_the_node_ready_and_every_pod(
    fleet: Fleet, namespace: str, lower_outage: LowerOutage
) -> None:
    """The "2 min" and "10 min" rows: the Node stays Ready, says LowerControlPlaneReachable
    False and carries tensile.io/lower-unreachable:NoSchedule; no pod is evicted upstairs,
    no lower pod is deleted or restarted, though the outage outlasted the grace period and
    the toleration together (the evict node's pods were evicted meanwhile). A pod bound
    meanwhile runs once the lower cluster is back; one the scheduler would place waits for
    the taint to go; a pod force-deleted meanwhile loses its lower pod then."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    name = lower_outage.kept.name
    seen = lower_outage.seen[name]
    assert seen.ready == {"True"}
    assert seen.reachable == {"True", "False"}
    assert lowerhealth.LOWER_UNREACHABLE_TAINT in seen.taints
    assert not seen.taints & {NOT_READY, UNREACHABLE}
    assert "untolerated taint" in lower_outage.pending_reason
    now = _lower_pods(lower, namespace, name)
    assert {k: now.get(k) for k in lower_outage.below[name]} == lower_outage.below[name]
    pods = _upper_pods(upper, namespace, name)
    assert {p: (pod.get("status") or {}).get("phase") for p, pod in pods.items()} == {
        **{f"{name}-{i}": "Running" for i in range(PODS)},
        "during": "Running",
        "once": "Running",
        "later": "Running",
    }
    assert pods["later"]["spec"]["nodeName"] == name
    assert name in lower_outage.consistent, "consistent again within 120 s of the return"


@pytest.mark.timeout(300)
def test_a_lower_outage_past_the_grace_makes_the_node_not_ready_and_moves_its_pods(
    lower_outage: LowerOutage,
) -> None:
    """Past --lower-outage-grace the Node says Ready False (LowerControlPlaneUnreachable),
    its Lease still renewed: the node lifecycle controller taints it not-ready NoExecute and
    evicts its pods after their toleration; their lower pods are deleted once the lower
    cluster answers (the upper pods' deletion finished then)."""
    seen = lower_outage.seen[lower_outage.moved.name]
    assert "False" in seen.ready
    assert "Unknown" not in seen.ready, "the node still reports: not Unknown"
    assert NOT_READY in seen.taints
    assert UNREACHABLE not in seen.taints
    assert lowerhealth.LOWER_UNREACHABLE_TAINT in seen.taints
    assert lower_outage.moved.name in lower_outage.consistent, "its pods gone, above and below"


@pytest.mark.timeout(300)
def test_the_evict_policy_is_tensile_kubes(lower_outage: LowerOutage) -> None:
    """--lower-outage-policy=evict: no heartbeat at all while the lower apiserver does not
    answer, so the Node turns Unknown, tainted unreachable; its pods are evicted after
    their toleration and their lower pods deleted when the lower cluster answers, though
    they ran all along."""
    seen = lower_outage.seen[lower_outage.evict.name]
    assert "Unknown" in seen.ready
    assert UNREACHABLE in seen.taints
    assert lowerhealth.LOWER_UNREACHABLE_TAINT not in seen.taints
    assert seen.reachable == {"True"}, "it writes nothing while the outage lasts"
    assert lower_outage.evict.name in lower_outage.consistent, "its pods gone, above and below"


# -- partitions of single nodes --------------------------------------------------------------


@dataclass
class Partitions:
    """What one window of single-node faults did: `cut_below` (the network to the lower
    apiserver cut), `down` (the process killed), `cut_above` (the network to the upper
    apiserver cut), `replicas` (two replicas, the leader killed), `lost` (a lower node lost)."""

    cut_below: VirtualNodeProcess
    down: VirtualNodeProcess
    cut_above: VirtualNodeProcess
    replicas: tuple[VirtualNodeProcess, VirtualNodeProcess]
    lost: VirtualNodeProcess
    seen: dict[str, Seen]
    below: dict[str, dict[str, str]]
    consistent: dict[str, float]
    lower_writes_of_new_leader: float
    lost_uids: set[str]
    """The upper UIDs of the lost node's pods before the loss."""
    cut_off_stopped: bool
    """The node cut off from the upper cluster had stopped (its renew deadline) before the
    network was back."""


@pytest.fixture(scope="module")
def partitions(fleet: Fleet, namespace: str, nodes: Nodes, logs: Path) -> Iterator[Partitions]:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    with contextlib.ExitStack() as stack:
        below_proxy = stack.enter_context(FreezableProxy(fleet.lower.server))
        above_proxy = stack.enter_context(FreezableProxy(fleet.upper.server))
        cut_below = nodes.new(
            "cutbelow",
            lower_kubeconfig=kubeconfig_through(
                fleet.lower.kubeconfig, below_proxy.url, logs / "lower.kubeconfig"
            ),
        )
        down = nodes.new("down")
        cut_above = nodes.new(
            "cutabove",
            *ELECTION,
            upper_kubeconfig=kubeconfig_through(
                fleet.upper.kubeconfig, above_proxy.url, logs / "upper.kubeconfig"
            ),
        )
        leader = nodes.new("replicas", *ELECTION)
        standby = nodes.new("replicas", *ELECTION, name=leader.name)
        lost = nodes.new("lost")
        _start_all(cut_below, down, cut_above, leader, lost)
        standby.start(wait=False)

        # The lost node's pods run on the lower node that is lost: the other goes out of
        # the lower scheduler's way while they are placed. A ReplicaSet owns them upstairs.
        _cordon(lower, KEPT_BELOW, True)
        replicas = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": lost.name},
            "spec": {
                "replicas": PODS,
                "selector": {"matchLabels": {"row": lost.name}},
                "template": {
                    "metadata": {"labels": {"row": lost.name}},
                    "spec": _row_pod("x", lost.name, lower_node=None)["spec"],
                },
            },
        }
        upper.request("POST", f"/apis/apps/v1/namespaces/{namespace}/replicasets", body=replicas)
        wait_for(
            "the lost node's pods Running",
            lambda: _running(upper, namespace, lost.name),
            timeout=90,
        )
        _cordon(lower, KEPT_BELOW, False)
        rows = (cut_below, down, cut_above, leader)
        for node in rows:
            _create_row(upper, namespace, node.name)
        _wait_running(upper, namespace, *rows)
        wait_for(
            "the standby's caches synced", lambda: standby.get("/readyz")[0] == 200, timeout=60
        )
        assert _leads(leader)
        assert not _leads(standby)
        below = {n.name: _lower_pods(lower, namespace, n.name) for n in (*rows, lost)}
        lost_uids = {
            p["metadata"]["uid"] for p in _upper_pods(upper, namespace, lost.name).values()
        }
        standby_lower_writes = _lower_writes(standby)

        names = [n.name for n in (cut_below, down, cut_above, leader, lost)]
        with Sampler(upper, names) as sampler:
            below_proxy.freeze()
            down.kill()
            above_proxy.freeze()
            _kill_after_a_renewal(upper, leader)
            lose_lower_node(lower, LOST_BELOW)
            started = time.monotonic()
            _eventually(
                lambda: (
                    _evicted(upper, namespace, down.name)
                    and _evicted(upper, namespace, cut_above.name)
                    and not _alive(cut_above)
                ),  # it stops at its renew deadline
                timeout=90,
            )
            cut_off_stopped = not _alive(cut_above)
            time.sleep(max(0.0, NODE_GRACE + TOLERATION + 10 - (time.monotonic() - started)))
            below_proxy.thaw()
            above_proxy.thaw()
            back = time.monotonic()
            for restarted in (down, cut_above):  # as their StatefulSets would
                assert restarted.process is not None
                if not restarted.process.alive():
                    restarted.process.restart()
            consistent: dict[str, float] = {}

            def settled() -> bool:
                done = {
                    cut_below.name: _healthy(upper, cut_below.name)
                    and _running(upper, namespace, cut_below.name),
                    down.name: _healthy(upper, down.name)
                    and not _upper_pods(upper, namespace, down.name)
                    and not _lower_pods(lower, namespace, down.name),
                    cut_above.name: _healthy(upper, cut_above.name)
                    and not _upper_pods(upper, namespace, cut_above.name)
                    and not _lower_pods(lower, namespace, cut_above.name),
                    leader.name: _healthy(upper, leader.name) and _leads(standby),
                    lost.name: _replaced(upper, namespace, lost.name, lost_uids),
                }
                for name, ok in done.items():
                    if ok:
                        consistent.setdefault(name, time.monotonic() - back)
                return all(done.values())

            _eventually(settled, timeout=120)  # each row's test says which one was not
        print(f"single-node partitions: consistent after {consistent}; saw {sampler.seen}")
        yield Partitions(
            cut_below=cut_below,
            down=down,
            cut_above=cut_above,
            replicas=(leader, standby),
            lost=lost,
            seen=sampler.seen,
            below=below,
            consistent=consistent,
            lower_writes_of_new_leader=_lower_writes(standby) - standby_lower_writes,
            lost_uids=lost_uids,
            cut_off_stopped=cut_off_stopped,
        )
        # The proxied nodes stop before their proxies close.
        cut_below.stop()
        cut_above.stop()


def _cordon(lower: RestClient, node: str, cordoned: bool) -> None:
    lower.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"spec": {"unschedulable": cordoned or None}},
        content_type="application/merge-patch+json",
    )


def _leads(node: VirtualNodeProcess) -> bool:
    return node.metric("tensile_leader_election_is_leader") == 1


def _alive(node: VirtualNodeProcess) -> bool:
    return node.process is not None and node.process.alive()


def _lower_writes(node: VirtualNodeProcess) -> float:
    return sum(
        node.metric("tensile_api_requests_total", cluster="lower", verb=verb)
        for verb in ("POST", "PUT", "PATCH", "DELETE")
    )


def _kill_after_a_renewal(upper: RestClient, leader: VirtualNodeProcess) -> None:
    """SIGKILL the leading replica right after it renewed the node's Lease: the gap the
    standby must fill is its takeover alone (the scaled grace period leaves no room for
    a renewal interval on top; with the defaults, 40 s Lease, 50 s grace, 15 s election,
    a kill at any moment is covered)."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{leader.name}"
    first = (get(upper, path) or {}).get("spec", {}).get("renewTime")
    wait_for(
        "a renewal of the node's Lease",
        lambda: (get(upper, path) or {}).get("spec", {}).get("renewTime") != first,
        timeout=30,
    )
    leader.kill()


def _replaced(upper: RestClient, namespace: str, node: str, old: set[str]) -> bool:
    """The ReplicaSet of `node` runs PODS pods none of which is one of `old` (UIDs)."""
    pods = _upper_pods(upper, namespace, node)
    running = [p for p in pods.values() if (p.get("status") or {}).get("phase") == "Running"]
    return len(running) == PODS and not {p["metadata"]["uid"] for p in running} & old


@pytest.mark.timeout(300)
def test_a_network_cut_to_the_lower_cluster_keeps_every_pod(
    fleet: Fleet, namespace: str, partitions: Partitions
) -> None:
    """Both control planes fine, the network between the node and the lower apiserver cut
    (longer than the grace period and the toleration): as a lower outage within the grace.
    Ready, LowerControlPlaneReachable False, tainted NoSchedule; nothing evicted, deleted or
    restarted."""
    node = partitions.cut_below.name
    seen = partitions.seen[node]
    assert seen.ready == {"True"}
    assert seen.reachable == {"True", "False"}
    assert lowerhealth.LOWER_UNREACHABLE_TAINT in seen.taints
    assert not seen.taints & {NOT_READY, UNREACHABLE}
    assert _lower_pods(fleet.lower.rest(), namespace, node) == partitions.below[node]
    assert node in partitions.consistent, "consistent again within 120 s of the return"


@pytest.mark.timeout(300)
def test_a_stopped_node_process_loses_its_pods_as_a_dead_kubelet(partitions: Partitions) -> None:
    """One replica, killed for longer than the grace period and the toleration: the Node
    turns Unknown, tainted unreachable, its pods are evicted upstairs; when it starts again
    it deletes their lower pods and finishes their deletion, as a kubelet does with the
    pods of a node that stopped reporting (run replicas to keep them)."""
    seen = partitions.seen[partitions.down.name]
    assert "Unknown" in seen.ready
    assert UNREACHABLE in seen.taints
    assert partitions.below[partitions.down.name], "it had pods below"
    assert partitions.down.name in partitions.consistent, "its pods gone, above and below"


@pytest.mark.timeout(300)
def test_a_killed_leader_is_replaced_and_nothing_changes(partitions: Partitions) -> None:
    """Two replicas, the leader killed: the standby leads within the election's lease, the
    Node never leaves Ready, and the new leader writes nothing below."""
    leader, _standby = partitions.replicas
    seen = partitions.seen[leader.name]
    assert seen.ready == {"True"}
    assert not seen.taints & {NOT_READY, UNREACHABLE, lowerhealth.LOWER_UNREACHABLE_TAINT}
    assert partitions.lower_writes_of_new_leader == 0
    assert leader.name in partitions.consistent


@pytest.mark.timeout(300)
def test_a_node_cut_off_from_the_upper_cluster_loses_its_pods_as_a_partitioned_kubelet(
    fleet: Fleet, namespace: str, partitions: Partitions
) -> None:
    """The network between the node and the upper apiserver cut (shipped with
    --leader-elect): it stops at its renew deadline having written nothing more below; the
    upper cluster cannot tell a cut from a death: Unknown, unreachable, its pods evicted
    after their toleration. Started again once the network is back, it deletes their lower
    pods (as a partitioned kubelet kills the pods evicted meanwhile)."""
    seen = partitions.seen[partitions.cut_above.name]
    assert partitions.cut_off_stopped
    assert "Unknown" in seen.ready
    assert UNREACHABLE in seen.taints
    assert not _lower_pods(fleet.lower.rest(), namespace, partitions.cut_above.name)
    assert partitions.cut_above.name in partitions.consistent, "its pods gone, above and below"


@pytest.mark.timeout(300)
def test_a_lost_lower_node_fails_its_pods_and_their_controller_replaces_them(
    partitions: Partitions,
) -> None:
    """A lower node lost with its pods: the upper pods fail (LowerPodDeleted), their
    ReplicaSet replaces them and the replacements run below on the node left, as on a
    kubelet whose containers vanished. The virtual Node stays Ready throughout."""
    seen = partitions.seen[partitions.lost.name]
    assert seen.ready == {"True"}
    assert seen.reachable == {"True"}
    assert partitions.lost.name in partitions.consistent


# -- the upper control plane down ------------------------------------------------------------


@pytest.mark.timeout(300)
def test_an_upper_outage_evicts_nothing_and_deletes_nothing(
    fleet: Fleet, namespace: str, partitions: Partitions
) -> None:
    """The upper control plane down (apiserver, controller manager, scheduler) for longer
    than the grace period: the node's writes fail and are retried, nothing is evicted, no
    lower pod is deleted or restarted (a status that changed below meanwhile lands once the
    apiserver is back: tests/e2e/test_faults.py). The controller manager starts again with
    the apiserver, as a real one having lost its leader election would, and gives every
    Node a fresh grace period."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = partitions.cut_below
    name = node.name
    below = _lower_pods(lower, namespace, name)
    _stop_control_plane(fleet, "upper")
    stopped = time.monotonic()
    time.sleep(max(0.0, NODE_GRACE + 5 - (time.monotonic() - stopped)))
    _start_control_plane(fleet, "upper")
    with Sampler(upper, [name]) as sampler:
        back = time.monotonic()
        wait_for("the node healthy", lambda: _healthy(upper, name), timeout=60)
        time.sleep(TOLERATION + 5)  # an eviction would have started by now
    print(
        f"upper outage: the Node healthy {time.monotonic() - back:.1f}s after; saw {sampler.seen}"
    )
    assert _running(upper, namespace, name)
    assert _lower_pods(lower, namespace, name) == below
    assert not sampler.seen[name].taints & {NOT_READY, UNREACHABLE}
    node.check()
