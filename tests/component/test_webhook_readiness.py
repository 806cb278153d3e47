"""The webhook process's own readiness (`webhook.service.Webhook`, run as the command runs
it, `tensile.serving.program.run`, signals included): `/readyz` fails until its caches have
listed AND it serves a certificate, and fails again from SIGTERM on while calls are still
answered for --shutdown-delay.

Against a scripted FAKE apiserver on 127.0.0.1, on purpose: the two moments in between --
caches listed but no certificate yet, a certificate but caches not listed -- need a list
and a Secret read held back on demand, which a real kube-apiserver cannot be made to do.
The same process against the real apiserver is tests/e2e/test_webhook.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devcluster import ports
from tensile.kube.config import ConnectionInfo
from tensile.serving import program
from tensile.serving.bootstrap import SecretSettings
from tensile.serving.https import ServerSettings
from webhook.__main__ import PROGRAM
from webhook.settings import Settings

SECRET = "/api/v1/namespaces/tensile-system/secrets/tensile-webhook-tls"
LISTS = (
    "/api/v1/nodes",
    "/api/v1/persistentvolumeclaims",
    "/api/v1/namespaces/tensile-system/configmaps",
)


class HeldApi:
    """Answers the webhook's lists once `listed` is set and its Secret read once `secret`
    is set (404, so it makes one and POSTs it); watches stay open and quiet."""

    def __init__(self) -> None:
        self.listed = asyncio.Event()
        self.secret = asyncio.Event()
        self.unexpected: list[str] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.server = TestServer(app, host="127.0.0.1")

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path in LISTS:
            if request.query.get("watch"):
                response = web.StreamResponse()
                await response.prepare(request)
                await asyncio.Event().wait()  # until the client goes away
            await self.listed.wait()
            return web.json_response(
                {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}
            )
        if request.method == "GET" and request.path == SECRET:
            await self.secret.wait()
            return _status(404, "NotFound")
        if request.method == "POST" and request.path == SECRET.rpartition("/")[0]:
            return web.json_response(await request.json(), status=201)
        self.unexpected.append(f"{request.method} {request.path_qs}")
        return _status(404, "NotFound")


def _status(code: int, reason: str) -> web.Response:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason}
    return web.json_response(body, status=code)


@pytest.fixture
async def api() -> AsyncIterator[HeldApi]:
    fake = HeldApi()
    await fake.server.start_server(shutdown_timeout=1.0)
    try:
        yield fake
    finally:
        fake.listed.set()
        fake.secret.set()
        await fake.server.close()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def _until(what: str, check: Any, timeout: float = 10.0) -> Any:
    """Poll `check` (an HTTP look at the webhook) until it returns something truthy."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                found = await check()
                if found:
                    return found
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout}s waiting for {what}")


async def test_ready_only_with_caches_and_a_certificate_and_not_from_sigterm_on(
    api: HeldApi,
) -> None:
    port, metrics_port = ports.pick(), ports.pick()
    settings = Settings(
        server=ServerSettings(
            address="127.0.0.1",
            port=port,
            metrics_addr=f"127.0.0.1:{metrics_port}",
            secret=SecretSettings(
                namespace="tensile-system", name="tensile-webhook-tls", names=("127.0.0.1",)
            ),
            shutdown_delay=1.5,
            shutdown_timeout=1.0,
        ),
        webhook_configuration="",
    )
    upper = ConnectionInfo(server=f"http://127.0.0.1:{api.server.port}", ssl_context=None)
    readyz = f"http://127.0.0.1:{metrics_port}/readyz?verbose"
    healthz = f"http://127.0.0.1:{metrics_port}/healthz"
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    running = asyncio.create_task(program.run(PROGRAM, settings, upper), name="webhook-under-test")
    try:
        async with aiohttp.ClientSession() as session:

            async def answering() -> tuple[int, str] | None:
                try:
                    return await _get(session, readyz)
                except aiohttp.ClientConnectionError:
                    return None

            status, text = await _until("/readyz answering", answering)
            assert status == 503
            assert "[-]caches failed" in text
            assert "[-]certificate failed: no serving certificate yet" in text
            assert await _get(session, healthz) == (200, "ok")

            api.listed.set()  # the caches list; still no certificate
            status, text = await _until(
                "the caches listed",
                lambda: _checked(session, readyz, "[+]caches ok"),
            )
            assert status == 503
            assert "[-]certificate failed" in text

            api.secret.set()  # a certificate is made, kept and served
            status, text = await _until(
                "ready", lambda: _checked(session, readyz, "readyz check passed")
            )
            assert status == 200
            mutate = f"https://127.0.0.1:{port}/healthz"
            assert await _get_tls(session, mutate, insecure) == 200

            os.kill(os.getpid(), signal.SIGTERM)  # what a kubelet sends first
            status, text = await _until(
                "not ready", lambda: _checked(session, readyz, "[-]shutdown failed")
            )
            assert status == 503
            assert "shutting down" in text
            # Not ready, yet still answering during --shutdown-delay: alive, and the
            # HTTPS port still serves the calls endpoints keep sending for a moment.
            assert await _get(session, healthz) == (200, "ok")
            assert await _get_tls(session, mutate, insecure) == 200
        async with asyncio.timeout(10):
            await running  # then it stops, cleanly
    finally:
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert api.unexpected == []


async def _checked(session: aiohttp.ClientSession, url: str, line: str) -> tuple[int, str] | None:
    found = await _get(session, url)
    return found if line in found[1] else None


async def _get_tls(session: aiohttp.ClientSession, url: str, context: ssl.SSLContext) -> int:
    async with session.get(url, ssl=context) as response:
        return response.status
