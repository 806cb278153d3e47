"""--adopt-tensile-kube on the real fleet: a virtual node takes over what tensile-kube made.

Two starting points: lower objects shaped exactly as tensile-kube writes them (always run;
`tensile_kube_shapes`), and the real tensile-kube virtual node (when
TENSILE_KUBE_VIRTUAL_NODE names its binary; see docs/migration.md). Either way: ours starts
in migration mode on the same node name, as two replicas with leader election started
together -> only the leader adopts (the standby writes nothing below), no lower pod created
or deleted (a watch of the lower namespace from before the start), every upper pod Running,
its copies and Service adopted in place, leftovers listed and kept (a Service of another
selector, a pod of another image, objects made after the operator's cut-off); a later upper
delete removes its lower pod; a restart without the flag writes nothing below.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e import tensile_kube_shapes as shapes
from tests.e2e.helpers import create, get, phase, pod, wait_for
from tests.fixtures import create_namespace

FLAG = "--adopt-tensile-kube"
PODS = ("web-0", "web-1")
ELECTION = (
    "--leader-elect",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-lease-duration=4s",
)
"""As shipped, every node elects (short timings: a test's replicas come and go)."""
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def _upper_objects(upper: RestClient, namespace: str, *, node: str) -> None:
    """A ConfigMap, a Secret, a Service and two pods bound to `node` that use them."""
    create(
        upper, namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "web-config"}, "data": {"index.html": "hi"}},
    )  # fmt: skip
    create(
        upper, namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "web-secret"},
                           "stringData": {"token": "s3cret"}},
    )  # fmt: skip
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 80}]},
        },
    )
    for name in PODS:
        create(upper, namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {
                "nodeName": node,
                "containers": [{
                    "name": "main", "image": "nginx:1.27",
                    "volumeMounts": [{"name": "cfg", "mountPath": "/usr/share/nginx/html"},
                                     {"name": "sec", "mountPath": "/etc/sec"}],
                }],
                "volumes": [{"name": "cfg", "configMap": {"name": "web-config"}},
                            {"name": "sec", "secret": {"secretName": "web-secret"}}],
            },
        })  # fmt: skip


def _as_tensile_kube_made_them(
    upper: RestClient, lower: RestClient, namespace: str, *, with_leftovers: bool
) -> None:
    """Write below what tensile-kube's virtual node wrote for the upper objects (and, with
    `with_leftovers`, a pod and a ConfigMap of its making that match nothing upstairs)."""
    base = f"/api/v1/namespaces/{namespace}"
    for name in PODS:
        lower.request(
            "POST", f"{base}/pods", body=shapes.pod(upper.request("GET", f"{base}/pods/{name}"))
        )
    for kind, name in (("configmaps", "web-config"), ("secrets", "web-secret")):
        made = shapes.copy_of(upper.request("GET", f"{base}/{kind}/{name}"))
        lower.request("POST", f"{base}/{kind}", body=made)
    lower.request(
        "POST",
        f"{base}/services",
        body=shapes.service(upper.request("GET", f"{base}/services/web")),
    )
    endpoints = wait_for("upper Endpoints web", lambda: get(upper, f"{base}/endpoints/web"))
    lower.request("POST", f"{base}/endpoints", body=shapes.copy_of(endpoints))
    if with_leftovers:
        stray = shapes.pod(upper.request("GET", f"{base}/pods/web-0"))
        stray["metadata"]["name"] = "gone-upstairs"
        lower.request("POST", f"{base}/pods", body=stray)
        lower.request("POST", f"{base}/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "orphan-config", "annotations": {"global": "true"}},
        })  # fmt: skip
    for name in PODS:
        wait_for(f"lower {name} Running", lambda n=name: phase(lower, namespace, n) == "Running")


