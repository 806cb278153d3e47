"""What watching copies namespace by namespace costs (--lower-namespace-role): one watch
per namespace and kind instead of one per kind.

On a local fleet's lower cluster: N namespaces (default 50), each with a few ConfigMaps;
the six kinds a virtual node keeps copies of (ConfigMaps, Secrets, ServiceAccounts,
Services, EndpointSlices, claims) watched per namespace (`NamespacedInformer`, N x 6
watches) and then cluster-wide (6 watches), as an administrator's credentials may.
Printed: the time to the first complete list, this process's RSS and open descriptors
after it, and the lower kube-apiserver's RSS, each for both ways.

    python -m bench.namespaced_watches [--namespaces 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from devcluster.fleet import Fleet, FleetSettings
from tensile.kube import config
from tensile.kube.client import ApiClient
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.namespaced import NamespaceSet
from tensile.kube.resources import (
    CONFIG_MAPS,
    ENDPOINT_SLICES,
    PERSISTENT_VOLUME_CLAIMS,
    SECRETS,
    SERVICE_ACCOUNTS,
    SERVICES,
)

KINDS = (
    CONFIG_MAPS,
    SECRETS,
    SERVICE_ACCOUNTS,
    SERVICES,
    ENDPOINT_SLICES,
    PERSISTENT_VOLUME_CLAIMS,
)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _measure(fleet: Fleet, names: list[str], *, per_namespace: bool) -> dict[str, float]:
    apiserver = fleet.component("lower-apiserver").pid
    before = _rss_kib(apiserver)
    async with ApiClient(config.load(str(fleet.lower.kubeconfig)), name="lower") as lower:
        factory = InformerFactory()
        watched = NamespaceSet()
        for name in names:
            watched.add(name)
        informers = [
            factory.informer(lower, kind, namespaces=watched if per_namespace else None)
            for kind in KINDS
        ]
        start = time.monotonic()
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(i.run(), name=f"bench-{i.name}") for i in informers]
            for informer in informers:
                await informer.wait_synced(timeout=120)
            synced = time.monotonic() - start
            await asyncio.sleep(5)  # every watch open, the server settled
            result = {
                "sync_s": synced,
                "client_rss_mib": _rss_kib(os.getpid()) / 1024,
                "client_fds": float(_fds()),
                "apiserver_rss_delta_mib": (_rss_kib(apiserver) - before) / 1024,
            }
            for task in tasks:
                task.cancel()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tensile-bench-") as directory:
        fleet = Fleet.start(directory=Path(directory), settings=FleetSettings())
        try:
            fleet.join_network()
            client = fleet.lower.rest()
            names = [f"bench-{i}" for i in range(args.namespaces)]
            for name in names:
                client.request(
                    "POST",
                    "/api/v1/namespaces",
                    body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                )
                for j in range(5):
                    client.request(
                        "POST",
                        f"/api/v1/namespaces/{name}/configmaps",
                        body={"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": f"c{j}"}, "data": {"v": "x" * 100}},
                    )  # fmt: skip
            for per_namespace in (True, False):
                result = asyncio.run(_measure(fleet, names, per_namespace=per_namespace))
                way = (
                    f"{len(names)} namespaces x {len(KINDS)} kinds"
                    if per_namespace
                    else f"cluster-wide, {len(KINDS)} kinds"
                )
                print(
                    f"{way}: first list {result['sync_s']:.2f}s, client RSS "
                    f"{result['client_rss_mib']:.0f} MiB, {result['client_fds']:.0f} open "
                    f"descriptors, lower apiserver RSS +{result['apiserver_rss_delta_mib']:.0f} MiB"
                )
        finally:
            fleet.stop()


if __name__ == "__main__":
    main()
