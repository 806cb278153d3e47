"""Run the real `virtual-node` command between an upper and a lower cluster of a fleet,
for tests.

The node runs as a child process, exactly as users run it, with the fleet's kubeconfigs
and kubelet certificates; tests talk to it only through the clusters, its metrics and its
signals.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from vnode.providers.k2k.naming import Owner
from vnode.testing import ports, processes
from vnode.testing.fleet import Fleet
from vnode.testing.rest import ApiStatusError

_SERVING_FILES = ("APISERVER_CERT_LOCATION", "APISERVER_KEY_LOCATION")


class VirtualNodeProcess:
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
    ) -> None:
        """A node named `name` between clusters `upper` and `lower` of `fleet` (their admin
        kubeconfigs unless `upper_kubeconfig` / `lower_kubeconfig` say otherwise).

        `certificate_from_csr`: start without the fleet's serving certificate files, so
        the node requests its certificate from the upper cluster (kept in `cert_dir`).

        `lower_kubelet_access` "direct" (the default here) reads kwok's resource metrics
        at its address without verifying its certificate; "proxy" (the command's default)
        reads them through the lower apiserver's node proxy, which works only in a private
        network (apiservers refuse to proxy to a loopback address)."""
        self.fleet = fleet
        self.upper = fleet.cluster(upper)
        self.name = name
        self.metrics_port = ports.pick()
        self.kubelet_port = ports.pick(host=fleet.node_ip)
        self.log = log_dir / f"virtual-node-{name}.log"
        self.cert_dir = log_dir / f"pki-{name}"
        """--cert-dir: where a CSR-issued serving certificate is kept (kept across restarts)."""
        self._argv = [
            sys.executable, "-m", "vnode",
            f"--nodename={name}",
            f"--kubeconfig={upper_kubeconfig or self.upper.kubeconfig}",
            f"--client-kubeconfig={lower_kubeconfig or fleet.cluster(lower).kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.metrics_port}",
            f"--cert-dir={self.cert_dir}",
            "--log-level=debug",
            f"--lower-kubelet-access={lower_kubelet_access}",
            *(["--lower-kubelet-insecure-tls"] if lower_kubelet_access == "direct" else []),
            *args,
        ]  # fmt: skip
        material = fleet.material(upper=upper, lower=lower).env()
        if certificate_from_csr:
            del material["APISERVER_CERT_LOCATION"], material["APISERVER_KEY_LOCATION"]
        self._env = {
            # Files from the caller's environment (a sourced devcluster env.sh) would
            # silently turn a CSR node back into a file-based one.
            **{k: v for k, v in os.environ.items() if k not in _SERVING_FILES},
            **material,
            "KUBELET_PORT": str(self.kubelet_port),
            **(env or {}),
        }
        self.process: processes.Process | None = None

    def start(
        self, *, timeout: float = 60.0, wait: bool = True, detach: bool = False
    ) -> VirtualNodeProcess:
        """Start the node; with `wait`, return once its Node is Ready (`timeout` seconds).

        `detach` lets the node outlive this process (for the demo; stop it by its `ref`).
        """
        self.process = processes.Process(
            name=f"virtual-node-{self.name}",
            argv=self._argv,
            log=self.log,
            env=self._env,
            die_with_parent=not detach,
        )
        if wait:
            self.wait_ready(timeout=timeout)
        return self

    def wait_ready(self, *, timeout: float = 60.0) -> None:
        """Wait until the upper cluster shows the Node Ready; raises ComponentDied/TimeoutError."""
        client = self.upper.rest()
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            try:
                node = client.request("GET", f"/api/v1/nodes/{self.name}")
                conditions = node.get("status", {}).get("conditions") or []
                taints = node.get("spec", {}).get("taints") or []
                # Ready, and the node lifecycle controller lifted its not-ready taint, so
                # pods schedule onto it straight away.
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in conditions
                ) and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
                    return
            except ApiStatusError as exc:
                if exc.code != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"node {self.name} not Ready after {timeout:.0f}s; log {self.log}"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the node (a crash: nothing is cleaned up); `restart` brings it back."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.stop(timeout=5.0)  # reaps it

    def restart(self, *, timeout: float = 60.0) -> None:
        """Start the node again after `kill` or `stop` (its log is appended to) and wait
        until its Node is Ready again."""
        if self.process is None:
            raise RuntimeError(f"node {self.name} was never started")
        self.process.restart()
        self.wait_ready(timeout=timeout)

    def check(self) -> None:
        """Raise ComponentDied (with the log's tail) if the node process exited."""
        if self.process is not None:
            self.process.check()

    def stop(self, *, timeout: float = 20.0) -> int | None:
        """SIGTERM the node, SIGKILL after `timeout` seconds; return its exit code."""
        if self.process is None:
            return None
        self.process.stop(timeout=timeout)
        return self.process.returncode

    @property
    def owner(self) -> Owner:
        """The owner this node marks its lower objects with: its name and the upper cluster's
        identity (--cluster-id when given, else the UID of the upper kube-system namespace)."""
        given = [a.partition("=")[2] for a in self._argv if a.startswith("--cluster-id=")]
        if given and given[-1]:
            return Owner(node_name=self.name, cluster_id=given[-1])
        namespace = self.upper.rest().request("GET", "/api/v1/namespaces/kube-system")
        return Owner(node_name=self.name, cluster_id=str(namespace["metadata"]["uid"]))

    def metrics(self) -> str:
        """Return the node's Prometheus metrics text."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text: str = r.read().decode()
            return text

    def delete_node(self) -> None:
        """Delete the Node object (and so its Lease) from the upper cluster."""
        try:
            self.upper.rest().request("DELETE", f"/api/v1/nodes/{self.name}")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise
