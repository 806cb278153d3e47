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

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import binaries, netns, ports
from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.podrun import LocalPod
from tests.e2e.helpers import get, phase, pod_manifest, token_kubeconfig, wait_for

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
    values.write_text(yaml.safe_dump(TWO_NODES))
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
    ],
    ids=[
        "node-without-kubeconfig",
        "node-with-both-kubeconfigs",
        "node-name-not-a-dns-label",
        "misspelt-key",
        "bad-failure-policy",
        "bad-duration",
        "bad-digest",
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


def test_the_scheduler_extender_is_off_by_default_and_reads_only_nodes(helm: str) -> None:
    scheduler = f"{FULLNAME}-scheduler"
    assert not [o for o in render(helm, {}) if o["metadata"]["name"] == scheduler]
    objects = render(helm, {"scheduler": {"enabled": True}})
    rules = by_kind(objects, "ClusterRole", scheduler)["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
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
    rules = by_kind(render(helm, values), "ClusterRole", f"{FULLNAME}-virtual-node")["rules"]
    token_rule = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}
    assert (token_rule in rules) is granted


def test_every_virtual_node_elects_one_replica_too(helm: str) -> None:
    """A node of one replica runs with --leader-elect like one of two: a process cut off
    from the upper cluster stops writing below before a replacement may lead. The election
    Role names every node's Lease."""
    objects = render(helm, TWO_NODES)
    for node in ("lower-a", "lower-b"):
        deployment = by_kind(objects, "Deployment", f"{FULLNAME}-vn-{node}")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--leader-elect=true" in args, (node, args)
        assert f"--leader-elect-resource-namespace={NAMESPACE}" in args
    role = by_kind(objects, "Role", f"{FULLNAME}-virtual-node-election")
    assert role["rules"][0]["resourceNames"] == [
        "tensile-virtual-node-lower-a",
        "tensile-virtual-node-lower-b",
    ]


def _namespace(cluster: Cluster, name: str) -> None:
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


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


@pytest.fixture
def installed(
    fleet: Fleet, helm: str, private_network: netns.Network, tmp_path: Path
) -> Iterator[Path]:
    """The chart installed in the upper cluster with one virtual node for the lower
    cluster; yields the values file. Uninstalled (and its Node removed) afterwards."""
    upper, lower = fleet.upper, fleet.lower
    lower_kubeconfig = token_kubeconfig(lower, LOWER_RBAC, tmp_path / "lower.kubeconfig")
    host = private_network.host_address(0)
    taken: set[int] = set()
    values = {
        "virtualNode": {
            "nodes": [{"name": NODE, "kubeconfig": lower_kubeconfig.read_text()}],
            "csrSelfApprove": True,
            "kubeletPort": ports.pick(host=host, taken=taken),
            "metricsPort": ports.pick(host=host, taken=taken),
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
        "descheduler": {"replicas": 1, "metricsPort": ports.pick(host=host, taken=taken)},
    }
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


def test_an_installed_chart_runs_a_virtual_node_webhook_and_descheduler(
    fleet: Fleet, helm: str, installed: Path, tmp_path: Path
) -> None:
    upper = fleet.upper
    # What helm says it installed is what the apiserver has.
    manifest = run_helm(
        helm, "get", "manifest", RELEASE, f"--kubeconfig={upper.kubeconfig}", "-n", NAMESPACE
    ).stdout
    objects = [o for o in yaml.safe_load_all(manifest) if o]
    assert len(objects) >= 20
    for obj in objects:
        kind, name = obj["kind"].lower(), obj["metadata"]["name"]
        namespaced = ["-n", NAMESPACE] if obj["metadata"].get("namespace") else []
        upper.kubectl("get", kind, name, *namespaced)
    # The containers of its pods, run here as their pods' ServiceAccounts.
    local = [
        LocalPod(upper, namespace=NAMESPACE, name=_pod_of(upper, c), directory=tmp_path / c)
        for c in ("virtual-node", "webhook", "descheduler")
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
        # The descheduler holds its Lease.
        lease_path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{FULLNAME}-descheduler"
        )
        wait_for(
            "the descheduler's Lease",
            lambda: ((get(upper.rest(), lease_path) or {}).get("spec") or {}).get("holderIdentity"),
            timeout=30,
        )
        for pod in local:
            pod.check()
    finally:
        for pod in local:
            pod.stop()
        upper.kubectl("delete", "namespace", "chart-e2e-pods", "--wait=false", "--ignore-not-found")
