"""A fenced client (`ApiClient.fenced`) over HTTP, against a FAKE apiserver (aiohttp on
127.0.0.1) that counts what reaches it: a gate switched by the test decides at one precise
moment (after a wait for the rate limiter), which a real election cannot be made to do on
demand. The fence with a real elector and real apiservers is tests/e2e/test_leader_election.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import CONFIG_MAPS


class Gate:
    """A WriteGate the test opens and closes."""

    def __init__(self) -> None:
        self.open = True

    def may_write(self) -> bool:
        return self.open

    def refusal(self) -> str:
        return "closed by the test"


async def _serve(received: Counter[str]) -> TestServer:
    async def answer(request: web.Request) -> web.StreamResponse:
        received[request.method] += 1
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "x"}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/namespaces/ns/configmaps", answer)
    app.router.add_route("*", "/api/v1/namespaces/ns/configmaps/{name}", answer)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_the_gate_is_asked_right_before_sending_after_the_rate_limiter() -> None:
    received: Counter[str] = Counter()
    server = await _serve(received)
    gate = Gate()
    url = str(server.make_url("")).rstrip("/")
    try:
        # Two requests per second: the second write waits half a second for its slot, and
        # the gate closes during that wait.
        client = ApiClient(
            ConnectionInfo(server=url, ssl_context=None), name="gated", qps=2, burst=1
        )
        fenced = client.fenced(gate)
        async with fenced:  # opening the view opens the client it was made from
            path = CONFIG_MAPS.path(namespace="ns")
            await fenced.request("POST", path, body={"metadata": {"name": "x"}})
            started = time.monotonic()
            waiting = asyncio.create_task(
                fenced.request("DELETE", CONFIG_MAPS.path(namespace="ns", name="x"))
            )
            await asyncio.sleep(0.1)
            assert not waiting.done()  # waiting for its rate slot, not yet asked
            gate.open = False
            with pytest.raises(errors.Fenced, match="closed by the test"):
                await waiting
            assert time.monotonic() - started >= 0.4  # refused after the wait, not before
            # Reads and the unfenced client go; the view shares its connections.
            await fenced.request("GET", path)
            await client.request("PUT", CONFIG_MAPS.path(namespace="ns", name="x"), body={})
            gate.open = True
            await fenced.request("PATCH", CONFIG_MAPS.path(namespace="ns", name="x"), body={})
        assert received == Counter({"POST": 1, "GET": 1, "PUT": 1, "PATCH": 1})
        with pytest.raises(RuntimeError, match="not open"):
            _ = client.session  # closing the view closed the client
    finally:
        await server.close()


def test_fenced_views_of_one_client_share_its_informers() -> None:
    client = ApiClient(ConnectionInfo(server="https://example.invalid", ssl_context=None), name="c")
    first, second = client.fenced(Gate()), client.fenced(Gate())
    assert client.fenced(None) is client
    assert first.unfenced is client
    assert second.unfenced is client
    factory = InformerFactory()
    informer = factory.informer(first, CONFIG_MAPS)
    assert factory.informer(second, CONFIG_MAPS) is informer
    assert factory.informer(client, CONFIG_MAPS) is informer
    assert informer.selection.client is client
