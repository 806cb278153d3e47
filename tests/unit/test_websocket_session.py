"""The channels of a WebSocket channel connection: bounded buffering, end, discard.

The channel's own state machine only; the connection runs for real under
tests/component/test_kubelet_streaming.py and tests/e2e/test_kubelet_websocket.py.
"""

from __future__ import annotations

import asyncio

from vnode.api.streaming import MAX_BUFFERED
from vnode.api.websocket_session import Channel, ChannelSpec


def _channel(*, readable: bool = True) -> Channel:
    # The connection is only used to write; these tests only read.
    return Channel(None, number=0, spec=ChannelSpec(kind="stdin", readable=readable))  # type: ignore[arg-type]


async def test_data_is_read_in_order_then_the_end() -> None:
    channel = _channel()
    await channel._feed(b"a")
    await channel._feed(b"b")
    channel._end()
    await channel._feed(b"late")  # after the end: dropped
    assert [await channel.read() for _ in range(4)] == [b"a", b"b", b"", b""]


async def test_the_reader_waits_while_a_channel_holds_too_much() -> None:
    channel = _channel()
    await channel._feed(b"x" * MAX_BUFFERED)  # at the bound: no wait yet
    feeding = asyncio.create_task(channel._feed(b"y"), name="feed")
    await asyncio.sleep(0.01)
    assert not feeding.done(), "over the bound, the connection's reader must wait"
    assert await channel.read() == b"x" * MAX_BUFFERED
    await asyncio.wait_for(feeding, timeout=1)
    assert await channel.read() == b"y"


async def test_discarding_drops_the_buffer_and_frees_the_reader() -> None:
    channel = _channel()
    await channel._feed(b"x" * MAX_BUFFERED)
    feeding = asyncio.create_task(channel._feed(b"y"), name="feed")
    await asyncio.sleep(0.01)
    channel.discard()
    await asyncio.wait_for(feeding, timeout=1)
    await channel._feed(b"z")
    assert await channel.read() == b""


async def test_a_channel_the_session_does_not_read_drops_data() -> None:
    channel = _channel(readable=False)
    await channel._feed(b"x" * (2 * MAX_BUFFERED))  # never waits
    channel._end()
    assert await channel.read() == b""


async def test_a_waiting_read_wakes_for_data_and_for_the_end() -> None:
    channel = _channel()
    reading = asyncio.create_task(channel.read(), name="read")
    await asyncio.sleep(0.01)
    await channel._feed(b"hi")
    assert await asyncio.wait_for(reading, timeout=1) == b"hi"
    reading = asyncio.create_task(channel.read(), name="read")
    await asyncio.sleep(0.01)
    channel._end()
    assert await asyncio.wait_for(reading, timeout=1) == b""
