"""The Helm chart (charts/tensile) with a real helm (built from its Go module beside the
control plane): it lints, renders, refuses bad values through values.schema.json, passes a
server-side dry run in the real upper apiserver, and, installed there, runs.

The installed chart's pods are placed by the upper scheduler on the upper cluster's host
Node (a kwok Node), and their containers run here as local processes with each pod's own
ServiceAccount, arguments and volumes (`devcluster.podrun`), as virtual-kubelet's suite
runs `manifests/vnode/virtual-node.yaml` (tests/e2e/test_virtual_kubelet_suite.py). So
what is checked is the chart's own wiring: its RBAC lets each program do its work, its
arguments and volumes start them, its Secret carries the lower kubeconfig.
"""

from __future__ import annotations

import base64
import http.server
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from descheduler import cli as descheduler_cli
from devcluster import binaries, netns, pki, podrun, ports
from devcluster.cluster import LOG_LINES, Cluster
from devcluster.fleet import Fleet
from devcluster.podrun import LocalPod
from scheduler import cli as scheduler_cli
from tests.e2e.helpers import (
    get,
    node_csrs,
    phase,
    pod_manifest,
    scrape,
    token_kubeconfig,
    wait_for,
)
from vnode import cli as vnode_cli
from webhook import cli as webhook_cli

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts" / "tensile"
LOWER_RBAC = ROOT / "manifests" / "vnode" / "lower-rbac.yaml"
RELEASE = "chart-e2e"
FULLNAME = "chart-e2e-tensile"
NAMESPACE = "tensile-chart"
NODE = "chart-lower"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(binaries.ensure(preexec_fn=netns.in_host_network())["helm"])


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=60, check=check
    )  # fmt: skip


def render(helm: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """`helm template` of the chart with `values` (as YAML on stdin): its objects."""
    done = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


TWO_NODES: dict[str, Any] = {
    "virtualNode": {
        "nodes": [
            {"name": "lower-a", "kubeconfig": "apiVersion: v1\nkind: Config\n"},
            {"name": "lower-b", "kubeconfigSecret": "lower-b-kubeconfig", "replicas": 2},
        ]
    },
    "scheduler": {"enabled": True},
}


def test_the_chart_lints_strictly(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    # The alerts and dashboards on too: every template renders.
    values.write_text(yaml.safe_dump({**TWO_NODES, "monitoring": MONITORING}))
    done = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # The chart's defaults alone (no virtual node yet) lint as well.
    done = run_helm(helm, "lint", "--strict", str(CHART), check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"virtualNode": {"nodes": [{"name": "a"}]}}, "oneOf"),
        (
            {"virtualNode": {"nodes": [{"name": "a", "kubeconfig": "x", "kubeconfigSecret": "s"}]}},
            "oneOf",
        ),
        ({"virtualNode": {"nodes": [{"name": "Lower_A", "kubeconfigSecret": "s"}]}}, "name"),
        ({"webhok": {"enabled": False}}, "webhok"),
        ({"webhook": {"failurePolicy": "Sometimes"}}, "failurePolicy"),
        ({"descheduler": {"deschedulingInterval": "10 seconds"}}, "deschedulingInterval"),
        ({"image": {"digest": "latest"}}, "digest"),
        (
            {
                "virtualNode": {
                    "nodes": [
                        {
                            "name": "a",
                            "kubeconfigSecret": "s",
                            "env": [{"name": "VKUBELET_NODE_LABEL", "vaule": "clusterID:a"}],
                        }
                    ]
                }
            },
            "vaule",
        ),
        ({"monitoring": {"dashboards": {"label": ""}}}, "label"),
    ],
    ids=[
        "node-without-kubeconfig",
        "node-with-both-kubeconfigs",
        "node-name-not-a-dns-label",
        "misspelt-key",
        "bad-failure-policy",
        "bad-duration",
        "bad-digest",
        "misspelt-env-field",
        "empty-dashboard-label",
    ],
)
def test_bad_values_are_refused_with_the_field_named(
    helm: str, values: dict[str, Any], message: str
) -> None:
    done = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "-f", "-"],
        input=yaml.safe_dump(values), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr
    assert message in done.stderr


