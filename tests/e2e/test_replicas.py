"""Two replicas of one virtual node (--leader-elect): the leader SIGKILLed, its warm standby
takes over within the Lease duration, the Node stays Ready, no pod changes, nothing is
created or deleted below, and `kubectl logs` / `exec` work through the new leader; the
killed replica comes back as a standby, and a graceful stop of the leader hands over at once.

Short election timings (lease 4 s, renew deadline 3 s, retry 0.5 s) keep the test to
seconds; the 500-pod measurement is bench/failover.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.kube.leaderelection import JITTER_FACTOR
from tests.e2e.helpers import (
    create,
    get,
    kubelet_request,
    pod_manifest,
    token_kubeconfig,
    wait_for,
)

LEASE, RENEW, RETRY = 4.0, 3.0, 0.5
PODS = 20
WRITES = ("POST", "PUT", "PATCH", "DELETE")
MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"
REPLICAS = MANIFESTS / "virtual-node-replicas.yaml"
_REQUESTS = re.compile(
    r'tensile_api_requests_total\{cluster="(?P<cluster>[^"]*)",verb="(?P<verb>[^"]*)",'
    r'code="(?P<code>[^"]*)"\} (?P<value>\S+)'
)


def _election_rbac(fleet: Fleet, tmp_path: Path) -> tuple[Path, str, str]:
    """Give the node's account (upper-rbac.yaml) the replicas' election Role of
    virtual-node-replicas.yaml, as deployed; check the whole file applies (server dry-run:
    its Deployment would run nowhere here). Returns that account's kubeconfig and the
    Lease's namespace and name."""
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig"
    )
    documents = [d for d in yaml.safe_load_all(REPLICAS.read_text()) if d]
    election = [d for d in documents if d["kind"] in ("Role", "RoleBinding")]
    fleet.upper.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(election))
    fleet.upper.kubectl("apply", "--dry-run=server", "-f", str(REPLICAS))
    [role] = [d for d in election if d["kind"] == "Role"]
    [lease] = role["rules"][0]["resourceNames"]
    return kubeconfig, role["metadata"]["namespace"], lease


def _replica(
    fleet: Fleet, *, name: str, log_dir: Path, kubeconfig: Path, lease: tuple[str, str]
) -> VirtualNodeProcess:
    log_dir.mkdir()
    return VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=log_dir,
        upper_kubeconfig=kubeconfig,
        args=[
            "--leader-elect",
            f"--leader-elect-lease-duration={LEASE}s",
            f"--leader-elect-renew-deadline={RENEW}s",
            f"--leader-elect-retry-period={int(RETRY * 1000)}ms",
            f"--leader-elect-resource-namespace={lease[0]}",
            f"--leader-elect-resource-name={lease[1]}",
        ],
    )


def _writes(node: VirtualNodeProcess, cluster: str) -> float:
    return sum(
        node.metric("tensile_api_requests_total", cluster=cluster, verb=verb) for verb in WRITES
    )


def _lower_writes(node: VirtualNodeProcess) -> dict[tuple[str, str], float]:
    """(verb, HTTP code) -> requests of `node` that wrote to the lower cluster."""
    found: dict[tuple[str, str], float] = {}
    for line in node.metrics().splitlines():
        match = _REQUESTS.match(line)
        if match and match["cluster"] == "lower" and match["verb"] in WRITES:
            key = (match["verb"], match["code"])
            found[key] = found.get(key, 0.0) + float(match["value"])
    return found


def _leads(node: VirtualNodeProcess) -> bool:
    return node.metric("tensile_leader_election_is_leader") == 1


