"""tensile-scheduler against real clusters: one upper cluster over two lower ones, a virtual
node for each, the upper kube-scheduler configured with the extender (ignorable). Lower
cluster A has four nodes of 1 CPU (its virtual node advertises 4 CPU), B one node of 8 CPU.
A pod of 1.5 CPU that prefers A's virtual node fits no single node of A: with the extender
it is bound to B's virtual node at once (without it, the upper scheduler picks A and the
pod waits below, Unschedulable, until the descheduler moves it: test_descheduler.py).

The extender runs with the token of manifests/scheduler/rbac.yaml's account, and answers
only callers presenting a client certificate of its --client-ca-file: the upper
kube-scheduler presents the one its configuration's extender tlsConfig names (a call it made
without one would be refused, and, the extender being ignorable, the pods would go where the
upper scheduler alone sends them). Quota slices records live on ResourceQuotas; the virtual
nodes hold pods bound by spec.nodeName, which no scheduler saw, to them and to their taint.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.pki import KeyPair
from devcluster.rest import RestClient
from devcluster.schedulers import SchedulerExtenderProcess, extender_client
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import clusterselector
from tensile.contracts.quotaslices import SLICES_ANNOTATION
from tensile.placement import summary
from tests.e2e.helpers import events_for, get, pod, scrape, token_kubeconfig, wait_for
from tests.fixtures import create_namespace, delete_namespace, long_lived_pids

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"
TOPOLOGY = FleetSettings(
    lowers=(
        LowerClusterSettings(nodes=4, cpu="1", memory="8Gi"),
        LowerClusterSettings(nodes=1, cpu="8", memory="32Gi"),
    ),
    metrics_server=False,
    scheduler_extender=True,
)


@dataclass(frozen=True)
class Topology:
    fleet: Fleet
    kubeconfig: Path
    """The tensile-scheduler ServiceAccount's kubeconfig (manifests/scheduler/rbac.yaml)."""
    log_dir: Path

    @property
    def upper(self) -> RestClient:
        return self.fleet.upper.rest()


def _summarized(client: RestClient, name: str) -> bool:
    node = get(client, f"/api/v1/nodes/{name}") or {}
    return summary.ANNOTATION in (node.get("metadata", {}).get("annotations") or {})


@pytest.fixture(scope="module")
def topology(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    directory = tmp_path_factory.mktemp("sched-fleet")
    fleet = Fleet.start(directory=directory / "fleet", settings=TOPOLOGY, owns_directory=True)
    pids = long_lived_pids(request.config)
    pids.update(fleet.pids())
    started: list[VirtualNodeProcess] = []
    try:
        for name, lower in (("vn-a", "lower"), ("vn-b", "lower-2")):
            node = VirtualNodeProcess(fleet, name=name, lower=lower, log_dir=directory)
            started.append(node)
            node.start()
            assert node.process is not None
            pids.add(node.process.pid)
        upper = fleet.upper.rest()
        for name in ("vn-a", "vn-b"):
            wait_for(f"{name}'s placement summary", lambda n=name: _summarized(upper, n))
        kubeconfig = token_kubeconfig(
            fleet.upper,
            MANIFESTS / "rbac.yaml",
            directory / "scheduler.kubeconfig",
            service_account="tensile-scheduler",
        )
        yield Topology(fleet=fleet, kubeconfig=kubeconfig, log_dir=directory)
    finally:
        for node in started:
            node.stop()
            if node.process is not None:
                pids.discard(node.process.pid)
        fleet.stop()
        pids.difference_update(fleet.pids())


@pytest.fixture
def extender(topology: Topology, tmp_path: Path) -> Iterator[SchedulerExtenderProcess]:
    """tensile-scheduler on the port the upper kube-scheduler calls; must exit 0."""
    process = SchedulerExtenderProcess(
        topology.fleet, log_dir=tmp_path, kubeconfig=topology.kubeconfig
    )
    process.start()
    try:
        yield process
    finally:
        if process.process is not None and process.process.alive():
            assert process.stop() == 0, process.log.read_text()[-2000:]


@pytest.fixture
def ns(topology: Topology, request: pytest.FixtureRequest) -> Iterator[str]:
    clusters = [topology.fleet.upper, *topology.fleet.lowers]
    name = create_namespace(clusters[:1], prefix=request.node.name[5:30].replace("_", "-"))
    try:
        yield name
    finally:
        delete_namespace(clusters, name)


def big_pod(name: str, *, cluster_selector: dict[str, Any] | None = None) -> dict[str, Any]:
    """1.5 CPU on one lower node, preferring vn-a upstairs (a preferred node affinity)."""
    annotations = (
        {clusterselector.ANNOTATION: json.dumps(cluster_selector)} if cluster_selector else {}
    )
    prefer = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["vn-a"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": {"matchExpressions": [prefer]}}
                    ]
                }
            },
            "nodeSelector": {"type": "virtual-kubelet"},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "1500m"}}}
            ],
        },
    }


