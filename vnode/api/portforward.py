"""port-forward over SPDY/3.1 (`portforward.k8s.io`) or the legacy WebSocket channel
protocol, bridged to the provider per forwarded connection (one bridge, two transports).

Kubelet semantics (cri/streaming/portforward): over SPDY, for every TCP connection it
forwards, the client opens a pair of streams carrying headers `streamType` (`data` |
`error`), `port` and `requestID`; the pair is matched by requestID (a partner that does not
come within the stream-creation timeout fails the pair), the port is dialled, the data
stream is piped both ways, and a failure is written as text on the error stream. One SPDY
connection carries any number of pairs, until the client closes it. Over WebSocket the
ports come from the query (`port`, repeated or comma-separated); port i gets channels 2i
(data) and 2i+1 (error), each opened by the port as two little-endian bytes; one forwarded
connection per port, and the WebSocket closes when all of them ended.

One SPDY session is bounded: at most `MAX_PENDING_PAIRS` pairs wait for their partner
(streams of more are reset) and at most `MAX_FORWARDED` connections are forwarded at once
(a pair past it is failed on its error stream, and no lower connection is made), so a
client that opens pairs without end cannot grow tasks or file descriptors without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from vnode import errors as provider_errors
from vnode.api import channels
from vnode.api.spdy_session import SpdyConnection, Stream, upgrade
from vnode.api.streaming import STREAM_CREATION_TIMEOUT, ChannelStream, run_connection
from vnode.api.websocket_session import ChannelSpec, open_channels
from vnode.provider import PortSession

logger = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"

Connect = Callable[[int], Awaitable[PortSession]]

MAX_PENDING_PAIRS = 128
"""Pairs of one session whose partner stream has not come yet."""
MAX_FORWARDED = 128
"""Connections one session forwards at once (kubectl opens one per local connection)."""


def negotiate(offered: list[str]) -> str | None:
    """Return PROTOCOL if the client offers it (values may be comma-separated), else None."""
    wanted = set(channels.header_values(offered))
    return PROTOCOL if PROTOCOL in wanted else None


def pair_key(*, request_id: str, stream_id: int, kind: str) -> str:
    """Return the key that matches a data stream with its error stream: the requestID
    header, or for old clients that send none, the error stream's id (a pair's data stream
    is opened right after its error stream, two ids later)."""
    return request_id or str(stream_id - (2 if kind == "data" else 0))


def parse_port(text: str) -> int:
    """Parse a stream's `port` header. Raises ValueError unless it is 1-65535."""
    try:
        return channels.parse_port(text)
    except ValueError:
        raise ValueError(f"invalid port {text!r}") from None


def websocket_layout(ports: Sequence[int]) -> dict[int, ChannelSpec]:
    """Return the channels of a WebSocket port-forward: data (read) and error per port."""
    layout: dict[int, ChannelSpec] = {}
    for i in range(len(ports)):
        layout[2 * i] = ChannelSpec(kind="data", readable=True)
        layout[2 * i + 1] = ChannelSpec(kind="error", readable=False)
    return layout


@dataclass(kw_only=True)
class _Pair:
    key: str
    streams: dict[str, Stream] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(kw_only=True)
class _Session:
    """The pairs of one SPDY session: those waiting for a partner, and how many forward."""

    pending: dict[str, _Pair] = field(default_factory=dict)
    forwarding: int = 0
    live: int = 0
    """Pair tasks not finished yet (waiting, forwarding, or failing)."""


async def serve_spdy(
    request: web.Request,
    *,
    connect: Connect,
    idle_timeout: float,
    creation_timeout: float = STREAM_CREATION_TIMEOUT,
) -> web.StreamResponse:
    """Upgrade `request` to SPDY/3.1 and forward every stream pair until the client is done,
    leaves, or the connection idles for `idle_timeout` seconds (<= 0: no limit). A pair
    whose partner does not come within `creation_timeout` seconds is failed."""
    connection = await upgrade(request, protocol=PROTOCOL)
    try:
        await run_connection(
            _serve_pairs(connection, connect=connect, creation_timeout=creation_timeout),
            closed=connection.closed,
            idle=connection.idle,
            idle_timeout=idle_timeout,
            name="port-forward-spdy",
        )
    finally:
        connection.close()
    assert connection.response is not None
    return connection.response


async def _serve_pairs(
    connection: SpdyConnection, *, connect: Connect, creation_timeout: float
) -> None:
    session = _Session()
    pending = session.pending
    async with asyncio.TaskGroup() as group:
        while (stream := await connection.accept()) is not None:
            if stream.kind not in ("data", "error"):
                stream.discard()
                continue
            key = pair_key(
                request_id=(stream.headers.get("requestid") or [""])[0],
                stream_id=stream.id,
                kind=stream.kind,
            )
            pair = pending.get(key)
            if pair is None:
                if (
                    len(pending) >= MAX_PENDING_PAIRS
                    or session.live >= MAX_PENDING_PAIRS + MAX_FORWARDED
                ):
                    logger.info(
                        "kubelet API: port-forward request %s refused: %d pairs wait for "
                        "their partner, %d are being served",
                        key,
                        len(pending),
                        session.live,
                    )
                    stream.discard()
                    continue
                pair = pending[key] = _Pair(key=key)
                session.live += 1
                group.create_task(
                    _serve_pair(pair, session=session, connect=connect, timeout=creation_timeout),
                    name=f"port-forward-{key}",
                )
            if stream.kind in pair.streams:
                logger.info(
                    "kubelet API: port-forward request %s: duplicate %s stream", key, stream.kind
                )
                stream.discard()
                continue
            pair.streams[stream.kind] = stream
            if len(pair.streams) == 2:
                pair.complete.set()


