"""One lifecycle for every streaming connection of the kubelet API (exec, attach,
port-forward), whatever carries it: SPDY/3.1 or a WebSocket channel protocol.

A session (`remotecommand`, `portforward`) sees a `Connection`: streams it accepts, each
a `ChannelStream` with a kind and headers, read and written with backpressure, finished
or discarded (reset). A `Transport` (`spdy_session.SpdyTransport`,
`websocket_session.WebSocketTransport`) answers the upgrade and makes the connection;
everything SPDY and WebSocket do differently stays behind it: over SPDY the client opens
the streams, over WebSocket the channels exist from the start and are handed out as if it
had. `serve` runs a session on a transport from the 101 to the close.

Kubelet parity (pkg/kubelet/server, cri/streaming): streams the client must open arrive
within a stream-creation timeout (30 s), and a connection on which no frame moved either
way for the streaming idle timeout (`--streaming-connection-idle-timeout`, default 4 h)
is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from aiohttp import web

logger = logging.getLogger(__name__)

MAX_BUFFERED = 1024 * 1024
"""Bytes a stream buffers, or a transport holds, before the other side is made to wait."""
STREAM_CREATION_TIMEOUT = 30.0
"""Seconds a client has to open the streams a session needs (kubelet's default)."""
DEFAULT_IDLE_TIMEOUT = 4 * 3600.0
"""Seconds without a frame either way before a streaming connection is closed (kubelet's
`--streaming-connection-idle-timeout` default)."""


class ChannelStream(Protocol):
    """One stream of a streaming connection as the sessions see it: a SPDY stream, or one
    channel of a WebSocket channel connection."""

    @property
    def id(self) -> int:
        """The SPDY stream id, or the WebSocket channel number."""

    @property
    def kind(self) -> str:
        """Its role: exec's "stdin", "stdout", "stderr", "error", "resize"; port-forward's
        "data", "error" (SPDY's `streamType` header, lower-cased)."""

    def header(self, name: str) -> str:
        """Return the first value of header `name` (lower-case) it was opened with, or ""."""

    async def read(self) -> bytes:
        """Return the next bytes the client sent, or b"" once it finished the stream."""

    async def write(self, data: bytes) -> None:
        """Send `data` to the client (waits while the client is slow to read)."""

    async def close(self) -> None:
        """Finish our side of the stream, where the protocol can say so; idempotent."""

    def discard(self) -> None:
        """Stop reading the stream for good: what is buffered and what comes is dropped."""


class Connection(Protocol):
    """An upgraded streaming connection, as a session sees it."""

    @property
    def response(self) -> web.StreamResponse:
        """The 101 answer, for the handler to return."""

    @property
    def closed(self) -> asyncio.Event:
        """Set once the client closed the connection or it dropped."""

    @property
    def idle(self) -> IdleWatch:
        """When a frame last moved either way."""

    async def accept(self) -> ChannelStream | None:
        """Return the next stream the client opens, or None once it will open no more."""


class Transport(Protocol):
    """What carries a session: how its connection is opened, and which streams it has."""

    @property
    def name(self) -> str:
        """ "spdy" or "websocket" (task names, logs)."""

    @property
    def protocol(self) -> str:
        """The negotiated sub-protocol (`v4.channel.k8s.io`, `portforward.k8s.io`, ...)."""

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds of stream a session on it has (see `ChannelStream.kind`)."""

    def open(self, request: web.Request) -> AbstractAsyncContextManager[Connection]:
        """Answer `request` with 101 Switching Protocols and yield the connection; on exit
        the connection is closed (bounded: a client that reads nothing is dropped)."""


Session = Callable[[Connection], Coroutine[Any, Any, None]]
"""A session's work on one connection (exec/attach bridge, port-forward pairs)."""


async def serve(
    request: web.Request,
    *,
    transport: Transport,
    session: Session,
    idle_timeout: float,
    name: str,
) -> web.StreamResponse:
    """Upgrade `request` over `transport`, run `session` on the connection until it
    returns, the client leaves, or no frame moved for `idle_timeout` seconds (<= 0: no
    limit), then close the connection; return the 101 answer for the handler.

    `name` ("exec", "attach", "port-forward") names the task and the log line. Raises what
    the upgrade raises (aiohttp's HTTPBadRequest for a bad WebSocket handshake,
    RuntimeError if the client left) and what `session` raises.
    """
    async with transport.open(request) as connection:
        await run_connection(
            session(connection),
            closed=connection.closed,
            idle=connection.idle,
            idle_timeout=idle_timeout,
            name=f"{name}-{transport.name}",
        )
    return connection.response


def idle_remaining(*, last_activity: float, now: float, timeout: float) -> float | None:
    """Return the seconds left before a connection last active at `last_activity` idles out
    at time `now` (<= 0: it has), or None when `timeout` <= 0 (no idle timeout, as the
    kubelet treats 0). All values in seconds of one monotonic clock."""
    if timeout <= 0:
        return None
    return last_activity + timeout - now


class IdleWatch:
    """When a connection last moved a frame. `touch()` is cheap (called per frame);
    `expired()` sleeps until the connection has been quiet for the timeout."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def touch(self) -> None:
        """Note that a frame moved now."""
        self._last = self._clock()

    async def expired(self, timeout: float) -> None:
        """Return once nothing moved for `timeout` seconds; never if `timeout` <= 0."""
        while True:
            remaining = idle_remaining(last_activity=self._last, now=self._clock(), timeout=timeout)
            if remaining is None:
                await asyncio.Event().wait()  # no idle timeout: wait to be cancelled
            elif remaining <= 0:
                return
            else:
                await asyncio.sleep(remaining)


async def run_connection(
    work: Coroutine[Any, Any, None],
    *,
    closed: asyncio.Event,
    idle: IdleWatch,
    idle_timeout: float,
    name: str,
) -> str:
    """Run `work` (a connection's bridge) until it returns, the peer drops the connection
    (`closed` is set), or no frame moved for `idle_timeout` seconds (<= 0: no limit).

    Whatever ends first, the others are cancelled and awaited. Returns "done", "closed" or
    "idle"; an exception of `work` propagates. The caller closes the connection.
    """
    worker = asyncio.create_task(work, name=name)
    dropped = asyncio.create_task(closed.wait(), name=f"{name}-closed")
    idled = asyncio.create_task(idle.expired(idle_timeout), name=f"{name}-idle")
    try:
        await asyncio.wait({worker, dropped, idled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (worker, dropped, idled):
            task.cancel()
        await asyncio.gather(worker, dropped, idled, return_exceptions=True)
    if worker.done() and not worker.cancelled():
        worker.result()  # re-raise what the bridge failed with
        return "done"
    if idled.done() and not idled.cancelled():
        logger.info("kubelet API: closing a %s connection idle for %.0fs", name, idle_timeout)
        return "idle"
    return "closed"
