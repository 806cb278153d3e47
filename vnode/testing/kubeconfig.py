"""Kubeconfig files for the local clusters (client-certificate users, file references)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from vnode.testing.pki import KeyPair


def write_kubeconfig(
    *, path: Path, cluster: str, server: str, ca: Path, user: str, credentials: KeyPair
) -> Path:
    """Write a single-context kubeconfig named `cluster` for `user` and return its path.

    Certificates are referenced by absolute path, so the file stays valid only while the
    directory holding them does. The file is written with mode 0600.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority": str(ca.resolve())},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(credentials.cert.resolve()),
                    "client-key": str(credentials.key.resolve()),
                },
            }
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path
