"""Streaming benchmark: `kubectl logs` throughput and exec round trips, through the virtual
node vs. directly from the lower apiserver, in one run on one local fleet.

Three paths are measured for each, one after the other on the same pod:
- direct: the lower apiserver's pods/log and pods/exec (WebSocket v5.channel.k8s.io), to kwok;
- node: the virtual node's kubelet API called directly (with the upper apiserver's kubelet
  client certificate), which bridges to the lower apiserver: the cost the virtual node adds;
- upper: the upper apiserver's pods/log and pods/exec, which reaches the node over SPDY: what
  a user's kubectl sees.
The ratios that have targets compare node against direct: logs throughput >= 0.7x, exec
round trip p50 <= direct + 2 ms.

    .venv/bin/python bench/streams.py [--log-mb 64] [--round-trips 300]

Uses the fleet of TENSILE_DEVCLUSTER_DIR if set, else starts (and stops) its own.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import secrets
import ssl
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from devcluster.cluster import FleetSettings, LowerClusterSettings, kubectl_binary
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.kube import config
from tensile.kube.client import ApiClient

LINE = "x" * 99  # 100 bytes a line with its newline, as the client receives it
STDIN, STDOUT = 0, 1
TARGETS = {"logs throughput (node / direct)": ">= 0.7x", "exec p50 added (node)": "<= 2 ms"}


def write_big_log(path: Path, *, megabytes: int) -> int:
    """Fill `path` with CRI log lines; return the bytes a client reads (text + newlines)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    line = f"{stamp} stdout F {LINE}\n"
    count = megabytes * 1_000_000 // (len(LINE) + 1)
    with path.open("w") as out:
        out.write(line * count)
    return count * (len(LINE) + 1)


async def read_all(chunks: AsyncIterator[bytes]) -> int:
    total = 0
    async for chunk in chunks:
        total += len(chunk)
    return total


def kubelet_tls(fleet: Fleet) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(fleet.vnode.client_ca))
    client = fleet.upper.kubelet_client
    context.load_cert_chain(str(client.cert), str(client.key))
    return context


async def logs_throughput(
    fleet: Fleet, node: VirtualNodeProcess, *, namespace: str, pod: str, runs: int
) -> dict[str, float]:
    """Best MB/s reading the whole log, per path; the paths take turns, so that a warming
    cache or a busy moment does not favour whichever path runs first."""
    log_path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
    url = f"https://{fleet.node_ip}:{node.kubelet_port}/containerLogs/{namespace}/{pod}/main"
    tls = kubelet_tls(fleet)  # one context: the pool keeps its connection, as the others do
    async with (
        ApiClient(config.load(str(fleet.lower.kubeconfig)), name="bench", qps=0) as lower,
        ApiClient(config.load(str(fleet.upper.kubeconfig)), name="bench", qps=0) as upper,
        aiohttp.ClientSession() as session,
    ):

        async def via_apiserver(client: ApiClient) -> int:
            async with client.stream(log_path, accept="*/*") as response:
                return await read_all(response.content.iter_chunked(256 * 1024))

        async def via_node() -> int:
            async with session.get(url, ssl=tls) as response:
                response.raise_for_status()
                return await read_all(response.content.iter_chunked(256 * 1024))

        paths: dict[str, Callable[[], Awaitable[int]]] = {
            "direct": lambda: via_apiserver(lower),
            "node": via_node,
            "upper": lambda: via_apiserver(upper),
        }
        best = dict.fromkeys(paths, 0.0)
        for _ in range(runs):
            for label, read in paths.items():
                started = time.perf_counter()
                size = await read()
                best[label] = max(best[label], size / (time.perf_counter() - started) / 1e6)
    return best


def kubectl_logs_throughput(
    fleet: Fleet, *, namespace: str, pod: str, runs: int
) -> dict[str, float]:
    """Best MB/s of `kubectl logs` (a Go client, as users read logs) from the lower cluster
    and through the upper one, taking turns."""
    best = {"direct": 0.0, "upper": 0.0}
    for _ in range(runs):
        for label, cluster in (("direct", fleet.lower), ("upper", fleet.upper)):
            started = time.perf_counter()
            out = subprocess.run(
                [kubectl_binary(), f"--kubeconfig={cluster.kubeconfig}", "logs", "-n",
                 namespace, pod], capture_output=True, check=True,
            ).stdout  # fmt: skip
            best[label] = max(best[label], len(out) / (time.perf_counter() - started) / 1e6)
    return best


async def round_trips(ws: aiohttp.ClientWebSocketResponse, *, count: int) -> list[float]:
    """Send one line to `cat` and wait for it back, `count` times; return seconds each."""
    times = []
    for i in range(count + 20):  # the first 20 warm up
        payload = f"{i}\n".encode()
        started = time.perf_counter()
        await ws.send_bytes(bytes([STDIN]) + payload)
        echoed = b""
        while not echoed.endswith(payload):
            message = await ws.receive(timeout=10)
            if message.type != aiohttp.WSMsgType.BINARY:
                raise RuntimeError(f"exec stream ended: {message}")
            if message.data[:1] == bytes([STDOUT]):
                echoed += message.data[1:]
        if i >= 20:
            times.append(time.perf_counter() - started)
    return times


EXEC_QUERY = [("command", "cat"), ("stdin", "true"), ("stdout", "true"), ("stderr", "false")]


