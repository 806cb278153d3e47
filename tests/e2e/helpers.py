"""Small helpers for e2e tests: polling, manifests, and API shortcuts on the real clusters."""

from __future__ import annotations

import asyncio
import base64
import http.client
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient

T = TypeVar("T")


def wait_for(what: str, condition: Callable[[], T | None], *, timeout: float = 30.0) -> T:
    """Poll `condition` every 0.1 s until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def pod_manifest(
    name: str,
    *,
    node: str,
    image: str = "nginx:1.27",
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod the upper scheduler places on virtual node `node`."""
    container: dict[str, Any] = {"name": "main", "image": image}
    if requests:
        container["resources"] = {"requests": requests}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name, **(labels or {})}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [container],
            **(spec or {}),
        },
    }


_PLURALS = {
    "Pod": "pods",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "ResourceQuota": "resourcequotas",
}


def create(client: RestClient, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST `obj` into `namespace` (its kind picks the collection)."""
    plural = _PLURALS[obj["kind"]]
    return client.request("POST", f"/api/v1/namespaces/{namespace}/{plural}", body=obj)


def get(client: RestClient, path: str) -> dict[str, Any] | None:
    """GET `path`, or None on 404."""
    try:
        return client.request("GET", path)
    except ApiStatusError as exc:
        if exc.code == 404:
            return None
        raise


def pod(client: RestClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod, or None."""
    return get(client, f"/api/v1/namespaces/{namespace}/pods/{name}")


def phase(client: RestClient, namespace: str, name: str) -> str | None:
    """The pod's phase, or None if there is no such pod."""
    found = pod(client, namespace, name)
    return None if found is None else found.get("status", {}).get("phase")


def events_for(client: RestClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events whose involved object is the pod `name`."""
    result = client.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={"fieldSelector": f"involvedObject.name={name}"},
    )
    return list(result.get("items") or [])


def token_kubeconfig(
    cluster: Cluster,
    manifest: Path,
    path: Path,
    *,
    service_account: str = "tensile-virtual-node",
    node: str | None = None,
) -> Path:
    """Apply the RBAC `manifest` to `cluster` and write to `path` a kubeconfig with a 1 h
    token of its ServiceAccount tensile-system/`service_account`; return `path`.

    `node`: the virtual node the account runs, for manifests that grant a node its own Node
    and Leases by name (upper-rbac.yaml): the node names shipped there are replaced by it,
    and its election Lease is added, as an administrator does for another node name."""
    if node is None:
        cluster.kubectl("apply", "-f", str(manifest))
    else:
        documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        cluster.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump_all(for_node(d, node) for d in documents)
        )
    token = cluster.kubectl(
        "create", "token", service_account, "-n", "tensile-system", "--duration=1h"
    ).stdout.strip()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": cluster.server,
                            "certificate-authority": str(cluster.ca),
                        },
                    }
                ],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
            }
        )
    )
    return path


SHIPPED_NODES = ("virtual-kubelet-0", "virtual-kubelet")
"""The node names the shipped manifests grant their own Node and Leases to."""


def node_csrs(client: RestClient, node: str) -> list[dict[str, Any]]:
    """The CertificateSigningRequests whose request names system:node:`node` (a node's
    kubelet-serving CSRs), oldest first."""
    items = client.request("GET", "/apis/certificates.k8s.io/v1/certificatesigningrequests")
    found = []
    for csr in items.get("items") or []:
        request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
        names = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if [n.value for n in names] == [f"system:node:{node}"]:
            found.append(csr)
    return sorted(found, key=lambda c: c["metadata"]["creationTimestamp"])


def serving_secret(node: str) -> str:
    """The Secret in tensile-system that keeps `node`'s serving certificate in the shipped
    manifests (--cert-secret)."""
    return f"tensile-vn-{node}-serving"


def for_node(document: dict[str, Any], node: str) -> dict[str, Any]:
    """`document` (a Role or ClusterRole of the shipped manifests; anything else as it is)
    with the rights it grants the shipped nodes by name granted to `node` instead, and
    the election Lease of `node` (tensile-virtual-node-`node`) and its serving
    certificate's Secret (tensile-vn-`node`-serving, which the caller makes) beside the
    shipped ones."""
    if document.get("kind") not in ("Role", "ClusterRole"):
        return document
    rules = []
    for rule in document.get("rules") or []:
        names = rule.get("resourceNames")
        if names:
            renamed = [node if n in SHIPPED_NODES else n for n in names]
            if any(n == f"tensile-virtual-node-{s}" for n in names for s in SHIPPED_NODES):
                renamed.append(f"tensile-virtual-node-{node}")
            if any(n == serving_secret(s) for n in names for s in SHIPPED_NODES):
                renamed.append(serving_secret(node))
            rules.append({**rule, "resourceNames": sorted(set(renamed))})
        else:
            rules.append(rule)
    return {**document, "rules": rules}


def kubelet_request(
    fleet: Fleet,
    port: int,
    path: str,
    *,
    method: str = "GET",
    cert: bool = False,
    token: str | None = None,
) -> tuple[int, str]:
    """Call a virtual node's kubelet API at the node address, `port`, as a client of its own
    would: with the upper apiserver's kubelet client certificate (`cert`) or a bearer
    `token`. Returns (status, body)."""
    context = ssl.create_default_context(cafile=str(fleet.vnode.client_ca))
    if cert:
        client = fleet.upper.kubelet_client
        context.load_cert_chain(str(client.cert), str(client.key))
    conn = http.client.HTTPSConnection(fleet.node_ip, port, context=context, timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def scrape(url: str, *, token: str = "") -> tuple[int, str] | None:
    """GET `url` over HTTPS with a bearer `token` (none: no credentials), verifying no
    certificate (what a test checks is who may read); return (status, body), or None while
    nothing answers there."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


@dataclass(frozen=True)
class Storage:
    """The StorageClasses and lower local PVs of one test."""

    upper_class: str
    """Provisioned by the virtual nodes (tensile.io/virtual-node, WaitForFirstConsumer)."""
    retain_class: str
    """The same with reclaimPolicy Retain."""
    legacy_class: str
    """An ordinary WaitForFirstConsumer class upstairs (tensile-kube's migration path)."""
    lower_class: str
    """Below: kubernetes.io/no-provisioner, WaitForFirstConsumer, local PVs."""
    volumes: dict[str, str]
    """Lower local PV name -> the kwok node its node affinity names."""


def delete_if_present(client: RestClient, path: str) -> None:
    """DELETE `path`; a 404 is fine."""
    try:
        client.request("DELETE", path)
    except ApiStatusError as exc:
        if exc.code != 404:
            raise


async def until(what: str, condition: Callable[[], Any], *, timeout: float = 20.0) -> Any:
    """Wait (asynchronously) until `condition()` (or the coroutine it returns) is truthy;
    return that value; fail the test after `timeout` seconds, naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)