def test_cert_manager_mode_uses_a_certificate_and_drops_the_bootstrap_permissions(
    helm: str,
) -> None:
    objects = render(helm, {"webhook": {"certManager": {"enabled": True}}})
    webhook = f"{FULLNAME}-webhook"
    certificate = by_kind(objects, "Certificate", webhook)
    assert certificate["spec"]["secretName"] == f"{webhook}-tls"
    assert f"{webhook}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] == f"{webhook}-selfsigned"
    configuration = by_kind(objects, "MutatingWebhookConfiguration", webhook)
    annotations = configuration["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{webhook}"
    args = by_kind(objects, "Deployment", webhook)["spec"]["template"]["spec"]["containers"][0]
    assert "--tlscert=/etc/tensile/tls/tls.crt" in args["args"]
    assert not any(a.startswith("--tls-secret") for a in args["args"])
    role = by_kind(objects, "Role", webhook)
    assert all("secrets" not in r["resources"] for r in role["rules"])
    cluster_role = by_kind(objects, "ClusterRole", webhook)
    assert all("mutatingwebhookconfigurations" not in r["resources"] for r in cluster_role["rules"])
    # A given issuer is used as it is, and no Issuer is made.
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    objects = render(helm, {"webhook": {"certManager": {"enabled": True, "issuerRef": issuer}}})
    assert by_kind(objects, "Certificate", webhook)["spec"]["issuerRef"] == issuer
    assert not [o for o in objects if o["kind"] == "Issuer"]


def _health_test_pod(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((o for o in objects if o["metadata"]["name"] == f"{FULLNAME}-test-health"), None)


def test_helm_test_asks_each_deployed_program_for_its_health(helm: str, tmp_path: Path) -> None:
    """`helm test`'s pod (templates/tests/): rendered, and its check run here against a
    server that answers and a port where none listens. Not run with `helm test` on the
    fleet: its pods are kwok's, which run no container (kwok marks a test pod Succeeded
    whatever it would do), so that would test nothing."""
    pod = _health_test_pod(render(helm, {"scheduler": {"enabled": True}}))
    assert pod is not None
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    python, flag, script, *urls = container["command"]
    assert (python, flag) == ("python3", "-c")
    assert urls == [
        f"https://{FULLNAME}-webhook.{NAMESPACE}.svc:443/healthz",
        f"https://{FULLNAME}-scheduler.{NAMESPACE}.svc:443/healthz",
    ]
    # Only what is deployed is asked; nothing deployed, no test pod.
    webhook_only = _health_test_pod(render(helm, {}))
    assert webhook_only is not None
    assert webhook_only["spec"]["containers"][0]["command"][3:] == urls[:1]
    assert _health_test_pod(render(helm, {"webhook": {"enabled": False}})) is None

    # The check itself: 0 when every program answers 200, 1 naming the one that does not.
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 500)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, name="health", daemon=True)
    thread.start()
    try:
        up = f"http://127.0.0.1:{server.server_address[1]}"
        closed = f"http://127.0.0.1:{ports.pick()}/healthz"
        ok = subprocess.run([sys.executable, "-c", script, f"{up}/healthz"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert ok.returncode == 0, ok.stdout
        bad = subprocess.run([sys.executable, "-c", script, f"{up}/healthz", f"{up}/x", closed],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert bad.returncode == 1
        assert f"{up}/x failed" in bad.stdout
        assert f"{closed} failed" in bad.stdout
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_scheduler_extender_is_off_by_default(helm: str) -> None:
    scheduler = f"{FULLNAME}-scheduler"
    assert not [o for o in render(helm, {}) if o["metadata"]["name"] == scheduler]
    objects = render(helm, {"scheduler": {"enabled": True}})
    pod = by_kind(objects, "Deployment", scheduler)["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["tensile-scheduler"]
    assert "--tls-cert-file=/etc/tensile/tls/tls.crt" in pod["containers"][0]["args"]
    assert pod["volumes"][0]["secret"]["secretName"] == f"{scheduler}-tls"
    # callers present a client certificate; the probes (none) use the HTTPS port
    assert "--client-ca-file=/etc/tensile/client-ca/ca.crt" in pod["containers"][0]["args"]
    assert pod["volumes"][1]["secret"]["secretName"] == f"{scheduler}-client-ca"
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # with cert-manager: one CA signs the serving certificate and kube-scheduler's
    managed = render(helm, {"scheduler": {"enabled": True, "certManager": {"enabled": True}}})
    client = by_kind(managed, "Certificate", f"{scheduler}-client")
    assert client["spec"]["usages"][-1] == "client auth"
    assert (
        client["spec"]["issuerRef"]
        == by_kind(managed, "Certificate", scheduler)["spec"]["issuerRef"]
    )
    pod = by_kind(managed, "Deployment", scheduler)["spec"]["template"]["spec"]
    assert pod["volumes"][1]["secret"]["secretName"] == f"{scheduler}-tls"  # its ca.crt
    assert by_kind(objects, "Service", scheduler)["spec"]["ports"][0]["port"] == 443


@pytest.mark.parametrize(
    ("common", "own", "granted"),
    [
        ([], ["--upper-api-address=upper:6443"], True),
        (["--upper-api-address=upper:6443"], [], True),
        # The node asks as its own identity (system:node:<name>): no token rule.
        (
            ["--upper-api-address=upper:6443"],
            ["--upper-token-kubeconfig=/etc/tensile/lower/upper-token-kubeconfig"],
            False,
        ),
        ([], [], False),
    ],
)
def test_the_token_rule_is_granted_only_to_nodes_that_ask_with_the_account(
    helm: str, common: list[str], own: list[str], granted: bool
) -> None:
    values = {"virtualNode": {"args": common, "nodes": [
        {"name": "lower-a", "kubeconfigSecret": "lower-a", "args": own},
    ]}}  # fmt: skip
    rules = by_kind(render(helm, values), "ClusterRole", f"{FULLNAME}-vn-lower-a")["rules"]
    token_rule = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}
    assert (token_rule in rules) is granted


def test_every_virtual_node_elects_one_replica_too(helm: str) -> None:
    """A node of one replica runs with --leader-elect like one of two: a process cut off
    from the upper cluster stops writing below before a replacement may lead. Each node's
    election Role names its own Lease, for its own account."""
    objects = render(helm, TWO_NODES)
    for node in ("lower-a", "lower-b"):
        deployment = by_kind(objects, "Deployment", f"{FULLNAME}-vn-{node}")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--leader-elect=true" in args, (node, args)
        assert f"--leader-elect-resource-namespace={NAMESPACE}" in args
        # Its own account may keep its own Lease only.
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == f"{FULLNAME}-vn-{node}"
        role = by_kind(objects, "Role", f"{FULLNAME}-vn-{node}-election")
        assert role["rules"][0]["resourceNames"] == [f"tensile-virtual-node-{node}"]


MONITORING: dict[str, Any] = {
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "dashboards": {"enabled": True, "annotations": {"grafana_folder": "tensile"}},
}


def test_alerts_and_dashboards_are_off_by_default(helm: str) -> None:
    """Without the Prometheus Operator's CRDs a PrometheusRule would fail the install."""
    objects = render(helm, TWO_NODES)
    assert not [o for o in objects if o["kind"] == "PrometheusRule"]
    assert not [o for o in objects if "dashboard" in o["metadata"]["name"]]


@pytest.mark.parametrize(
    ("values", "groups"),
    [
        (
            {**TWO_NODES, "monitoring": MONITORING},
            ["tensile-virtual-node", "tensile-clients", "tensile-serving", "tensile-webhook",
             "tensile-descheduler", "tensile-scheduler"],
        ),
        (
            {"webhook": {"enabled": False}, "descheduler": {"enabled": False},
             "monitoring": MONITORING},
            ["tensile-clients", "tensile-serving"],
        ),
    ],
    ids=["every-part", "no-part"],
)  # fmt: skip
def test_the_prometheus_rule_holds_the_alerts_of_the_parts_the_release_runs(
    helm: str, values: dict[str, Any], groups: list[str]
) -> None:
    rule = by_kind(render(helm, values), "PrometheusRule", FULLNAME)
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())["groups"]
    assert rule["spec"]["groups"] == [g for g in source if g["name"] in groups]


def test_service_monitors_scrape_each_program_over_https_with_prometheus_token(
    helm: str,
) -> None:
    """Off by default (no CRD, no install); on: one ServiceMonitor per program that serves
    /metrics behind authentication, over HTTPS with the Prometheus ServiceAccount's token,
    the server's CA named; the metrics-reader ClusterRole allows exactly get nodes/metrics
    and get /metrics, bound to the accounts listed."""
    assert not [o for o in render(helm, TWO_NODES) if o["kind"] == "ServiceMonitor"]
    readers = [{"name": "prometheus-k8s", "namespace": "monitoring"}]
    objects = render(
        helm,
        {
            **TWO_NODES,
            "scheduler": {"enabled": True},
            "monitoring": {
                "metricsReaders": readers,
                "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
            },
        },
    )
    monitors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceMonitor"}
    parts = ("virtual-node", "webhook", "scheduler", "descheduler")
    assert set(monitors) == {f"{FULLNAME}-{part}" for part in parts}
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    for part in parts:
        monitor = monitors[f"{FULLNAME}-{part}"]
        assert monitor["metadata"]["labels"]["release"] == "kps"
        [endpoint] = monitor["spec"]["endpoints"]
        assert (endpoint["scheme"], endpoint["path"], endpoint["bearerTokenFile"]) == (
            "https",
            "/metrics",
            token,
        )
        # The descheduler's certificate is self-signed without descheduler.tlsSecret.
        assert bool(endpoint["tlsConfig"].get("insecureSkipVerify")) is (part == "descheduler")
        assert endpoint["honorLabels"] is (part == "scheduler")  # its `namespace` label
        # The Service it selects is the program's, at the port named.
        selector = monitor["spec"]["selector"]["matchLabels"]
        [service] = [
            o
            for o in objects
            if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()
        ]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    # With a serving Secret, the descheduler's is verified with its CA, and served.
    tls_secret = render(
        helm,
        {
            **TWO_NODES,
            "descheduler": {"enabled": True, "tlsSecret": "descheduler-tls"},
            "monitoring": {"serviceMonitor": {"enabled": True}},
        },
    )
    [endpoint] = by_kind(tls_secret, "ServiceMonitor", f"{FULLNAME}-descheduler")["spec"][
        "endpoints"
    ]
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "descheduler-tls", "key": "ca.crt"}},
        "serverName": f"{FULLNAME}-descheduler.{NAMESPACE}.svc",
    }
    pod = by_kind(tls_secret, "Deployment", f"{FULLNAME}-descheduler")["spec"]["template"]
    assert {"name": "tls", "secret": {"secretName": "descheduler-tls"}} in pod["spec"]["volumes"]
    assert "--tls-cert-file=/etc/tensile/tls/tls.crt" in pod["spec"]["containers"][0]["args"]
    role = by_kind(objects, "ClusterRole", f"{FULLNAME}-metrics-reader")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
    ]
    binding = by_kind(objects, "ClusterRoleBinding", f"{FULLNAME}-metrics-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", **r} for r in readers]


