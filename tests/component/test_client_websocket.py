"""ApiClient.websocket against a scripted FAKE apiserver (aiohttp on 127.0.0.1).

A fake is used to refuse an upgrade with a chosen Status on demand; the real lower
apiserver's refusals reach users through tests/e2e (exec into a container that is gone).
"""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo

REFUSAL = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'container "gone" is not valid for pod "web"',
    "reason": "BadRequest",
    "code": 400,
}


async def _refuse(request: web.Request) -> web.StreamResponse:
    if request.path.endswith("/exec"):
        return web.json_response(REFUSAL, status=400)
    return web.Response(status=503, text="the proxy is down")


async def _plain(_request: web.Request) -> web.StreamResponse:
    return web.json_response(REFUSAL, status=400)


async def test_a_refused_upgrade_carries_the_servers_status() -> None:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/web/{sub}", _refuse)
    app.router.add_get("/api/v1/namespaces/ns/pods", _plain)
    server = TestServer(app)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        async with ApiClient(ConnectionInfo(server=url, ssl_context=None), name="fake") as client:
            with pytest.raises(errors.BadRequest) as info:
                await client.websocket(
                    "/api/v1/namespaces/ns/pods/web/exec",
                    params=[("command", "true")],
                    protocols=("v5.channel.k8s.io",),
                )
            assert info.value.message == REFUSAL["message"]
            assert info.value.code == 400
            with pytest.raises(errors.ServerError, match="the proxy is down"):
                await client.websocket(
                    "/api/v1/namespaces/ns/pods/web/portforward", params=[], protocols=()
                )
            # Plain (non-upgrade) streams keep their own error handling.
            with pytest.raises(errors.BadRequest) as plain:
                async with client.stream("/api/v1/namespaces/ns/pods"):
                    pass
            assert plain.value.status == REFUSAL
    finally:
        await server.close()
