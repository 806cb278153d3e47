"""The HTTPS server every program shares (`tensile.serving.https.HttpsServer`) on real
sockets on 127.0.0.1: when its port listens (a certificate there, its informers synced), how
it stops (not ready at once, answering for the shutdown delay, then refusing), and that a
failed start names the flag and leaves nothing claimed."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tensile.serving import endpoints, selfsigned
from tensile.serving.https import HttpsServer, ServerSettings, certificate_files
from tensile.serving.lifecycle import StartupError
from tensile.serving.selfsigned import SubjectNames
from tensile.serving.sockets import bound_socket

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


def _settings(tmp_path: Path, **changes: object) -> ServerSettings:
    authority = selfsigned.new_authority(common_name="test CA", now=NOW, lifetime=DAY)
    pair = selfsigned.issue(authority, names=SubjectNames.of(["127.0.0.1"]), now=NOW, lifetime=DAY)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    settings = ServerSettings(
        address="127.0.0.1",
        port=0,
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        shutdown_delay=0.5,
        shutdown_timeout=0.5,
    )
    return dataclasses.replace(settings, **changes)  # type: ignore[arg-type]


def _server(settings: ServerSettings, *, wait_for: object = ()) -> HttpsServer:
    health = endpoints.Health()
    app = web.Application()
    endpoints.add_routes(app, health=health)
    return HttpsServer(
        settings,
        app=app,
        tls=certificate_files(settings, label="test"),
        name="test",
        label="test",
        health=health,
        wait_for=wait_for,  # type: ignore[arg-type]
    )


async def _get(port: int, path: str) -> tuple[int, str] | None:
    """The answer of https://127.0.0.1:port/path, None when the port refuses."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{port}{path}", ssl=insecure) as response,
        ):
            return response.status, await response.text()
    except aiohttp.ClientConnectorError:
        return None


async def test_the_port_listens_once_its_informers_synced_and_drains_on_stop(
    tmp_path: Path,
) -> None:
    # The Runner runs `run()` only once the informers of `informers()` have synced.
    server = _server(_settings(tmp_path), wait_for=["an informer"])
    assert server.informers() == ("an informer",)
    await server.start()
    running: asyncio.Task[None] | None = None
    try:
        assert server.ready()
        assert server.not_serving() == "the HTTPS port is not listening yet"
        assert await _get(server.port, "/healthz") is None  # refused, not queued
        running = asyncio.create_task(server.run(), name="server")
        for _ in range(100):
            if server.not_serving() is None:
                break
            await asyncio.sleep(0.02)
        assert await _get(server.port, "/readyz") == (200, "ok")
        stopping = asyncio.create_task(server.shut_down(), name="stop")
        await asyncio.sleep(0.1)
        # Not ready at once, still answering during the shutdown delay.
        answer = await _get(server.port, "/readyz")
        assert answer is not None
        assert answer[0] == 503
        assert "[-]shutdown failed: shutting down" in answer[1]
        await stopping
        await asyncio.wait_for(running, timeout=5)
        assert await _get(server.port, "/healthz") is None
    finally:
        if running is not None and not running.done():
            running.cancel()


async def test_with_nothing_to_wait_for_files_are_served_from_the_start(
    tmp_path: Path,
) -> None:
    server = _server(_settings(tmp_path, shutdown_delay=0.0))
    await server.start()
    try:
        assert server.not_serving() is None
        assert await _get(server.port, "/healthz") == (200, "ok")
    finally:
        await server.shut_down()


async def test_a_failed_start_names_the_flag_and_leaves_nothing_claimed(
    tmp_path: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = _settings(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(
            StartupError, match=r"test: cannot listen on 127\.0\.0\.1:\d+ \(--port\)"
        ):
            await _server(busy).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "ca.crt").write_text("not a CA")
    bad_ca = _settings(tmp_path, port=port, client_ca_file=str(tmp_path / "ca.crt"))
    with pytest.raises(StartupError, match="cannot load the client CA file --client-ca-file="):
        await _server(bad_ca).start()
    (tmp_path / "tls.key").write_text("not a key")
    bad_key = dataclasses.replace(bad_ca, client_ca_file="", metrics_addr=f"127.0.0.1:{port}")
    bad_key = dataclasses.replace(bad_key, port=0)
    with pytest.raises(
        StartupError,
        match=r"cannot load the serving certificate --tls-cert-file=.* with --tls-priv",
    ):
        await _server(bad_key).start()
    # The port and the metrics address were given back.
    with bound_socket("127.0.0.1", port):
        pass