def test_the_dashboards_are_config_maps_for_grafanas_sidecar(helm: str) -> None:
    objects = render(helm, {"monitoring": MONITORING})
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert files
    for path in files:
        config_map = by_kind(objects, "ConfigMap", f"{FULLNAME}-dashboard-{path.stem}")
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "tensile"}
        [(key, text)] = config_map["data"].items()
        assert key == f"tensile-{path.stem}.json"
        assert json.loads(text) == json.loads(path.read_text())


def _namespace(cluster: Cluster, name: str) -> None:
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def _container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    spec = by_kind(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    [container] = spec["containers"]
    return dict(container)


def test_each_virtual_node_takes_environment_variables_of_its_own(helm: str) -> None:
    """virtual-node reads tensile-kube's VKUBELET_* variables (a node's label, its taint):
    `virtualNode.env` sets them for every node, a node's `env` for that node only, over
    them and over the chart's own (KUBELET_PORT), in the replaced entry's place."""
    values = {
        "virtualNode": {
            "env": [
                {"name": "VKUBELET_NODE_LABEL", "value": "clusterID:default"},
                {"name": "VKUBELET_TAINT_EFFECT", "value": "NoExecute"},
            ],
            "nodes": [
                {
                    "name": "lower-a",
                    "kubeconfigSecret": "a",
                    "env": [
                        {"name": "VKUBELET_NODE_LABEL", "value": "clusterID:eu-1"},
                        {"name": "KUBELET_PORT", "value": "10460"},
                    ],
                },
                {"name": "lower-b", "kubeconfigSecret": "b"},
            ],
        }
    }
    objects = render(helm, values)
    settings = {}
    for node in ("lower-a", "lower-b"):
        container = _container(objects, f"{FULLNAME}-vn-{node}")
        names = [e["name"] for e in container["env"]]
        assert len(names) == len(set(names)), names
        assert names[:4] == [
            "POD_IP",
            "VKUBELET_POD_IP",
            "KUBELET_PORT",
            "APISERVER_CA_CERT_LOCATION",
        ]
        args = [podrun.expand(str(a), {"POD_IP": "10.0.0.1"}) for a in container["args"]]
        settings[node] = vnode_cli.parse(args, env=_env(container, node=node), holder="x").node
    assert settings["lower-a"].extra_labels == (("clusterID", "eu-1"),)
    assert settings["lower-a"].kubelet_port == 10460
    assert settings["lower-b"].extra_labels == (("clusterID", "default"),)
    assert (
        settings["lower-b"].kubelet_port
        == yaml.safe_load(VALUES.read_text())["virtualNode"]["kubeletPort"]
    )
    for node in settings.values():
        assert node.taint is not None
        assert node.taint.effect == "NoExecute"


def test_the_rendered_chart_passes_a_server_side_dry_run(fleet: Fleet, helm: str) -> None:
    upper = fleet.upper
    _namespace(upper, NAMESPACE)
    objects = render(helm, TWO_NODES)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ClusterRole", "MutatingWebhookConfiguration", "Secret"} <= kinds
    done = upper.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=helm-e2e", "-f", "-",
        input="\n---\n".join(yaml.safe_dump(o) for o in objects), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(server dry run)") == len(objects), done.stdout


def _pod_of(cluster: Cluster, component: str) -> str:
    def one() -> str | None:
        pods = cluster.rest().request(
            "GET",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            query={"labelSelector": f"app.kubernetes.io/component={component}"},
        )["items"]
        return str(pods[0]["metadata"]["name"]) if pods else None

    return wait_for(f"the {component} pod", one, timeout=30)


def _node_ready(cluster: Cluster) -> bool:
    node = get(cluster.rest(), f"/api/v1/nodes/{NODE}") or {}
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


VALUES = CHART / "values.yaml"


def _scheduler_secrets(cluster: Cluster, directory: Path) -> None:
    """The Secrets the chart's scheduler mounts without cert-manager: its serving
    certificate (<fullname>-scheduler-tls) and the CA of its callers' client certificates
    (<fullname>-scheduler-client-ca, ca.crt), from a CA made here."""
    directory.mkdir()
    ca = pki.CertificateAuthority.create(directory=directory, name="scheduler-ca")
    name = f"{FULLNAME}-scheduler"
    serving = ca.issue(
        directory=directory,
        name="serving",
        common_name=name,
        dns_names=(f"{name}.{NAMESPACE}.svc",),
        server=True,
    )
    pem = {
        "tls.crt": serving.cert.read_bytes(),
        "tls.key": serving.key.read_bytes(),
        "ca.crt": ca.pair.cert.read_bytes(),
    }
    for secret, data in ((f"{name}-tls", pem), (f"{name}-client-ca", {"ca.crt": pem["ca.crt"]})):
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


METRICS_READER = "metrics-reader"
"""The ServiceAccount the installed chart lets read metrics (`monitoring.metricsReaders`)."""


def _probe(cluster: Cluster, host: str, pod_name: str, probe: str) -> int | None:
    """The HTTP status `probe` (readinessProbe, livenessProbe) of the installed pod
    `pod_name` answers at `host` (hostNetwork or not, its process runs here), or None
    while it does not answer. HTTPS probes, like the kubelet's, verify no certificate."""
    pod = cluster.rest().request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name}")
    [container] = pod["spec"]["containers"]
    get_ = container[probe]["httpGet"]
    port = get_["port"]
    if isinstance(port, str):
        [port] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    scheme = str(get_.get("scheme", "HTTP")).lower()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"{scheme}://{host}:{port}{get_['path']}", timeout=5, context=context
        ) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


