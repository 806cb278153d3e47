"""The kubelet API's streaming endpoints over real HTTP (aiohttp on 127.0.0.1), with a
scripted FAKE provider.

A fake provider is used on purpose: these scenarios need what a real lower cluster cannot
produce on demand -- a session that fails only once the client's streams exist, one that
never ends (to watch the idle timeout), one that must not start before the streams are
there, a client that never opens a port-forward pair's partner. The same paths against the
real control planes are in tests/e2e/test_kubelet_websocket.py, test_exec.py and
test_port_forward.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from vnode import provider_errors
from vnode.api import portforward, spdy, spdy_session
from vnode.api.server import ApiContext, make_app
from vnode.testing.fakeprovider import FakePort, FakeProvider, FakeSession

POD = {
    "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
    "spec": {"containers": [{"name": "main"}]},
}
EXEC = "/exec/ns/web/main?command=sh&output=1&error=1"
SUCCESS = json.dumps({"metadata": {}, "status": "Success"}).encode()


@contextlib.asynccontextmanager
async def _api(
    provider: FakeProvider, *, idle_timeout: float = 60.0, creation_timeout: float = 30.0
) -> AsyncIterator[TestServer]:
    context = ApiContext(
        node_name="n1",
        pod=lambda ns, name: POD if (ns, name) == ("ns", "web") else None,
        pods=lambda: [POD],
        provider=provider,
        authenticator=None,
        authorizer=None,
        idle_timeout=idle_timeout,
        stream_creation_timeout=creation_timeout,
    )
    server = TestServer(make_app(context))
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def _ws(
    server: TestServer, path: str, protocol: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(server.make_url(path), protocols=(protocol,) if protocol else ()) as ws,
    ):
        yield ws


async def _messages(ws: aiohttp.ClientWebSocketResponse) -> list[bytes]:
    """Every binary message until the server closes (within 5 s)."""
    got = []
    async with asyncio.timeout(5):
        async for message in ws:
            got.append(bytes(message.data))
    return got


class SpdyClient:
    """A bare SPDY/3.1 client: the HTTP upgrade, then frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._in, self._out = spdy.FrameReader(), spdy.FrameWriter()
        self._frames: list[spdy.Frame] = []

    @classmethod
    async def connect(cls, server: TestServer, path: str, protocol: str) -> SpdyClient:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: node\r\nConnection: Upgrade\r\n"
            f"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    def send(self, frame: spdy.Frame) -> None:
        self._writer.write(self._out.encode(frame))

    def open(self, stream_id: int, kind: str, **headers: str) -> None:
        values = {"streamtype": [kind], **{k: [v] for k, v in headers.items()}}
        self.send(spdy.SynStream(stream_id=stream_id, headers=values))

    async def frame(self, *, timeout: float = 5.0) -> spdy.Frame | None:
        """The next frame from the server, or None once it closed the connection."""
        async with asyncio.timeout(timeout):
            while not self._frames:
                chunk = await self._reader.read(65536)
                if not chunk:
                    return None
                self._frames += self._in.feed(chunk)
        return self._frames.pop(0)

    async def until_closed(self, *, timeout: float = 5.0) -> list[spdy.Frame]:
        frames = []
        while (frame := await self.frame(timeout=timeout)) is not None:
            frames.append(frame)
        return frames

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


def _data(frames: list[spdy.Frame], stream_id: int) -> bytes:
    return b"".join(f.data for f in frames if isinstance(f, spdy.Data) and f.stream_id == stream_id)


def _finished(frames: list[spdy.Frame], stream_id: int) -> bool:
    return any(isinstance(f, spdy.Data) and f.stream_id == stream_id and f.fin for f in frames)


# -- WebSocket exec --------------------------------------------------------------------