def _changes_since(client: RestClient, namespace: str, version: str) -> Counter[tuple[str, str]]:
    """(kind, watch event type) of every change to the pods, ConfigMaps, Secrets and
    Services of `namespace` after resourceVersion `version` (a watch per kind from then,
    read for a second, side by side: the apiserver replays what happened since)."""

    def watch(plural: str) -> list[tuple[str, str]]:
        status, text = client.get_text(
            f"/api/v1/namespaces/{namespace}/{plural}?watch=1&resourceVersion={version}"
            "&timeoutSeconds=1",
            timeout=10.0,
        )
        assert status == 200, text
        events = [json.loads(line) for line in text.splitlines() if line]
        return [(plural, e["type"]) for e in events if e["type"] != "BOOKMARK"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        found = pool.map(watch, ("pods", "configmaps", "secrets", "services"))
        return Counter(change for changes in found for change in changes)


def _version(client: RestClient, namespace: str) -> str:
    return str(
        client.request("GET", f"/api/v1/namespaces/{namespace}/pods")["metadata"]["resourceVersion"]
    )


def _wait_synced(node: VirtualNodeProcess) -> None:
    """Until the node's /readyz says every component works (its caches synced, the adoption
    done): the Node object may be Ready long before, as tensile-kube left it."""

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{node.endpoint}/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for("the node's /readyz", ready, timeout=60)


def _cutoff() -> str:
    """The operator's --adopt-tensile-kube-before: now, in whole seconds, a second after
    what came before (creationTimestamps are whole seconds)."""
    time.sleep(1.1)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _lower_writes(node: VirtualNodeProcess) -> float:
    return sum(
        node.metric("tensile_api_requests_total", cluster="lower", verb=verb) for verb in WRITES
    )


def _leads(node: VirtualNodeProcess) -> bool:
    return node.metric("tensile_leader_election_is_leader") == 1


def _migrate(
    fleet: Fleet,
    tmp_path: Path,
    namespace: str,
    *,
    node_name: str,
    nodes: list[VirtualNodeProcess],
    cutoff: str,
) -> dict[str, Any]:
    """Start ours in migration mode on `node_name` (two replicas at once) and check the
    adoption; then an upper delete and a restart without the flag. Returns what it
    measured, for the report."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    before = {p: pod(lower, namespace, p) for p in PODS}
    version = _version(lower, namespace)
    args = [FLAG, f"--adopt-tensile-kube-before={cutoff}", *ELECTION]
    replicas = []
    for replica in ("a", "b"):
        (tmp_path / replica).mkdir()
        replicas.append(
            VirtualNodeProcess(fleet, name=node_name, log_dir=tmp_path / replica, args=args)
        )
    nodes.extend(replicas)
    for replica in replicas:
        replica.start(wait=False)  # together: each would have adopted at its start
    for replica in replicas:
        _wait_synced(replica)
    node = wait_for("a leader", lambda: next((r for r in replicas if _leads(r)), None))
    [standby] = [r for r in replicas if r is not node]
    for name in PODS:
        wait_for(f"upper {name} Running", lambda n=name: phase(upper, namespace, n) == "Running")
    owner = node.owner
    for plural, name in (("pods", "web-0"), ("configmaps", "web-config"),
                         ("secrets", "web-secret"), ("services", "web")):  # fmt: skip
        found = get(lower, f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        assert found is not None, (plural, name)
        assert ownership.is_owned(found, owner=owner), (plural, name, found)
    for name in PODS:
        after = pod(lower, namespace, name)
        assert after is not None
        assert before[name] is not None
        assert after["metadata"]["uid"] == before[name]["metadata"]["uid"]
    changes = _changes_since(lower, namespace, version)
    print(f"lower changes while adopting: {dict(changes)}")
    assert not any(kind in ("ADDED", "DELETED") for _, kind in changes), changes
    # Only the leader adopted: the standby, started with it, wrote nothing below.
    assert node.metric("tensile_api_requests_total", cluster="lower", verb="PATCH") > 0
    assert _lower_writes(standby) == 0
    assert standby.stop() == 0

    # A later upper delete removes its lower pod.
    upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web-1")
    wait_for("lower web-1 gone", lambda: pod(lower, namespace, "web-1") is None)
    wait_for("upper web-1 gone", lambda: pod(upper, namespace, "web-1") is None)

    # Restarting without the flag changes nothing below.
    assert node.stop() == 0
    version = _version(lower, namespace)
    again = VirtualNodeProcess(
        fleet, name=node_name, log_dir=tmp_path / "again", args=list(ELECTION)
    )
    (tmp_path / "again").mkdir()
    nodes.append(again)
    again.start()
    _wait_synced(again)
    wait_for("upper web-0 Running", lambda: phase(upper, namespace, "web-0") == "Running")
    quiet = _changes_since(lower, namespace, version)
    print(f"lower changes after a restart without {FLAG}: {dict(quiet)}")
    assert not quiet, quiet
    return {"changes": changes}


def _bare_pod(name: str, *, node: str, image: str = "nginx:1.27") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}]},
    }


def _lookalikes(upper: RestClient, lower: RestClient, namespace: str, *, node: str) -> None:
    """Below, objects shaped like tensile-kube's that were not made for what is upstairs: a
    Service copy whose kept selector is another, a pod of another image."""
    base = f"/api/v1/namespaces/{namespace}"
    upper.request("POST", f"{base}/services", body={
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-other"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 80}]},
    })  # fmt: skip
    other = shapes.service(upper.request("GET", f"{base}/services/web-other"))
    other["metadata"]["annotations"]["labelSelector"] = json.dumps({"app": "other"})
    lower.request("POST", f"{base}/services", body=other)
    create(upper, namespace, _bare_pod("web-image", node=node))
    made = shapes.pod(upper.request("GET", f"{base}/pods/web-image"))
    made["spec"]["containers"][0]["image"] = "registry.example/not-nginx:1"
    lower.request("POST", f"{base}/pods", body=made)


def _made_late(upper: RestClient, lower: RestClient, namespace: str, *, node: str) -> None:
    """A pod shaped like tensile-kube's for an upper pod of the node, made below after the
    operator's cut-off (tensile-kube was stopped by then: someone else made it)."""
    base = f"/api/v1/namespaces/{namespace}"
    create(upper, namespace, _bare_pod("web-late", node=node))
    lower.request(
        "POST", f"{base}/pods", body=shapes.pod(upper.request("GET", f"{base}/pods/web-late"))
    )


def test_objects_shaped_as_tensile_kube_made_them_are_adopted_in_place(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node_name = f"tk-{secrets.token_hex(3)}"
    # The Node tensile-kube registered stays when it stops (the pod GC controller deletes
    # pods bound to a node that does not exist).
    upper.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                  "metadata": {"name": node_name}})  # fmt: skip
    _upper_objects(upper, namespace, node=node_name)
    _as_tensile_kube_made_them(upper, lower, namespace, with_leftovers=True)
    _lookalikes(upper, lower, namespace, node=node_name)
    cutoff = _cutoff()
    _made_late(upper, lower, namespace, node=node_name)
    kept = {
        p: (pod(lower, namespace, p) or {})["metadata"]["uid"] for p in ("web-image", "web-late")
    }
    _migrate(fleet, tmp_path, namespace, node_name=node_name, nodes=nodes, cutoff=cutoff)
    # Leftovers are listed, never deleted, never marked as ours.
    owner = ownership.NodeIdentity(node_name=node_name, cluster_id=_cluster_id(upper))
    for path in ("pods/gone-upstairs", "configmaps/orphan-config", "endpoints/web",
                 "services/web-other", "pods/web-image", "pods/web-late"):  # fmt: skip
        found = get(lower, f"/api/v1/namespaces/{namespace}/{path}")
        assert found is not None, path
        assert not ownership.is_owned(found, owner=owner), path
    assert {p: (pod(lower, namespace, p) or {})["metadata"]["uid"] for p in kept} == kept
    events = upper.request(
        "GET", "/api/v1/namespaces/default/events",
        query={"fieldSelector": f"involvedObject.name={node_name},reason=TensileKubeLeftovers"},
    )["items"]  # fmt: skip
    assert events, "no TensileKubeLeftovers Event"
    message = events[0]["message"]
    for named in ("Pod " + namespace + "/gone-upstairs (unmatched)",
                  "ConfigMap " + namespace + "/orphan-config (unmatched)",
                  "Endpoints " + namespace + "/web (superseded)",
                  "Service " + namespace + "/web-other (mismatch)",
                  "Pod " + namespace + "/web-image (mismatch)",
                  "Pod " + namespace + "/web-late (after-cutoff)"):  # fmt: skip
        assert named in message, message


