"""Run the real `virtual-node` command between an upper and a lower cluster of a fleet,
for tests.

The node runs as a child process, exactly as users run it, with the fleet's kubeconfigs
and kubelet certificates; tests talk to it only through the clusters, its metrics and its
signals.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from devcluster import ports, programs
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient
from tensile.contracts.ownership import NodeIdentity

_SERVING_FILES = ("APISERVER_CERT_LOCATION", "APISERVER_KEY_LOCATION")


class VirtualNodeProcess(programs.Program):
    """One `python -m vnode` child process; `start()` returns when its Node is Ready."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        name: str,
        log_dir: Path,
        upper: str = "upper",
        lower: str = "lower",
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        lower_kubeconfig: Path | None = None,
        upper_kubeconfig: Path | None = None,
        certificate_from_csr: bool = False,
        lower_kubelet_access: str = "direct",
        module: str = "vnode",
    ) -> None:
        """A node named `name` between clusters `upper` and `lower` of `fleet` (their admin
        kubeconfigs unless `upper_kubeconfig` / `lower_kubeconfig` say otherwise).

        `certificate_from_csr`: start without the fleet's serving certificate files, so
        the node requests its certificate from the upper cluster (kept in `cert_dir`).

        `lower_kubelet_access` "direct" (the default here) reads kwok's resource metrics
        at its address without verifying its certificate; "proxy" (the command's default)
        reads them through the lower apiserver's node proxy, which works only in a private
        network (apiservers refuse to proxy to a loopback address).

        `module`: the module run as the command (`python -m`), e.g.
        "devcluster.missed_events" for the command with a fault a test switches on."""
        self.fleet = fleet
        self.upper = fleet.cluster(upper)
        self.name = name
        self.metrics_port = ports.pick()
        self.kubelet_port = ports.pick(host=fleet.node_ip)
        log = log_dir / f"virtual-node-{name}.log"
        self.cert_dir = log_dir / f"pki-{name}"
        """--cert-dir: where a CSR-issued serving certificate is kept (kept across restarts),
        unless `args` name --cert-secret (the two are exclusive)."""
        in_secret = any(a.startswith("--cert-secret") for a in args)
        argv = [
            sys.executable, "-m", module,
            f"--nodename={name}",
            f"--kubeconfig={upper_kubeconfig or self.upper.kubeconfig}",
            f"--client-kubeconfig={lower_kubeconfig or fleet.cluster(lower).kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.metrics_port}",
            *([] if in_secret else [f"--cert-dir={self.cert_dir}"]),
            "--log-level=debug",
            f"--lower-kubelet-access={lower_kubelet_access}",
            *(["--lower-kubelet-insecure-tls"] if lower_kubelet_access == "direct" else []),
            *args,
        ]  # fmt: skip
        material = fleet.material(upper=upper, lower=lower).env()
        if certificate_from_csr:
            del material["APISERVER_CERT_LOCATION"], material["APISERVER_KEY_LOCATION"]
        environment = {
            # Files from the caller's environment (a sourced devcluster env.sh) would
            # silently turn a CSR node back into a file-based one.
            **{k: v for k, v in os.environ.items() if k not in _SERVING_FILES},
            **material,
            "KUBELET_PORT": str(self.kubelet_port),
            **(env or {}),
        }
        super().__init__(
            process_name=f"virtual-node-{name}",
            argv=argv,
            log=log,
            endpoint=f"http://127.0.0.1:{self.metrics_port}",
            env=environment,
        )

    def ready(self) -> bool:
        """Tell whether the upper cluster shows the Node Ready (and schedulable)."""
        try:
            node = self._upper_client.request("GET", f"/api/v1/nodes/{self.name}")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise
            return False
        conditions = node.get("status", {}).get("conditions") or []
        taints = node.get("spec", {}).get("taints") or []
        # Ready, and the node lifecycle controller lifted its not-ready taint, so pods
        # schedule onto it straight away.
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in taints
        )

    @functools.cached_property
    def _upper_client(self) -> RestClient:
        return self.upper.rest()

    @property
    def owner(self) -> NodeIdentity:
        """The owner this node marks its lower objects with: its name and the upper cluster's
        identity (--cluster-id when given, else the UID of the upper kube-system namespace)."""
        given = [a.partition("=")[2] for a in self.argv if a.startswith("--cluster-id=")]
        if given and given[-1]:
            return NodeIdentity(node_name=self.name, cluster_id=given[-1])
        namespace = self.upper.rest().request("GET", "/api/v1/namespaces/kube-system")
        return NodeIdentity(node_name=self.name, cluster_id=str(namespace["metadata"]["uid"]))

    def delete_node(self) -> None:
        """Delete the Node object (and so its Lease) from the upper cluster."""
        try:
            self.upper.rest().request("DELETE", f"/api/v1/nodes/{self.name}")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise
