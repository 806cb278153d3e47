"""The kwok documents and manifests the harness writes."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from devcluster import components, kwok
from devcluster.cluster import LOWER_CONTROLLERS, LowerClusterSettings
from devcluster.pki import KeyPair


def test_node_manifest_is_managed_and_has_no_addresses() -> None:
    node = kwok.FakeNode(name="n1", cpu="4", memory="8Gi", pods="10",
                         labels={"zone": "a"}, extended={"example.com/gpu": "2"})  # fmt: skip
    manifest = kwok.node_manifest(node)
    assert manifest["metadata"]["annotations"] == {
        kwok.MANAGED_ANNOTATION: kwok.MANAGED_VALUE,
        # Where metrics-server (and the virtual node) read the node's resource metrics.
        "metrics.k8s.io/resource-metrics-path": "/metrics/nodes/n1/metrics/resource",
    }
    assert manifest["metadata"]["labels"]["zone"] == "a"
    assert manifest["metadata"]["labels"]["kubernetes.io/hostname"] == "n1"
    assert "addresses" not in manifest["status"]
    assert manifest["status"]["allocatable"] == {
        "cpu": "4",
        "memory": "8Gi",
        "pods": "10",
        "ephemeral-storage": "1Ti",
        "example.com/gpu": "2",
    }
    assert manifest["status"]["capacity"] == manifest["status"]["allocatable"]


def test_cri_log_lines_are_in_the_cri_format() -> None:
    start = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    text = kwok.cri_log_lines(["a b", "c"], start=start)
    assert text.splitlines() == [
        "2026-01-02T03:04:05.000000000Z stdout F a b",
        "2026-01-02T03:04:06.000000000Z stdout F c",
    ]
    for line in text.splitlines():
        assert re.fullmatch(r"\S+Z (stdout|stderr) [FP] .*", line)


def test_simulation_rules_match_every_pod(tmp_path: Path) -> None:
    docs = kwok.simulation_documents(
        logs_file=tmp_path / "l",
        previous_logs_file=tmp_path / "p",
        attach_file=tmp_path / "a",
        exec_dir=tmp_path,
        forward_port=1234,
    )
    assert {d["kind"] for d in docs} == {
        "ClusterLogs",
        "ClusterAttach",
        "ClusterExec",
        "ClusterPortForward",
        "ClusterResourceUsage",
        "Metric",
        "Stage",  # the resize stage, selecting by the pod's state (resize_stage)
    }
    for doc in docs:
        assert doc["kind"] == "Stage" or "selector" not in doc["spec"]
    forward = next(d for d in docs if d["kind"] == "ClusterPortForward")
    assert forward["spec"]["forwards"] == [{"target": {"address": "127.0.0.1", "port": 1234}}]


def test_kwok_serves_its_nodes_at_their_address_with_a_certificate(tmp_path: Path) -> None:
    serving = KeyPair(cert=tmp_path / "c.crt", key=tmp_path / "c.key")
    argv = kwok.kwok_argv(
        binary=tmp_path / "kwok",
        kubeconfig=tmp_path / "k",
        configs=[],
        address="192.0.2.1",
        port=4321,
        serving=serving,
        cidr="10.245.0.0/16",
    )
    assert "--server-address=192.0.2.1:4321" in argv
    assert "--node-ip=192.0.2.1" in argv
    assert "--node-port=4321" in argv
    assert f"--tls-cert-file={serving.cert}" in argv
    assert f"--tls-private-key-file={serving.key}" in argv
    assert "--cidr=10.245.0.0/16" in argv
    assert "--node-lease-duration-seconds=40" in argv  # the kubelet's default


def test_a_lower_cluster_of_many_nodes_renews_their_leases_less_often(tmp_path: Path) -> None:
    serving = KeyPair(cert=tmp_path / "c.crt", key=tmp_path / "c.key")
    argv = kwok.kwok_argv(
        binary=tmp_path / "kwok",
        kubeconfig=tmp_path / "k",
        configs=[],
        address="192.0.2.1",
        port=4321,
        serving=serving,
        lease_seconds=3600,
    )
    assert "--node-lease-duration-seconds=3600" in argv
    with pytest.raises(ValueError, match="node_lease_seconds must be >= 1, got 0"):
        LowerClusterSettings(node_lease_seconds=0)


def test_every_node_serves_the_kubelets_resource_series_at_its_own_path() -> None:
    docs = kwok.resource_metrics_documents()
    metric = next(d for d in docs if d["kind"] == "Metric")
    # kwok installs only paths under /metrics; {nodeName} selects the node per request.
    assert metric["spec"]["path"] == "/metrics/nodes/{nodeName}/metrics/resource"
    assert kwok.resource_metrics_path("n1") == "/metrics/nodes/n1/metrics/resource"
    series = {m["name"]: m for m in metric["spec"]["metrics"]}
    assert set(series) == {
        "scrape_error",
        "container_start_time_seconds",
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "pod_cpu_usage_seconds_total",
        "pod_memory_working_set_bytes",
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
    }
    for name, m in series.items():
        labels = [label["name"] for label in m.get("labels", [])]
        expected = {"container": ["container", "namespace", "pod"], "pod": ["namespace", "pod"]}
        assert labels == expected.get(m["dimension"], []), name
        assert m["kind"] == ("counter" if name.endswith("_total") else "gauge")
    usage = next(d for d in docs if d["kind"] == "ClusterResourceUsage")
    [rule] = usage["spec"]["usages"]
    assert "selector" not in usage["spec"]
    assert "containers" not in rule  # every container of every pod
    assert kwok.DEFAULT_USAGE_CPU in rule["usage"]["cpu"]["expression"]
    assert kwok.USAGE_MEMORY_ANNOTATION in rule["usage"]["memory"]["expression"]


def test_a_lower_cluster_runs_only_the_controllers_it_is_given(tmp_path: Path) -> None:
    pair = KeyPair(cert=tmp_path / "ca.crt", key=tmp_path / "ca.key")
    common = {
        "binary": tmp_path / "kcm",
        "kubeconfig": tmp_path / "k",
        "port": 1,
        "ca": pair,
        "service_account_key": tmp_path / "sa.key",
        "cluster_cidr": "10.245.0.0/16",
    }
    every = components.controller_manager_argv(**common)
    assert not [a for a in every if a.startswith("--controllers")]  # every default one
    only = components.controller_manager_argv(**common, controllers=LOWER_CONTROLLERS)
    assert f"--controllers={','.join(LOWER_CONTROLLERS)}" in only
    assert "node-lifecycle-controller" in LOWER_CONTROLLERS  # new Nodes' not-ready taint
    assert "garbage-collector-controller" not in LOWER_CONTROLLERS


def test_the_resize_stage_patches_a_running_pods_status() -> None:
    stage = kwok.resize_stage()
    assert stage["kind"] == "Stage"
    assert stage["spec"]["resourceRef"] == {"apiGroup": "v1", "kind": "Pod"}
    (patch,) = stage["spec"]["next"]["patches"]
    assert (patch["subresource"], patch["root"], patch["type"]) == ("status", "status", "merge")
    keys = [e["key"] for e in stage["spec"]["selector"]["matchExpressions"]]
    assert keys[:2] == [".metadata.deletionTimestamp", ".status.phase"]