async def _timed_out(pair: _Pair) -> None:
    message = f"timed out waiting for the streams of port-forward request {pair.key}"
    logger.info("kubelet API: %s", message)
    error = pair.streams.get("error")
    if error is not None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(STREAM_CREATION_TIMEOUT):  # the client may not read
                await error.write(message.encode())
                await error.close()


async def _serve_pair(pair: _Pair, *, session: _Session, connect: Connect, timeout: float) -> None:
    """Wait (`timeout` seconds) for both streams of a pair, then forward; a kubelet fails a
    pair whose partner never comes with a message on the error stream (if it has one)."""
    try:
        await _serve_complete_pair(pair, session=session, connect=connect, timeout=timeout)
    finally:
        session.live -= 1


async def _serve_complete_pair(
    pair: _Pair, *, session: _Session, connect: Connect, timeout: float
) -> None:
    try:
        async with asyncio.timeout(timeout):
            await pair.complete.wait()
    except TimeoutError:
        # The partner may have come in the very turn the timeout fired: then forward.
        if not pair.complete.is_set():
            await _timed_out(pair)
            return
    finally:
        session.pending.pop(pair.key, None)
        if not pair.complete.is_set():
            for stream in pair.streams.values():
                stream.discard()
    data, error = pair.streams["data"], pair.streams["error"]
    port_text = (data.headers.get("port") or [""])[0]
    refusal = ""
    try:
        port = parse_port(port_text)
    except ValueError as exc:
        refusal = str(exc)
    if not refusal and session.forwarding >= MAX_FORWARDED:
        refusal = (
            f"port-forward request {pair.key} refused: this session already forwards "
            f"{session.forwarding} connections (at most {MAX_FORWARDED})"
        )
    if refusal:
        # The client may not read: the message gets a bounded time, then the streams go.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await _fail(data, error, refusal)
        data.discard()
        error.discard()
        return
    session.forwarding += 1
    try:
        await forward(data, error, port=port, connect=connect)
    finally:
        session.forwarding -= 1


async def serve_websocket(
    request: web.Request,
    *,
    protocol: str,
    ports: Sequence[int],
    connect: Connect,
    idle_timeout: float,
) -> web.StreamResponse:
    """Upgrade `request` to a WebSocket speaking `protocol` and forward one connection per
    port of `ports` on its channel pair; the WebSocket closes once every one ended, the
    client leaves, or it idles for `idle_timeout` seconds (<= 0: no limit)."""
    async with open_channels(
        request, protocol=protocol, layout=websocket_layout(ports)
    ) as connection:
        pairs = [
            (connection.channels[2 * i], connection.channels[2 * i + 1], port)
            for i, port in enumerate(ports)
        ]

        async def work() -> None:
            for data, error, port in pairs:
                prefix = channels.port_prefix(port)
                await data.write(prefix)
                await error.write(prefix)
            async with asyncio.TaskGroup() as group:
                for data, error, port in pairs:
                    group.create_task(
                        forward(data, error, port=port, connect=connect),
                        name=f"port-forward-websocket-{port}",
                    )

        await run_connection(
            work(),
            closed=connection.closed,
            idle=connection.idle,
            idle_timeout=idle_timeout,
            name="port-forward-websocket",
        )
    return connection.response


async def forward(
    data: ChannelStream, error: ChannelStream, *, port: int, connect: Connect
) -> None:
    """Forward one connection: dial `port` through `connect`, pipe `data` both ways, and
    report a failure as text on `error`. Never raises (one forwarded connection failing
    must not take the others of the session down); ends and discards both streams."""
    try:
        await _forward_one(data, error, port=port, connect=connect)
    except Exception as exc:  # noqa: BLE001
        logger.info("kubelet API: port-forward connection ended: %s", exc)
        with contextlib.suppress(Exception):
            await _fail(data, error, f"port-forward failed: {exc}")
    finally:
        data.discard()
        error.discard()


async def _forward_one(
    data: ChannelStream, error: ChannelStream, *, port: int, connect: Connect
) -> None:
    try:
        # The lower side may accept the connection and never answer the upgrade.
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT):
            session = await connect(port)
    except provider_errors.ProviderError as exc:
        await _fail(data, error, f"forwarding port {port}: {exc}")
        return
    except TimeoutError:
        await _fail(
            data,
            error,
            f"forwarding port {port}: the lower cluster did not connect in "
            f"{STREAM_CREATION_TIMEOUT:.0f}s",
        )
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


async def _fail(data: ChannelStream, error: ChannelStream, message: str) -> None:
    await error.write(message.encode())
    await error.close()
    await data.close()
