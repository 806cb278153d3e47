"""Failover benchmark: two replicas of one virtual node (--leader-elect), N pods, the leader
SIGKILLed.

On one local fleet: replica A leads, replica B stands by with warm caches; N pods run
through the node; A is SIGKILLed (nothing released). Printed, from the kill:
- when B leads (its own metric, and the Lease's acquireTime), against the target: the
  Lease duration plus one renewal (retry period);
- when the node's Lease in kube-node-lease is renewed again, and whether the Node was ever
  seen other than Ready (polled every 0.2 s);
- when the Node's kubelet endpoint is B's, and when `kubectl logs` and `kubectl exec`
  through the upper cluster work again;
- when B has looked at every pod (both pod queues), how often its caches listed again
  (target: 0), what it wrote below (target: 0 lower creates and 0 lower deletes), and which
  upper pod status fields changed (target: none; no pod evicted).

    .venv/bin/python bench/failover.py [--pods 500] [--lower-nodes 4]

Uses the fleet of TENSILE_DEVCLUSTER_DIR if set, else starts (and stops) its own. Expect
a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import harness
from scale import changed_fields, lower_pod_writes, upper_statuses, wait_process_ready, writes

from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient
from devcluster.vnodes import VirtualNodeProcess

LEASE, RENEW, RETRY = 15.0, 10.0, 2.0
"""client-go's defaults, the node's too."""
LEASE_NAMESPACE = "default"
NODE_ARGS = ["--kube-api-qps=500", "--kube-api-burst=1000", "--log-level=info"]


def replica(fleet: Fleet, *, name: str, log_dir: Path) -> VirtualNodeProcess:
    log_dir.mkdir(parents=True)
    return VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=log_dir,
        args=[
            *NODE_ARGS,
            "--leader-elect",
            f"--leader-elect-lease-duration={LEASE}s",
            f"--leader-elect-renew-deadline={RENEW}s",
            f"--leader-elect-retry-period={RETRY}s",
            f"--leader-elect-resource-namespace={LEASE_NAMESPACE}",
        ],
    )


def stamp(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()


def get(client: RestClient, path: str) -> dict[str, Any]:
    try:
        return client.request("GET", path)
    except ApiStatusError as exc:
        if exc.code == 404:
            return {}
        raise


class Watch:
    """Polls, every 0.2 s in a thread, the Node's Ready condition, its kubelet port and the
    renewTime of its Lease; keeps when (wall clock) each was first seen as wanted."""

    def __init__(self, client: RestClient, *, node: str, port: int, since: float) -> None:
        self.not_ready: list[str] = []
        self.port_at: float | None = None
        self.renewed_at: float | None = None
        self._client, self._node, self._port, self._since = client, node, port, since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            now = time.time()
            node = get(self._client, f"/api/v1/nodes/{self._node}")
            status = node.get("status") or {}
            ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
            if not ready or ready[0]["status"] != "True":
                self.not_ready.append(ready[0]["status"] if ready else "missing")
            port = status.get("daemonEndpoints", {}).get("kubeletEndpoint", {}).get("Port")
            if self.port_at is None and port == self._port:
                self.port_at = now
            lease = get(
                self._client,
                f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self._node}",
            )
            renew = (lease.get("spec") or {}).get("renewTime")
            if self.renewed_at is None and renew and stamp(renew) > self._since:
                self.renewed_at = stamp(renew)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def until_works(fleet: Fleet, *args: str, timeout: float = 120.0) -> float:
    """Run kubectl `args` against the upper cluster until it exits 0; return when (wall)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if fleet.upper.kubectl(*args, check=False, timeout=20).returncode == 0:
                return time.time()
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"kubectl {' '.join(args)} did not work within {timeout}s")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lower-nodes", type=int, default=4)
    args = parser.parse_args()
    fleet, attached = harness.fleet_for_pods(
        pods=args.pods, lower_nodes=args.lower_nodes, prefix="tensile-failover-"
    )
    name = f"failover-{secrets.token_hex(3)}"
    logs = fleet.directory / "logs" / name
    first = replica(fleet, name=name, log_dir=logs / "a")
    second = replica(fleet, name=name, log_dir=logs / "b")
    namespace = harness.new_namespace()
    upper = fleet.upper.rest()
    watch: Watch | None = None
    try:
        print(
            f"failover benchmark: {args.pods} pods, two replicas of virtual node {name}, "
            f"lease {LEASE:.0f} s / renew {RENEW:.0f} s / retry {RETRY:.0f} s",
            flush=True,
        )
        first.start(timeout=300)
        second.start(wait=False)
        wait_process_ready(second)
        assert first.metric("tensile_leader_election_is_leader") == 1
        assert second.metric("tensile_leader_election_is_leader") == 0
        timed = asyncio.run(
            harness.create_pods(
                fleet.upper.kubeconfig,
                namespace=namespace,
                pods=args.pods,
                concurrency=args.concurrency,
                node=name,
                timeout=1800,
            )
        )
        print(f"  {args.pods} pods Running in {timed.total:.1f} s", flush=True)
        harness.wait_reconciled(first, keys=args.pods)
        before = asyncio.run(upper_statuses(fleet, namespace))
        standby = writes(second)
        relisted = second.metric("tensile_reflector_relists_total")
        pod = sorted(before)[0]

        killed, killed_clock = time.time(), time.monotonic()
        watch = Watch(upper, node=name, port=second.kubelet_port, since=killed)
        first.kill()
        while second.metric("tensile_leader_election_is_leader") != 1:
            if time.time() - killed > 300:
                raise TimeoutError("the standby did not lead within 300 s")
            time.sleep(0.05)
        leads = time.time() - killed
        lease = get(
            upper,
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/"
            f"tensile-virtual-node-{name}",
        )
        acquired = stamp(lease["spec"]["acquireTime"]) - killed
        reconciled = harness.wait_reconciled(second, keys=args.pods) - killed_clock
        written = writes(second)
        relisted = second.metric("tensile_reflector_relists_total") - relisted
        # What got through: a create answered 409 (a copy the lower cluster has of its own,
        # the pods' "default" ServiceAccount) made nothing.
        creates, deletes = lower_pod_writes({k: n for k, n in written.items() if int(k[2]) < 300})
        logs_at = until_works(fleet, "logs", "-n", namespace, pod, "--tail=1") - killed
        exec_at = (
            until_works(fleet, "exec", "-n", namespace, pod, "--", "sh", "-c", "echo hi") - killed
        )
        watch.stop()
        after = asyncio.run(upper_statuses(fleet, namespace))
        changed = changed_fields(before, after)
        missing = sorted(set(before) - set(after))
        target = LEASE + RETRY
        print("\nleader SIGKILLed (times from the kill)")
        print(
            f"  standby leads             {acquired:6.1f} s (Lease acquireTime; its metric "
            f"{leads:.1f} s)   [< {target:.0f} s: {'met' if acquired < target else 'MISSED'}]"
        )
        if watch.renewed_at is not None:
            renewed = watch.renewed_at - killed
            print(
                f"  node Lease renewed        {renewed:6.1f} s   [< {target:.0f} s: "
                f"{'met' if renewed < target else 'MISSED'}]"
            )
        else:
            print("  node Lease renewed        never seen")
        print(f"  Node seen not Ready       {len(watch.not_ready)} times {watch.not_ready or ''}")
        if watch.port_at is not None:
            print(f"  kubelet port the leader's {watch.port_at - killed:6.1f} s")
        print(f"  kubectl logs works        {logs_at:6.1f} s")
        print(f"  kubectl exec works        {exec_at:6.1f} s")
        print(f"  every pod looked at       {reconciled:6.1f} s   ({args.pods} keys, both queues)")
        print(
            f"  lower creates / deletes   {creates:.0f} / {deletes:.0f}   "
            f"[0 / 0: {'met' if not creates and not deletes else 'MISSED'}]"
        )
        print(f"  lists by the new leader   {relisted:.0f}   (its caches were warm)")
        print(f"  standby's writes before   {standby or 'none'}")
        print(f"  new leader's writes       {dict(written) or 'none'} (cluster, verb, code: n)")
        print(f"  upper pods gone           {len(missing)}")
        print(f"  upper pod status fields changed (field: pods)  {changed or 'none'}")
    finally:
        if watch is not None:
            watch.stop()
        first.kill()
        second.stop()
        second.delete_node()
        harness.release_fleet(fleet, attached=attached, namespaces=[namespace])


if __name__ == "__main__":
    main()
