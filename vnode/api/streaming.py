"""What the exec/attach and port-forward bridges share, whatever the transport (SPDY/3.1
or a WebSocket channel protocol): the stream shape they work on, and the bounds of a
connection's life.

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
from typing import Any, Protocol

logger = logging.getLogger(__name__)

MAX_BUFFERED = 1024 * 1024
"""Bytes a stream buffers, or a transport holds, before the other side is made to wait."""
STREAM_CREATION_TIMEOUT = 30.0
"""Seconds a client has to open the streams a session needs (kubelet's default)."""
DEFAULT_IDLE_TIMEOUT = 4 * 3600.0
"""Seconds without a frame either way before a streaming connection is closed (kubelet's
`--streaming-connection-idle-timeout` default)."""


class ChannelStream(Protocol):
    """One stream of a streaming connection as the bridges see it: a SPDY stream, or one
    channel of a WebSocket channel connection."""

    async def read(self) -> bytes:
        """Return the next bytes the client sent, or b"" once it finished the stream."""

    async def write(self, data: bytes) -> None:
        """Send `data` to the client (waits while the client is slow to read)."""

    async def close(self) -> None:
        """Finish our side of the stream, where the protocol can say so; idempotent."""

    def discard(self) -> None:
        """Stop reading the stream for good: what is buffered and what comes is dropped."""


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
