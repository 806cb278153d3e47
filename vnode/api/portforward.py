"""port-forward over SPDY/3.1 (`portforward.k8s.io`) or the legacy WebSocket channel
protocol, bridged to the provider per forwarded connection: one session, run by
`streaming.serve` on either transport.

Kubelet semantics (cri/streaming/portforward): over SPDY, for every TCP connection it
forwards, the client opens a pair of streams carrying headers `streamType` (`data` |
`error`), `port` and `requestID`; the pair is matched by requestID (a partner that does not
come within the stream-creation timeout fails the pair), the port is dialled, the data
stream is piped both ways, and a failure is written as text on the error stream. One SPDY
connection carries any number of pairs, until the client closes it. Over WebSocket the
ports come from the query (`port`, repeated or comma-separated); port i gets channels 2i
(data) and 2i+1 (error), each opened by the port as two little-endian bytes; one forwarded
connection per port, and the WebSocket closes when all of them ended. Its channels come to
the session as the pairs of a SPDY client would (`channels.port_forward_layout`: the port
and a request id as headers), so both transports are served by the same pairing.

One SPDY session is bounded: at most `MAX_PENDING_PAIRS` pairs wait for their partner
(streams of more are reset) and at most `MAX_FORWARDED` connections are forwarded at once
(a pair past it is failed on its error stream, and no lower connection is made), so a
client that opens pairs without end cannot grow tasks or file descriptors without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from vnode import provider_errors
from vnode.api import channels, streaming
from vnode.api.streaming import STREAM_CREATION_TIMEOUT, ChannelStream, Connection
from vnode.provider import PortSession

logger = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"
KINDS = frozenset({"data", "error"})
"""The kinds of stream of a forwarded connection (a pair)."""

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


@dataclass(kw_only=True)
class _Pair:
    key: str
    streams: dict[str, ChannelStream] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(kw_only=True)
class _Session:
    """The pairs of one SPDY session: those waiting for a partner, and how many forward."""

    pending: dict[str, _Pair] = field(default_factory=dict)
    forwarding: int = 0
    live: int = 0
    """Pair tasks not finished yet (waiting, forwarding, or failing)."""


async def serve(
    request: web.Request,
    *,
    transport: streaming.Transport,
    connect: Connect,
    idle_timeout: float,
    creation_timeout: float = STREAM_CREATION_TIMEOUT,
) -> web.StreamResponse:
    """Upgrade `request` over `transport` and forward every stream pair until the client
    is done (WebSocket: every port's connection ended), leaves, or the connection idles
    for `idle_timeout` seconds (<= 0: no limit). A pair whose partner does not come within
    `creation_timeout` seconds is failed."""

    async def session(connection: Connection) -> None:
        await _serve_pairs(connection, connect=connect, creation_timeout=creation_timeout)

    return await streaming.serve(
        request,
        transport=transport,
        session=session,
        idle_timeout=idle_timeout,
        name="port-forward",
    )


async def _serve_pairs(
    connection: Connection, *, connect: Connect, creation_timeout: float
) -> None:
    session = _Session()
    pending = session.pending
    async with asyncio.TaskGroup() as group:
        while (stream := await connection.accept()) is not None:
            if stream.kind not in KINDS:
                stream.discard()
                continue
            key = pair_key(
                request_id=stream.header("requestid"), stream_id=stream.id, kind=stream.kind
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
                # Waits no more: pairs that come all at once (a WebSocket's, one per port)
                # never count against the bound of pairs waiting for their partner.
                del pending[key]
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
        if session.pending.get(pair.key) is pair:  # a later pair may have its key
            del session.pending[pair.key]
        if not pair.complete.is_set():
            for stream in pair.streams.values():
                stream.discard()
    data, error = pair.streams["data"], pair.streams["error"]
    port_text = data.header("port")
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
