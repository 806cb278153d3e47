"""`tensile-webhook` start failures exit 1 with the reason, before serving anything: a busy
port, certificate files that cannot be loaded (on 127.0.0.1; the kubeconfig names a
server nobody listens on, which the start does not need)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from webhook.__main__ import main

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: c
clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "upper.kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


def test_a_busy_port_exits_1(kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code = main([f"--kubeconfig={kubeconfig}", "--address=127.0.0.1", f"--port={port}"])
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_certificate_files_that_cannot_be_loaded_exit_1(
    kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tls.crt").write_text("garbage")
    (tmp_path / "tls.key").write_text("garbage")
    with socket.create_server(("127.0.0.1", 0)) as free:
        port = free.getsockname()[1]
    code = main(
        [
            f"--kubeconfig={kubeconfig}", "--address=127.0.0.1", f"--port={port}",
            f"--tlscert={tmp_path / 'tls.crt'}", f"--tlskey={tmp_path / 'tls.key'}",
        ]
    )  # fmt: skip
    assert code == 1
    assert "cannot load the serving certificate --tlscert=" in capsys.readouterr().err


def test_a_kubeconfig_that_cannot_be_loaded_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([f"--kubeconfig={tmp_path / 'missing'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