def _time(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


def _pods(upper: RestClient, namespace: str) -> dict[str, tuple[str, str]]:
    found = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    return {
        p["metadata"]["name"]: (p["metadata"]["uid"], (p.get("status") or {}).get("phase", ""))
        for p in found["items"]
    }


class ReadyWatch:
    """Polls the Node's Ready condition in a thread; `not_ready` lists what it saw other
    than True (the node lifecycle controller's Unknown, a status write's False)."""

    def __init__(self, upper: RestClient, node: str) -> None:
        self.not_ready: list[str] = []
        self._upper, self._node = upper, node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            node = get(self._upper, f"/api/v1/nodes/{self._node}") or {}
            ready = [
                c for c in node.get("status", {}).get("conditions") or [] if c["type"] == "Ready"
            ]
            status = ready[0]["status"] if ready else "missing"
            if status != "True":
                self.not_ready.append(status)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_a_killed_leader_is_replaced_by_its_warm_standby(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    upper = fleet.upper.rest()
    name = f"vn-{secrets.token_hex(3)}"
    # The replicas run with the deployed account and Roles: the standby's watch of the
    # Lease included (list and watch of one named Lease).
    kubeconfig, *lease = _election_rbac(fleet, tmp_path)
    replica = functools.partial(
        _replica, fleet, name=name, kubeconfig=kubeconfig, lease=(lease[0], lease[1])
    )
    first, second = replica(log_dir=tmp_path / "a"), replica(log_dir=tmp_path / "b")
    watch: ReadyWatch | None = None
    first.start()  # returns once the Node is Ready: the first replica leads
    try:
        second.start(wait=False)
        wait_for("the standby's caches synced", lambda: second.get("/readyz")[0] == 200)
        assert _leads(first)
        assert not _leads(second)
        for i in range(PODS):
            create(upper, namespace, pod_manifest(f"web-{i}", node=name))
        wait_for(
            "every pod Running",
            lambda: all(phase == "Running" for _uid, phase in _pods(upper, namespace).values()),
        )
        before = _pods(upper, namespace)

        # The standby wrote nothing anywhere, yet serves the kubelet API from warm caches.
        assert _writes(second, "upper") == 0
        assert _writes(second, "lower") == 0
        code, body = kubelet_request(fleet, second.kubelet_port, "/pods", cert=True)
        assert code == 200
        assert all(f'"web-{i}"' in body for i in range(PODS))
        code, body = kubelet_request(
            fleet, second.kubelet_port, f"/containerLogs/{namespace}/web-0/main", cert=True
        )
        assert (code, body.splitlines()[0]) == (200, "tensile log line 1")

        watch = ReadyWatch(upper, name)
        killed_at = time.time()
        first.kill()
        wait_for("the standby leads", lambda: _leads(second), timeout=20)
        election = upper.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{lease[0]}/leases/{lease[1]}"
        )
        took = _time(election["spec"]["acquireTime"]) - killed_at
        # The standby sees each renewal as it happens (it watches the Lease) and tries
        # again as the lease duration since the last one is over; the last renewal came
        # at most one retry before the kill. So: within the lease duration plus one
        # (jittered) retry; 0.5 s more for a loaded machine.
        bound = LEASE + (1 + JITTER_FACTOR) * RETRY + 0.5
        print(f"new leader {took:.2f} s after the kill (bound {bound:.1f} s)")
        assert took <= bound
        assert election["spec"]["leaseTransitions"] >= 1

        def renewed() -> dict[str, Any] | None:
            node_lease = get(
                upper, f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            )
            renew = (node_lease or {}).get("spec", {}).get("renewTime")
            return node_lease if renew and _time(renew) > killed_at else None

        node_lease = wait_for("the node Lease renewed by the new leader", renewed, timeout=10)
        renewal = _time(node_lease["spec"]["renewTime"]) - killed_at
        print(f"node Lease renewed {renewal:.2f} s after the kill")
        assert renewal <= bound + 1.0  # the new leader's first heartbeat, after a ping below
        # The Node's kubelet endpoint follows the leader, which writes its status.
        wait_for(
            "the Node's kubelet port is the new leader's",
            lambda: (
                (get(upper, f"/api/v1/nodes/{name}") or {})["status"]["daemonEndpoints"][
                    "kubeletEndpoint"
                ]["Port"]
                == second.kubelet_port
            ),
        )

        def settled() -> bool:
            done = [
                second.metric("tensile_workqueue_work_duration_seconds_count", queue=q)
                for q in ("pods_from_upper", "status_from_lower")
            ]
            depth = [
                second.metric("tensile_workqueue_depth", queue=q)
                for q in ("pods_from_upper", "status_from_lower")
            ]
            return all(d >= PODS for d in done) and not any(depth)

        wait_for("every pod looked at by the new leader", settled, timeout=30)
        # Its first pass only compared: nothing created or deleted below (exec, a POST
        # below, comes after this count). A create answered 409 made nothing: the
        # ServiceAccount mirror asks for the pods' "default", which the lower cluster has
        # of its own, as after any restart.
        lower = _lower_writes(second)
        print(f"lower writes of the new leader (verb, code: n): {lower}")
        done = {(verb, code): n for (verb, code), n in lower.items() if int(code) < 300}
        assert not {k: n for k, n in done.items() if k[0] in ("POST", "DELETE")}
        assert _pods(upper, namespace) == before

        logs = fleet.upper.kubectl("logs", "web-0", "-n", namespace, "--tail=1").stdout
        assert logs == "tensile log line 10\n"
        out = fleet.upper.kubectl(
            "exec", "-n", namespace, "web-0", "--", "sh", "-c", "echo hi"
        ).stdout
        assert out == "hi\n"

        # The killed replica comes back as a standby; a graceful stop of the leader (a
        # rolling update) releases the Lease, and the standby, watching it, leads at once.
        assert first.process is not None
        first.process.restart()
        wait_for("the restarted replica's caches synced", lambda: first.get("/readyz")[0] == 200)
        assert not _leads(first)
        assert second.stop() == 0
        exited = time.monotonic()
        wait_for("the restarted replica leads", lambda: _leads(first), timeout=10)
        handed_over = time.monotonic() - exited
        print(f"graceful stop: the standby leads {handed_over:.2f} s after the leader exited")
        # The release, not an expiry (which would come about a lease duration after the
        # last renewal); within one retry even without the watch.
        assert handed_over < (1 + JITTER_FACTOR) * RETRY + 0.5
        watch.stop()
        assert watch.not_ready == []
    finally:
        if watch is not None:
            watch.stop()
        codes = {"second": second.stop(), "first": first.stop()}
        second.delete_node()
        assert set(codes.values()) <= {0, None}, f"replicas exited {codes}; logs in {tmp_path}"
