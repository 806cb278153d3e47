"""The fleet harness's pure parts: topology flags, names, addresses, metrics-server objects,
and how a pod's container is turned into a local process."""

from __future__ import annotations

import argparse
import base64
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from devcluster import cluster, metricsserver, netns, podrun
from devcluster.__main__ import _parser, _Usage, env_values, fleet_settings


def _up(*flags: str) -> argparse.Namespace:
    return _parser().parse_args(["up", "--dir", "/tmp/x", *flags])


def test_the_default_fleet_is_todays_pair() -> None:
    settings = fleet_settings(_up())
    assert settings.upper_names == ("upper",)
    assert settings.lower_names == ("lower",)
    [lower] = settings.lowers
    assert (lower.nodes, lower.cpu, lower.memory, lower.pods) == (3, "32", "256Gi", "110")


def test_topology_flags_set_each_lower_cluster() -> None:
    settings = fleet_settings(
        _up(
            "--uppers", "2", "--lowers", "3", "--lower-nodes", "2",
            "--lower-nodes", "lower-3=1",
            "--node-capacity", "lower-2:cpu=2,memory=4Gi",
            "--node-capacity", "lower-3:pods=10",
            "--node-label", "lower:1:disk=ssd",
            "--node-label", "lower-3:0:example.com/zone=a",
            "--node-label", "lower-3:0:empty=",
        )
    )  # fmt: skip
    assert settings.upper_names == ("upper", "upper-2")
    assert settings.lower_names == ("lower", "lower-2", "lower-3")
    first, second, third = settings.lowers
    assert [c.nodes for c in settings.lowers] == [2, 2, 1]
    assert (second.cpu, second.memory, second.pods) == ("2", "4Gi", "110")
    assert (third.cpu, third.pods) == ("32", "10")
    assert first.node_labels == {1: {"disk": "ssd"}}
    assert third.node_labels == {0: {"example.com/zone": "a", "empty": ""}}
    assert not settings.die_with_parent


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lower-nodes", "lower-2=1"], "no lower cluster 'lower-2' (have lower)"),
        (["--lower-nodes", "x"], "not a whole number"),
        (["--node-capacity", "lower"], "expected CLUSTER:cpu=Q,memory=Q,pods=N"),
        (["--node-capacity", "lower:gpu=1"], "'gpu=1' is not one of cpu=Q, memory=Q, pods=N"),
        (["--node-capacity", "lower:cpu=lots"], "not a Kubernetes quantity"),
        (["--node-capacity", "lower:cpu=0"], "must be more than zero"),
        (["--node-label", "lower:0:disk"], "expected CLUSTER:INDEX:KEY=VALUE"),
        (["--node-label", "lower:3:disk=ssd"], "lower has 3 nodes (indexes from 0)"),
        (["--node-label", "lower:0:bad key=x"], "not a valid label key=value"),
        (["--node-label", "lower:0:k=" + "v" * 64], "not a valid label key=value"),
        (["--node-cpu", "-1"], "must be more than zero"),
    ],
)
def test_bad_topology_flags_name_the_flag_and_the_reason(flags: list[str], message: str) -> None:
    with pytest.raises(_Usage, match=message.replace("(", r"\(").replace(")", r"\)")):
        fleet_settings(_up(*flags))


def test_fleet_settings_refuse_an_empty_fleet_and_unknown_networks() -> None:
    with pytest.raises(ValueError, match="at least one upper and one lower"):
        cluster.FleetSettings(uppers=0)
    with pytest.raises(ValueError, match="at least one upper and one lower"):
        cluster.FleetSettings(lowers=())
    with pytest.raises(ValueError, match="network must be one of auto, private, host"):
        cluster.FleetSettings(network="bridge")


def test_names_of_clusters_and_nodes() -> None:
    assert cluster.cluster_names("lower", 3) == ("lower", "lower-2", "lower-3")
    assert cluster.lower_node_name("lower", 0) == "lower-node-0"
    assert cluster.lower_node_name("lower-2", 1) == "lower-2-node-1"
    assert cluster.host_node_name("upper-2") == "upper-2-host"


