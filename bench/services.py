"""Service benchmark: how long a change of a Service's endpoints takes to reach the lower
cluster's EndpointSlices, over N scale events of a Deployment on the virtual node.

One run, one fleet: a Deployment of 3 pods on a virtual node and a Service selecting them;
then N scale events (3 -> 4 -> 3 -> ...). For each event three moments are taken from
watches: the scale request, the upper cluster's EndpointSlice showing the new set of ready
endpoints (the upper controllers' own work, from pod start to slice: the baseline), and
the lower cluster's mirrored EndpointSlice showing the same set. Printed: p50/p99 of the
mirror's delay (upper slice -> lower slice), of the baseline (scale -> upper slice) and
their ratio, and of the whole path (scale -> lower slice). Percentiles are nearest-rank
(`harness.pct`): p99 of 100 events is the 99th smallest, so one outlier does not set it.

    .venv/bin/python bench/services.py [--events 100]

Uses the fleet of TENSILE_DEVCLUSTER_DIR if set, else starts (and stops) its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import pct

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.kube import config
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import ENDPOINT_SLICES, NAMESPACES
from vnode.providers.k2k import services

History = list[tuple[float, frozenset[str]]]


def deployment(name: str, *, node: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    # Pods go at once when scaled down, as the endpoint change does.
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "web", "image": "nginx:1.27"}],
                },
            },
        },
    }


def ready_set(slices: list[dict[str, Any]]) -> frozenset[str]:
    return frozenset(
        address
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
        for address in e.get("addresses") or []
    )


def watch_slices(
    client: ApiClient, namespace: str, *, mirrored: bool, history: History
) -> Informer:
    """An informer on the namespace's slices of Service "web" (only ours if `mirrored`)
    that appends (time, ready addresses) to `history` whenever the set changes."""
    selector = f"{services.SERVICE_NAME_LABEL}=web"
    if mirrored:
        selector += f",{services.MANAGED_BY_LABEL}={services.MANAGED_BY}"
    informer = Informer(
        client, ENDPOINT_SLICES, name=f"bench-{client.name}", namespace=namespace,
        label_selector=selector,
    )  # fmt: skip

    def changed(_obj: dict[str, Any]) -> None:
        now = time.monotonic()
        current = ready_set(list(informer.store))
        if not history or history[-1][1] != current:
            history.append((now, current))

    informer.add_handlers(
        Handlers(on_add=changed, on_update=lambda _o, n: changed(n), on_delete=changed)
    )
    return informer


async def first(
    history: History, *, after: float, where: Any, timeout: float
) -> tuple[float, frozenset[str]]:
    """Wait for the first entry of `history` after `after` for which `where(set)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        for moment, seen in history:
            if moment >= after and where(seen):
                return moment, seen
        if time.monotonic() > deadline:
            raise TimeoutError(f"no matching endpoints within {timeout}s (last {history[-1:]})")
        await asyncio.sleep(0.01)


async def run(fleet: Fleet, node: str, *, events: int) -> list[tuple[float, float, float, bool]]:
    """Return (scale -> upper slice, upper slice -> lower slice, scale -> lower slice in
    seconds, whether it scaled up) for each scale event."""
    namespace = f"bench-{secrets.token_hex(3)}"
    async with (
        ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper", qps=0) as upper,
        ApiClient(config.load(str(fleet.lower.kubeconfig)), name="lower", qps=0) as lower,
    ):
        await upper.request("POST", NAMESPACES.path(), body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})  # fmt: skip
        while True:  # pods are refused until the ServiceAccount controller made `default`
            try:
                await upper.request(
                    "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
                )
                break
            except Exception:  # noqa: BLE001
                await asyncio.sleep(0.1)
        above: History = []
        below: History = []
        informers = [
            watch_slices(upper, namespace, mirrored=False, history=above),
            watch_slices(lower, namespace, mirrored=True, history=below),
        ]
        tasks = [asyncio.create_task(i.run(), name=f"watch-{i.name}") for i in informers]
        results = []
        try:
            replicas = 3
            deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
            await upper.request(
                "POST", deployments, body=deployment("web", node=node, replicas=replicas)
            )
            await upper.request("POST", f"/api/v1/namespaces/{namespace}/services", body={
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})  # fmt: skip
            _, start = await first(above, after=0, where=lambda s: len(s) == replicas, timeout=120)
            await first(below, after=0, where=lambda s: s == start, timeout=60)
            for index in range(events):
                replicas = 4 if replicas == 3 else 3
                previous = above[-1][1]
                scaled = time.monotonic()
                await upper.request(
                    "PATCH", f"{deployments}/web", body={"spec": {"replicas": replicas}},
                    content_type=MERGE_PATCH,
                )  # fmt: skip
                t_upper, wanted = await first(
                    above, after=scaled,
                    where=lambda s, n=replicas, p=previous: len(s) == n and s != p, timeout=60,
                )  # fmt: skip
                t_lower, _ = await first(
                    below, after=scaled, where=lambda s, w=wanted: s == w, timeout=60
                )
                results.append(
                    (t_upper - scaled, t_lower - t_upper, t_lower - scaled, replicas == 4)
                )
                if (index + 1) % 10 == 0:
                    print(f"  {index + 1}/{events} scale events", flush=True)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await upper.request("DELETE", NAMESPACES.path(name=namespace))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100)
    args = parser.parse_args()
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        fleet = Fleet.attach(Path(existing))
        fleet.join_network()
    else:
        fleet = Fleet.start(
            directory=Path(tempfile.mkdtemp(prefix="tensile-bench-")),
            settings=FleetSettings(lowers=(LowerClusterSettings(nodes=2),), metrics_server=False),
            owns_directory=True,
        )
    try:
        node = VirtualNodeProcess(
            fleet, name=f"bench-{secrets.token_hex(3)}", log_dir=fleet.directory / "logs",
            args=["--log-level=info", "--enable-controllers=ServiceControllers"],
        )  # fmt: skip
        node.start()
        try:
            print(f"service benchmark: {args.events} scale events (3 <-> 4 pods)")
            results = asyncio.run(run(fleet, node.name, events=args.events))
        finally:
            node.stop()
            node.delete_node()
    finally:
        if not existing:
            fleet.stop()
    upstairs = [r[0] for r in results]
    mirror = [r[1] for r in results]
    whole = [r[2] for r in results]
    print(f"\n{'seconds':44}{'p50':>8}{'p99':>8}")
    rows = [
        ("scale -> upper EndpointSlice (baseline)", upstairs),
        ("upper -> lower EndpointSlice (the mirror)", mirror),
        ("  of which scaling up (a new pod)", [r[1] for r in results if r[3]]),
        ("  of which scaling down", [r[1] for r in results if not r[3]]),
        ("scale -> lower EndpointSlice", whole),
    ]
    for label, values in rows:
        if values:
            print(f"{label:44}{pct(values, 0.5):8.3f}{pct(values, 0.99):8.3f}")
    print(
        f"mirror delay / baseline: p50 {pct(mirror, 0.5) / pct(upstairs, 0.5):.2f}, "
        f"p99 {pct(mirror, 0.99) / pct(upstairs, 0.99):.2f}"
    )


if __name__ == "__main__":
    main()