def _bound(client: RestClient, ns: str, name: str) -> str | None:
    return ((pod(client, ns, name) or {}).get("spec") or {}).get("nodeName")


def test_a_pod_no_node_of_a_fits_goes_straight_to_b(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    upper = topology.upper
    started = time.monotonic()
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=big_pod("big"))
    node = wait_for("the pod bound", lambda: _bound(upper, ns, "big"))
    print(f"bound to {node} after {time.monotonic() - started:.1f}s")
    assert node == "vn-b"
    wait_for(
        "the pod Running",
        lambda: (pod(upper, ns, "big") or {}).get("status", {}).get("phase") == "Running",
    )
    print(f"Running after {time.monotonic() - started:.1f}s")
    assert extender.metric("tensile_scheduler_filtered_nodes_total", verdict="unfit") >= 1


def test_the_failed_scheduling_event_says_why_no_lower_node_fits(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    upper = topology.upper
    first = topology.fleet.cluster("lower").nodes[0]
    only_there = {"nodeSelector": {"kubernetes.io/hostname": first}}
    upper.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body=big_pod("nowhere", cluster_selector=only_there),
    )

    def failed() -> str | None:
        for event in events_for(upper, ns, "nowhere"):
            if event.get("reason") == "FailedScheduling" and "lower cluster" in event["message"]:
                return str(event["message"])
        return None

    message = wait_for("a FailedScheduling event", failed)
    print(message)
    assert "lower cluster of vn-a: 0/4 nodes are available: 1 Insufficient cpu" in message
    assert "lower cluster of vn-b: 0/1 nodes are available: 1 node(s) didn't match" in message
    assert _bound(upper, ns, "nowhere") is None


def _extender_get(port: int, path: str, *, token: str = "") -> tuple[int, str]:
    """GET `path` of the extender at 127.0.0.1 with a bearer `token` (`scrape`); it answers."""
    answer = scrape(f"https://127.0.0.1:{port}{path}", token=token)
    assert answer is not None, f"nothing answers on 127.0.0.1:{port}"
    return answer


def test_the_extenders_metrics_are_only_for_callers_allowed_to_read_them(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    """/metrics on the HTTPS port, as kube-scheduler serves its own: without a client
    certificate or a token 401; a token the upper cluster does not allow `get` on the
    non-resource URL /metrics 403; one bound to a ClusterRole that allows it (the chart's
    metrics-reader rule) 200 with the extender's metrics. The reviews are made with
    manifests/scheduler/rbac.yaml's rights."""
    upper = topology.fleet.upper
    role = f"tensile-test-metrics-{ns}"
    for account in ("reader", "not-a-reader"):
        upper.kubectl("create", "serviceaccount", account, "-n", ns)
    upper.kubectl("create", "clusterrole", role, "--verb=get", "--non-resource-url=/metrics")
    try:
        upper.kubectl(
            "create", "clusterrolebinding", role, f"--clusterrole={role}",
            f"--serviceaccount={ns}:reader",
        )  # fmt: skip
        reader, other = (
            upper.kubectl("create", "token", a, "-n", ns).stdout.strip()
            for a in ("reader", "not-a-reader")
        )
        assert _extender_get(extender.port, "/metrics") == (401, "Unauthorized")
        status, body = _extender_get(extender.port, "/metrics", token=other)
        assert status == 403, body
        assert "path=/metrics" in body
        status, body = _extender_get(extender.port, "/metrics", token=reader)
        assert status == 200, body
        assert "tensile_scheduler_virtual_nodes" in body
        # The probes' endpoints stay open; the calls still need kube-scheduler's certificate.
        assert _extender_get(extender.port, "/readyz")[0] == 200
        assert _extender_get(extender.port, "/filter", token=reader)[0] == 401
    finally:
        upper.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found")


def test_scheduling_goes_on_while_the_extender_is_down(
    topology: Topology, extender: SchedulerExtenderProcess, ns: str
) -> None:
    assert extender.stop() == 0
    upper = topology.upper
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=big_pod("anyway"))
    node = wait_for("the pod bound without the extender", lambda: _bound(upper, ns, "anyway"))
    print(f"bound to {node} without the extender")


