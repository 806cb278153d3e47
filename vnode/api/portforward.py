"""port-forward over SPDY/3.1 (`portforward.k8s.io`), bridged to the provider per connection.

Kubelet semantics (kubelet portforward/httpstream): after the 101 the client opens, for
every TCP connection it forwards, a pair of streams carrying headers `streamType`
(`data` | `error`), `port` and `requestID`; the pair is matched by requestID, the port is
dialled, the data stream is piped both ways, and a failure is written as text on the error
stream. One SPDY connection carries any number of pairs, until the client closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from vnode import errors as provider_errors
from vnode.api.spdy_session import Stream, upgrade
from vnode.provider import PortSession

logger = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"


def negotiate(offered: list[str]) -> str | None:
    """Return PROTOCOL if the client offers it (values may be comma-separated), else None."""
    wanted = {p.strip() for value in offered for p in value.split(",")}
    return PROTOCOL if PROTOCOL in wanted else None


async def serve_spdy(
    request: web.Request, *, connect: Callable[[int], Awaitable[PortSession]]
) -> web.StreamResponse:
    """Upgrade `request` to SPDY/3.1 and forward every stream pair until the client is done."""
    connection = await upgrade(request, protocol=PROTOCOL)
    pending: dict[str, dict[str, Stream]] = {}
    try:
        async with asyncio.TaskGroup() as group:
            while (stream := await connection.accept()) is not None:
                request_id = (stream.headers.get("requestid") or [""])[0] or str(
                    # Old clients send no requestID: a pair's streams then have adjacent ids.
                    stream.id - (2 if stream.kind == "data" else 0)
                )
                pair = pending.setdefault(request_id, {})
                pair[stream.kind] = stream
                if stream.kind not in ("data", "error"):
                    stream.discard()
                    continue
                if "data" in pair and "error" in pair:
                    del pending[request_id]
                    group.create_task(
                        _forward(pair["data"], pair["error"], connect=connect),
                        name=f"port-forward-{request_id}",
                    )
    finally:
        connection.close()
    assert connection.response is not None
    return connection.response


async def _forward(
    data: Stream, error: Stream, *, connect: Callable[[int], Awaitable[PortSession]]
) -> None:
    # One forwarded connection failing must never take the others of the session down.
    try:
        await _forward_one(data, error, connect=connect)
    except Exception as exc:  # noqa: BLE001
        logger.info("kubelet API: port-forward connection ended: %s", exc)
        with contextlib.suppress(Exception):
            await _fail(data, error, f"port-forward failed: {exc}")
    finally:
        data.discard()
        error.discard()


async def _forward_one(
    data: Stream, error: Stream, *, connect: Callable[[int], Awaitable[PortSession]]
) -> None:
    port_text = (data.headers.get("port") or [""])[0]
    try:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError(port_text)
    except ValueError:
        await _fail(data, error, f"invalid port {port_text!r}")
        return
    try:
        session = await connect(port)
    except provider_errors.ProviderError as exc:
        await _fail(data, error, f"forwarding port {port}: {exc}")
        return

    async def upstream() -> None:
        while chunk := await data.read():
            await session.send(chunk)
        # The client finished sending: the WebSocket protocol below cannot half-close, and
        # kubectl waits for our end, so the whole connection ends here (as a kubelet does).
        await session.close()

    try:
        async with asyncio.TaskGroup() as group:
            sending = group.create_task(upstream(), name=f"port-{port}-up")
            while (chunk := await session.receive()) is not None:
                await data.write(chunk)
            problem = session.error()
            if problem:
                await error.write(problem.encode())
            sending.cancel()
    finally:
        await session.close()
        await data.close()
        await error.close()


async def _fail(data: Stream, error: Stream, message: str) -> None:
    await error.write(message.encode())
    await error.close()
    await data.close()
