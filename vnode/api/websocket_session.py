"""One WebSocket channel connection on the server side (exec/attach, port-forward): the
WebSocket transport of `streaming`.

After the upgrade the server sends each channel's greeting (exec's empty "the session is
up" message, port-forward's port prefixes), then one reader task takes the client's
messages, decodes them with the negotiated codec (`channel_framing.Codec`) and hands each
payload to its channel; messages for channels the session does not read are dropped, as a
kubelet drops them. The channels exist from the start; `accept` hands them to the session in
channel order, as if the client had opened them, so a session runs the same over SPDY. A
channel that holds more than `MAX_BUFFERED` unread bytes makes the reader wait, so the
client is slowed down by TCP instead of making memory grow; writers wait while the client
is slow to read (aiohttp drains its transport). No server pings: a kubelet sends none, and
a ping would keep an idle connection alive past its idle timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from aiohttp import WSMsgType, web

from tensile.kube import channel_framing as framing
from vnode.api.channels import ChannelSpec
from vnode.api.streaming import MAX_BUFFERED, IdleWatch

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024
MAX_MESSAGE = 4 * 1024 * 1024
"""Largest message a client may send (bytes); bigger ones close the connection (1009)."""
CLOSE_TIMEOUT = 10.0
"""Seconds we give the close handshake (our close frame out, the client's back) before
dropping the socket."""


class Channel:
    """One channel of the connection, shaped like a SPDY stream (`streaming.ChannelStream`)."""

    def __init__(self, connection: WebSocketChannels, *, number: int, spec: ChannelSpec):
        self.number = number
        self.kind = spec.kind
        self._headers = spec.headers
        self._readable = spec.readable
        self._connection = connection
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._ended = False
        self._discarded = False
        self._ready = asyncio.Event()
        """Set while there is something for `read` (bytes, or the end)."""
        self._room = asyncio.Event()
        """Set while the channel buffers at most MAX_BUFFERED bytes."""
        self._room.set()

    @property
    def id(self) -> int:
        """The channel number."""
        return self.number

    def header(self, name: str) -> str:
        """Return the value of header `name` its spec gives it (port-forward's `port` and
        `requestid`), or ""."""
        return self._headers.get(name, "")

    async def _feed(self, data: bytes) -> None:
        if not self._readable or self._ended or self._discarded or not data:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        self._ready.set()
        if self._buffered > MAX_BUFFERED:
            self._room.clear()
            await self._room.wait()

    def _end(self) -> None:
        self._ended = True
        self._ready.set()
        self._room.set()

    async def read(self) -> bytes:
        """Return the next bytes the client sent on the channel, or b"" once it ended it
        (v5 CLOSE signal) or the connection ended."""
        while not self._chunks:
            if self._ended or self._discarded:
                return b""
            self._ready.clear()
            await self._ready.wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._buffered <= MAX_BUFFERED // 2:
            self._room.set()
        return chunk

    async def write(self, data: bytes) -> None:
        """Send `data` on the channel; an empty `data` sends one empty message (the
        kubelet's "the session is up" signal). Does nothing once the connection closed."""
        await self._connection.send(self.number, data)

    async def close(self) -> None:
        """Nothing to send: the channel protocols have no half-close from the server; the
        status and the end of the connection end every channel."""

    def discard(self) -> None:
        """Stop reading the channel: what is buffered and what comes is dropped."""
        self._discarded = True
        self._chunks.clear()
        self._buffered = 0
        self._ready.set()
        self._room.set()


class WebSocketChannels:
    """The server side of one upgraded WebSocket speaking a channel protocol."""

    def __init__(
        self, ws: web.WebSocketResponse, *, protocol: str, layout: Mapping[int, ChannelSpec]
    ) -> None:
        self.response = ws
        """The 101 answer, for the handler to return."""
        self._codec = framing.Codec.of(protocol)
        self._close_signal = framing.has_close_signal(protocol)
        self.channels = {n: Channel(self, number=n, spec=spec) for n, spec in layout.items()}
        self._unaccepted = collections.deque(self.channels[n] for n in sorted(self.channels))
        self.closed = asyncio.Event()
        """Set once the client closed the connection or it dropped."""
        self.idle = IdleWatch()
        """When a data message last moved either way (what a kubelet's deadline counts)."""

    async def accept(self) -> Channel | None:
        """Return the next channel not handed out yet, in channel order, or None once all
        were: the session takes them as it would take the streams a SPDY client opens."""
        return self._unaccepted.popleft() if self._unaccepted else None

    async def send(self, channel: int, data: bytes) -> None:
        """Send `data` on `channel` in messages of at most 64 KiB of payload."""
        for start in range(0, max(len(data), 1), _CHUNK):
            if self.response.closed:
                return
            message = self._codec.encode(channel, data[start : start + _CHUNK])
            try:
                if isinstance(message, str):
                    await self.response.send_str(message)
                else:
                    await self.response.send_bytes(message)
            except ConnectionError:
                return  # the client went away; the reader notices and ends the session
            self.idle.touch()

    async def read_loop(self) -> None:
        """Hand the client's messages to their channels until the connection ends."""
        try:
            while True:
                message = await self.response.receive()
                if message.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                    return  # close, closing, closed or error: the client is gone
                self.idle.touch()
                try:
                    number, payload = self._codec.decode(message.data)
                except ValueError as exc:
                    # A kubelet logs and skips a message it cannot decode.
                    logger.debug("kubelet API: skipping a WebSocket message: %s", exc)
                    continue
                if number == framing.CLOSE and self._close_signal:
                    ended = framing.close_signal_target(payload)
                    if ended is not None and ended in self.channels:
                        self.channels[ended]._end()
                    continue
                target = self.channels.get(number)
                if target is not None:
                    await target._feed(payload)
        finally:
            for channel in self.channels.values():
                channel._end()
            self.closed.set()


@contextlib.asynccontextmanager
async def open_channels(
    request: web.Request, *, protocol: str, layout: Mapping[int, ChannelSpec]
) -> AsyncIterator[WebSocketChannels]:
    """Answer `request` with 101 Switching Protocols to a WebSocket speaking `protocol`
    ("" for none), send the greetings of `layout`, and yield the connection; on exit its
    reader task is stopped and the connection closed (close frame, then up to
    CLOSE_TIMEOUT seconds for the client's).

    Raises aiohttp's HTTPBadRequest for an invalid WebSocket handshake.
    """
    ws = web.WebSocketResponse(
        protocols=(protocol,) if protocol else (),
        compress=False,
        autoping=True,
        max_msg_size=MAX_MESSAGE,
        timeout=CLOSE_TIMEOUT,
    )
    await ws.prepare(request)
    connection = WebSocketChannels(ws, protocol=protocol, layout=layout)
    reader = asyncio.create_task(connection.read_loop(), name="websocket-channels-reader")
    try:
        for number, spec in sorted(layout.items()):
            if spec.greeting is not None:
                await connection.send(number, spec.greeting)
        yield connection
    finally:
        for channel in connection.channels.values():
            channel.discard()  # a reader waiting for room goes on
        # The reader must not sit in receive() while we close: aiohttp would then drop the
        # socket at once, before the client answered our close frame, and output still on
        # its way could be lost. Without it, close() waits for the client's close frame.
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await ws.close()
        except TimeoutError:
            # A client that reads nothing (our close frame cannot even be sent) or never
            # answers it: drop the socket rather than wait for its buffers to drain.
            if request.transport is not None:
                request.transport.abort()


@dataclass(frozen=True, kw_only=True)
class WebSocketTransport:
    """A WebSocket speaking the channel protocol `protocol`, with the channels `layout`
    (`channels.exec_layout`, `channels.port_forward_layout`): a `streaming.Transport`."""

    name: ClassVar[str] = "websocket"
    protocol: str
    layout: Mapping[int, ChannelSpec]

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds of the layout's channels."""
        return frozenset(spec.kind for spec in self.layout.values())

    def open(
        self, request: web.Request
    ) -> contextlib.AbstractAsyncContextManager[WebSocketChannels]:
        """See `open_channels`."""
        return open_channels(request, protocol=self.protocol, layout=self.layout)
