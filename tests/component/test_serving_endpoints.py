"""The serving layer's operator endpoints (`tensile.serving.endpoints`) and signal handling
(`tensile.serving.shutdown`), on real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
from prometheus_client import Counter

from devcluster import ports
from tensile.serving import endpoints, shutdown

PROBE = Counter("tensile_test_serving_probe", "A counter only this test increments.")


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def test_metrics_health_and_readiness_are_served_on_the_metrics_address() -> None:
    health = endpoints.Health()
    state: dict[str, str | None] = {"informers": "pods not synced"}
    health.add_check("informers", lambda: state["informers"])
    health.add_check("certificate", lambda: None)
    port = ports.pick()
    PROBE.inc()
    async with endpoints.metrics_server(f"127.0.0.1:{port}", health=health):
        status, text = await _get(port, "/metrics")
        assert status == 200
        assert "tensile_test_serving_probe_total 1.0" in text
        assert await _get(port, "/healthz") == (200, "ok")
        assert await _get(port, "/readyz") == (
            503,
            "[-]informers failed: pods not synced\n[+]certificate ok\nreadyz check failed\n",
        )
        state["informers"] = None
        assert await _get(port, "/readyz") == (200, "ok")
        assert await _get(port, "/readyz?verbose") == (
            200,
            "[+]informers ok\n[+]certificate ok\nreadyz check passed\n",
        )
    # Closed with the context: nothing listens any more.
    assert not ports.is_listening(port)


async def test_a_check_that_raises_fails_readiness_instead_of_the_request() -> None:
    health = endpoints.Health()

    def broken() -> str | None:
        raise KeyError("gone")

    health.add_check("broken", broken)
    port = ports.pick()
    async with endpoints.metrics_server(f"127.0.0.1:{port}", health=health):
        assert await _get(port, "/readyz") == (
            503,
            "[-]broken failed: KeyError: 'gone'\nreadyz check failed\n",
        )


async def test_no_address_serves_nothing() -> None:
    async with endpoints.metrics_server(""):
        pass


async def test_sigterm_and_sigint_ask_for_a_stop_while_the_context_is_open() -> None:
    stopped = asyncio.Event()
    calls: list[str] = []

    def stop() -> None:
        calls.append("stop")
        stopped.set()

    with shutdown.stop_on_signals(stop):
        for sig in (signal.SIGTERM, signal.SIGINT):
            stopped.clear()
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stopped.wait(), timeout=5)
    assert calls == ["stop", "stop"]
    # Outside the context the handlers are gone: Python's defaults are back.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