HOST_KUBELET_PORTS = (10250, 10255)
"""What a real host's kubelet listens on, on every address: its API and (often) its
read-only port."""


@pytest.fixture
def host_kubelet(private_network: netns.Network) -> Iterator[None]:
    """Listeners on the wildcard address at the kubelet's ports in the fleet's network, as
    a real upper host's kubelet holds them (the upper cluster's host Node here is a kwok
    Node, with no kubelet of its own). Only in the private network: on the host's loopback
    these ports may be anyone's."""
    held = [socket.create_server(("0.0.0.0", port)) for port in HOST_KUBELET_PORTS]
    try:
        yield
    finally:
        for listener in held:
            listener.close()


@pytest.fixture
def installed(
    fleet: Fleet,
    helm: str,
    private_network: netns.Network,
    host_kubelet: None,
    tmp_path: Path,
) -> Iterator[Path]:
    """The chart installed in the upper cluster with one virtual node for the lower
    cluster, at the chart's default kubelet and metrics ports, beside a host kubelet;
    yields the values file. Uninstalled (and its Node removed) afterwards."""
    upper, lower = fleet.upper, fleet.lower
    lower_kubeconfig = token_kubeconfig(lower, LOWER_RBAC, tmp_path / "lower.kubeconfig")
    host = private_network.host_address(0)
    taken: set[int] = set()
    values = {
        "virtualNode": {
            "nodes": [{"name": NODE, "kubeconfig": lower_kubeconfig.read_text()}],
            "csrSelfApprove": True,
        },
        # The upper cluster's one host Node is its control plane (tainted): the webhook
        # tolerates that here, as the other two do by default.
        "webhook": {
            "replicas": 1,
            "port": ports.pick(host=host, taken=taken),
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            # Stopped at the end of the test: no endpoints to wait for.
            "args": ["--shutdown-delay=0s"],
        },
        "descheduler": {
            "replicas": 1,
            "metricsPort": ports.pick(taken=taken),
            "healthzPort": ports.pick(host=host, taken=taken),
            "securePort": ports.pick(host=host, taken=taken),
        },
        "scheduler": {"enabled": True, "replicas": 1, "port": ports.pick(host=host, taken=taken)},
        "monitoring": {"metricsReaders": [{"name": METRICS_READER, "namespace": NAMESPACE}]},
    }
    if "metricsPort" in yaml.safe_load(VALUES.read_text())["scheduler"]:
        values["scheduler"]["metricsPort"] = ports.pick(host=host, taken=taken)
    _namespace(upper, NAMESPACE)
    _scheduler_secrets(upper, tmp_path / "scheduler-pki")
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    install = run_helm(
        helm, "install", RELEASE, str(CHART), f"--kubeconfig={upper.kubeconfig}",
        "-n", NAMESPACE, "--create-namespace", "-f", str(values_file), check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    try:
        yield values_file
    finally:
        run_helm(helm, "uninstall", RELEASE, f"--kubeconfig={upper.kubeconfig}", "-n", NAMESPACE)
        upper.kubectl("delete", "node", NODE, "--ignore-not-found")


def _serial(host: str, port: int) -> int | None:
    """The serial number of the certificate served at `host`:`port`, or None while nothing
    serves there (the kubelet API listens once its certificate is issued)."""
    try:
        pem = ssl.get_server_certificate((host, port), timeout=5)
    except OSError:
        return None
    return int(x509.load_pem_x509_certificate(pem.encode()).serial_number)


def test_an_installed_chart_runs_a_virtual_node_webhook_descheduler_and_scheduler(
    fleet: Fleet, helm: str, installed: Path, tmp_path: Path, private_network: netns.Network
) -> None:
    """With its defaults on a host whose kubelet holds 10250: the virtual node serves,
    registers, forwards a pod whose logs `kubectl logs` reads, and, replaced by a new pod,
    serves the certificate it had without a new CSR; the webhook, the descheduler and the
    scheduler extender come up with their RBAC."""
    upper = fleet.upper

    def _logs_work() -> bool:
        done = upper.kubectl(
            "logs", "through-the-chart", "-n", "chart-e2e-pods", check=False, timeout=30
        )
        return done.returncode == 0 and done.stdout.splitlines() == list(LOG_LINES)

    # What helm says it installed is what the apiserver has.
    manifest = run_helm(
        helm, "get", "manifest", RELEASE, f"--kubeconfig={upper.kubeconfig}", "-n", NAMESPACE
    ).stdout
    objects = [o for o in yaml.safe_load_all(manifest) if o]
    assert len(objects) >= 20
    for obj in objects:
        kind, name = obj["kind"].lower(), obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace")
        namespaced = ["-n", namespace] if namespace else []
        upper.kubectl("get", kind, name, *namespaced)
    # The containers of its pods, run here as their pods' ServiceAccounts.
    local = [
        LocalPod(upper, namespace=NAMESPACE, name=_pod_of(upper, c), directory=tmp_path / c)
        for c in ("virtual-node", "webhook", "descheduler", "scheduler")
    ]
    try:
        for pod in local:
            pod.start()
        # The virtual node registers, and forwards a pod into the lower cluster.
        wait_for("the chart's virtual node to be Ready", lambda: _node_ready(upper), timeout=60)
        _namespace(upper, "chart-e2e-pods")
        upper.rest().request(
            "POST",
            "/api/v1/namespaces/chart-e2e-pods/pods",
            body=pod_manifest("through-the-chart", node=NODE),
        )
        wait_for(
            "the pod forwarded by the chart's node to run",
            lambda: phase(upper.rest(), "chart-e2e-pods", "through-the-chart") == "Running",
            timeout=60,
        )
        # Beside the host's kubelet (holding 10250 and 10255 on every address), the node
        # serves its kubelet API at the chart's port, publishes that port and its host's
        # address, and the upper apiserver reaches it there (`kubectl logs`).
        host = private_network.host_address(0)
        port = yaml.safe_load(VALUES.read_text())["virtualNode"]["kubeletPort"]
        assert port not in HOST_KUBELET_PORTS
        status = (get(upper.rest(), f"/api/v1/nodes/{NODE}") or {})["status"]
        assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port
        assert {"type": "InternalIP", "address": host} in status["addresses"]
        wait_for("kubectl logs through the chart's node", _logs_work, timeout=60)
        # Its certificate (self-approved) is kept in its Secret: started again as a new
        # pod (the Deployment's replacement, with fresh emptyDirs), it serves the same
        # one and asks for none.
        [csr] = wait_for("the node's CSR", lambda: node_csrs(upper.rest(), NODE), timeout=30)
        served = _serial(host, port)
        local[0].stop()
        old = local[0].name
        upper.kubectl("delete", "pod", old, "-n", NAMESPACE, "--wait=false")

        def replacement() -> str | None:
            pods = upper.rest().request(
                "GET",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                query={"labelSelector": "app.kubernetes.io/component=virtual-node"},
            )["items"]
            names = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] != old]
            return str(names[0]) if names else None

        local[0] = LocalPod(
            upper,
            namespace=NAMESPACE,
            name=wait_for("the node's replacement pod", replacement, timeout=60),
            directory=tmp_path / "virtual-node-again",
        )
        local[0].start()
        assert wait_for("the kubelet API again", lambda: _serial(host, port), timeout=60) == served
        wait_for("kubectl logs after the restart", _logs_work, timeout=60)
        assert [c["metadata"]["name"] for c in node_csrs(upper.rest(), NODE)] == [
            csr["metadata"]["name"]
        ]
        # The webhook bootstrapped its certificate into its Secret and its configuration.
        webhook = f"{FULLNAME}-webhook"

        def ca_bundle() -> str | None:
            configuration = get(
                upper.rest(),
                f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{webhook}",
            )
            return (
                ((configuration or {}).get("webhooks") or [{}])[0]
                .get("clientConfig", {})
                .get("caBundle")
            )

        wait_for("the webhook's caBundle", ca_bundle, timeout=30)
        assert get(upper.rest(), f"/api/v1/namespaces/{NAMESPACE}/secrets/{webhook}-tls")
        _metrics_only_to_readers(upper, host, installed, serving=local[:3])
        # The descheduler holds its Lease.
        lease_path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{FULLNAME}-descheduler"
        )
        wait_for(
            "the descheduler's Lease",
            lambda: ((get(upper.rest(), lease_path) or {}).get("spec") or {}).get("holderIdentity"),
            timeout=30,
        )
        # The scheduler extender becomes ready: its Nodes and its quota slices' caches
        # are listed with the chart's RBAC (manifests/scheduler/rbac.yaml's rules).
        host = private_network.host_address(0)
        scheduler = local[3].name
        wait_for(
            "the chart's scheduler extender to be ready",
            lambda: _probe(upper, host, scheduler, "readinessProbe") == 200,
            timeout=60,
        )
        for pod in local:
            pod.check()
    finally:
        for pod in local:
            pod.stop()
        upper.kubectl("delete", "namespace", "chart-e2e-pods", "--wait=false", "--ignore-not-found")


