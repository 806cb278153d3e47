"""Kubeconfig files for the local clusters (client-certificate users, file references)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from devcluster.pki import KeyPair


def write_kubeconfig(
    *,
    path: Path,
    cluster: str,
    server: str,
    ca: Path,
    user: str,
    credentials: KeyPair | None = None,
    token_file: Path | None = None,
) -> Path:
    """Write a single-context kubeconfig named `cluster` for `user` and return its path.

    `user` authenticates with the client certificate `credentials` or with the bearer
    token in `token_file` (read again by clients as it changes). Files are referenced by
    absolute path, so the kubeconfig stays valid only while the directory holding them
    does. The file is written with mode 0600.
    """
    if credentials is not None and token_file is None:
        auth = {
            "client-certificate": str(credentials.cert.resolve()),
            "client-key": str(credentials.key.resolve()),
        }
    elif token_file is not None and credentials is None:
        auth = {"tokenFile": str(token_file.resolve())}
    else:
        raise ValueError("give exactly one of credentials and token_file")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority": str(ca.resolve())},
            }
        ],
        "users": [{"name": user, "user": auth}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path