async def test_websocket_v5_bridges_every_channel_and_the_close_signal() -> None:
    provider = FakeProvider()
    path = "/exec/ns/web/main?command=cat&input=1&output=1&error=1"
    async with _api(provider) as server, _ws(server, path, "v5.channel.k8s.io") as ws:
        assert await ws.receive_bytes() == b"\x01"  # the session is up: empty on stdout
        await provider.opened.wait()
        session = provider.sessions[0]
        await ws.send_bytes(b"\x00typed")
        await ws.send_bytes(b"\xff\x00")  # CLOSE stdin
        for _ in range(100):
            if session.stdin_closed:
                break
            await asyncio.sleep(0.01)
        assert session.sent == [(0, b"typed")]
        assert session.stdin_closed
        for message in ((1, b"out"), (2, b"err"), (3, SUCCESS), None):
            session.output.put_nowait(message)
        assert await _messages(ws) == [b"\x01out", b"\x02err", b"\x03" + SUCCESS]
        assert ws.close_code == aiohttp.WSCloseCode.OK
    assert session.closed


async def test_websocket_base64_and_v1_text_status() -> None:
    provider = FakeProvider()
    async with _api(provider) as server, _ws(server, EXEC, "base64.channel.k8s.io") as ws:
        assert (await ws.receive()).data == "1"
        await provider.opened.wait()
        failure = json.dumps({"status": "Failure", "message": "exit 2"}).encode()
        for message in ((1, b"\n"), (3, failure), None):
            provider.sessions[0].output.put_nowait(message)
        got = []
        async with asyncio.timeout(5):
            async for message in ws:
                got.append(message.data)
        assert got == ["1Cg==", "3ZXhpdCAy"]  # "\n", then the message as text: "exit 2"


