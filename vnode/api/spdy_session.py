"""One upgraded SPDY/3.1 connection on the server side: the peer opens streams, we answer
(the SPDY transport of `streaming`).

aiohttp hands every byte after the 101 to `feed_data` (it is installed as the request's
payload parser before the 101 goes out) and calls `feed_eof` when the connection drops.
Streams the peer opens are answered with SYN_REPLY at once and queued for `accept`; DATA
goes to the stream's buffer; PINGs are echoed (the apiserver pings every few seconds);
SETTINGS and WINDOW_UPDATE are ignored, as the Go implementation does (no flow control).
Reading is paused while a stream holds more than `MAX_BUFFERED` unread bytes, and writers
wait while the transport's buffer is over the same bound: a slow side never makes memory
grow without bound. The frames the connection answers by itself (SYN_REPLY, RST_STREAM,
PING echoes) cannot wait, so while they leave more than `MAX_BUFFERED` unsent bytes,
reading pauses instead: a peer that sends PINGs and never reads stops being read. At most
`MAX_STREAMS` streams are open at once; more are refused (RST_STREAM REFUSED_STREAM).
Every frame in or out counts as activity for the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar

from aiohttp import web

from vnode.api import spdy
from vnode.api.streaming import MAX_BUFFERED, IdleWatch

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024
MAX_STREAMS = 1024
"""Streams open at once on one connection (an exec session uses at most five; a
port-forward session two per forwarded connection)."""
_BACKLOG_CHECK = 0.02
"""Seconds between checks of whether the peer read our answers, while reading waits."""
_BACKLOG = -1
"""The `over_limit` key of unsent answers (stream ids are positive)."""


class Stream:
    """A stream the peer opened; `kind` is its `streamtype` header (stdin, stdout, error, ...)."""

    def __init__(self, connection: SpdyConnection, frame: spdy.SynStream) -> None:
        self.id = frame.stream_id
        self.headers = frame.headers
        self.kind = (frame.headers.get("streamtype") or [""])[0].lower()
        self._connection = connection
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._buffered = 0
        self._discarded = False
        self.remote_closed = False
        self.local_closed = False
        if frame.flags & spdy.FLAG_FIN:
            self._end()

    def header(self, name: str) -> str:
        """Return the first value of header `name` (lower-case) the peer opened it with, or ""."""
        return (self.headers.get(name) or [""])[0]

    def _feed(self, data: bytes, *, fin: bool) -> None:
        if data and not self.remote_closed and not self._discarded:
            self._chunks.put_nowait(data)
            self._buffered += len(data)
            if self._buffered > MAX_BUFFERED:
                self._connection.over_limit(self, True)
        if fin:
            self._end()

    def _end(self) -> None:
        if not self.remote_closed:
            self.remote_closed = True
            self._chunks.put_nowait(None)

    async def read(self) -> bytes:
        """Return the next bytes the peer sent, or b"" once it finished the stream."""
        chunk = await self._chunks.get()
        if chunk is None:
            self._chunks.put_nowait(None)  # stay at EOF for later reads
            return b""
        self._buffered -= len(chunk)
        if self._buffered <= MAX_BUFFERED // 2:
            self._connection.over_limit(self, False)
        return chunk

    def discard(self) -> None:
        """Stop reading the stream for good: drop what is queued, ignore what comes, forget it
        (a reset tells the peer if it is still sending)."""
        if self._discarded:
            return
        self._discarded = True
        self._buffered = 0
        self._connection.over_limit(self, False)
        self._connection.forget(self)

    async def write(self, data: bytes) -> None:
        """Send `data` on the stream (waits while the peer is slow to read)."""
        for i in range(0, len(data), _CHUNK):
            await self._connection.send(spdy.Data(stream_id=self.id, data=data[i : i + _CHUNK]))

    async def close(self) -> None:
        """Finish our side of the stream (DATA with FIN); idempotent."""
        if not self.local_closed:
            self.local_closed = True
            await self._connection.send(spdy.Data(stream_id=self.id, data=b"", flags=spdy.FLAG_FIN))


class SpdyConnection:
    """The server side of one SPDY/3.1 connection over an already upgraded transport."""

    def __init__(self, transport: asyncio.Transport, *, response: web.StreamResponse) -> None:
        self._transport = transport
        self._reader = spdy.FrameReader()
        self._writer = spdy.FrameWriter()
        self._streams: dict[int, Stream] = {}
        self._new: asyncio.Queue[Stream | None] = asyncio.Queue()
        self._paused = False
        self._over_limit: set[int] = set()
        self._backlog_timer: asyncio.TimerHandle | None = None
        self.closed = asyncio.Event()
        self._last_stream = 0
        self.response = response
        """The 101 answer, for the handler to return."""
        self.idle = IdleWatch()
        """When a frame last moved either way (every frame counts, PINGs too, as in
        spdystream's idle-aware framer)."""

    # -- aiohttp's payload parser interface --------------------------------------------

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        """Take bytes from the connection; (True, b"") asks aiohttp to close it."""
        self.idle.touch()
        try:
            frames = self._reader.feed(data)
        except spdy.ProtocolError as exc:
            logger.info("kubelet API: closing a SPDY connection: %s", exc)
            self._send_now(spdy.GoAway(last_good_stream_id=self._last_stream, status=1))
            self._transport.close()
            self._finish()
            return True, b""
        for frame in frames:
            self._dispatch(frame)
        return False, b""

    def feed_eof(self) -> None:
        """The connection dropped: every stream ends."""
        self._finish()

    # -- frames ------------------------------------------------------------------------

    def _dispatch(self, frame: spdy.Frame) -> None:
        if isinstance(frame, spdy.SynStream):
            if frame.stream_id in self._streams or frame.stream_id <= self._last_stream:
                self._answer(
                    spdy.RstStream(stream_id=frame.stream_id, status=spdy.RST_PROTOCOL_ERROR)
                )
                return
            self._last_stream = frame.stream_id
            if len(self._streams) >= MAX_STREAMS:
                self._answer(
                    spdy.RstStream(stream_id=frame.stream_id, status=spdy.RST_REFUSED_STREAM)
                )
                return
            stream = Stream(self, frame)
            self._streams[stream.id] = stream
            self._answer(spdy.SynReply(stream_id=stream.id))
            self._new.put_nowait(stream)
        elif isinstance(frame, spdy.Data):
            target = self._streams.get(frame.stream_id)
            if target is None:
                if frame.stream_id > self._last_stream:  # never opened (a forgotten one: ignore)
                    self._answer(
                        spdy.RstStream(stream_id=frame.stream_id, status=spdy.RST_INVALID_STREAM)
                    )
            else:
                target._feed(frame.data, fin=frame.fin)
        elif isinstance(frame, spdy.RstStream):
            reset = self._streams.get(frame.stream_id)
            if reset is not None:
                reset.local_closed = True
                reset._end()
        elif isinstance(frame, spdy.Ping):
            self._answer(frame)
        elif isinstance(frame, spdy.GoAway):
            self._new.put_nowait(None)
        # SETTINGS, WINDOW_UPDATE and HEADERS carry nothing we act on.

    def _answer(self, frame: spdy.Frame) -> None:
        """Send a frame the peer's own frame calls for; stop reading while such answers
        pile up unsent (the peer does not read), until the peer has taken most of them."""
        self._send_now(frame)
        if self._backlog_timer is None and self._backlogged(MAX_BUFFERED):
            self._hold(_BACKLOG, True)
            self._backlog_timer = asyncio.get_running_loop().call_later(
                _BACKLOG_CHECK, self._check_backlog
            )

    def _backlogged(self, bound: int) -> bool:
        return not self._transport.is_closing() and self._transport.get_write_buffer_size() > bound

    def _check_backlog(self) -> None:
        if self._backlogged(MAX_BUFFERED // 2) and not self.closed.is_set():
            self._backlog_timer = asyncio.get_running_loop().call_later(
                _BACKLOG_CHECK, self._check_backlog
            )
            return
        self._backlog_timer = None
        self._hold(_BACKLOG, False)

    def _finish(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self._backlog_timer is not None:
            self._backlog_timer.cancel()
            self._backlog_timer = None
        for stream in self._streams.values():
            stream._end()
        self._new.put_nowait(None)

    # -- for handlers ----------------------------------------------------------------------

    async def accept(self) -> Stream | None:
        """Return the next stream the peer opens, or None once it will open no more."""
        stream = await self._new.get()
        if stream is None:
            self._new.put_nowait(None)
        return stream

    async def send(self, frame: spdy.Frame) -> None:
        """Send a frame, after waiting while the transport holds too much unsent data."""
        # The transport has no awaitable drain; poll its buffer while it is over the bound.
        while not self.closed.is_set() and self._transport.get_write_buffer_size() > MAX_BUFFERED:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        self._send_now(frame)

    def _send_now(self, frame: spdy.Frame) -> None:
        if not self._transport.is_closing():
            self.idle.touch()
            self._transport.write(self._writer.encode(frame))

    def over_limit(self, stream: Stream, over: bool) -> None:
        """Note whether `stream` buffers too much; reading pauses while any stream does."""
        self._hold(stream.id, over)

    def _hold(self, key: int, over: bool) -> None:
        """Note whether `key` (a stream id, or _BACKLOG) needs reading paused; reading
        resumes once none does."""
        if over:
            self._over_limit.add(key)
        else:
            self._over_limit.discard(key)
        if self._transport.is_closing():
            return
        if self._over_limit and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        elif not self._over_limit and self._paused:
            self._paused = False
            self._transport.resume_reading()

    def forget(self, stream: Stream) -> None:
        """Drop a finished stream; reset it if the peer may still send on it."""
        if self._streams.pop(stream.id, None) is not None and not stream.remote_closed:
            self._answer(spdy.RstStream(stream_id=stream.id, status=spdy.RST_CANCEL))

    def close(self) -> None:
        """Say goodbye (GOAWAY) and close the connection."""
        if not self._transport.is_closing():
            self._send_now(spdy.GoAway(last_good_stream_id=self._last_stream))
            self._transport.close()
        self._finish()


async def upgrade(request: web.Request, *, protocol: str) -> SpdyConnection:
    """Answer `request` with 101 Switching Protocols to SPDY/3.1 (sub-protocol `protocol`)
    and return the connection that now owns its transport.

    The connection is installed as the request's payload parser before the 101 goes out,
    so no byte the client sends after it is lost. Raises RuntimeError if the client left.
    """
    transport = request.transport
    if transport is None:
        raise RuntimeError("the connection is already closed")
    response = web.StreamResponse(
        status=101,
        headers={
            "Connection": "Upgrade",
            "Upgrade": "SPDY/3.1",
            "X-Stream-Protocol-Version": protocol,
        },
    )
    response.force_close()
    connection = SpdyConnection(transport, response=response)
    request.protocol.set_parser(connection)  # type: ignore[arg-type]
    await response.prepare(request)
    return connection


@dataclass(frozen=True, kw_only=True)
class SpdyTransport:
    """SPDY/3.1 with sub-protocol `protocol`, on which a session's client opens a stream
    of each of `kinds`: a `streaming.Transport`."""

    name: ClassVar[str] = "spdy"
    protocol: str
    kinds: frozenset[str]

    @contextlib.asynccontextmanager
    async def open(self, request: web.Request) -> AsyncIterator[SpdyConnection]:
        """Upgrade `request` (see `upgrade`), yield the connection, then close it (GOAWAY)."""
        connection = await upgrade(request, protocol=self.protocol)
        try:
            yield connection
        finally:
            connection.close()