def small_pod(name: str) -> dict[str, Any]:
    """500m, preferring vn-a (a preferred node affinity): where the scheduler goes unless
    something filters vn-a out."""
    prefer = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["vn-a"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": {"matchExpressions": [prefer]}}
                    ]
                }
            },
            "nodeSelector": {"type": "virtual-kubelet"},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "500m"}}}
            ],
        },
    }


def _quota(client: RestClient, ns: str, cpu: str, *, record: str | None = None) -> None:
    """The namespace's ResourceQuota "compute" on requests.cpu; `record`: an
    administrator's quota slices record on it."""
    annotations = {SLICES_ANNOTATION: record} if record is not None else {}
    client.request(
        "POST",
        f"/api/v1/namespaces/{ns}/resourcequotas",
        body={
            "metadata": {"name": "compute", "annotations": annotations},
            "spec": {"hard": {"requests.cpu": cpu}},
        },
    )


def _record(client: RestClient, ns: str) -> str | None:
    found = get(client, f"/api/v1/namespaces/{ns}/resourcequotas/compute") or {}
    return (found.get("metadata", {}).get("annotations") or {}).get(SLICES_ANNOTATION)


def _failed_scheduling(client: RestClient, ns: str, name: str, word: str) -> str | None:
    for event in events_for(client, ns, name):
        if event.get("reason") == "FailedScheduling" and word in event["message"]:
            return str(event["message"])
    return None


def test_a_quotad_namespaces_pods_go_only_where_its_slices_are(
    topology: Topology, tmp_path: Path
) -> None:
    """The real tensile-scheduler with its slice controller: a quota'd namespace's pods go
    only where its slices are, within their budget, and the program writes the record of
    a namespace no administrator set."""
    upper, clusters = topology.upper, [topology.fleet.upper, *topology.fleet.lowers]
    extender = _slices_extender(topology, tmp_path)
    held = create_namespace(clusters[:1], prefix="slices-held")
    placed = create_namespace(clusters[:1], prefix="slices-placed")
    try:
        # An administrator's record (no status: set by hand) on the quota: 1 cpu, on vn-b.
        _quota(upper, held, "2", record="vn-b=2x(500m,-)")
        bound = []
        for name in ("p1", "p2"):
            upper.request("POST", f"/api/v1/namespaces/{held}/pods", body=small_pod(name))
            bound.append(
                wait_for(
                    f"{name} bound",
                    lambda n=name: (pod(upper, held, n) or {}).get("spec", {}).get("nodeName"),
                )
            )
        print(f"bound to {bound} (they prefer vn-a)")
        assert bound == ["vn-b", "vn-b"]
        # The quota allows a third, the slices do not: it waits, saying why.
        upper.request("POST", f"/api/v1/namespaces/{held}/pods", body=small_pod("p3"))
        message = wait_for(
            "p3's FailedScheduling", lambda: _failed_scheduling(upper, held, "p3", "slices")
        )
        print(message)
        assert "its namespace holds no quota slices on vn-a" in message
        assert "quota slices on vn-b (2x(500m,-)) allow 1 cpu: 1 in use" in message
        # unresolvable: preemption looks for no victims there (they would go for nothing)
        assert "No preemption victims" not in message
        assert (pod(upper, held, "p3") or {}).get("spec", {}).get("nodeName") is None
        assert _record(upper, held) == "vn-b=2x(500m,-)"  # the administrator's, kept
        # The program's own slice controller places a quota'd namespace's slices.
        _quota(upper, placed, "1500m")
        record = wait_for("the record placed", lambda: _record(upper, placed))
        print(f"{placed}: {record}")
        # 3 slices by room: vn-b's lower cluster has 8 CPU free, vn-a's 4 (D'Hondt: b, then
        # a before b's second at an equal 4, ties by name, then b).
        assert record == "vn-a=1x(500m,-),vn-b=2x(500m,-)"
        assert (
            extender.metric("tensile_scheduler_quota_slice_admissions_total", outcome="refused")
            >= 1
        )
    finally:
        delete_namespace(clusters, held)
        delete_namespace(clusters, placed)
        assert extender.stop() == 0, extender.log.read_text()[-2000:]


