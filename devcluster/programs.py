"""tensile's own commands (`virtual-node`, `tensile-webhook`, `tensile-descheduler`,
`tensile-scheduler`) run as child processes for tests and the demo, all started, waited for,
checked, killed, restarted and stopped the same way; and the local pods of `podrun`, which
share the checking and stopping.

Each runs exactly as users run it (`python -m <package>` with its flags), logging to a file
whose tail explains a death (`processes.ComponentDied`). What differs between them is only
their command line and how to tell they are ready: a subclass of `Program` says that.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from devcluster import processes

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class ChildProcess:
    """Something the harness runs as a child process (`process`, once started)."""

    def __init__(self) -> None:
        self.process: processes.Process | None = None

    def check(self) -> None:
        """Raise ComponentDied (with the log's tail) if the process exited."""
        if self.process is not None:
            self.process.check()

    def kill(self) -> None:
        """SIGKILL it (a crash: nothing is cleaned up or released)."""
        if self.process is not None and self.process.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.stop(timeout=5.0)  # reaps it

    def stop(self, *, timeout: float = 20.0) -> int | None:
        """SIGTERM it, SIGKILL after `timeout` seconds; return its exit code (None: it was
        never started)."""
        if self.process is None:
            return None
        self.process.stop(timeout=timeout)
        return self.process.returncode


class Program(ChildProcess):
    """One of tensile's commands as a child process; `start()` returns once it is ready.

    `endpoint` is the base URL where it answers `/readyz` and `/healthz`, and `/metrics`
    unless `metrics_endpoint` names another (a program whose HTTPS port serves `/metrics`
    only to callers the cluster allows also serves it on a loopback port of its own); an
    HTTPS one is not verified, as a kubelet's probe does not verify.
    """

    def __init__(
        self,
        *,
        process_name: str,
        argv: Sequence[str],
        log: Path,
        endpoint: str,
        metrics_endpoint: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        for url in (endpoint, metrics_endpoint or endpoint):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint must be an http(s) URL, got {url!r}")
        self.process_name = process_name
        self.argv = list(argv)
        """Its command line."""
        self.log = log
        self.endpoint = endpoint
        self.metrics_endpoint = metrics_endpoint or endpoint
        self._env = dict(env) if env is not None else None

    def ready(self) -> bool:
        """Tell whether it is ready: by default `/readyz` answers 200."""
        return self.get("/readyz")[0] == 200

    def start(self, *, timeout: float = 60.0, wait: bool = True, detach: bool = False) -> Self:
        """Start it; with `wait`, return once it is ready (`timeout` seconds). `detach` lets
        it outlive this process (the demo; stop it by its process's `ref`). Raises
        ComponentDied / TimeoutError."""
        self.process = processes.Process(
            name=self.process_name,
            argv=self.argv,
            log=self.log,
            env=self._env,
            die_with_parent=not detach,
        )
        if wait:
            self.wait_ready(timeout=timeout)
        return self

    def wait_ready(self, *, timeout: float = 60.0) -> None:
        """Wait until it is ready; raises ComponentDied if it exits, TimeoutError after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.process_name} not ready after {timeout:.0f}s; log {self.log}"
                )
            time.sleep(0.1)

    def restart(self, *, timeout: float = 60.0) -> None:
        """Start it again after `kill` or `stop` (its log is appended to) and wait until it
        is ready again."""
        if self.process is None:
            raise RuntimeError(f"{self.process_name} was never started")
        self.process.restart()
        self.wait_ready(timeout=timeout)

    def get(self, path: str, *, endpoint: str | None = None) -> tuple[int, str]:
        """GET `path` from its endpoint (or `endpoint`); return the status and the body (0
        and "": nothing answers)."""
        base = endpoint or self.endpoint
        context = None
        if base.startswith("https:"):
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        url = base + path  # http(s): checked when made
        try:
            with urllib.request.urlopen(url, context=context, timeout=5) as r:  # noqa: S310
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:  # URLError included
            return 0, ""

    def metrics(self) -> str:
        """Return its Prometheus metrics text. Raises RuntimeError unless it answers 200."""
        status, text = self.get("/metrics", endpoint=self.metrics_endpoint)
        if status != 200:
            raise RuntimeError(f"{self.process_name}: /metrics answered {status}")
        return text

    def metric(self, name: str, **labels: str) -> float:
        """Return the sum of the samples of metric `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            found = _SAMPLE.match(line)
            if not found or found.group(1) != name:
                continue
            sample = found.group(2) or ""
            if all(f'{k}="{v}"' in sample for k, v in labels.items()):
                total += float(found.group(3))
        return total