def _metrics_only_to_readers(
    upper: Cluster, host: str, values_file: Path, *, serving: list[LocalPod]
) -> None:
    """The installed programs' metrics on the host's (non-loopback) address: the virtual
    node's on its kubelet port, the webhook's and the descheduler's on their HTTPS ports
    (the descheduler's certificate self-signed), each 401 without a token,
    403 with the token of an account the chart did not list in `monitoring.metricsReaders`,
    200 with that of one it did (ClusterRole <fullname>-metrics-reader, reviewed by the
    upper cluster with the chart's RBAC); plain HTTP serves them on loopback only.
    `serving`: the node's, the webhook's and the descheduler's local pods, in that order (one
    that exited fails the wait with its log's tail)."""
    assert not ipaddress.ip_address(host).is_loopback
    values = yaml.safe_load(VALUES.read_text())
    installed = yaml.safe_load(values_file.read_text())
    tokens = {}
    for account in (METRICS_READER, "not-a-reader"):
        upper.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
        tokens[account] = upper.kubectl("create", "token", account, "-n", NAMESPACE).stdout.strip()
    for pod, url, metric in zip(
        serving,
        (
            f"https://{host}:{values['virtualNode']['kubeletPort']}/metrics",
            f"https://{host}:{installed['webhook']['port']}/metrics",
            f"https://{host}:{installed['descheduler']['securePort']}/metrics",
        ),
        ("tensile_virtual_node_info", "tensile_webhook_", "tensile_descheduler_"),
        strict=True,
    ):

        def answered(pod: LocalPod = pod, url: str = url) -> tuple[int, str] | None:
            pod.check()  # an exited program: its log's tail, not a timeout
            return scrape(url)

        assert wait_for(f"{url} to answer", answered, timeout=30) == (401, "Unauthorized")
        refused = scrape(url, token=tokens["not-a-reader"])
        assert refused is not None
        assert refused[0] == 403, refused
        scraped = scrape(url, token=tokens[METRICS_READER])
        assert scraped is not None
        assert scraped[0] == 200, scraped
        assert metric in scraped[1]
    assert not ports.is_listening(values["virtualNode"]["metricsPort"], host=host)