def _slices_extender(topology: Topology, log_dir: Path) -> SchedulerExtenderProcess:
    """A tensile-scheduler with its slice controller, started once the earlier tests'
    quota'd namespaces are gone: slices are placed across every quota'd namespace, so a
    namespace still terminating would take room the test counts on (its deletion is not
    waited for where it is asked)."""
    wait_for(
        "no ResourceQuota left from earlier tests",
        lambda: not topology.upper.request("GET", "/api/v1/resourcequotas").get("items"),
        timeout=60,
    )
    extender = SchedulerExtenderProcess(
        topology.fleet,
        log_dir=log_dir,
        kubeconfig=topology.kubeconfig,
        args=["--slice-sync-delay=100ms"],
    )
    extender.start()
    return extender


def test_records_tenants_write_or_beyond_the_quota_take_no_room_from_others(
    topology: Topology, tmp_path: Path
) -> None:
    """A tenant allowed to patch its own Namespace (a RoleBinding there grants it) writes a
    quota slices record on it: it is not read, so it neither frees the tenant nor takes
    room on vn-a from the others; the tenant cannot write its ResourceQuota, where records
    are read. An administrator's record beyond its namespace's quota takes no more room
    than the quota. Either way another namespace's slices go where they would."""
    upper, fleet = topology.upper, topology.fleet
    clusters = [fleet.upper, *fleet.lowers]
    extender = _slices_extender(topology, tmp_path)
    tenant = create_namespace(clusters[:1], prefix="slices-tenant")
    admins = create_namespace(clusters[:1], prefix="slices-admins")
    other = create_namespace(clusters[:1], prefix="slices-other")
    who = f"--as=system:serviceaccount:{tenant}:default"
    try:
        # The tenant: the built-in admin role in its namespace, and patch on its Namespace.
        fleet.upper.kubectl(
            "-n", tenant, "create", "rolebinding", "admin", "--clusterrole=admin",
            f"--serviceaccount={tenant}:default",
        )  # fmt: skip
        fleet.upper.kubectl(
            "-n", tenant, "create", "role", "own-namespace", "--verb=get,patch",
            "--resource=namespaces", f"--resource-name={tenant}",
        )  # fmt: skip
        fleet.upper.kubectl(
            "-n", tenant, "create", "rolebinding", "own-namespace", "--role=own-namespace",
            f"--serviceaccount={tenant}:default",
        )  # fmt: skip
        forged = f"{SLICES_ANNOTATION}=vn-a=8x(1,-)"
        fleet.upper.kubectl("annotate", "namespace", tenant, forged, who)  # it may
        _quota(upper, tenant, "2")
        refused = fleet.upper.kubectl(
            "-n", tenant, "annotate", "--overwrite", "resourcequota", "compute", forged, who,
            check=False,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "Forbidden" in refused.stderr, refused.stderr
        # An administrator's record of 8 cpu on vn-a, for a quota of 1 cpu.
        _quota(upper, admins, "1", record="vn-a=8x(1,-)")
        tenants = wait_for("the tenant's slices placed", lambda: _record(upper, tenant))
        print(f"{tenant}: {tenants}")
        assert tenants != "vn-a=8x(1,-)"  # computed by the controller: not the forged record
        _quota(upper, other, "1500m")
        record = wait_for("the other namespace's slices placed", lambda: _record(upper, other))
        print(f"{other}: {record}")
        # Of the 4 cpu of vn-a, the administrator's record takes 1 (capped at its quota, not
        # 8) and the tenant's computed slices at most 1 more: D'Hondt gives vn-a one of the 3
        # slices, as in a fleet without either. The forged 8 cpu would have left it none.
        assert record == "vn-a=1x(500m,-),vn-b=2x(500m,-)"
    finally:
        for ns in (tenant, admins, other):
            delete_namespace(clusters, ns)
        assert extender.stop() == 0, extender.log.read_text()[-2000:]


def test_a_record_that_cannot_be_read_admits_no_pod_anywhere(
    topology: Topology, tmp_path: Path
) -> None:
    """Fail closed: a namespace whose record cannot be read has its pods refused by the
    extender (the reason in FailedScheduling) and by the virtual node (a pod bound by
    spec.nodeName), instead of being freed of its slices."""
    upper, clusters = topology.upper, [topology.fleet.upper, *topology.fleet.lowers]
    extender = _slices_extender(topology, tmp_path)
    ns = create_namespace(clusters[:1], prefix="slices-broken")
    try:
        _quota(upper, ns, "2", record="vn-a=lots")
        upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=small_pod("waits"))
        message = wait_for(
            "its FailedScheduling", lambda: _failed_scheduling(upper, ns, "waits", "refused")
        )
        print(message)
        assert "its namespace's quota slices are refused: the tensile.io/quota-slices record" in (
            message
        )
        assert (pod(upper, ns, "waits") or {}).get("spec", {}).get("nodeName") is None
        upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pinned("pinned", "vn-b"))
        status = wait_for("the pinned pod refused", lambda: _failed(upper, ns, "pinned"))
        print(status)
        assert status["reason"] == "OutOfQuotaSlices"
        assert "record of ResourceQuota compute cannot be read" in status["message"]
    finally:
        delete_namespace(clusters, ns)
        assert extender.stop() == 0, extender.log.read_text()[-2000:]


