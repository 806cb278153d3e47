"""`tensile-devcluster up|env|shell|down` as a person runs it: small fleets of its own."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devcluster import netns, ports, processes
from devcluster.cluster import STATE_FILE, kubectl_binary


def _devcluster(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devcluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _exports(text: str) -> dict[str, str]:
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in text.splitlines()
        if line.startswith("export ")
    )


@pytest.mark.timeout(300)
def test_host_network_up_env_down_on_an_occupied_port_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    state = tmp_path / "fleet"
    with socket.socket() as blocker:
        blocker.bind((ports.LOOPBACK, 0))
        blocker.listen()
        occupied = blocker.getsockname()[1]
        try:
            up = _devcluster(
                "up", "--dir", str(state), "--lower-nodes", "1", "--network", "host",
                "--upper-port", str(occupied), "--timeout", "120",
            )  # fmt: skip
            assert up.returncode == 0, up.stderr
            assert "host loopback only" in up.stdout
            recorded = json.loads((state / STATE_FILE).read_text())
            pids = [p["pid"] for p in recorded["processes"].values()]
            used_ports = list(recorded["ports"].values())
            assert recorded["ports"]["upper-apiserver"] != occupied
            assert f"port {occupied} on 127.0.0.1 is in use" in up.stderr
            assert "upper-metrics-server" not in recorded["processes"]  # needs the namespace

            assert (state / "env.sh").read_text().startswith("export ")
            env = _devcluster("env", "--dir", str(state))
            assert env.returncode == 0, env.stderr
            exports = _exports(env.stdout)
            assert exports["TENSILE_UPPER_KUBECONFIG"] == str(state / "upper.kubeconfig")
            assert exports["KUBECONFIG"] == str(state / "upper.kubeconfig")
            assert exports["VKUBELET_POD_IP"] == "127.0.0.1"
            assert exports["TENSILE_NODE_IP"] == "127.0.0.1"
            for key in (
                "APISERVER_CERT_LOCATION",
                "APISERVER_KEY_LOCATION",
                "APISERVER_CA_CERT_LOCATION",
            ):
                assert Path(exports[key]).is_file()

            lower_kubeconfig = f"--kubeconfig={state / 'lower.kubeconfig'}"
            nodes = subprocess.run(
                [kubectl_binary(), lower_kubeconfig, "get", "nodes", "-o", "json"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            )
            names = [n["metadata"]["name"] for n in json.loads(nodes.stdout)["items"]]
            assert names == ["lower-node-0"]
        finally:
            down = _devcluster("down", "--dir", str(state))
        assert down.returncode == 0, down.stderr

    assert not [p for p in pids if processes.group_alive(p)]
    assert not [p for p in used_ports if ports.is_listening(p)]
    assert not state.exists()


@pytest.mark.timeout(300)
def test_a_private_fleet_of_two_lower_clusters_is_entered_with_shell(
    tmp_path: Path, private_network: netns.Network
) -> None:
    # pytest runs in a private namespace of its own; this fleet makes another, nested one.
    state = tmp_path / "fleet"
    try:
        up = _devcluster(
            "up", "--dir", str(state), "--lowers", "2", "--lower-nodes", "1",
            "--lower-nodes", "lower-2=2", "--no-metrics-server",
            "--node-capacity", "lower-2:cpu=4,memory=8Gi,pods=20",
            "--node-label", "lower-2:1:topology.kubernetes.io/zone=b",
            "--timeout", "150",
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert "private network namespace" in up.stdout
        assert f"tensile-devcluster shell --dir {state}" in up.stdout
        recorded = json.loads((state / STATE_FILE).read_text())
        pids = [p["pid"] for p in recorded["processes"].values()]

        exports = _exports((state / "env.sh").read_text())
        assert exports["TENSILE_LOWER_2_KUBECONFIG"] == str(state / "lower-2.kubeconfig")
        assert exports["TENSILE_NODE_IP"] == private_network.node_ip
        assert "tensile-devcluster shell" in (state / "env.sh").read_text()

        # From here the fleet's apiservers cannot be reached: they are in its namespace.
        upper_server = yaml.safe_load((state / "upper.kubeconfig").read_text())
        address = upper_server["clusters"][0]["cluster"]["server"]
        from_here = subprocess.run(
            [kubectl_binary(), f"--kubeconfig={state / 'upper.kubeconfig'}",
             "get", "--raw", "/readyz", "--request-timeout=3s"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert from_here.returncode != 0, f"{address} answered outside the fleet's namespace"

        inside = _devcluster(
            "shell", "--dir", str(state), "--",
            "kubectl", f"--kubeconfig={state / 'lower-2.kubeconfig'}", "get", "nodes", "-o", "json",
        )  # fmt: skip
        assert inside.returncode == 0, inside.stderr
        nodes = {n["metadata"]["name"]: n for n in json.loads(inside.stdout)["items"]}
        assert sorted(nodes) == ["lower-2-node-0", "lower-2-node-1"]
        for node in nodes.values():
            assert node["status"]["capacity"]["cpu"] == "4"
            assert node["status"]["capacity"]["memory"] == "8Gi"
            assert node["status"]["capacity"]["pods"] == "20"
        zones = {
            n: node["metadata"]["labels"].get("topology.kubernetes.io/zone")
            for n, node in nodes.items()
        }
        assert zones == {"lower-2-node-0": None, "lower-2-node-1": "b"}

        # The default kubeconfig in the shell is the first upper cluster's.
        upper = _devcluster(
            "shell", "--dir", str(state), "--", "kubectl", "get", "--raw", "/readyz"
        )
        assert upper.returncode == 0, upper.stderr
        assert upper.stdout.strip() == "ok"
    finally:
        down = _devcluster("down", "--dir", str(state))
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if processes.group_alive(p)]
    assert not state.exists()


def test_down_without_a_fleet_says_so(tmp_path: Path) -> None:
    result = _devcluster("down", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 0
    assert "nothing to stop" in result.stderr


def test_env_without_a_fleet_is_an_error(tmp_path: Path) -> None:
    result = _devcluster("env", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 2
    assert "no running fleet" in result.stderr


def test_missing_binaries_without_go_is_one_clear_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBEBUILDER_ASSETS"}
    env["TENSILE_CACHE_DIR"] = str(tmp_path / "empty-cache")
    # A PATH with python but no go.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env["PATH"] = str(bin_dir)
    assert shutil.which("go", path=env["PATH"]) is None
    result = _devcluster("up", "--dir", str(tmp_path / "fleet"), env=env, timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1
    assert "missing control-plane binaries: etcd, kube-apiserver" in result.stderr
    assert "'go' tool is not on PATH" in result.stderr
    assert "KUBEBUILDER_ASSETS" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "fleet" / STATE_FILE).exists()


def test_bad_flags_exit_2(tmp_path: Path) -> None:
    result = _devcluster("up", "--dir", str(tmp_path), "--lower-nodes", "-1")
    assert result.returncode == 2
    assert "must be >= 0" in result.stderr
    result = _devcluster("up", "--dir", str(tmp_path), "--upper-port", "70000")
    assert result.returncode == 2
    assert "not a TCP port" in result.stderr
