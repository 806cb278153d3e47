"""Run the real `tensile-scheduler` command for an upper cluster of a fleet, for tests and
the demo.

A fleet started with `FleetSettings(scheduler_extender=True)` runs its upper
kube-schedulers with `components.scheduler_configuration` (the extender ignorable, so they
schedule on while it is not running) and reserves the extender's port
(`<upper>-scheduler-extender` in `fleet.ports`); `SchedulerExtenderProcess` then serves on
that port with the fleet's serving certificate for it, signed by the upper cluster's CA, and
requires a client certificate of the CA that signed kube-scheduler's (`extender_client`):
the upper kube-scheduler presents it, as its configuration's `tlsConfig` says.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from devcluster import ports, programs
from devcluster.fleet import Fleet
from devcluster.pki import KeyPair


def extender_client(fleet: Fleet, *, upper: str = "upper") -> KeyPair:
    """The client certificate and key the upper kube-scheduler of `upper` presents to the
    extender (for tests that call the extender as kube-scheduler does)."""
    pki = fleet.directory / "pki"
    name = f"{upper}-scheduler-extender-client"
    return KeyPair(cert=pki / f"{name}.crt", key=pki / f"{name}.key")


def extender_client_ca(fleet: Fleet, *, upper: str = "upper") -> Path:
    """The CA the extender of `upper` verifies its callers' certificates against."""
    return fleet.directory / "pki" / f"{upper}-scheduler-extender-client-ca.crt"


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
        port: int | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """`kubeconfig` defaults to the cluster's admin kubeconfig; `port` to the one the
        fleet reserved for `upper`'s extender (its certificate names the loopback address,
        not a port, so another serves as well); `args` are added to the flags the fleet
        dictates (port, certificate, `--metrics-addr` on a free loopback port). Raises
        KeyError when the fleet reserved no extender port for `upper`."""
        port = fleet.ports[f"{upper}-scheduler-extender"] if port is None else port
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
            f"--client-ca-file={extender_client_ca(fleet, upper=upper)}",
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