# -- one source: the chart grants and passes what manifests/ does ----------------------

MANIFESTS = ROOT / "manifests"
EVERYTHING: dict[str, Any] = {
    "virtualNode": {
        "csrSelfApprove": True,
        "nodes": [
            {"name": "lower-a", "kubeconfigSecret": "lower-a"},
            # Asks for its pods' upper tokens with its account, and copies Ingresses.
            {
                "name": "lower-b",
                "kubeconfigSecret": "lower-b",
                "args": ["--upper-api-address=upper:6443", "--enable-ingress"],
            },
        ],
    },
    "scheduler": {"enabled": True},
}
"""Chart values that turn every optional grant on."""
MANIFEST_FILES = {
    "virtual-node": (
        "vnode/upper-rbac.yaml",
        "vnode/upper-rbac-csr-self-approve.yaml",
        "vnode/upper-rbac-serviceaccount-tokens.yaml",
        "vnode/upper-rbac-ingress.yaml",
    ),
    "webhook": ("webhook/rbac.yaml",),
    "descheduler": ("descheduler/rbac.yaml",),
    "scheduler": ("scheduler/rbac.yaml",),
}
"""Each program's RBAC in manifests/, for one account (tensile-system/tensile-<program>)."""
SHIPPED_NODES = ("virtual-kubelet-0", "virtual-kubelet")

