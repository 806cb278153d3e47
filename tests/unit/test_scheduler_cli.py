"""tensile-scheduler's command line: defaults, and a precise error for each bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.pki import CertificateAuthority
from scheduler import __main__ as command
from scheduler.cli import parse
from tensile.serving.flags import UsageError

TLS = ["--tls-cert-file=/c", "--tls-private-key-file=/k", "--client-ca-file=/ca"]


def test_defaults() -> None:
    settings = parse(TLS)
    assert settings.server.port == 8443
    assert settings.policy.headroom == 0.0
    assert settings.virtual_node_selector == "type=virtual-kubelet"
    assert settings.server.metrics_addr == ""
    # callers' certificates: verified when presented at the handshake (probes present
    # none), required by every route but /healthz and /readyz
    assert settings.server.client_ca_file == "/ca"
    assert not settings.server.require_client_certificate
    assert settings.callers.client_certificates
    assert settings.callers.max_in_flight == 32
    assert parse([*TLS, "--max-requests-inflight=4"]).callers.max_in_flight == 4


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        ([], "--tls-cert-file and --tls-private-key-file are required"),
        (TLS[:2], "--client-ca-file is required: the CA of the client certificate kube-sched"),
        ([*TLS, "--max-requests-inflight=0"], "--max-requests-inflight must be at least 1"),
        ([*TLS, "--port=0"], "--port must be 1-65535"),
        ([*TLS, "--headroom=1"], r"--headroom must be a share in \[0, 1\)"),
        ([*TLS, "--headroom=-0.1"], "--headroom must be a share"),
        ([*TLS, "--headroom=x"], "invalid float value"),
        ([*TLS, "--virtual-node-selector=a in (b"], "--virtual-node-selector"),
        ([*TLS, "--metrics-addr=nope"], "--metrics-addr must be host:port"),
        ([*TLS, "--max-request-bytes=10"], "--max-request-bytes must be at least 1024"),
        ([*TLS, "--shutdown-delay=soon"], "--shutdown-delay"),
    ],
)
def test_bad_flags_are_refused_precisely(argv: list[str], error: str) -> None:
    with pytest.raises(UsageError, match=error):
        parse(argv)


def test_the_command_exits_2_on_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["--port=0", *TLS]) == 2
    assert "tensile-scheduler: error: --port" in capsys.readouterr().err
    assert command.main(["--version"]) == 0


def test_the_command_exits_1_when_its_certificate_cannot_be_loaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    argv = [
        f"--kubeconfig={kubeconfig}",
        f"--tls-cert-file={tmp_path / 'none.crt'}",
        f"--client-ca-file={CertificateAuthority.create(directory=tmp_path, name='ca').pair.cert}",
    ]
    assert command.main([*argv, f"--tls-private-key-file={tmp_path / 'none.key'}"]) == 1
    assert "cannot load the serving certificate" in capsys.readouterr().err
