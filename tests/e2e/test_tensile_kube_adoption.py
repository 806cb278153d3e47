"""--adopt-tensile-kube on the real fleet: a virtual node takes over what tensile-kube made;
and the way back (docs/migration.md): what tensile leaves when it stops is what tensile-kube
takes back, and tensile-kube's webhook configuration is switched first.

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
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devcluster import rest
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
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
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


# --- the way back to tensile-kube --------------------------------------------------------

TENSILE_SLICES = "endpointslice.kubernetes.io/managed-by=endpointslice-mirror.tensile.io"


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    """The real kubectl of the test extra (beside this Python)."""
    kubectl = Path(sys.executable).parent / "kubectl"
    return subprocess.run(
        [str(kubectl), *args], capture_output=True, text=True, timeout=60, check=False
    )


def _tensile_slices(lower: RestClient, namespace: str) -> list[dict[str, Any]]:
    return list(
        lower.request(
            "GET",
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            query={"labelSelector": TENSILE_SLICES},
        )["items"]
    )


def _forwarded_by_tensile(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> VirtualNodeProcess:
    """A tensile virtual node (as shipped: electing) forwarding two pods that use a
    ConfigMap and a Secret, behind a Service whose EndpointSlice it mirrors below."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    (tmp_path / "tensile").mkdir()
    node = VirtualNodeProcess(
        fleet, name=f"rb-{secrets.token_hex(3)}", log_dir=tmp_path / "tensile", args=ELECTION
    )
    nodes.append(node)
    node.start()
    _upper_objects(upper, namespace, node=node.name)
    for name in PODS:
        wait_for(f"upper {name} Running", lambda n=name: phase(upper, namespace, n) == "Running")
    base = f"/api/v1/namespaces/{namespace}"
    for path in ("configmaps/web-config", "secrets/web-secret", "services/web"):
        wait_for(f"lower {path}", lambda p=path: get(lower, f"{base}/{p}"))
    wait_for("tensile's EndpointSlice below", lambda: _tensile_slices(lower, namespace))
    return node