def test_addresses_are_documentation_addresses_in_a_private_network() -> None:
    assert netns.PRIVATE.node_ip == "192.0.2.1"
    assert [netns.PRIVATE.host_address(i) for i in range(3)] == [
        "192.0.2.11",
        "192.0.2.12",
        "192.0.2.13",
    ]
    for address in (netns.PRIVATE.node_ip, netns.PRIVATE.host_address(0)):
        assert ipaddress.ip_address(address) in netns.DOCUMENTATION_BLOCK
    assert netns.HOST.node_ip == netns.HOST.host_address(1) == "127.0.0.1"


class _FakeFleet:
    """What env_values reads of a fleet."""

    def __init__(self, tmp_path: Path) -> None:
        names = ("upper", "upper-2", "lower", "lower-2")
        self.clusters = {n: _FakeCluster(tmp_path / f"{n}.kubeconfig") for n in names}
        self.upper = self.clusters["upper"]
        self.node_ip = "192.0.2.1"
        self.vnode = _FakeMaterial()


class _FakeCluster:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig


class _FakeMaterial:
    def env(self) -> dict[str, str]:
        return {"VKUBELET_POD_IP": "192.0.2.1"}


def test_env_names_a_kubeconfig_per_cluster(tmp_path: Path) -> None:
    values = env_values(_FakeFleet(tmp_path))  # type: ignore[arg-type]
    assert values["TENSILE_UPPER_KUBECONFIG"] == str(tmp_path / "upper.kubeconfig")
    assert values["TENSILE_UPPER_2_KUBECONFIG"] == str(tmp_path / "upper-2.kubeconfig")
    assert values["TENSILE_LOWER_KUBECONFIG"] == str(tmp_path / "lower.kubeconfig")
    assert values["TENSILE_LOWER_2_KUBECONFIG"] == str(tmp_path / "lower-2.kubeconfig")
    assert values["KUBECONFIG"] == str(tmp_path / "upper.kubeconfig")
    assert values["TENSILE_NODE_IP"] == values["VKUBELET_POD_IP"] == "192.0.2.1"


def test_metrics_server_objects_register_an_aggregated_api_at_a_routable_endpoint() -> None:
    objects = metricsserver.objects(address="192.0.2.1", port=4443, ca_bundle=b"PEM")
    by_kind = {o["kind"]: o for o in objects}
    service = by_kind["Service"]
    assert "selector" not in service["spec"]  # the endpoint is written, not selected
    [port] = service["spec"]["ports"]
    endpoints = by_kind["EndpointSlice"]
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == "metrics-server"
    assert endpoints["endpoints"][0]["addresses"] == ["192.0.2.1"]
    # The aggregator matches the slice's port to the Service's port by name.
    assert endpoints["ports"] == [{"name": port["name"], "port": 4443, "protocol": "TCP"}]
    api = by_kind["APIService"]["spec"]
    assert (api["group"], api["version"]) == ("metrics.k8s.io", "v1beta1")
    assert base64.b64decode(api["caBundle"]) == b"PEM"
    assert api["service"] == {"name": "metrics-server", "namespace": "kube-system", "port": 443}
    # Registration comes last: the API is announced once what serves it exists.
    assert [o["kind"] for o in objects][-2:] == ["EndpointSlice", "APIService"]
    assert metricsserver.collection_path(by_kind["APIService"]) == (
        "/apis/apiregistration.k8s.io/v1/apiservices"
    )
    assert metricsserver.collection_path(endpoints) == (
        "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"
    )
    assert metricsserver.available(
        {"status": {"conditions": [{"type": "Available", "status": "True"}]}}
    )
    assert not metricsserver.available({"status": {}})


# -- a pod's container as a local process -------------------------------------------------


def test_dependent_variables_expand_like_the_kubelets() -> None:
    env = {"A": "x", "B": "y"}
    assert podrun.expand("$(A)-$(B)", env) == "x-y"
    assert podrun.expand("$(MISSING)", env) == "$(MISSING)"
    assert podrun.expand("$$(A)", env) == "$(A)"
    assert podrun.expand("cost $$5", env) == "cost $5"


