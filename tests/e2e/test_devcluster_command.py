"""`tensile-devcluster up|env|down` as a person runs it: a second, small pair of its own."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vnode.testing import ports, processes
from vnode.testing.cluster import STATE_FILE, kubectl_binary


def _devcluster(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vnode.testing.devcluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.mark.timeout(300)
def test_up_env_down_on_an_occupied_port_leaves_nothing_behind(tmp_path: Path) -> None:
    state = tmp_path / "pair"
    with socket.socket() as blocker:
        blocker.bind((ports.LOOPBACK, 0))
        blocker.listen()
        occupied = blocker.getsockname()[1]
        try:
            up = _devcluster(
                "up", "--dir", str(state), "--lower-nodes", "1",
                "--upper-port", str(occupied), "--timeout", "120",
            )  # fmt: skip
            assert up.returncode == 0, up.stderr
            recorded = json.loads((state / STATE_FILE).read_text())
            pids = [p["pid"] for p in recorded["processes"].values()]
            used_ports = list(recorded["ports"].values())
            assert recorded["ports"]["upper-apiserver"] != occupied
            assert f"port {occupied} on 127.0.0.1 is in use" in up.stderr

            assert (state / "env.sh").read_text().startswith("export ")
            env = _devcluster("env", "--dir", str(state))
            assert env.returncode == 0, env.stderr
            exports = dict(
                line.removeprefix("export ").split("=", 1) for line in env.stdout.splitlines()
            )
            assert exports["TENSILE_UPPER_KUBECONFIG"] == str(state / "upper.kubeconfig")
            assert exports["VKUBELET_POD_IP"] == "127.0.0.1"
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


def test_down_without_a_pair_says_so(tmp_path: Path) -> None:
    result = _devcluster("down", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 0
    assert "nothing to stop" in result.stderr


def test_env_without_a_pair_is_an_error(tmp_path: Path) -> None:
    result = _devcluster("env", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 2
    assert "no running pair" in result.stderr


def test_missing_binaries_without_go_is_one_clear_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBEBUILDER_ASSETS"}
    env["TENSILE_CACHE_DIR"] = str(tmp_path / "empty-cache")
    # A PATH with python but no go.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env["PATH"] = str(bin_dir)
    assert shutil.which("go", path=env["PATH"]) is None
    result = _devcluster("up", "--dir", str(tmp_path / "pair"), env=env, timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1
    assert "missing control-plane binaries: etcd, kube-apiserver" in result.stderr
    assert "'go' tool is not on PATH" in result.stderr
    assert "KUBEBUILDER_ASSETS" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "pair" / STATE_FILE).exists()


def test_bad_flags_exit_2(tmp_path: Path) -> None:
    result = _devcluster("up", "--dir", str(tmp_path), "--lower-nodes", "-1")
    assert result.returncode == 2
    assert "must be >= 0" in result.stderr
    result = _devcluster("up", "--dir", str(tmp_path), "--upper-port", "70000")
    assert result.returncode == 2
    assert "not a TCP port" in result.stderr
