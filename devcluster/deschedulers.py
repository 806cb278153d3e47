"""Run the real `tensile-descheduler` command against an upper cluster of a fleet, for tests
and the demo.

The descheduler runs as a child process, exactly as users run it; tests see it only through
the cluster (Events, Leases, the avoidance record), its metrics and its signals.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from devcluster import ports, programs
from devcluster.fleet import Fleet


class DeschedulerProcess(programs.Program):
    """One `python -m descheduler` child process against cluster `upper` of `fleet`;
    `start()` returns once /readyz answers 200 (its caches are synced)."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        log_dir: Path,
        name: str = "descheduler",
        upper: str = "upper",
        kubeconfig: Path | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """`kubeconfig` defaults to the cluster's admin kubeconfig; `args` are added to
        `--kubeconfig`, `--metrics-addr` (a free loopback port) and `--secure-port` (another
        one, on loopback: `secure_port`; not the default, which another may hold)."""
        self.name = name
        self.metrics_port = ports.pick()
        self.secure_port = ports.pick(taken={self.metrics_port})
        argv = [
            sys.executable, "-m", "descheduler",
            f"--kubeconfig={kubeconfig or fleet.cluster(upper).kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.metrics_port}",
            f"--secure-port={self.secure_port}",
            "--bind-address=127.0.0.1",
            "--log-level=debug",
            *args,
        ]  # fmt: skip
        super().__init__(
            process_name=name,
            argv=argv,
            log=log_dir / f"{name}.log",
            endpoint=f"http://127.0.0.1:{self.metrics_port}",
        )
