"""Run the real `tensile-webhook` command against an upper cluster of a fleet, for tests and
the demo, and register it there with a URL-based MutatingWebhookConfiguration.

The webhook runs as a child process, exactly as users run it (bootstrapped TLS: its CA and
certificate in a Secret, the CA set as the configuration's caBundle by the webhook
itself). It listens on the fleet's node address, which the upper apiserver reaches (in a
private network, an RFC 5737 address: nothing leaves the machine). Configurations made
here are scoped to one namespace, so a shared fleet's other tests never meet them.
"""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devcluster import ports, programs
from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError
from tensile.contracts.objects import annotations_of, name_of

CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class WebhookProcess(programs.Program):
    """One `python -m webhook` child process; `start()` returns when `/readyz` answers 200."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        name: str,
        log_dir: Path,
        secret_namespace: str,
        configuration: str,
        upper: str = "upper",
        kubeconfig: Path | None = None,
        port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """A webhook named `name` on cluster `upper` of `fleet` (its admin kubeconfig unless
        `kubeconfig` says otherwise), keeping its certificate in Secret
        `secret_namespace`/`name`-tls and publishing its CA into MutatingWebhookConfiguration
        `configuration`."""
        self.fleet = fleet
        self.upper = fleet.cluster(upper)
        self.name = name
        self.port = port or ports.pick(host=fleet.node_ip)
        self.secret = f"{secret_namespace}/{name}-tls"
        self.configuration = configuration
        """The MutatingWebhookConfiguration whose caBundle it sets."""
        self.metrics_port = ports.pick()
        argv = [
            sys.executable, "-m", "webhook",
            f"--kubeconfig={kubeconfig or self.upper.kubeconfig}",
            f"--address={fleet.node_ip}",
            f"--port={self.port}",
            f"--tls-secret={self.secret}",
            f"--tls-san={fleet.node_ip}",
            f"--webhook-configuration={configuration}",
            "--shutdown-delay=0",
            "--log-level=debug",
            # /metrics on the HTTPS port is for callers the cluster allows; the tests read
            # the plain loopback copy.
            f"--metrics-addr={ports.LOOPBACK}:{self.metrics_port}",
            *args,
        ]  # fmt: skip
        super().__init__(
            process_name=f"webhook-{name}",
            argv=argv,
            log=log_dir / f"webhook-{name}.log",
            endpoint=f"https://{fleet.node_ip}:{self.port}",
            metrics_endpoint=f"http://{ports.LOOPBACK}:{self.metrics_port}",
            env=env,
        )

    @property
    def url(self) -> str:
        """Where the apiserver calls it."""
        return f"https://{self.fleet.node_ip}:{self.port}/mutate"


def configuration(
    name: str,
    *,
    url: str,
    namespace: str,
    failure_policy: str = "Fail",
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """Return a MutatingWebhookConfiguration `name` calling `url` for pods labelled
    virtual-pod=true created in `namespace` only (no caBundle: the webhook sets it)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "placement.tensile.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "objectSelector": {"matchLabels": {"virtual-pod": "true"}},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }


def register(cluster: Cluster, manifest: Mapping[str, Any]) -> None:
    """Create (or replace) the MutatingWebhookConfiguration `manifest` in `cluster`."""
    client = cluster.rest()
    name = name_of(manifest)
    unregister(cluster, name)
    client.request("POST", CONFIGURATIONS, body=dict(manifest))


def unregister(cluster: Cluster, name: str) -> None:
    """Delete MutatingWebhookConfiguration `name` from `cluster` (absent is fine)."""
    try:
        cluster.rest().request("DELETE", f"{CONFIGURATIONS}/{name}")
    except ApiStatusError as exc:
        if exc.code != 404:
            raise


def ca_bundle(cluster: Cluster, name: str) -> bytes | None:
    """Return the caBundle of the first webhook of configuration `name` (PEM), or None."""
    try:
        found = cluster.rest().request("GET", f"{CONFIGURATIONS}/{name}")
    except ApiStatusError as exc:
        if exc.code == 404:
            return None
        raise
    encoded = (found.get("webhooks") or [{}])[0].get("clientConfig", {}).get("caBundle")
    return base64.b64decode(encoded) if encoded else None


def wait_admitting(cluster: Cluster, *, namespace: str, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the apiserver calls the webhook for pods of `namespace` (a server-side
    dry-run create comes back with the clusterSelector annotation: the configuration and
    its caBundle reached the apiserver's cache); return that pod. Raises TimeoutError."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "webhook-probe", "labels": {"virtual-pod": "true"}},
        "spec": {"containers": [{"name": "c", "image": "probe"}]},
    }
    client = cluster.rest()
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            created = client.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                body=probe,
                query={"dryRun": "All"},
            )
            if "clusterSelector" in annotations_of(created):
                return created
            last = "not mutated yet"
        except ApiStatusError as exc:
            last = str(exc)  # e.g. the apiserver does not trust the certificate yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"the webhook was not called in {timeout:.0f}s: {last}")
        time.sleep(0.2)