@asynccontextmanager
async def apiserver_exec(
    kubeconfig: Path, *, namespace: str, pod: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    async with ApiClient(config.load(str(kubeconfig)), name="bench", qps=0) as client:
        ws = await client.websocket(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/exec",
            params=[("container", "main"), *EXEC_QUERY],
            protocols=("v5.channel.k8s.io",),
        )
        try:
            yield ws
        finally:
            await ws.close()


@asynccontextmanager
async def node_exec(
    fleet: Fleet, node: VirtualNodeProcess, *, namespace: str, pod: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    query = [(k.replace("stdin", "input").replace("stdout", "output")
              .replace("stderr", "error"), v) for k, v in EXEC_QUERY]  # fmt: skip
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(
            f"https://{fleet.node_ip}:{node.kubelet_port}/exec/{namespace}/{pod}/main",
            params=query,
            protocols=("v5.channel.k8s.io",),
            ssl=kubelet_tls(fleet),
        )
        try:
            yield ws
        finally:
            await ws.close()


async def exec_latency(
    fleet: Fleet, node: VirtualNodeProcess, *, namespace: str, pod: str, count: int
) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    async with apiserver_exec(fleet.lower.kubeconfig, namespace=namespace, pod=pod) as ws:
        results["direct"] = await round_trips(ws, count=count)
    async with node_exec(fleet, node, namespace=namespace, pod=pod) as ws:
        results["node"] = await round_trips(ws, count=count)
    async with apiserver_exec(fleet.upper.kubeconfig, namespace=namespace, pod=pod) as ws:
        results["upper"] = await round_trips(ws, count=count)
    return results


def pod_manifest(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stream"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


async def make_pod(fleet: Fleet, node: str) -> str:
    """Create a namespace and a pod on `node`; return the namespace once the pod runs."""
    namespace = f"bench-{secrets.token_hex(3)}"
    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="bench", qps=0) as client:
        await client.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                await client.request(
                    "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod_manifest(node)
                )
                break
            except Exception:  # the `default` ServiceAccount may not exist yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        while True:
            pod = await client.request("GET", f"/api/v1/namespaces/{namespace}/pods/stream")
            if pod.get("status", {}).get("phase") == "Running":
                return namespace
            if time.monotonic() > deadline:
                raise TimeoutError("the benchmark pod did not run in 60 s")
            await asyncio.sleep(0.2)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log-mb", type=int, default=64, help="log size in MB (default 64)")
    parser.add_argument("--runs", type=int, default=5, help="log reads per path; the best counts")
    parser.add_argument("--round-trips", type=int, default=300, help="exec round trips per path")
    args = parser.parse_args()
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        fleet = Fleet.attach(Path(existing))
        fleet.join_network()
    else:
        fleet = Fleet.start(
            directory=Path(tempfile.mkdtemp(prefix="tensile-bench-")),
            settings=FleetSettings(lowers=(LowerClusterSettings(nodes=1),), metrics_server=False),
            owns_directory=True,
        )
    original_log = fleet.logs_file.read_bytes()
    node = VirtualNodeProcess(
        fleet, name=f"bench-{secrets.token_hex(3)}", log_dir=fleet.directory / "logs",
        args=["--log-level=info"],
    )  # fmt: skip
    node.start()
    try:
        namespace = asyncio.run(make_pod(fleet, node.name))
        size = write_big_log(fleet.logs_file, megabytes=args.log_mb)
        print(f"streams benchmark: a {size / 1e6:.0f} MB log, best of {args.runs} reads; "
              f"{args.round_trips} exec round trips of `cat`")  # fmt: skip
        rates = asyncio.run(
            logs_throughput(fleet, node, namespace=namespace, pod="stream", runs=args.runs)
        )
        kubectl_rates = kubectl_logs_throughput(
            fleet, namespace=namespace, pod="stream", runs=args.runs
        )
        latency = asyncio.run(
            exec_latency(fleet, node, namespace=namespace, pod="stream", count=args.round_trips)
        )
    finally:
        fleet.logs_file.write_bytes(original_log)
        node.stop()
        node.delete_node()
        if not existing:
            fleet.stop()

    def p(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q * 100) - 1]

    print(f"\n{'':24}{'direct (lower)':>16}{'node':>12}{'upper':>12}")
    print(f"{'logs MB/s':24}" + "".join(f"{rates[k]:>{w}.1f}" for k, w in
                                       (("direct", 16), ("node", 12), ("upper", 12))))  # fmt: skip
    print(f"{'kubectl logs MB/s':24}{kubectl_rates['direct']:>16.1f}{'':>12}"
          f"{kubectl_rates['upper']:>12.1f}")  # fmt: skip
    for label, q in (("exec round trip p50 ms", 0.5), ("exec round trip p99 ms", 0.99)):
        print(f"{label:24}{ms(p(latency['direct'], q)):>16}{ms(p(latency['node'], q)):>12}"
              f"{ms(p(latency['upper'], q)):>12}")  # fmt: skip
    ratio = rates["node"] / rates["direct"]
    added = p(latency["node"], 0.5) - p(latency["direct"], 0.5)
    print("\nagainst the targets")
    print(f"  logs throughput (node / direct): {ratio:.2f}x "
          f"[{TARGETS['logs throughput (node / direct)']}] "
          f"{'met' if ratio >= 0.7 else 'MISSED'}")  # fmt: skip
    print(f"  exec p50 added (node): {ms(added)} ms [{TARGETS['exec p50 added (node)']}] "
          f"{'met' if added <= 0.002 else 'MISSED'}")  # fmt: skip
    upper_ratio = kubectl_rates["upper"] / kubectl_rates["direct"]
    upper_added = p(latency["upper"], 0.5) - p(latency["direct"], 0.5)
    print(f"  (as kubectl sees it, through the upper apiserver: {upper_ratio:.2f}x logs, "
          f"+{ms(upper_added)} ms exec p50)")  # fmt: skip


if __name__ == "__main__":
    main()
