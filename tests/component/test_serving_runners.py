"""The runner every tensile server runs on (`tensile.serving.runners`): idle connections to
the kubelet API and the webhook are closed after the keep-alive timeout, while a long
request is never cut; real sockets on 127.0.0.1.

The timeout is shortened to half a second here (the real one, 95 s, is too long to wait
for in a test); the servers take it from the same runner as the node and the webhook.
A FAKE provider serves the kubelet API's log stream: it must pause longer than the
timeout on demand, which a real lower cluster does not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from tensile.serving import endpoints, runners
from vnode.api.server import ApiContext
from vnode.api.server import make_app as kubelet_api
from webhook.mutation import Lookups, MutationSettings
from webhook.server import Admission
from webhook.server import make_app as webhook

SHORT = 0.5
"""Seconds: the keep-alive timeout of these tests."""
POD = {"metadata": {"name": "web", "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]}}


class SlowLogs:
    """A provider whose container log says one line, pauses `pause` seconds, says another."""

    def __init__(self, *, pause: float) -> None:
        self.pause = pause

    async def container_logs(self, *_: Any, **__: Any) -> AsyncIterator[bytes]:
        yield b"first\n"
        await asyncio.sleep(self.pause)
        yield b"second\n"


def _kubelet_api() -> web.Application:
    context = ApiContext(
        node_name="n1",
        pod=lambda ns, name: POD if (ns, name) == ("ns", "web") else None,
        pods=lambda: [POD],
        provider=SlowLogs(pause=3 * SHORT),  # type: ignore[arg-type]
        authenticator=None,
        authorizer=None,
    )
    return kubelet_api(context)


async def _never() -> None:
    await asyncio.Event().wait()


def _webhook() -> web.Application:
    admission = Admission(
        settings=MutationSettings(), lookups=Lookups(), ready=lambda: True, wait_ready=_never
    )
    return webhook(admission, health=endpoints.Health(), max_request_bytes=64 * 1024)


@pytest.fixture
def short_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runners, "KEEPALIVE_TIMEOUT", SHORT)


@contextlib.asynccontextmanager
async def _serving(app: web.Application) -> AsyncIterator[tuple[str, int]]:
    runner = runners.app_runner(app, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield "127.0.0.1", runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Read until the server closes the connection; True if it did within 10 s."""
    try:
        async with asyncio.timeout(10):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    return True


APPS = [pytest.param(_kubelet_api, id="kubelet-api"), pytest.param(_webhook, id="webhook")]


def test_the_timeout_is_just_above_the_apiservers_idle_connection_timeout() -> None:
    # Go's http.DefaultTransport IdleConnTimeout, which client-go's transports take: 90 s.
    assert 90 < runners.KEEPALIVE_TIMEOUT <= 120


@pytest.mark.usefixtures("short_keepalive")
@pytest.mark.parametrize("app", APPS)
async def test_an_idle_connection_is_closed(app: Callable[[], web.Application]) -> None:
    async with _serving(app()) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            assert b"close" not in head.lower()  # kept alive: it may carry the next request
            assert await reader.readexactly(2) == b"ok"
            assert await _closed_by_server(reader), "an idle connection stayed open"
        finally:
            writer.close()


@pytest.mark.usefixtures("short_keepalive")
@pytest.mark.parametrize("app", APPS)
async def test_a_request_whose_headers_never_end_is_dropped(
    app: Callable[[], web.Application],
) -> None:
    async with _serving(app()) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\n")  # and nothing more
            assert await _closed_by_server(reader), "a slow-header client held its connection"
        finally:
            writer.close()


@pytest.mark.usefixtures("short_keepalive")
async def test_a_long_request_is_not_cut() -> None:
    # A log stream quiet for three timeouts: the keep-alive clock runs only between requests.
    async with _serving(_kubelet_api()) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /containerLogs/ns/web/c HTTP/1.1\r\nHost: node\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            async with asyncio.timeout(10):
                body = b""
                while b"second" not in body:
                    chunk = await reader.read(65536)
                    assert chunk, f"closed mid-stream after {body!r}"
                    body += chunk
        finally:
            writer.close()
