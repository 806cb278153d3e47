"""The node's /metrics/resource, /stats/summary, /runningpods/ and /run, with kwok below.

These tests scrape the virtual node directly, as metrics-server does, with a
ServiceAccount token allowed `get` on nodes/metrics and nodes/stats, and parse the text
with a Prometheus text parser; the virtual nodes here read kwok's kubelet endpoint
directly (`VirtualNodeProcess`: --lower-kubelet-access=direct). `kubectl top` through a
real metrics-server, the apiservers' node proxy and the `proxy` access mode are in
tests/e2e/test_fleet.py.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import secrets
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from devcluster import kwok
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import (
    create,
    get,
    kubelet_request,
    phase,
    pod,
    pod_manifest,
    token_kubeconfig,
    wait_for,
)

MEMORY = 48 * 1024 * 1024  # the usage the pod's kwok annotations ask for, per container
CPU_CORES = 0.2
MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"


@pytest.fixture
def scraper_token(fleet: Fleet, namespace: str) -> Iterator[str]:
    """A token of ServiceAccount `scraper` allowed what metrics-server is: get on
    nodes/metrics and nodes/stats (nothing else)."""
    upper = fleet.upper
    name = f"tensile-test-scraper-{namespace}"
    upper.kubectl("create", "serviceaccount", "scraper", "-n", namespace)
    upper.kubectl(
        "create", "clusterrole", name, "--verb=get", "--resource=nodes/metrics,nodes/stats"
    )
    upper.kubectl(
        "create", "clusterrolebinding", name, f"--clusterrole={name}",
        f"--serviceaccount={namespace}:scraper",
    )  # fmt: skip
    try:
        yield upper.kubectl("create", "token", "scraper", "-n", namespace).stdout.strip()
    finally:
        upper.kubectl("delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")


@pytest.fixture
def prefixed_node(fleet: Fleet, tmp_path: Path) -> Iterator[tuple[VirtualNodeProcess, str]]:
    """A virtual node whose lower namespaces are `<prefix><upper namespace>`, and the
    prefix: lower and upper names differ, so a label that leaks a lower name shows."""
    prefix = f"lo{secrets.token_hex(2)}-"
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--namespace-prefix={prefix}"],
    )
    node.start()
    try:
        yield node, prefix
    finally:
        code = node.stop()
        node.delete_node()
        lower = fleet.lower.rest()
        for item in lower.request("GET", "/api/v1/namespaces")["items"]:
            if item["metadata"]["name"].startswith(prefix):
                lower.request("DELETE", f"/api/v1/namespaces/{item['metadata']['name']}")
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


def _samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _lower_kubelet_pods(fleet: Fleet, node_name: str, namespace: str) -> set[str]:
    """Pods kwok's kubelet endpoint reports CPU for in `namespace` (read directly, as the
    virtual node does)."""
    node = fleet.lower.rest().request("GET", f"/api/v1/nodes/{node_name}")
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    path = node["metadata"]["annotations"]["metrics.k8s.io/resource-metrics-path"]
    [address] = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    context = ssl.create_default_context(cafile=str(fleet.lower.ca))  # kwok's is signed by it
    with urllib.request.urlopen(f"https://{address}:{port}{path}", context=context) as r:
        text = r.read().decode()
    return {
        s.labels["pod"]
        for s in _samples(text)
        if s.name == "container_cpu_usage_seconds_total" and s.labels["namespace"] == namespace
    }


def _neighbour(
    name: str, *, node: str, owner: ownership.NodeIdentity | None, upper_namespace: str
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if owner is not None:
        labels, annotations = ownership.owner_marks(owner)
        annotations[ownership.UPPER_UID_ANNOTATION] = "00000000-0000-0000-0000-000000000000"
        annotations[ownership.UPPER_NAMESPACE_ANNOTATION] = upper_namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def test_resource_metrics_and_summary_show_our_pods_under_upper_names(
    fleet: Fleet,
    prefixed_node: tuple[VirtualNodeProcess, str],
    namespace: str,
    scraper_token: str,
) -> None:
    node, prefix = prefixed_node
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    manifest = pod_manifest("web", node=node.name)
    manifest["metadata"]["annotations"] = {
        kwok.USAGE_CPU_ANNOTATION: f"{int(CPU_CORES * 1000)}m",
        kwok.USAGE_MEMORY_ANNOTATION: "48Mi",
    }
    manifest["spec"]["containers"].append({"name": "side", "image": "busybox"})
    create(upper, namespace, manifest)
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    uid = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/web")["metadata"]["uid"]
    lower_namespace = prefix + namespace
    below = pod(lower, lower_namespace, "web")
    assert below is not None
    lower_node = below["spec"]["nodeName"]
    # Neighbours on the same lower node: nobody's pod, and one of another virtual node.
    for neighbour in (
        _neighbour("stranger", node=lower_node, owner=None, upper_namespace=namespace),
        _neighbour(
            "other-vn",
            node=lower_node,
            owner=ownership.NodeIdentity(
                node_name="vn-someone-else", cluster_id=node.owner.cluster_id
            ),
            upper_namespace=namespace,
        ),
    ):
        create(lower, lower_namespace, neighbour)
    wait_for(
        "the lower kubelet to report all three pods",
        lambda: (
            {"web", "stranger", "other-vn"}
            <= _lower_kubelet_pods(fleet, lower_node, lower_namespace)
        ),
    )

    def scrape(path: str) -> str:
        status, body = kubelet_request(fleet, node.kubelet_port, path, token=scraper_token)
        assert status == 200, body
        return body

    def our_series() -> list[Sample] | None:
        samples = _samples(scrape("/metrics/resource"))
        mine = [s for s in samples if s.labels.get("pod") == "web"]
        cpu = [s for s in mine if s.name == "container_cpu_usage_seconds_total"]
        return samples if len(cpu) == 2 else None

    # A container's CPU is 0 at kwok's first measurement: its pod only shows once > 0.
    samples = wait_for("our pod's series", our_series, timeout=60)
    now_ms = time.time() * 1000
    series: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {
        (s.name, tuple(sorted(s.labels.items()))): s for s in samples
    }
    for container in ("main", "side"):
        labels = tuple(
            sorted({"container": container, "pod": "web", "namespace": namespace}.items())
        )
        cpu = series[("container_cpu_usage_seconds_total", labels)]
        memory = series[("container_memory_working_set_bytes", labels)]
        start = series[("container_start_time_seconds", labels)]
        assert cpu.value > 0
        assert memory.value == MEMORY
        for sample in (cpu, memory):
            # Milliseconds in the text (the parser gives seconds): measured just now.
            assert sample.timestamp is not None
            assert abs(float(sample.timestamp) * 1000 - now_ms) < 120_000
        created = dt.datetime.fromisoformat(below["metadata"]["creationTimestamp"])
        assert start.value == created.timestamp()
    pod_labels = tuple(sorted({"pod": "web", "namespace": namespace}.items()))
    pod_cpu = series[("pod_cpu_usage_seconds_total", pod_labels)]
    pod_memory = series[("pod_memory_working_set_bytes", pod_labels)]
    assert pod_cpu.value > 0
    assert pod_memory.value == 2 * MEMORY
    # The node is the sum of its pods: here, the one pod.
    assert series[("node_memory_working_set_bytes", ())].value == 2 * MEMORY
    assert series[("node_cpu_usage_seconds_total", ())].value == pytest.approx(
        pod_cpu.value, rel=0.05
    )
    assert series[("scrape_error", ())].value == 0
    # Nothing of the neighbours, and no lower name anywhere.
    assert {s.labels.get("pod") for s in samples} <= {"web", None}
    assert {s.labels.get("namespace") for s in samples} <= {namespace, None}

    def summary_with_rates() -> dict[str, Any] | None:
        body: dict[str, Any] = json.loads(scrape("/stats/summary"))
        pods = body["pods"]
        return body if pods and "usageNanoCores" in pods[0]["cpu"] else None

    summary = wait_for("a summary with CPU rates", summary_with_rates, timeout=30)
    assert summary["node"]["nodeName"] == node.name
    assert summary["node"]["memory"]["workingSetBytes"] == 2 * MEMORY
    [entry] = summary["pods"]
    assert entry["podRef"] == {"name": "web", "namespace": namespace, "uid": uid}
    assert [c["name"] for c in entry["containers"]] == ["main", "side"]
    for container in entry["containers"]:
        assert container["memory"]["workingSetBytes"] == MEMORY
        assert container["cpu"]["usageCoreNanoSeconds"] > 0
        assert container["cpu"]["usageNanoCores"] == pytest.approx(CPU_CORES * 1e9, rel=0.25)
    assert entry["cpu"]["usageNanoCores"] == pytest.approx(2 * CPU_CORES * 1e9, rel=0.25)


def test_metrics_and_stats_are_authorized_as_their_own_subresources(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    fleet.upper.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = fleet.upper.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    for path, subresource in (
        ("/metrics/resource", "metrics"),
        ("/stats/summary", "stats"),
        ("/runningpods/", "pods proxy"),
    ):
        status, body = kubelet_request(fleet, virtual_node.kubelet_port, path, token=token)
        assert status == 403, path
        assert f"subresource(s)=[{subresource}]" in body


def test_running_pods_lists_the_pod_under_its_upper_names(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    upper = fleet.upper.rest()
    found = get(upper, f"/api/v1/namespaces/{namespace}/pods/{running_pod}")
    assert found is not None

    def listed() -> list[dict[str, Any]] | None:
        status, body = kubelet_request(fleet, virtual_node.kubelet_port, "/runningpods/", cert=True)
        assert status == 200
        items: list[dict[str, Any]] = json.loads(body)["items"]
        return items or None

    [item] = wait_for("the running pod", listed)
    assert item["metadata"] == {
        "name": running_pod,
        "namespace": namespace,
        "uid": found["metadata"]["uid"],
    }
    assert [c["name"] for c in item["spec"]["containers"]] == ["main"]


def test_run_returns_the_commands_output_or_why_it_failed(
    fleet: Fleet,
    virtual_node: VirtualNodeProcess,
    namespace: str,
    running_pod: str,
    tmp_path: Path,
) -> None:
    # kwok runs commands on this machine (ClusterExec local), so scripts can be files here.
    ok, failing = tmp_path / "ok.sh", tmp_path / "failing.sh"
    ok.write_text("echo out\necho err >&2\n")
    failing.write_text("echo partial\necho bad >&2\nexit 4\n")
    uid = get(fleet.upper.rest(), f"/api/v1/namespaces/{namespace}/pods/{running_pod}")
    assert uid is not None
    base = f"/run/{namespace}/{running_pod}"

    def run(path: str, cmd: str) -> tuple[int, str]:
        query = urllib.parse.urlencode({"cmd": cmd})
        return kubelet_request(
            fleet, virtual_node.kubelet_port, f"{path}?{query}", method="POST", cert=True
        )

    assert run(f"{base}/main", "echo hello") == (200, "hello\n")
    assert run(f"{base}/{uid['metadata']['uid']}/main", f"sh {ok}") == (200, "out\nerr\n")
    assert run(f"{base}/main", f"sh {failing}") == (
        500,
        f"command 'sh {failing}' exited with 4: bad\n",
    )
    assert run(f"{base}/wrong-uid/main", "echo hello")[0] == 404
    assert run(f"/run/{namespace}/nope/main", "echo hello")[0] == 404


def test_a_node_reading_the_kubelets_with_its_own_token_serves_its_pods_metrics(
    fleet: Fleet, tmp_path: Path, namespace: str, scraper_token: str
) -> None:
    """Direct mode with --lower-kubelet-token-file holding a token of the ServiceAccount of
    manifests/vnode/lower-rbac-kubelet-metrics.yaml, and otherwise only the base lower
    manifest's permissions (no nodes/proxy, no nodes/metrics): the node serves
    /metrics/resource for its pod, and the token is allowed nothing but metrics and stats.

    kwok's kubelet endpoint accepts any caller, so this cannot show WHICH credential the
    node sends: tests/component/test_kubelet_metrics.py shows it against a recording fake
    kubelet."""
    lower = fleet.lower
    lower_kubeconfig = token_kubeconfig(
        lower, MANIFESTS / "lower-rbac.yaml", tmp_path / "lower-sa.kubeconfig"
    )
    lower.kubectl("apply", "-f", str(MANIFESTS / "lower-rbac-kubelet-metrics.yaml"))

    def can(who: str, verb: str, resource: str, subresource: str = "") -> str:
        extra = [f"--subresource={subresource}"] if subresource else []
        answer = lower.kubectl(
            "auth", "can-i", verb, resource, *extra,
            f"--as=system:serviceaccount:tensile-system:{who}", check=False,
        )  # fmt: skip
        return answer.stdout.strip()

    scraper_sa, main_sa = "tensile-kubelet-metrics", "tensile-virtual-node"
    assert can(scraper_sa, "get", "nodes", "metrics") == "yes"
    assert can(scraper_sa, "get", "nodes", "stats") == "yes"
    assert can(scraper_sa, "get", "nodes", "proxy") == "no"
    assert can(scraper_sa, "create", "pods", "exec") == "no"
    assert can(scraper_sa, "get", "secrets") == "no"
    assert can(main_sa, "get", "nodes", "proxy") == "no"
    assert can(main_sa, "get", "nodes", "metrics") == "no"
    # The proxy mode's grant is valid as written (not applied: it is what this test avoids).
    lower.kubectl(
        "apply", "--dry-run=server", "-f", str(MANIFESTS / "lower-rbac-metrics-proxy.yaml")
    )
    token_file = tmp_path / "kubelet-token"
    token_file.write_text(
        lower.kubectl(
            "create", "token", "tensile-kubelet-metrics", "-n", "tensile-system",
            "--duration=1h",
        ).stdout
    )  # fmt: skip
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-tok-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        lower_kubeconfig=lower_kubeconfig,
        args=[f"--lower-kubelet-token-file={token_file}"],
    )
    node.start()
    try:
        upper = fleet.upper.rest()
        manifest = pod_manifest("web", node=node.name)
        manifest["metadata"]["annotations"] = {
            kwok.USAGE_CPU_ANNOTATION: f"{int(CPU_CORES * 1000)}m",
            kwok.USAGE_MEMORY_ANNOTATION: "48Mi",
        }
        create(upper, namespace, manifest)
        wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")

        def our_cpu() -> list[Sample] | None:
            status, body = kubelet_request(
                fleet, node.kubelet_port, "/metrics/resource", token=scraper_token
            )
            assert status == 200, body
            cpu = [
                s
                for s in _samples(body)
                if s.name == "container_cpu_usage_seconds_total" and s.labels.get("pod") == "web"
            ]
            return cpu or None

        [cpu] = wait_for("our pod's CPU", our_cpu, timeout=60)
        assert cpu.labels == {"container": "main", "pod": "web", "namespace": namespace}
        assert cpu.value > 0
        log = node.log.read_text()
        assert "main credential" not in log
        assert "--lower-kubelet-insecure-tls: the --lower-kubelet-token-file token" in log
    finally:
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


def test_the_nodes_own_metrics_are_served_on_the_kubelet_port_as_a_kubelets(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, scraper_token: str
) -> None:
    """`/metrics` (the node's tensile_* metrics) on the kubelet API at the node's address,
    which is not loopback, as a kubelet serves it: 401 without credentials, 403 for a
    token not allowed `get` on nodes/metrics, the metrics for one allowed (the upper
    cluster's real TokenReview and SubjectAccessReview decide)."""
    assert not ipaddress.ip_address(fleet.node_ip).is_loopback
    port = virtual_node.kubelet_port
    assert kubelet_request(fleet, port, "/metrics") == (401, "Unauthorized")
    fleet.upper.kubectl("create", "serviceaccount", "no-metrics", "-n", namespace)
    token = fleet.upper.kubectl("create", "token", "no-metrics", "-n", namespace).stdout
    status, body = kubelet_request(fleet, port, "/metrics", token=token.strip())
    assert status == 403
    assert "subresource(s)=[metrics]" in body
    status, body = kubelet_request(fleet, port, "/metrics", token=scraper_token)
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(body)}
    assert {"tensile_virtual_node_info", "tensile_kubelet_api_requests"} <= names
