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
import json
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from devcluster.faults import kubeconfig_through
from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.tcpproxy import FreezableProxy
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
from vnode.cli import lease_name

LEASE, RENEW, RETRY = 4.0, 3.0, 0.5
PODS = 20
WRITES = ("POST", "PUT", "PATCH", "DELETE")
MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"
REPLICAS = MANIFESTS / "virtual-node-replicas.yaml"
_REQUESTS = re.compile(
    r'tensile_api_requests_total\{cluster="(?P<cluster>[^"]*)",verb="(?P<verb>[^"]*)",'
    r'code="(?P<code>[^"]*)"\} (?P<value>\S+)'
)


def _election_rbac(fleet: Fleet, tmp_path: Path, *, node: str) -> tuple[Path, str, str]:
    """Give the account of virtual node `node` its rights as deployed (upper-rbac.yaml,
    whose Role grants the election's Lease, and its own Node and Node Lease by name);
    check virtual-node-replicas.yaml applies (server dry-run: its Deployment would run
    nowhere here). Returns that account's kubeconfig and the namespace and name of the
    replicas' Lease."""
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=node
    )
    fleet.upper.kubectl("apply", "--dry-run=server", "-f", str(REPLICAS))
    documents = [d for d in yaml.safe_load_all(REPLICAS.read_text()) if d]
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    [node] = [a.partition("=")[2] for a in args if a.startswith("--nodename=")]
    return kubeconfig, _election_namespace(), lease_name(node)


def _election_namespace() -> str:
    """The namespace of upper-rbac.yaml's election Role (where the Leases are)."""
    documents = [d for d in yaml.safe_load_all((MANIFESTS / "upper-rbac.yaml").read_text()) if d]
    [role] = [
        d
        for d in documents
        if d["kind"] == "Role" and d["metadata"]["name"] == "tensile-virtual-node-election"
    ]
    return str(role["metadata"]["namespace"])


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
    kubeconfig, *lease = _election_rbac(fleet, tmp_path, node=name)
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


# -- a replica cut off from the upper cluster ------------------------------------------------

NODE_MANIFEST = MANIFESTS / "virtual-node.yaml"
_TIMINGS = (
    "--leader-elect-lease-duration",
    "--leader-elect-renew-deadline",
    "--leader-elect-retry-period",
)


def _shipped_election_args() -> tuple[bool, list[str]]:
    """Whether manifests/vnode/virtual-node.yaml (one replica) runs the node with leader
    election, and its --leader-elect* flags, the timings shortened for the test."""
    documents = [d for d in yaml.safe_load_all(NODE_MANIFEST.read_text()) if d]
    [statefulset] = [d for d in documents if d["kind"] == "StatefulSet"]
    shipped = statefulset["spec"]["template"]["spec"]["containers"][0]["args"]
    chosen = [a for a in shipped if a.startswith("--leader-elect") and not a.startswith(_TIMINGS)]
    elects = any(a in ("--leader-elect", "--leader-elect=true") for a in chosen)
    if elects:
        chosen += [
            # The Lease of the StatefulSet's node (its pod's name), which upper-rbac.yaml
            # grants; this test's node has a name of its own.
            f"--leader-elect-resource-name={lease_name(statefulset['metadata']['name'] + '-0')}",
            f"--leader-elect-lease-duration={LEASE}s",
            f"--leader-elect-renew-deadline={RENEW}s",
            f"--leader-elect-retry-period={int(RETRY * 1000)}ms",
        ]
    return elects, chosen


def _removals_since(client: RestClient, namespace: str, version: str) -> list[tuple[str, str, str]]:
    """(plural, name, what) of every deletion asked for in `namespace` after resourceVersion
    `version`, of pods and the copies the node makes: a watch per kind from then, read for
    a second (the apiserver replays what happened since)."""
    found = []
    for plural in ("pods", "configmaps", "secrets", "serviceaccounts", "services"):
        status, text = client.get_text(
            f"/api/v1/namespaces/{namespace}/{plural}?watch=1&resourceVersion={version}"
            "&timeoutSeconds=1",
            timeout=10.0,
        )
        assert status == 200, text
        for line in filter(None, text.splitlines()):
            event = json.loads(line)
            meta = event["object"]["metadata"]
            if event["type"] == "DELETED":
                found.append((plural, meta["name"], "deleted"))
            elif event["type"] == "MODIFIED" and meta.get("deletionTimestamp"):
                found.append((plural, meta["name"], "deletion asked"))
    return sorted(set(found))


