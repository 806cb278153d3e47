"""Run the real `tensile-descheduler` command against an upper cluster of a fleet, for tests
and the demo.

The descheduler runs as a child process, exactly as users run it; tests see it only through
the cluster (Events, Leases, the avoidance record), its metrics and its signals.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from vnode.testing import ports, processes
from vnode.testing.fleet import Fleet

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class DeschedulerProcess:
    """One `python -m descheduler` child process against cluster `upper` of `fleet`."""

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
        `--kubeconfig` and `--metrics-addr` (a free loopback port)."""
        self.name = name
        self.metrics_port = ports.pick()
        self.log = log_dir / f"{name}.log"
        self._argv = [
            sys.executable, "-m", "descheduler",
            f"--kubeconfig={kubeconfig or fleet.cluster(upper).kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.metrics_port}",
            "--log-level=debug",
            *args,
        ]  # fmt: skip
        self.process: processes.Process | None = None

    def start(
        self, *, wait: bool = True, timeout: float = 30.0, detach: bool = False
    ) -> DeschedulerProcess:
        """Start it; with `wait`, return once /readyz answers 200 (its caches are synced).
        `detach` lets it outlive this process (the demo). Raises ComponentDied/TimeoutError."""
        self.process = processes.Process(
            name=self.name,
            argv=self._argv,
            log=self.log,
            env=dict(os.environ),
            die_with_parent=not detach,
        )
        if wait:
            deadline = time.monotonic() + timeout
            while self._get("/readyz")[0] != 200:
                self.check()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.name} not ready after {timeout:.0f}s; log {self.log}"
                    )
                time.sleep(0.1)
        return self

    def check(self) -> None:
        """Raise ComponentDied (with the log's tail) if the process exited."""
        if self.process is not None:
            self.process.check()

    def kill(self) -> None:
        """SIGKILL it (a crash: nothing is released)."""
        if self.process is not None and self.process.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.stop(timeout=5.0)  # reaps it

    def stop(self, *, timeout: float = 20.0) -> int | None:
        """SIGTERM it, SIGKILL after `timeout` seconds; return its exit code."""
        if self.process is None:
            return None
        self.process.stop(timeout=timeout)
        return self.process.returncode

    def metric(self, name: str, **labels: str) -> float:
        """Return the sum of the samples of metric `name` whose labels include `labels`."""
        status, text = self._get("/metrics")
        if status != 200:
            raise RuntimeError(f"{self.name}: /metrics answered {status}")
        total = 0.0
        for line in text.splitlines():
            found = _SAMPLE.match(line)
            if not found or found.group(1) != name:
                continue
            sample = found.group(2) or ""
            if all(f'{k}="{v}"' in sample for k, v in labels.items()):
                total += float(found.group(3))
        return total

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5
            ) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:
            return 0, ""