def _cluster_id(upper: RestClient) -> str:
    return str(upper.request("GET", "/api/v1/namespaces/kube-system")["metadata"]["uid"])


TENSILE_KUBE = os.environ.get("TENSILE_KUBE_VIRTUAL_NODE", "")


@pytest.mark.skipif(
    not TENSILE_KUBE,
    reason="TENSILE_KUBE_VIRTUAL_NODE names no tensile-kube virtual-node (docs/migration.md)",
)
def test_the_real_tensile_kube_virtual_node_is_replaced_in_place(
    start_fleet: Any, tmp_path: Path, nodes: list[VirtualNodeProcess]
) -> None:
    # A fleet of its own: tensile-kube mirrors every upper Service and collects copies
    # cluster-wide, which would touch other tests' objects.
    fleet: Fleet = start_fleet(FleetSettings(uppers=1, lowers=(LowerClusterSettings(nodes=1),)))
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node_name = "tk-node"
    namespace = create_namespace((fleet.upper, fleet.lower), prefix="tk-real")
    # tensile-kube's manifest (manifeasts/virtual-node.yaml), without its kubelet API (no
    # APISERVER_CERT_LOCATION: nothing listens) and with its metrics on loopback.
    log = (tmp_path / "tensile-kube.log").open("wb")
    process = subprocess.Popen(
        [TENSILE_KUBE, "--provider=k8s", f"--nodename={node_name}", "--disable-taint=true",
         "--kube-api-qps=500", "--kube-api-burst=1000", "--client-qps=500", "--client-burst=1000",
         f"--kubeconfig={fleet.upper.kubeconfig}", f"--client-kubeconfig={fleet.lower.kubeconfig}",
         "--klog.v=5", "--log-level=debug", "--metrics-addr=127.0.0.1:0"],
        env={"PATH": os.environ.get("PATH", ""), "VKUBELET_POD_IP": fleet.node_ip},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(
            "tensile-kube's Node", lambda: get(upper, f"/api/v1/nodes/{node_name}"), timeout=60
        )
        _upper_objects(upper, namespace, node=node_name)
        for name in PODS:
            wait_for(
                f"upper {name} Running via tensile-kube",
                lambda n=name: phase(upper, namespace, n) == "Running",
                timeout=60,
            )
        wait_for("tensile-kube's Service copy",
                 lambda: get(lower, f"/api/v1/namespaces/{namespace}/services/web"))  # fmt: skip
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
    # tensile-kube was stopped just now: everything it made is older.
    _migrate(fleet, tmp_path, namespace, node_name=node_name, nodes=nodes, cutoff=_cutoff())
