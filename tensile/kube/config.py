"""Where a cluster is and how to authenticate to it, loaded with the `kubernetes` package.

The official package does the hard part (kubeconfig merging, contexts, client certificates
and embedded data, bearer tokens, token files, exec and auth-provider plugins, in-cluster
ServiceAccount tokens with rotation); we turn its result into what aiohttp needs.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config


class ConfigError(Exception):
    """The cluster configuration could not be loaded; the message says from where and why."""


@dataclass(frozen=True, kw_only=True)
class ConnectionInfo:
    """How to reach one cluster's kube-apiserver."""

    server: str
    """Base URL without a trailing slash, e.g. "https://10.0.0.1:6443"."""
    ssl_context: ssl.SSLContext | None
    """TLS settings (CA, client certificate); None for plain HTTP."""
    tls_server_name: str | None = None
    """Server name to verify instead of the URL's host, if the kubeconfig says so."""
    proxy: str | None = None
    client_certificate: tuple[str, str | None] | None = None
    """(certificate file, key file) the client authenticates with, if any (for TLS
    contexts of connections other than to the apiserver, e.g. to kubelets)."""
    ca_file: str | None = None
    """The cluster's CA bundle file, if the configuration names one (for TLS contexts that
    verify against it without presenting the client certificate, e.g. to kubelets)."""
    source: str = ""
    """Where this came from, for messages ("kubeconfig /path", "in-cluster")."""
    _authorization: Callable[[], str | None] = field(default=lambda: None, repr=False)

    def authorization(self) -> str | None:
        """Return the Authorization header value (refreshing expiring tokens), or None."""
        return self._authorization()


def load(kubeconfig: str | None, *, context: str | None = None, server: str = "") -> ConnectionInfo:
    """Load the connection of a kubeconfig file, or of the pod's ServiceAccount.

    `kubeconfig` None or "" means `$KUBECONFIG`, then `~/.kube/config`, then in-cluster
    (tensile-kube and client-go's order). `server`, when given, is the apiserver URL used
    instead of the configuration's (client-go's master URL: node-cli's MASTER_URI, the
    webhook's --master); credentials and CA stay the configuration's. Raises ConfigError.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    cfg = k8s_client.Configuration()
    if kubeconfig or Path(path).is_file():
        if not Path(path).is_file():
            raise ConfigError(f"kubeconfig {path} does not exist")
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=cfg, persist_config=False
            )
        except Exception as exc:
            raise ConfigError(f"cannot load kubeconfig {path}: {exc}") from exc
        source = f"kubeconfig {path}"
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ConfigError(
                f"no kubeconfig at {path} and not running in a cluster: {exc}"
            ) from exc
        source = "in-cluster"
    if server:
        cfg.host = server
        source += f", server {server}"
    return from_configuration(cfg, source=source)


def from_configuration(cfg: k8s_client.Configuration, *, source: str) -> ConnectionInfo:
    """Turn a loaded `kubernetes.client.Configuration` into a ConnectionInfo."""
    server = str(cfg.host).rstrip("/")
    context: ssl.SSLContext | None = None
    if server.startswith("https://"):
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE

    def authorization() -> str | None:
        # auth_settings() is what the package's own clients send; it calls the refresh hook
        # (exec plugins, rotating in-cluster token files) when one is set. The key the token
        # is stored under changed across package versions; the header name did not.
        settings = cast("Mapping[str, Mapping[str, object]]", cfg.auth_settings())
        for setting in settings.values():
            if setting.get("in") == "header" and str(setting.get("key")).lower() == "authorization":
                value = setting.get("value")
                if value:
                    return str(value)
        if cfg.username or cfg.password:
            return str(cfg.get_basic_auth_token())
        return None

    return ConnectionInfo(
        server=server,
        ssl_context=context,
        tls_server_name=getattr(cfg, "tls_server_name", None) or None,
        proxy=cfg.proxy or None,
        client_certificate=(cfg.cert_file, cfg.key_file or None) if cfg.cert_file else None,
        ca_file=cfg.ssl_ca_cert or None,
        source=source,
        _authorization=authorization,
    )
