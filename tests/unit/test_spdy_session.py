"""The server side of a SPDY connection: streams, echoes, flow control, discarding.

A recording fake transport stands in for the socket: these are unit tests of our own state
machine (the real thing runs under kubectl in tests/e2e/test_exec.py and test_port_forward.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vnode.api import spdy
from vnode.api.spdy_session import MAX_BUFFERED, SpdyConnection


class FakeTransport:
    def __init__(self) -> None:
        self.sent = spdy.FrameReader()
        self.frames: list[spdy.Frame] = []
        self.paused = False
        self.closed = False

    def write(self, data: bytes) -> None:
        self.frames += self.sent.feed(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


def _connection() -> tuple[SpdyConnection, FakeTransport, spdy.FrameWriter]:
    transport = FakeTransport()
    connection = SpdyConnection(transport, response=web.StreamResponse(status=101))  # type: ignore[arg-type]
    return connection, transport, spdy.FrameWriter()


def _open(connection: SpdyConnection, writer: spdy.FrameWriter, stream_id: int, kind: str) -> Any:
    connection.feed_data(
        writer.encode(spdy.SynStream(stream_id=stream_id, headers={"streamtype": [kind]}))
    )


async def test_streams_are_answered_pings_echoed_and_data_delivered() -> None:
    connection, transport, writer = _connection()
    _open(connection, writer, 1, "stdin")
    stream = await connection.accept()
    assert stream is not None
    assert stream.kind == "stdin"
    assert transport.frames == [spdy.SynReply(stream_id=1)]
    connection.feed_data(writer.encode(spdy.Ping(ping_id=3)))
    assert transport.frames[-1] == spdy.Ping(ping_id=3)
    connection.feed_data(writer.encode(spdy.Data(stream_id=1, data=b"abc", flags=spdy.FLAG_FIN)))
    assert await stream.read() == b"abc"
    assert await stream.read() == b""
    assert await stream.read() == b""  # stays at EOF


async def test_reading_pauses_while_any_stream_holds_too_much() -> None:
    connection, transport, writer = _connection()
    _open(connection, writer, 1, "data")
    _open(connection, writer, 3, "data")
    a, b = await connection.accept(), await connection.accept()
    assert a is not None
    assert b is not None
    big = b"x" * (MAX_BUFFERED + 1)
    for sid in (1, 3):
        connection.feed_data(writer.encode(spdy.Data(stream_id=sid, data=big)))
    assert transport.paused
    assert await a.read() == big
    assert transport.paused, "b still holds too much: reading must stay paused"
    b.discard()
    assert not transport.paused


async def test_a_discarded_stream_is_reset_and_its_late_data_ignored() -> None:
    connection, transport, writer = _connection()
    _open(connection, writer, 1, "data")
    stream = await connection.accept()
    assert stream is not None
    stream.discard()
    assert transport.frames[-1] == spdy.RstStream(stream_id=1, status=spdy.RST_CANCEL)
    count = len(transport.frames)
    connection.feed_data(writer.encode(spdy.Data(stream_id=1, data=b"late")))
    assert len(transport.frames) == count  # no reply, no growth


async def test_a_protocol_error_closes_the_connection_with_goaway() -> None:
    connection, transport, _ = _connection()
    eof, _ = connection.feed_data(bytes.fromhex("8002000100000000"))
    assert eof
    assert transport.closed
    assert isinstance(transport.frames[-1], spdy.GoAway)
    assert await connection.accept() is None


async def test_a_reused_stream_id_is_refused() -> None:
    connection, transport, writer = _connection()
    _open(connection, writer, 3, "stdout")
    _open(connection, writer, 1, "stderr")
    assert transport.frames[-1] == spdy.RstStream(stream_id=1, status=spdy.RST_PROTOCOL_ERROR)