def pinned(name: str, node: str, *, tolerate: bool = True, cpu: str = "500m") -> dict[str, Any]:
    """A pod bound by spec.nodeName (no scheduler sees it), tolerating the virtual nodes'
    taint unless not `tolerate`."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": cpu}}}
        ],
    }
    if tolerate:
        spec["tolerations"] = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _failed(client: RestClient, ns: str, name: str) -> dict[str, Any] | None:
    status = (pod(client, ns, name) or {}).get("status") or {}
    return status if status.get("phase") == "Failed" else None


def _running(client: RestClient, ns: str, name: str) -> bool:
    return ((pod(client, ns, name) or {}).get("status") or {}).get("phase") == "Running"


def test_the_virtual_node_holds_pods_bound_by_node_name_to_their_slices(
    topology: Topology, ns: str
) -> None:
    """No extender runs: pods bound by spec.nodeName are admitted by the virtual node within
    their namespace's slices, first come first served, and refused beyond them as a kubelet
    refuses a pod it has no room for (Failed, the reason in the status and an Event)."""
    upper = topology.upper
    _quota(upper, ns, "4", record="vn-b=2x(500m,-)")  # 1 cpu on vn-b, nothing on vn-a
    for name in ("b1", "b2"):
        upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pinned(name, "vn-b"))
        wait_for(f"{name} Running", lambda n=name: _running(upper, ns, n))
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pinned("b3", "vn-b"))
    upper.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pinned("a1", "vn-a"))
    beyond = wait_for("b3 refused", lambda: _failed(upper, ns, "b3"))
    print(beyond)
    assert beyond["reason"] == "OutOfQuotaSlices"
    assert beyond["message"] == (
        "Pod was rejected: its namespace's quota slices on vn-b (2x(500m,-)) allow 1 cpu: "
        "1 in use, the pod requests 500m"
    )
    elsewhere = wait_for("a1 refused", lambda: _failed(upper, ns, "a1"))
    assert elsewhere["message"] == (
        "Pod was rejected: its namespace holds no quota slices on vn-a "
        "(its slices: vn-b=2x(500m,-))"
    )
    assert [e["reason"] for e in events_for(upper, ns, "b3")].count("OutOfQuotaSlices") == 1
    lower = topology.fleet.lowers[1].rest()
    assert get(lower, f"/api/v1/namespaces/{ns}/pods/b3") is None  # never created below
    for admitted in ("b1", "b2"):  # admitted first: they stay
        assert _running(upper, ns, admitted)


def test_a_pod_bound_by_node_name_must_tolerate_the_virtual_nodes_taint(
    topology: Topology, ns: str
) -> None:
    """As a kubelet refuses a pod not tolerating its NoExecute taints, the virtual node
    refuses one not tolerating its taint (the pod's consent to run in another cluster),
    with the kubelet's reason and message."""
    upper = topology.upper
    upper.request(
        "POST", f"/api/v1/namespaces/{ns}/pods", body=pinned("bare", "vn-a", tolerate=False)
    )
    status = wait_for("the pod refused", lambda: _failed(upper, ns, "bare"))
    print(status)
    assert status["reason"] == "TaintToleration"
    assert status["message"] == (
        "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod "
        "didn't tolerate"
    )
    assert "TaintToleration" in [e["reason"] for e in events_for(upper, ns, "bare")]
    lower = topology.fleet.lower.rest()
    assert get(lower, f"/api/v1/namespaces/{ns}/pods/bare") is None  # never created below


# -- who may call the extender -----------------------------------------------------------------


def _call(
    extender: SchedulerExtenderProcess,
    path: str,
    *,
    body: Any = None,
    cert: KeyPair | None = None,
    ca: Path,
) -> tuple[int, str]:
    """(status, text) of a call to the extender's HTTPS port, presenting `cert` (None: no
    client certificate)."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"https://127.0.0.1:{extender.port}{path}",
        data=data,
        headers={"Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_extender_answers_only_callers_with_a_client_certificate_of_its_ca(
    topology: Topology, extender: SchedulerExtenderProcess
) -> None:
    """The upper kube-scheduler presents its certificate (every placement test above shows
    its calls answered). A caller presenting none gets 401 and learns nothing (no verdict,
    no failure reason, no metrics); the probes' /healthz and /readyz say whether, not why;
    a certificate of the cluster CA (the admin's) is refused at the handshake."""
    ca = topology.fleet.upper.ca
    args = {"Pod": big_pod("p"), "NodeNames": ["vn-a", "vn-b"]}
    status, text = _call(extender, "/filter", body=args, ca=ca)
    assert (status, "vn-a" in text) == (401, False)
    assert "a client certificate is required" in text
    assert _call(extender, "/prioritize", body=args, ca=ca)[0] == 401
    status, text = _call(extender, "/metrics", ca=ca)
    assert (status, "tensile_scheduler" in text) == (401, False)
    assert _call(extender, "/healthz", ca=ca) == (200, "ok")
    assert _call(extender, "/readyz?verbose", ca=ca) == (200, "ok")
    kube_scheduler = extender_client(topology.fleet)
    status, text = _call(extender, "/filter", body=args, cert=kube_scheduler, ca=ca)
    assert status == 200
    assert "lower cluster of vn-a" in json.loads(text)["FailedNodes"]["vn-a"]
    assert _call(extender, "/readyz?verbose", cert=kube_scheduler, ca=ca)[1].startswith("[+]")
    # (TLS 1.3: the server's verdict on the certificate comes after the client's handshake,
    # as an alert, or the connection closed before any answer)
    with pytest.raises(OSError):  # noqa: PT011 - an SSLError, a URLError or a reset
        _call(extender, "/healthz", cert=topology.fleet.upper.admin, ca=ca)


def test_a_call_cannot_plant_a_verdict_for_a_pending_pod(
    topology: Topology, extender: SchedulerExtenderProcess
) -> None:
    """A call naming a pod's UID and resourceVersion with a spec of its own (one that fits
    vn-a) leaves no verdict behind for the pod with that UID and version: the verdict
    cache is keyed on what was judged."""
    ca, cert = topology.fleet.upper.ca, extender_client(topology.fleet)
    real, forged = big_pod("p"), small_pod("p")
    for one in (real, forged):
        one["metadata"].update(namespace="x", uid="4f1c6c9e-0000-4000-8000-000000000001")
        one["metadata"]["resourceVersion"] = "12345"
    planted = _call(
        extender, "/filter", body={"Pod": forged, "NodeNames": ["vn-a"]}, cert=cert, ca=ca
    )
    assert json.loads(planted[1])["NodeNames"] == ["vn-a"]
    status, text = _call(
        extender, "/filter", body={"Pod": real, "NodeNames": ["vn-a"]}, cert=cert, ca=ca
    )
    assert status == 200
    answer = json.loads(text)
    print(answer)
    assert answer["NodeNames"] == []
    assert "Insufficient cpu" in answer["FailedNodes"]["vn-a"]
