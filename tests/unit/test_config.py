"""Kubeconfig loading: every way a kubeconfig authenticates reaches the Authorization header."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

from devcluster.pki import CertificateAuthority
from tensile.kube import config


def _kubeconfig(
    path: Path,
    user: dict[str, object],
    *,
    server: str = "https://127.0.0.1:6443",
    ca: Path | None = None,
) -> str:
    cluster: dict[str, object] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return str(path)


def test_a_bearer_token(tmp_path: Path) -> None:
    info = config.load(_kubeconfig(tmp_path / "k", {"token": "abc"}, ca=_ca(tmp_path)))
    assert info.authorization() == "Bearer abc"
    assert info.server == "https://127.0.0.1:6443"
    assert info.ssl_context is not None


def test_a_token_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    info = config.load(
        _kubeconfig(tmp_path / "k", {"tokenFile": str(tmp_path / "token")}, ca=_ca(tmp_path))
    )
    assert info.authorization() == "Bearer from-file"


def test_an_exec_plugin(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-plugin"},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    info = config.load(_kubeconfig(tmp_path / "k", user, ca=_ca(tmp_path)))
    assert info.authorization() == "Bearer from-plugin"


def test_client_certificates_and_no_token(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(directory=tmp_path, name="ca")
    pair = ca.issue(directory=tmp_path, name="admin", common_name="admin", client=True)
    user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    info = config.load(_kubeconfig(tmp_path / "k", user, ca=ca.pair.cert))
    assert info.authorization() is None
    assert info.ssl_context is not None
    assert info.client_certificate == (str(pair.cert), str(pair.key))
    # Kept apart, for contexts that verify against the CA without the client certificate.
    assert info.ca_file == str(ca.pair.cert)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(str(tmp_path / "nope"))


def test_garbage_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("this: [is not: a kubeconfig")
    with pytest.raises(config.ConfigError, match="cannot load kubeconfig"):
        config.load(str(tmp_path / "k"))


def _ca(tmp_path: Path) -> Path:
    return CertificateAuthority.create(directory=tmp_path, name="ca").pair.cert