def test_a_replica_cut_off_from_the_upper_cluster_deletes_nothing_below(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    """The node as shipped (manifests/vnode/virtual-node.yaml's arguments), once cut off
    from the upper apiserver (a frozen proxy between them), is replaced by another process
    of the same node, which forwards new pods. The stale process, whose upper caches no
    longer change, must not take the replacement's lower pods for orphans: nothing is
    deleted below, and every lower pod keeps its UID."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    name = f"vn-{secrets.token_hex(3)}"
    elects, args = _shipped_election_args()
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=name
    )
    with FreezableProxy(fleet.upper.server) as proxy:
        (tmp_path / "stale").mkdir()
        (tmp_path / "replacement").mkdir()
        stale = VirtualNodeProcess(
            fleet,
            name=name,
            log_dir=tmp_path / "stale",
            upper_kubeconfig=kubeconfig_through(
                kubeconfig, proxy.url, tmp_path / "proxied.kubeconfig"
            ),
            args=args,
        )
        replacement = VirtualNodeProcess(
            fleet,
            name=name,
            log_dir=tmp_path / "replacement",
            upper_kubeconfig=kubeconfig,
            args=args,
        )
        try:
            stale.start()
            create(upper, namespace, pod_manifest("before", node=name))
            wait_for("before Running", lambda: _pods(upper, namespace)["before"][1] == "Running")
            version = str(
                lower.request("GET", f"/api/v1/namespaces/{namespace}/pods")["metadata"][
                    "resourceVersion"
                ]
            )

            proxy.freeze()
            replacement.start(wait=False)

            def serving() -> bool:
                return replacement.get("/readyz")[0] == 200 and (not elects or _leads(replacement))

            wait_for("the replacement serves the node", serving, timeout=60)
            after = [f"after-{i}" for i in range(3)]
            for pod_name in after:
                create(upper, namespace, pod_manifest(pod_name, node=name))
            # Run upstairs, or failed there because their lower pods vanished.
            wait_for(
                "every pod started",
                lambda: all(phase != "Pending" for _, phase in _pods(upper, namespace).values()),
                timeout=60,
            )
            below = {p: lower_uid(lower, namespace, p) for p in ["before", *after]}
            # The stale process sees the new lower pods (its lower watch works) and not
            # their upper pods: the moment it would delete them as orphans. Long enough for
            # its lower watch, a queue and a DELETE, many times over.
            time.sleep(3 * LEASE)
            removals = _removals_since(lower, namespace, version)
            print(f"deletions below since the stale process was cut off: {removals}")
            assert removals == []
            assert {p: lower_uid(lower, namespace, p) for p in below} == below
            assert all(phase == "Running" for _, phase in _pods(upper, namespace).values())
            if elects:
                # It stopped at its renew deadline (a lost Lease ends the process).
                wait_for("the stale process exits", lambda: not _alive(stale), timeout=30)
                assert stale.stop() == 1
                assert "stops leading" in stale.log.read_text()
        finally:
            proxy.thaw()
            codes = {"replacement": replacement.stop(), "stale": stale.stop()}
            replacement.delete_node()
        assert codes["replacement"] == 0, f"replicas exited {codes}; logs in {tmp_path}"


def lower_uid(lower: RestClient, namespace: str, name: str) -> str:
    found = get(lower, f"/api/v1/namespaces/{namespace}/pods/{name}") or {}
    return str((found.get("metadata") or {}).get("uid") or "")


def _alive(node: VirtualNodeProcess) -> bool:
    return node.process is not None and node.process.alive()


# -- the Lease's namespace -------------------------------------------------------------------


def test_a_missing_lease_namespace_is_created_or_the_node_stops_saying_what_to_run(
    fleet: Fleet, tmp_path: Path
) -> None:
    """--leader-elect with a Lease namespace that does not exist: the node's own account
    (upper-rbac.yaml) may neither create namespaces nor keep Leases outside its election's
    namespace and kube-node-lease, so it exits 1 at once saying what to grant or choose;
    an identity that may (the fleet's admin) creates it, labelled, and leads."""
    upper = fleet.upper.rest()
    missing = f"lease-{secrets.token_hex(3)}"
    name = f"vn-{secrets.token_hex(3)}"
    args = ["--leader-elect", f"--leader-elect-resource-namespace={missing}"]
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=name
    )
    (tmp_path / "refused").mkdir()
    (tmp_path / "allowed").mkdir()
    refused = VirtualNodeProcess(
        fleet, name=name, log_dir=tmp_path / "refused", upper_kubeconfig=kubeconfig, args=args
    )
    allowed = VirtualNodeProcess(fleet, name=name, log_dir=tmp_path / "allowed", args=args)
    try:
        refused.start(wait=False)
        wait_for("the node without the right to exit", lambda: not _alive(refused), timeout=30)
        assert refused.stop() == 1
        said = refused.log.read_text()
        lease = lease_name(name)
        assert f"must be able to create Leases in namespace {missing}" in said
        assert "--leader-elect-resource-namespace" in said
        assert get(upper, f"/api/v1/namespaces/{missing}") is None

        allowed.start()  # Ready: it made the namespace and leads
        namespace = get(upper, f"/api/v1/namespaces/{missing}") or {}
        labels = namespace["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") == "tensile-virtual-node"
        assert get(upper, f"/apis/coordination.k8s.io/v1/namespaces/{missing}/leases/{lease}")
        assert _leads(allowed)
        assert "created namespace " + missing in allowed.log.read_text()
    finally:
        codes = {"allowed": allowed.stop(), "refused": refused.stop()}
        allowed.delete_node()
        fleet.upper.kubectl("delete", "namespace", missing, "--wait=false", "--ignore-not-found")
    assert codes["allowed"] == 0, f"exited {codes}; logs in {tmp_path}"
