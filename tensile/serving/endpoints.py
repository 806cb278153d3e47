"""The endpoints every tensile program serves for its operators: Prometheus `/metrics`, and
`/healthz` + `/readyz` for kubelet probes.

`/healthz` answers 200 "ok" while the process serves at all (a liveness probe: failing it
restarts the container). `/readyz` runs the program's readiness checks (caches synced, a
serving certificate loaded...) and answers 200 "ok", or 503 naming each failing check in
kube-apiserver's format (`[-]informers failed: ...`), so a Service sends no traffic to a
replica that cannot answer well yet; `?verbose` lists passing checks too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tensile.serving import runners

logger = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""A readiness check: None when it passes, else why it does not (one line)."""


class Health:
    """Named readiness checks, evaluated on every `/readyz`."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add_check(self, name: str, check: Check) -> None:
        """Add (or replace) the readiness check `name`."""
        self._checks[name] = check

    def results(self) -> list[tuple[str, str | None]]:
        """Return (name, None or the reason it fails) for each check, in the order added. A
        check that raises fails with the exception's text (and is logged)."""
        results: list[tuple[str, str | None]] = []
        for name, check in self._checks.items():
            try:
                results.append((name, check()))
            except Exception as exc:
                logger.exception("readiness check %s raised", name)
                results.append((name, f"{type(exc).__name__}: {exc}"))
        return results


HEALTH_KEY: Final = web.AppKey("health", Health)
_SHUTDOWN_TIMEOUT = 5.0
"""Seconds a stop waits for a scrape or probe in flight (each answers at once)."""


def add_routes(app: web.Application, *, health: Health | None = None, metrics: bool = True) -> None:
    """Add `GET /metrics` (unless not `metrics`), `/healthz` and `/readyz` to `app` (see the
    module docstring); `health` holds the readiness checks (none: always ready)."""
    app[HEALTH_KEY] = health or Health()
    if metrics:
        app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)


@contextlib.asynccontextmanager
async def metrics_server(addr: str, *, health: Health | None = None) -> AsyncIterator[None]:
    """Serve `add_routes`'s endpoints over plain HTTP on `addr` ("host:port"; "" serves
    nothing) while the context is open (tensile-kube's and virtual-kubelet's
    `--metrics-addr`; `tensile.serving.metrics_flags` keeps it on loopback). Raises OSError
    when the address cannot be listened on."""
    async with _plain_server(addr, health=health, metrics=True):
        yield


@contextlib.asynccontextmanager
async def healthz_server(addr: str, *, health: Health | None = None) -> AsyncIterator[None]:
    """Serve `/healthz` and `/readyz` only over plain HTTP on `addr` ("" serves nothing)
    while the context is open (`--healthz-addr`). Raises OSError when the address cannot be
    listened on."""
    async with _plain_server(addr, health=health, metrics=False):
        yield


@contextlib.asynccontextmanager
async def _plain_server(addr: str, *, health: Health | None, metrics: bool) -> AsyncIterator[None]:
    if not addr:
        yield
        return
    host, _, port = addr.rpartition(":")
    app = web.Application()
    add_routes(app, health=health, metrics=metrics)
    runner = runners.app_runner(app, shutdown_timeout=_SHUTDOWN_TIMEOUT)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host or None, int(port))
        await site.start()
        what = "metrics" if metrics else "health"
        logger.info("%s on http://%s/%s", what, addr, "metrics" if metrics else "readyz")
        yield
    finally:
        await runner.cleanup()


async def _metrics(_request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    results = request.app[HEALTH_KEY].results()
    failed = [(name, reason) for name, reason in results if reason is not None]
    if not failed and "verbose" not in request.query:
        return web.Response(text="ok")
    lines = [
        f"[+]{name} ok" if reason is None else f"[-]{name} failed: {reason}"
        for name, reason in results
    ]
    lines.append("readyz check failed" if failed else "readyz check passed")
    return web.Response(status=503 if failed else 200, text="\n".join(lines) + "\n")
