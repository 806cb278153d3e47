"""Faults the fleet stages on purpose, shared by the tests and the benchmarks: a node's
connection to an apiserver sent through a proxy that can be cut (`kubeconfig_through`,
with `devcluster.tcpproxy`), and a lower Node lost with its pods (`lose_lower_node`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

from devcluster.rest import ApiStatusError, RestClient


def kubeconfig_through(kubeconfig: Path, server: str, path: Path) -> Path:
    """Write to `path` the kubeconfig `kubeconfig` with every cluster's server replaced by
    `server` (a proxy's URL); return `path`."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(config))
    return path


def lose_lower_node(lower: RestClient, node: str) -> None:
    """The lower Node `node` goes, and its pods with it: force-deleted at once, as the pod
    garbage collector does once the Node has been gone for 40 s. A pod already gone is
    fine."""
    lower.request("DELETE", f"/api/v1/nodes/{node}")
    found = lower.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
    for item in found["items"]:
        meta = item["metadata"]
        with contextlib.suppress(ApiStatusError):
            lower.request(
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
            )
