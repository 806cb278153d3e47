"""Forwarding benchmark: N pods created directly in the lower cluster vs. through the virtual node.

Both runs happen on one local fleet, one after the other: the lower apiserver's own write
rate is the physical limit of forwarding, so the direct run is the baseline. Printed:
time to all Running and per-pod create->Running latency (p50, p99) for both, their ratios,
and the virtual node's resident memory per cached pod.

    .venv/bin/python bench/forwarding.py [--pods 500] [--concurrency 64]

Uses the fleet of TENSILE_DEVCLUSTER_DIR if set, else starts (and stops) its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from vnode.kube import config
from vnode.kube.client import ApiClient
from vnode.kube.informer import Handlers, Informer
from vnode.kube.resources import NAMESPACES, PODS
from vnode.testing.cluster import FleetSettings, LowerClusterSettings
from vnode.testing.fleet import Fleet
from vnode.testing.vnodes import VirtualNodeProcess

TARGETS = {"throughput ratio": ">= 0.8", "p99": "<= 1.5x direct + 1 s", "RSS per pod": "<= 20 KB"}


def pod(name: str, *, node: str | None) -> dict[str, Any]:
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


async def run_pods(
    kubeconfig: Path, *, pods: int, concurrency: int, node: str | None
) -> tuple[float, list[float]]:
    """Create `pods` pods in a new namespace; return (seconds to all Running, latencies)."""
    namespace = f"bench-{secrets.token_hex(3)}"
    async with ApiClient(config.load(str(kubeconfig)), name="bench", qps=0) as client:
        await client.request("POST", NAMESPACES.path(), body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})  # fmt: skip
        while True:  # pods are refused until the ServiceAccount controller made `default`
            try:
                await client.request(
                    "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
                )
                break
            except Exception:  # noqa: BLE001
                await asyncio.sleep(0.1)
        created: dict[str, float] = {}
        running: dict[str, float] = {}
        done = asyncio.Event()

        def seen(obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if obj.get("status", {}).get("phase") == "Running" and name not in running:
                running[name] = time.monotonic()
                if len(running) == pods:
                    done.set()

        informer = Informer(client, PODS, name="bench", namespace=namespace)
        informer.add_handlers(Handlers(on_add=seen, on_update=lambda _o, n: seen(n)))
        watch = asyncio.create_task(informer.run(), name="bench-watch")
        await informer.wait_synced()
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
        await asyncio.wait_for(done.wait(), timeout=900)
        total = time.monotonic() - start
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await client.request("DELETE", NAMESPACES.path(name=namespace))
        return total, [running[n] - created[n] for n in running]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def component_cpu(fleet: Fleet) -> dict[str, float]:
    """CPU seconds used so far by each component of the fleet."""
    return {name: cpu_seconds(ref.pid) for name, ref in fleet.refs.items()}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_lower_empty(fleet: Fleet) -> None:
    async with ApiClient(config.load(str(fleet.lower.kubeconfig)), name="bench", qps=0) as client:
        while True:
            pods = (await client.request("GET", "/api/v1/pods", params={"labelSelector": ""}))[
                "items"
            ]
            if not [p for p in pods if p["metadata"]["namespace"].startswith("bench-")]:
                return
            await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--profile", type=Path, help="record the virtual node with py-spy (collapsed stacks)"
    )
    args = parser.parse_args()
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        fleet = Fleet.attach(Path(existing))
        fleet.join_network()
    else:
        fleet = Fleet.start(
            directory=Path(tempfile.mkdtemp(prefix="tensile-bench-")),
            settings=FleetSettings(
                lowers=(LowerClusterSettings(nodes=5, pods=str(args.pods)),),  # room for 2N+
                metrics_server=False,
            ),
            owns_directory=True,
        )
    try:
        print(f"forwarding benchmark: {args.pods} pods, {args.concurrency} concurrent creates")
        cpu0 = component_cpu(fleet)
        direct_total, direct = asyncio.run(
            run_pods(
                fleet.lower.kubeconfig, pods=args.pods, concurrency=args.concurrency, node=None
            )
        )
        cpu_direct = {k: v - cpu0[k] for k, v in component_cpu(fleet).items()}
        asyncio.run(wait_lower_empty(fleet))
        node = VirtualNodeProcess(
            fleet, name=f"bench-{secrets.token_hex(3)}", log_dir=fleet.directory / "logs",
            args=["--kube-api-qps=500", "--kube-api-burst=1000", "--log-level=info"],
        )  # fmt: skip
        node.start()
        try:
            time.sleep(2)
            assert node.process is not None
            rss_before = rss_kib(node.process.pid)
            profiler = None
            if args.profile:
                profiler = subprocess.Popen(
                    ["py-spy", "record", "--pid", str(node.process.pid), "--format", "raw",
                     "--rate", "200", "-o", str(args.profile)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                time.sleep(1)
            cpu_before = cpu_seconds(node.process.pid)
            cpu1 = component_cpu(fleet)
            via_total, via = asyncio.run(
                run_pods(fleet.upper.kubeconfig, pods=args.pods, concurrency=args.concurrency,
                         node=node.name)
            )  # fmt: skip
            cpu_used = cpu_seconds(node.process.pid) - cpu_before
            requests = [
                line
                for line in node.metrics().splitlines()
                if line.startswith("tensile_api_requests_total{")
            ]
            cpu_via = {k: v - cpu1[k] for k, v in component_cpu(fleet).items()}
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(timeout=30)
            # Memory per cached pod is the slope between N and 2N pods: by N the connection
            # pools and buffers have reached their working size, a fixed cost, not a per-pod one.
            time.sleep(2)
            rss_mid = rss_kib(node.process.pid)
            asyncio.run(
                run_pods(
                    fleet.upper.kubeconfig,
                    pods=args.pods,
                    concurrency=args.concurrency,
                    node=node.name,
                )
            )
            time.sleep(2)
            rss_after = rss_kib(node.process.pid)
        finally:
            node.stop()
            node.delete_node()
    finally:
        if not existing:
            fleet.stop()

    rate_direct, rate_via = args.pods / direct_total, args.pods / via_total
    rows = [
        ("time to all Running (s)", f"{direct_total:.2f}", f"{via_total:.2f}"),
        ("throughput (pods/s)", f"{rate_direct:.1f}", f"{rate_via:.1f}"),
        ("latency p50 (s)", f"{pct(direct, 0.5):.3f}", f"{pct(via, 0.5):.3f}"),
        ("latency p99 (s)", f"{pct(direct, 0.99):.3f}", f"{pct(via, 0.99):.3f}"),
        ("latency mean (s)", f"{statistics.mean(direct):.3f}", f"{statistics.mean(via):.3f}"),
    ]
    print("\nCPU seconds per component (direct run | via run)")
    for name in sorted(cpu_via, key=lambda n: -cpu_via[n]):
        print(f"  {name:26}{cpu_direct[name]:6.1f} |{cpu_via[name]:6.1f}")
    print(f"  {'virtual node':26}{'':6} |{cpu_used:6.1f}")
    print("virtual node API requests (whole run, per pod):")
    for line in requests:
        series, _, value = line.rpartition(" ")
        if float(value) >= args.pods / 10:
            print(
                f"  {series.removeprefix('tensile_api_requests_total'):60}"
                f"{float(value) / args.pods:6.2f}"
            )
    print(f"\n{'':28}{'direct (lower)':>16}{'via virtual node':>18}")
    for label, a, b in rows:
        print(f"{label:28}{a:>16}{b:>18}")
    per_pod = (rss_after - rss_mid) * 1024 / args.pods / 1000
    p99_budget = 1.5 * pct(direct, 0.99) + 1.0
    print("\nratios (target in brackets)")
    print(
        f"  throughput via / direct     {rate_via / rate_direct:.2f}x   "
        f"[{TARGETS['throughput ratio']}]"
    )
    print(
        f"  p99 via / direct            {pct(via, 0.99) / pct(direct, 0.99):.2f}x   "
        f"(budget {p99_budget:.2f} s: {'met' if pct(via, 0.99) <= p99_budget else 'MISSED'})"
    )
    print(f"  virtual node RSS per pod    {per_pod:.1f} KB   [{TARGETS['RSS per pod']}] "
          f"({rss_before // 1024} MiB idle, {rss_mid // 1024} MiB at {args.pods} pods, "
          f"{rss_after // 1024} MiB at {2 * args.pods})")  # fmt: skip


if __name__ == "__main__":
    main()
