"""Run the real `tensile-scheduler` command for an upper cluster of a fleet, for tests and
the demo, and the KubeSchedulerConfiguration the fleet's kube-scheduler calls it with.

A fleet started with `FleetSettings(scheduler_extender=True)` runs its upper
kube-schedulers with `scheduler_configuration` (the extender ignorable, so they schedule on
while it is not running) and reserves the extender's port (`<upper>-scheduler-extender` in
`fleet.ports`); `SchedulerExtenderProcess` then serves on that port with the fleet's
serving certificate for it, signed by the upper cluster's CA.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from devcluster import ports, programs

if TYPE_CHECKING:
    from devcluster.fleet import Fleet

EXTENDER_WEIGHT = 2
"""The extender's prioritize weight (its 0..10 scores count as 0..100 times this, beside
each plugin's 0..100 times its weight)."""
EXTENDER_TIMEOUT = "2s"
"""How long kube-scheduler waits for an extender call before going on without it."""


def scheduler_configuration(*, kubeconfig: Path, url: str, ca: Path) -> str:
    """Return a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1, YAML) whose one
    extender is `tensile-scheduler` at `url` (HTTPS, its certificate signed by `ca`):
    filter and prioritize, node names only, ignorable."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": EXTENDER_WEIGHT,
                "enableHTTPS": True,
                "tlsConfig": {"caFile": str(ca)},
                "nodeCacheCapable": True,
                "ignorable": True,
                "httpTimeout": EXTENDER_TIMEOUT,
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


class SchedulerExtenderProcess(programs.Program):
    """One `python -m scheduler` child process for cluster `upper` of `fleet` (started with
    `scheduler_extender=True`), on the port its kube-scheduler calls; `start()` returns once
    /readyz answers 200 (the virtual Nodes are listed)."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        log_dir: Path,
        name: str = "tensile-scheduler",
        upper: str = "upper",
        kubeconfig: Path | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """`kubeconfig` defaults to the cluster's admin kubeconfig; `args` are added to the
        flags the fleet dictates (port, certificate, `--metrics-addr` on a free loopback
        port). Raises KeyError when the fleet reserved no extender port for `upper`."""
        port = fleet.ports[f"{upper}-scheduler-extender"]
        pki = fleet.directory / "pki"
        self.name = name
        self.port = port
        self.metrics_port = ports.pick()
        argv = [
            sys.executable, "-m", "scheduler",
            f"--kubeconfig={kubeconfig or fleet.cluster(upper).kubeconfig}",
            f"--address={ports.LOOPBACK}",
            f"--port={port}",
            f"--tls-cert-file={pki / f'{upper}-scheduler-extender.crt'}",
            f"--tls-private-key-file={pki / f'{upper}-scheduler-extender.key'}",
            f"--metrics-addr={ports.LOOPBACK}:{self.metrics_port}",
            "--shutdown-delay=0s",
            "--log-level=debug",
            *args,
        ]  # fmt: skip
        super().__init__(
            process_name=name,
            argv=argv,
            log=log_dir / f"{name}.log",
            endpoint=f"http://{ports.LOOPBACK}:{self.metrics_port}",
        )