async def test_refusals_come_before_the_upgrade_and_start_nothing() -> None:
    provider = FakeProvider()
    async with _api(provider) as server, aiohttp.ClientSession() as http:
        for path, protocol, status in (
            ("/exec/ns/other/main?command=sh&output=1", "v4.channel.k8s.io", 404),
            ("/exec/ns/web/nope?command=sh&output=1", "v4.channel.k8s.io", 404),
            ("/exec/ns/web/main?output=1", "v4.channel.k8s.io", 400),
            (EXEC, "v3.channel.k8s.io", 403),  # a SPDY-only version
            ("/portForward/ns/web", "v4.channel.k8s.io", 400),  # no port
            ("/portForward/ns/web?port=70000", "v4.channel.k8s.io", 400),
            ("/portForward/ns/web?port=80", "v5.channel.k8s.io", 403),
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(server.make_url(path), protocols=(protocol,))
            assert info.value.status == status, path
    assert not provider.opened.is_set()


async def test_a_provider_error_after_the_upgrade_is_a_status_on_the_error_channel() -> None:
    provider = FakeProvider()
    provider.exec_error = provider_errors.PodNotFound('container "main" not found (from below)')
    async with _api(provider) as server:
        async with _ws(server, EXEC, "v4.channel.k8s.io") as ws:
            messages = await _messages(ws)
        assert messages[0] == b"\x01"
        status = json.loads(messages[1][1:])
        assert (status["status"], status["reason"], status["code"]) == (
            "Failure",
            "InternalError",
            500,
        )
        assert status["message"] == (
            "Internal error occurred: error executing command in container: "
            'container "main" not found (from below)'
        )
        async with _ws(server, EXEC, "channel.k8s.io") as ws:
            messages = await _messages(ws)
        assert messages[1].startswith(b"\x03Internal error occurred")


async def test_a_resize_stream_of_nonsense_is_dropped() -> None:
    provider = FakeProvider()
    path = "/exec/ns/web/main?command=sh&output=1&tty=1"
    async with _api(provider) as server, _ws(server, path, "v4.channel.k8s.io") as ws:
        await provider.opened.wait()
        session = provider.sessions[0]
        await ws.send_bytes(b'\x04{"Width":80,"Height":24}')
        await ws.send_bytes(b"\x04" + b"[" * 100_000)  # no terminal size nests
        await ws.send_bytes(b'\x04{"Width":1,"Height":1}')  # the stream is gone by now
        await asyncio.sleep(0.1)
        assert session.sent == [(4, b'{"Width": 80, "Height": 24}')]
        # The session goes on without it.
        for message in ((1, b"still here"), (3, SUCCESS), None):
            session.output.put_nowait(message)
        assert await _messages(ws) == [b"\x01", b"\x01still here", b"\x03" + SUCCESS]


async def test_an_idle_websocket_is_closed() -> None:
    provider = FakeProvider()
    loop = asyncio.get_running_loop()
    async with _api(provider, idle_timeout=0.3) as server:
        start = loop.time()  # before the connection: it cannot have been idle any earlier
        async with _ws(server, EXEC, "v5.channel.k8s.io") as ws:
            assert await _messages(ws) == [b"\x01"]  # then closed, within _messages' bound
            assert loop.time() - start >= 0.3
            assert ws.close_code == aiohttp.WSCloseCode.OK
    assert provider.sessions[0].closed


async def test_websocket_backpressure_both_ways() -> None:
    # Output: a client that reads nothing stops the bridge from taking more from the session.
    provider = FakeProvider()
    chunk = b"o" * (256 * 1024)
    async with _api(provider) as server, _ws(server, EXEC, "v4.channel.k8s.io") as ws:
        await provider.opened.wait()
        output = provider.sessions[0].output
        for _ in range(200):  # 50 MiB
            output.put_nowait((1, chunk))
        await asyncio.sleep(0.5)
        assert output.qsize() > 100, "most of the output must still wait in the session"

    # Input: a session that takes nothing stops the server from reading the client.
    provider = FakeProvider()
    path = "/exec/ns/web/main?command=cat&input=1&output=1"
    sent = 0

    async def flood(ws: aiohttp.ClientWebSocketResponse) -> None:
        nonlocal sent
        while True:
            await ws.send_bytes(b"\x00" + chunk)
            sent += 1

    async with _api(provider) as server, _ws(server, path, "v4.channel.k8s.io") as ws:
        await provider.opened.wait()
        stuck = asyncio.Event()

        async def never_done(_channel: int, _data: bytes) -> None:
            await stuck.wait()

        provider.sessions[0].send = never_done  # type: ignore[method-assign]
        flooding = asyncio.create_task(flood(ws), name="flood")
        await asyncio.sleep(0.5)
        flooding.cancel()
        await asyncio.gather(flooding, return_exceptions=True)
        assert sent < 100, f"{sent * 256} KiB accepted from a client nobody reads"
        provider.sessions[0].output.put_nowait(None)


# -- WebSocket port-forward ------------------------------------------------------------


async def test_websocket_port_forward_pairs_channels_per_port() -> None:
    provider = FakeProvider(refused_ports=(81,))
    path = "/portForward/ns/web?port=80,81"
    async with _api(provider) as server, _ws(server, path, "v4.channel.k8s.io") as ws:
        await ws.send_bytes(b"\x00hello")
        got: dict[int, bytes] = {}
        async with asyncio.timeout(5):
            async for message in ws:
                data = bytes(message.data)
                got[data[0]] = got.get(data[0], b"") + data[1:]
    assert got == {
        0: b"\x50\x00HELLO",
        1: b"\x50\x00",
        2: b"\x51\x00",
        3: b"\x51\x00forwarding port 81: nothing listens on 81",
    }


# -- SPDY --------------------------------------------------------------------------------


async def test_spdy_exec_starts_the_session_only_once_the_streams_exist() -> None:
    provider = FakeProvider()
    async with _api(provider) as server:
        client = await SpdyClient.connect(server, EXEC, "v4.channel.k8s.io")
        try:
            await asyncio.sleep(0.2)
            assert not provider.opened.is_set()
            client.open(1, "error")
            client.open(3, "stdout")
            await asyncio.sleep(0.05)
            assert not provider.opened.is_set(), "stderr is still missing"
            client.open(5, "stderr")
            await asyncio.wait_for(provider.opened.wait(), timeout=5)
            for message in ((1, b"out"), (3, SUCCESS), None):
                provider.sessions[0].output.put_nowait(message)
            frames = await client.until_closed()
        finally:
            await client.close()
    assert _data(frames, 3) == b"out"
    assert _data(frames, 1) == SUCCESS


async def test_resize_data_that_never_completes_a_size_is_cut_off_at_4_kib() -> None:
    provider = FakeProvider()
    async with _api(provider) as server:
        path = "/exec/ns/web/main?command=sh&input=1&output=1&tty=1"
        client = await SpdyClient.connect(server, path, "v4.channel.k8s.io")
        try:
            for stream_id, kind in ((1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")):
                client.open(stream_id, kind)
            await asyncio.wait_for(provider.opened.wait(), timeout=5)
            client.send(spdy.Data(stream_id=7, data=b'{"Width":80,"Height":24} "'))
            for _ in range(3):  # an unterminated string: always "the rest is coming"
                client.send(spdy.Data(stream_id=7, data=b"a" * 1000))
            await asyncio.sleep(0.1)
            assert provider.sessions[0].sent == [(4, b'{"Width": 80, "Height": 24}')]
            client.send(spdy.Data(stream_id=7, data=b"a" * 1100))  # now over 4 KiB waiting
            frames = []
            async with asyncio.timeout(5):
                while spdy.RstStream(stream_id=7, status=spdy.RST_CANCEL) not in frames:
                    frame = await client.frame()
                    assert frame is not None
                    frames.append(frame)
            # The session goes on without it.
            for message in ((1, b"still here"), (3, SUCCESS), None):
                provider.sessions[0].output.put_nowait(message)
            frames = await client.until_closed()
        finally:
            await client.close()
    assert _data(frames, 5) == b"still here"
    assert _data(frames, 1) == SUCCESS


async def test_spdy_provider_errors_after_the_upgrade_go_to_the_error_stream() -> None:
    provider = FakeProvider()
    provider.exec_error = provider_errors.BackendUnavailable("lower cluster unreachable")
    async with _api(provider) as server:
        for protocol in ("v4.channel.k8s.io", "v2.channel.k8s.io"):
            client = await SpdyClient.connect(server, EXEC, protocol)
            try:
                for stream_id, kind in ((1, "error"), (3, "stdout"), (5, "stderr")):
                    client.open(stream_id, kind)
                frames = await client.until_closed()
            finally:
                await client.close()
            error = _data(frames, 1)
            if protocol == "v4.channel.k8s.io":
                error = json.loads(error)["message"].encode()
            assert error == (
                b"Internal error occurred: error executing command in container: "
                b"lower cluster unreachable"
            )
            assert _finished(frames, 3)


async def test_a_spdy_port_forward_pair_whose_partner_never_comes_fails() -> None:
    provider = FakeProvider()
    async with _api(provider, creation_timeout=0.2) as server:
        client = await SpdyClient.connect(server, "/portForward/ns/web", "portforward.k8s.io")
        try:
            client.open(1, "error", port="80", requestid="0")
            client.open(3, "data", port="80", requestid="1")
            client.open(5, "error", port="80", requestid="1")  # this pair completes
            client.send(spdy.Data(stream_id=3, data=b"ping", flags=spdy.FLAG_FIN))
            frames: list[spdy.Frame] = []
            async with asyncio.timeout(5):
                while not all(_finished(frames, stream_id) for stream_id in (1, 3)):
                    frame = await client.frame()
                    assert frame is not None
                    frames.append(frame)
        finally:
            await client.close()
    assert _data(frames, 1) == b"timed out waiting for the streams of port-forward request 0"
    assert _data(frames, 3) == b"PING"


async def test_an_idle_spdy_connection_is_closed_and_pings_keep_it_open() -> None:
    provider = FakeProvider()
    async with _api(provider, idle_timeout=0.3) as server:
        client = await SpdyClient.connect(server, "/portForward/ns/web", "portforward.k8s.io")
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for ping in range(1, 16, 2):  # every frame counts, PINGs too (spdystream)
                client.send(spdy.Ping(ping_id=ping))
                assert await client.frame() == spdy.Ping(ping_id=ping)
                await asyncio.sleep(0.1)
            frames = await client.until_closed()
            # The last PING went out at about 0.7 s: the connection lived 0.3 s past it.
            assert loop.time() - start >= 0.7 + 0.3
        finally:
            await client.close()
    assert frames == [spdy.GoAway(last_good_stream_id=0)]


async def test_streams_nobody_asked_for_are_reset_and_cannot_stall_the_session() -> None:
    # A stream of an unknown kind, a repeated one, and one opened once the session runs are
    # never read: they are reset at once, and megabytes written to them hold nothing back.
    provider = FakeProvider()
    async with _api(provider) as server:
        client = await SpdyClient.connect(server, EXEC, "v4.channel.k8s.io")
        try:
            for stream_id, kind in ((1, "error"), (3, "bogus"), (5, "error"), (7, "stdout")):
                client.open(stream_id, kind)
            client.open(9, "stderr")
            await asyncio.wait_for(provider.opened.wait(), timeout=5)
            client.open(11, "stdin")  # late: the session already runs
            for stream_id in (3, 5, 11):
                client.send(spdy.Data(stream_id=stream_id, data=b"x" * (2 * 1024 * 1024)))
            # Frames are handled in order: the PING's echo says all that data was taken in.
            client.send(spdy.Ping(ping_id=1))
            frames = []
            async with asyncio.timeout(5):
                wanted = [spdy.RstStream(stream_id=i, status=spdy.RST_CANCEL) for i in (3, 5, 11)]
                wanted.append(spdy.Ping(ping_id=1))
                while not all(frame in frames for frame in wanted):
                    frame = await client.frame()
                    assert frame is not None
                    frames.append(frame)
            for message in ((1, b"still here"), (3, SUCCESS), None):
                provider.sessions[0].output.put_nowait(message)
            frames = await client.until_closed()
        finally:
            await client.close()
    assert _data(frames, 7) == b"still here"
    assert _data(frames, 1) == SUCCESS


class HangingProvider(FakeProvider):
    """A lower side that accepts the connection and never answers the upgrade."""

    async def open_exec(self, *_: Any, **__: Any) -> FakeSession:
        self.opened.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_run_gives_up_on_a_lower_session_that_never_opens() -> None:
    provider = HangingProvider()
    async with (
        _api(provider, creation_timeout=0.3) as server,
        aiohttp.ClientSession() as http,
    ):
        async with asyncio.timeout(5):
            response = await http.post(server.make_url("/run/ns/web/main?cmd=ls"))
            text = await response.text()
    assert response.status == 504
    assert "did not open the command's session in 0.3s" in text


async def test_streams_past_the_per_connection_bound_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spdy_session, "MAX_STREAMS", 4)
    provider = FakeProvider()
    async with _api(provider) as server:
        client = await SpdyClient.connect(server, EXEC, "v4.channel.k8s.io")
        try:
            for i in range(6):
                client.open(1 + 2 * i, "bogus")  # never accepted by the exec handler
            frames = [await client.frame() for _ in range(6)]
        finally:
            await client.close()
    replies = [f.stream_id for f in frames if isinstance(f, spdy.SynReply)]
    refused = [
        f.stream_id
        for f in frames
        if isinstance(f, spdy.RstStream) and f.status == spdy.RST_REFUSED_STREAM
    ]
    assert replies == [1, 3, 5, 7]
    assert refused == [9, 11]


async def test_port_forward_pairs_are_bounded_per_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(portforward, "MAX_PENDING_PAIRS", 3)
    monkeypatch.setattr(portforward, "MAX_FORWARDED", 2)
    provider = FakeProvider()
    held: list[FakePort] = []

    async def open_port_forward(_pod: dict[str, Any], *, port: int) -> FakePort:
        port_session = FakePort()
        held.append(port_session)
        return port_session  # says nothing until the client sends: stays forwarding

    provider.open_port_forward = open_port_forward  # type: ignore[method-assign]
    async with _api(provider, creation_timeout=0.5) as server:
        client = await SpdyClient.connect(server, "/portForward/ns/web", "portforward.k8s.io")
        try:
            # Five half pairs: three wait for a partner, two are reset at once.
            for i in range(5):
                client.open(1 + 2 * i, "error", port="80", requestid=f"half-{i}")
            frames = [await client.frame() for _ in range(7)]  # 5 SYN_REPLY, 2 RST_STREAM
            resets = [f.stream_id for f in frames if isinstance(f, spdy.RstStream)]
            assert resets == [7, 9]
            await asyncio.sleep(1.0)  # the waiting halves time out
            # Three whole pairs: two forward, the third is refused on its error stream.
            stream_id = 11
            for i in range(3):
                client.open(stream_id, "error", port="80", requestid=f"whole-{i}")
                client.open(stream_id + 2, "data", port="80", requestid=f"whole-{i}")
                stream_id += 4
            got: list[spdy.Frame] = []
            async with asyncio.timeout(5):
                while b"refused" not in _data(got, 19):
                    frame = await client.frame()
                    assert frame is not None
                    got.append(frame)
        finally:
            await client.close()
    assert len(held) == 2, "no lower connection for the refused pair"
    assert b"already forwards 2 connections (at most 2)" in _data(got, 19)