def _roll_back(fleet: Fleet, namespace: str, node: VirtualNodeProcess) -> None:
    """Steps 2 and 3 of docs/migration.md's way back, checking what they promise: stopping
    deletes nothing, the Node and its bound pods stay, everything below carries what
    tensile-kube reads, and the page's command removes tensile's EndpointSlices."""
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    base = f"/api/v1/namespaces/{namespace}"
    version = _version(lower, namespace)
    assert node.stop() == 0
    changes = _changes_since(lower, namespace, version)
    assert not any(kind in ("ADDED", "DELETED") for _, kind in changes), changes
    assert get(upper, f"/api/v1/nodes/{node.name}") is not None, "the Node stays"
    for name in PODS:
        bound = pod(upper, namespace, name)
        assert bound is not None
        assert bound["spec"]["nodeName"] == node.name
        assert not bound["metadata"].get("deletionTimestamp")
        below = pod(lower, namespace, name)
        assert below is not None
        assert shapes.takes_as_its_pod(below, bound), below["metadata"]
    for path in ("configmaps/web-config", "secrets/web-secret", "services/web"):
        copy = get(lower, f"{base}/{path}")
        assert copy is not None
        assert shapes.takes_as_its_copy(copy), (path, copy["metadata"])
    done = _kubectl(
        "--kubeconfig", str(fleet.lower.kubeconfig), "delete", "endpointslices",
        "--all-namespaces", "-l", f"{TENSILE_SLICES},tensile.io/cluster-id={_cluster_id(upper)}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_for("no tensile EndpointSlice below", lambda: not _tensile_slices(lower, namespace))


def test_stopping_tensile_leaves_what_tensile_kube_takes_back(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    node = _forwarded_by_tensile(fleet, tmp_path, namespace, nodes)
    _roll_back(fleet, namespace, node)
    # Forward again, as a later migration would: the objects are still this node's, so a
    # start without --adopt-tensile-kube takes them back and writes nothing below.
    lower = fleet.lower.rest()
    version = _version(lower, namespace)
    (tmp_path / "again").mkdir()
    again = VirtualNodeProcess(fleet, name=node.name, log_dir=tmp_path / "again", args=ELECTION)
    nodes.append(again)
    again.start()
    _wait_synced(again)
    wait_for(
        "upper web-0 Running", lambda: phase(fleet.upper.rest(), namespace, "web-0") == "Running"
    )
    changes = _changes_since(lower, namespace, version)
    assert not any(kind in ("ADDED", "DELETED") for _, kind in changes), changes


@pytest.mark.skipif(
    not TENSILE_KUBE,
    reason="TENSILE_KUBE_VIRTUAL_NODE names no tensile-kube virtual-node (docs/migration.md)",
)
def test_the_real_tensile_kube_takes_back_what_tensile_made(
    start_fleet: Any, tmp_path: Path, nodes: list[VirtualNodeProcess]
) -> None:
    # A fleet of its own, as for the way there: tensile-kube acts cluster-wide.
    fleet: Fleet = start_fleet(FleetSettings(uppers=1, lowers=(LowerClusterSettings(nodes=1),)))
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    namespace = create_namespace((fleet.upper, fleet.lower), prefix="tk-back")
    node = _forwarded_by_tensile(fleet, tmp_path, namespace, nodes)
    uids = {name: (pod(lower, namespace, name) or {})["metadata"]["uid"] for name in PODS}
    _roll_back(fleet, namespace, node)
    version = _version(lower, namespace)
    log = (tmp_path / "tensile-kube.log").open("wb")
    process = subprocess.Popen(
        [TENSILE_KUBE, "--provider=k8s", f"--nodename={node.name}", "--disable-taint=true",
         f"--kubeconfig={fleet.upper.kubeconfig}", f"--client-kubeconfig={fleet.lower.kubeconfig}",
         "--metrics-addr=127.0.0.1:0"],
        env={"PATH": os.environ.get("PATH", ""), "VKUBELET_POD_IP": fleet.node_ip},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # tensile-kube hands lower changes to its pod controller 10 s after its start.
        time.sleep(15)
        for name in PODS:
            assert phase(upper, namespace, name) == "Running", name
        changes = _changes_since(lower, namespace, version)
        print(f"lower changes once tensile-kube is back: {dict(changes)}")
        assert not any(
            kind in ("ADDED", "DELETED") for plural, kind in changes if plural == "pods"
        ), changes
        assert {n: (pod(lower, namespace, n) or {})["metadata"]["uid"] for n in PODS} == uids
        create(upper, namespace, _bare_pod("after", node=node.name))
        wait_for("tensile-kube forwards a new pod", lambda: pod(lower, namespace, "after"),
                 timeout=60)  # fmt: skip
        upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web-1")
        wait_for("lower web-1 gone", lambda: pod(lower, namespace, "web-1") is None, timeout=60)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


def _vk_mutator(name: str) -> dict[str, Any]:
    """tensile-kube's webhook configuration (manifeasts/webhook.yaml) in admissionregistration
    v1: pods, CREATE, failurePolicy Fail, no namespace or object selector, service
    kube-system/vk-mutator (the webhook's name made valid: tensile-kube's "xxx" is not)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "vk-mutator.tensile-kube.io",
            "clientConfig": {"service": {"namespace": "kube-system", "name": "vk-mutator",
                                         "path": "/mutate", "port": 443}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }  # fmt: skip


def _admitted(upper: RestClient, namespace: str) -> bool:
    """Whether a pod creation in `namespace` gets through admission (a dry run)."""
    try:
        upper.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            query={"dryRun": "All"},
            body={"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-"},
                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        )  # fmt: skip
    except rest.ApiStatusError as exc:
        if "vk-mutator" in str(exc):
            return False
        raise
    return True


def test_tensile_kube_s_webhook_configuration_blocks_every_pod_until_it_is_deleted(
    fleet: Fleet, namespace: str
) -> None:
    """docs/migration.md, step 1: why tensile-kube's configuration goes first, and the
    command that finds it."""
    upper = fleet.upper.rest()
    name = f"vk-mutator-{secrets.token_hex(3)}"
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    upper.request(
        "POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        body=_vk_mutator(name),
    )  # fmt: skip
    try:
        # No Service behind it: every pod is refused, in any namespace, kube-system too.
        wait_for("pods refused", lambda: not _admitted(upper, namespace))
        assert not _admitted(upper, "kube-system")
        listed = _kubectl(
            "--kubeconfig", str(fleet.upper.kubeconfig), "get", "mutatingwebhookconfigurations",
            "-o", "custom-columns=NAME:.metadata.name,FAILURE:.webhooks[*].failurePolicy,"
            "SERVICE:.webhooks[*].clientConfig.service.name,"
            "NAMESPACES:.webhooks[*].namespaceSelector,OBJECTS:.webhooks[*].objectSelector",
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        [row] = [line.split() for line in listed.stdout.splitlines() if line.startswith(name)]
        # The apiserver stores the missing selectors as empty ones: they match everything.
        assert row[1:] == ["Fail", "vk-mutator", "map[]", "map[]"], listed.stdout
    finally:
        upper.request("DELETE", path)
    wait_for("pods admitted again", lambda: _admitted(upper, namespace))