def test_mount_paths_move_under_the_root(tmp_path: Path) -> None:
    mounts = ["/etc/tensile/lower", "/etc/tensile"]
    rewrite = lambda text: podrun.rewrite_paths(text, mounts=mounts, root=tmp_path)  # noqa: E731
    assert rewrite("--client-kubeconfig=/etc/tensile/lower/kubeconfig") == (
        f"--client-kubeconfig={tmp_path}/etc/tensile/lower/kubeconfig"
    )
    assert rewrite("/etc/tensile/x") == f"{tmp_path}/etc/tensile/x"
    assert rewrite("/etc/tensile") == f"{tmp_path}/etc/tensile"
    assert rewrite("/etc/tensilex") == "/etc/tensilex"  # another directory
    assert rewrite("--x=/var/etc/tensile") == "--x=/var/etc/tensile"  # not at the start


def test_a_path_moved_under_the_root_is_not_moved_again(tmp_path: Path) -> None:
    # An emptyDir at /tmp while the root is itself below /tmp (pytest's tmp_path).
    root = Path("/tmp/pods/vk-0/root")
    mounts = ["/tmp", "/etc/tensile/policy"]
    assert podrun.rewrite_paths("--p=/etc/tensile/policy/p.yaml", mounts=mounts, root=root) == (
        "--p=/tmp/pods/vk-0/root/etc/tensile/policy/p.yaml"
    )
    assert podrun.rewrite_paths("/tmp/x", mounts=mounts, root=root) == "/tmp/pods/vk-0/root/tmp/x"


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "vk-0", "namespace": "ns", "uid": "u-1"},
        "spec": {"nodeName": "upper-host", "serviceAccountName": "sa", **spec},
        "status": {"podIP": "192.0.2.11", "hostIP": "192.0.2.11"},
    }


def test_a_pods_container_becomes_a_command_with_its_environment_and_files(
    tmp_path: Path,
) -> None:
    container = {
        "name": "c",
        "command": ["virtual-node"],
        "args": ["--nodename=$(POD_NAME)", "--client-kubeconfig=/etc/lower/kubeconfig"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ADDR", "value": "$(IP):10255"},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
        "volumeMounts": [
            {"name": "lower", "mountPath": "/etc/lower"},
            {"name": "scratch", "mountPath": "/var/lib/x"},
            {"name": "api", "mountPath": podrun.SERVICE_ACCOUNT_DIR},
        ],
    }
    volumes = [
        {"name": "lower", "secret": {"secretName": "lower-kubeconfig"}},
        {"name": "scratch", "emptyDir": {}},
        {
            "name": "api",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {"downwardAPI": {"items": []}},
                ]
            },
        },
    ]
    result = podrun.describe(
        _pod(containers=[container], volumes=volumes),
        objects={("Secret", "lower-kubeconfig"): {"kubeconfig": "K"}, ("Secret", "s"): {"k": "v"}},
        token="TOKEN",
        ca=b"CA",
        root=tmp_path,
    )
    assert result.argv == (
        "virtual-node",
        "--nodename=vk-0",
        f"--client-kubeconfig={tmp_path}/etc/lower/kubeconfig",
    )
    assert result.env["ADDR"] == "192.0.2.11:10255"
    assert result.env["KEY"] == "v"
    assert result.env["KUBECONFIG"] == (
        f"{tmp_path}/var/run/secrets/kubernetes.io/serviceaccount/kubeconfig"
    )
    assert result.files == {
        "etc/lower/kubeconfig": b"K",
        "var/run/secrets/kubernetes.io/serviceaccount/token": b"TOKEN",
        "var/run/secrets/kubernetes.io/serviceaccount/ca.crt": b"CA",
    }
    assert result.directories == ("var/lib/x",)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": [{"name": "c", "image": "i"}]}, "names no command"),
        (
            {
                "containers": [
                    {
                        "name": "c",
                        "command": ["x"],
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                    }
                ]
            },
            "volumeMount v names no volume",
        ),
        (
            {
                "containers": [
                    {
                        "name": "c",
                        "command": ["x"],
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                    }
                ],
                "volumes": [{"name": "v", "hostPath": {"path": "/"}}],
            },
            "only configMap, secret, emptyDir and projected",
        ),
        (
            {
                "containers": [
                    {
                        "name": "c",
                        "command": ["x"],
                        "env": [
                            {
                                "name": "E",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}},
                            }
                        ],
                    }
                ]
            },
            "fieldRef metadata.labels is not supported",
        ),
    ],
)
def test_what_cannot_run_locally_is_refused_with_the_reason(
    spec: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(podrun.PodRunError, match=message):
        podrun.describe(_pod(**spec), objects={}, token="", ca=b"", root=tmp_path)