Grant = tuple[str, str, str, str, str]
"""(namespace or "*" for the cluster, apiGroup, resource, resourceName or "", verb)."""


def granted(objects: list[dict[str, Any]], *, account: str, namespace: str) -> set[Grant]:
    """What ServiceAccount `namespace`/`account` may do through `objects`' bindings."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    found: set[Grant] = set()
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if subject not in binding.get("subjects") or []:
            continue
        scope = binding["metadata"].get("namespace") or "*"
        ref = binding["roleRef"]
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else scope, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [""]:
                        found |= {(scope, group, resource, name, v) for v in rule["verbs"]}
    return found


def normalized(grants: set[Grant], *, release: bool, node: str = "") -> set[Grant]:
    """`grants` in the manifests' names: the chart's namespace is tensile-system, its
    `<fullname>-x` objects tensile-x, and a virtual node's own name (the chart's `node`,
    the manifests' shipped ones) is NODE, in its election Lease's and its serving
    certificate Secret's names too."""

    def name(text: str) -> str:
        if release:
            text = text.replace(FULLNAME, "tensile")
        for own in (node,) if release else SHIPPED_NODES:
            if not text or not own:
                continue
            if text == own:
                return "NODE"
            if text == f"tensile-virtual-node-{own}":
                return "tensile-virtual-node-NODE"
            if text == f"tensile-vn-{own}-serving":
                return "tensile-vn-NODE-serving"
        return text

    return {
        ("tensile-system" if release and scope == NAMESPACE else scope, g, r, name(n), v)
        for scope, g, r, n, v in grants
    }


def manifest_objects(program: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for file in MANIFEST_FILES[program]:
        found += [d for d in yaml.safe_load_all((MANIFESTS / file).read_text()) if d]
    return found


@pytest.mark.parametrize(
    ("program", "account", "node"),
    [
        ("virtual-node", f"{FULLNAME}-vn-lower-b", "lower-b"),
        ("webhook", f"{FULLNAME}-webhook", ""),
        ("descheduler", f"{FULLNAME}-descheduler", ""),
        ("scheduler", f"{FULLNAME}-scheduler", ""),
    ],
)
def test_the_chart_grants_each_program_what_its_manifests_grant_rule_for_rule(
    helm: str, program: str, account: str, node: str
) -> None:
    """manifests/ is the one source of each program's RBAC; the chart, which names its
    objects after the release and each virtual node after its own node, grants the same,
    grant by grant (a rule the program gained in one and not the other fails here)."""
    chart = normalized(
        granted(render(helm, EVERYTHING), account=account, namespace=NAMESPACE),
        release=True,
        node=node,
    )
    shipped = normalized(
        granted(
            manifest_objects(program), account=f"tensile-{program}", namespace="tensile-system"
        ),
        release=False,
    )
    assert chart, account
    assert (sorted(chart - shipped), sorted(shipped - chart)) == ([], []), (
        "(granted by the chart only, granted by manifests/ only)"
    )


def test_a_virtual_node_of_the_chart_asking_for_no_tokens_is_not_granted_them(
    helm: str,
) -> None:
    chart = granted(render(helm, EVERYTHING), account=f"{FULLNAME}-vn-lower-a", namespace=NAMESPACE)
    assert not [g for g in chart if g[2] == "serviceaccounts/token"]
    assert ("*", "", "nodes", "lower-a", "update") in chart
    assert not [g for g in chart if g[3] == "lower-b"]


def _allowed(cluster: Cluster, user: str, **attributes: str) -> bool:
    """Whether the upper apiserver lets `user` do what `attributes` name (a
    SubjectAccessReview: the authorizers the cluster runs, RBAC included)."""
    review = cluster.rest().request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                "resourceAttributes": attributes,
            },
        },
    )
    return bool(review["status"].get("allowed"))


def test_each_virtual_node_of_the_chart_writes_only_its_own_node_and_leases(
    fleet: Fleet, helm: str
) -> None:
    """Each node's pod runs as an account of its own, which may write its own Node, its
    Node's Lease and its election Lease, and not another node's. What RBAC cannot narrow
    stays: any node's account reads every Secret (its pods' Secrets are copied below), so
    also the other nodes' lower kubeconfigs (docs/tenancy.md says what to do about it)."""
    upper = fleet.upper
    _namespace(upper, NAMESPACE)
    objects = render(helm, TWO_NODES)
    rbac = [
        o
        for o in objects
        if o["kind"]
        in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    upper.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in rbac))
    accounts = {}
    for node in ("lower-a", "lower-b"):
        pod = by_kind(objects, "Deployment", f"{FULLNAME}-vn-{node}")["spec"]["template"]["spec"]
        accounts[node] = f"system:serviceaccount:{NAMESPACE}:{pod['serviceAccountName']}"
    for node, other in (("lower-a", "lower-b"), ("lower-b", "lower-a")):
        user = accounts[node]
        for name, allowed in ((node, True), (other, False)):
            for attributes in (
                {"resource": "nodes", "verb": "update", "name": name},
                {"resource": "nodes", "verb": "patch", "name": name},
                {"resource": "nodes", "subresource": "status", "verb": "patch", "name": name},
                {"resource": "nodes", "verb": "watch", "name": name},
                {
                    "group": "coordination.k8s.io",
                    "resource": "leases",
                    "namespace": "kube-node-lease",
                    "verb": "update",
                    "name": name,
                },
                {
                    "group": "coordination.k8s.io",
                    "resource": "leases",
                    "namespace": NAMESPACE,
                    "verb": "update",
                    "name": f"tensile-virtual-node-{name}",
                },
            ):
                assert _allowed(upper, user, **attributes) is allowed, (node, attributes)
        # Nothing else in kube-node-lease, and no Node but by name (create cannot be).
        for attributes in (
            {"group": "coordination.k8s.io", "resource": "leases", "verb": "update",
             "namespace": "kube-node-lease", "name": "some-real-node"},
            {"resource": "nodes", "verb": "list"},
            {"resource": "nodes", "verb": "delete", "name": node},
        ):  # fmt: skip
            assert not _allowed(upper, user, **attributes), (node, attributes)
        assert _allowed(upper, user, resource="nodes", verb="create")
        # The limit: pods' Secrets are read cluster-wide, the other node's kubeconfig too.
        secret = by_kind(objects, "Secret", f"{FULLNAME}-lower-lower-a")["metadata"]["name"]
        assert _allowed(
            upper, user, resource="secrets", verb="get", namespace=NAMESPACE, name=secret
        )


CONTAINERS = {
    # program: (the chart's Deployment, the manifest that runs it)
    "virtual-node": (f"{FULLNAME}-vn-lower-a", "vnode/virtual-node.yaml"),
    "webhook": (f"{FULLNAME}-webhook", "webhook/webhook.yaml"),
    "descheduler": (f"{FULLNAME}-descheduler", "descheduler/descheduler.yaml"),
    "scheduler": (f"{FULLNAME}-scheduler", "scheduler/scheduler.yaml"),
}


def _args(container: dict[str, Any], *, node: str, policy: Path, chart_node: str = "") -> list[str]:
    """`container`'s arguments in the manifests' names, with the kubelet's `$(VAR)`
    expanded as the pods would have them, the descheduler's policy file at `policy`, and
    the chart's virtual node `chart_node` (in its serving certificate Secret's name) read
    as `node`."""
    env = {"POD_NAMESPACE": "tensile-system", "POD_IP": "10.0.0.1", "POD_NAME": node}
    found = []
    for arg in container["args"]:
        text = str(arg).replace(FULLNAME, "tensile").replace(NAMESPACE, "tensile-system")
        text = podrun.expand(text, env)
        if chart_node:
            text = text.replace(f"tensile-vn-{chart_node}-serving", f"tensile-vn-{node}-serving")
        if text.startswith("--nodename="):
            text = f"--nodename={node}"
        if text.startswith("--policy-config-file="):
            text = f"--policy-config-file={policy}"
        found.append(text)
    return found


def _env(container: dict[str, Any], *, node: str) -> dict[str, str]:
    """`container`'s environment as its pod would have it (named `node`, in tensile-system,
    at 10.0.0.1): the variables a program reads its defaults from (KUBELET_PORT...)."""
    fields = {
        "metadata.name": node,
        "metadata.namespace": "tensile-system",
        "status.podIP": "10.0.0.1",
    }
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = podrun.expand(str(var.get("value", "")), env)
        else:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
    return env


def _settings(program: str, args: list[str], env: dict[str, str]) -> object:
    if program == "virtual-node":
        return vnode_cli.parse(args, env=env, holder="x")
    if program == "webhook":
        return webhook_cli.parse(args, env=env)
    if program == "descheduler":
        return descheduler_cli.parse(args, holder="x")[0]
    return scheduler_cli.parse(args)


@pytest.mark.parametrize("program", sorted(CONTAINERS))
def test_the_chart_passes_each_program_what_its_manifests_pass(
    helm: str, program: str, tmp_path: Path
) -> None:
    """manifests/ is the one source of each program's arguments and environment too: the
    chart's defaults give each program the settings its manifest gives it (parsed by the
    program's own flags and variables, so a default spelt out in one and left out of the
    other is the same; the virtual node's kubelet port, KUBELET_PORT, is compared so)."""
    deployment, manifest = CONTAINERS[program]
    objects = render(helm, EVERYTHING)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(yaml.safe_load(VALUES.read_text())["descheduler"]["policy"]))
    [chart] = by_kind(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    [shipped] = [
        d["spec"]["template"]["spec"]["containers"][0]
        for d in yaml.safe_load_all((MANIFESTS / manifest).read_text())
        if d and d["kind"] in ("Deployment", "StatefulSet")
    ]
    node = "virtual-kubelet-0"
    chart_node = "lower-a" if program == "virtual-node" else ""
    assert _settings(
        program,
        _args(chart, node=node, policy=policy, chart_node=chart_node),
        _env(chart, node=node),
    ) == _settings(program, _args(shipped, node=node, policy=policy), _env(shipped, node=node))
    # The containers' ports are the ones the programs are told to listen on.
    assert sorted((p["name"], p["containerPort"]) for p in chart.get("ports") or []) == sorted(
        (p["name"], p["containerPort"]) for p in shipped.get("ports") or []
    )
