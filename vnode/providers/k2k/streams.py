"""The provider's client end of the lower apiserver's WebSocket streams (exec, attach,
port-forward): adapters from an open `aiohttp` WebSocket to the sessions of
`vnode.provider` (`RemoteSession`, `PortSession`).

The framing is `tensile.kube.channel_framing`, the same the kubelet API serves upstairs; the
provider offers only binary protocols (v5 and v4 for exec, v4 for port-forward), so every
message is one channel byte and its payload.
"""

from __future__ import annotations

import contextlib

import aiohttp

from tensile.kube import channel_framing as framing

EXEC_PROTOCOLS = (framing.V5, framing.V4)
"""What the provider offers the lower apiserver for exec/attach, best first."""
PORT_FORWARD_PROTOCOLS = (framing.V4,)
"""What the provider offers the lower apiserver for port-forward."""

_ENDED = (
    aiohttp.WSMsgType.CLOSE,
    aiohttp.WSMsgType.CLOSED,
    aiohttp.WSMsgType.CLOSING,
    aiohttp.WSMsgType.ERROR,
)


class ChannelSession:
    """A command running below, over the WebSocket channel protocol (v4 or v5): a
    `vnode.provider.RemoteSession`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """`ws` is open, with a binary protocol negotiated (one of EXEC_PROTOCOLS)."""
        self._ws = ws
        self._v5 = framing.has_close_signal(ws.protocol or "")

    async def send(self, channel: int, data: bytes) -> None:
        """Send `data` on `channel`; a connection already gone drops it (the session's
        end is reported by `receive`)."""
        if not self._ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._ws.send_bytes(framing.binary_frame(channel, data))

    async def close_stdin(self) -> None:
        """Half-close stdin: v5's CLOSE signal; v4 cannot, as with kubectl itself."""
        if self._v5 and not self._ws.closed:
            await self._ws.send_bytes(framing.close_signal(framing.STDIN))

    async def receive(self) -> tuple[int, bytes] | None:
        """Return the next (channel, payload), or None once the WebSocket has ended."""
        while True:
            message = await self._ws.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                data = bytes(message.data)
                if len(data) > 1:
                    return data[0], data[1:]
                continue  # an empty message only says the session is up
            if message.type in _ENDED:
                return None

    async def close(self) -> None:
        """Close the WebSocket."""
        await self._ws.close()


class PortChannels:
    """One forwarded connection over the WebSocket port-forward protocol: a
    `vnode.provider.PortSession`. The data channel carries the bytes, the error channel
    the error; each channel first carries the port (PORT_PREFIX_BYTES), dropped here."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """`ws` is open, forwarding one port (PORT_FORWARD_PROTOCOLS)."""
        self._ws = ws
        self._started: set[int] = set()
        self._error = b""

    async def send(self, data: bytes) -> None:
        """Send `data` to the port; a connection already gone drops it."""
        if not self._ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._ws.send_bytes(framing.binary_frame(framing.PORT_DATA, data))

    async def receive(self) -> bytes | None:
        """Return the next bytes from the port, or None once the WebSocket has ended (the
        error channel's text, if any, is then in `error()`)."""
        while True:
            message = await self._ws.receive()
            if message.type != aiohttp.WSMsgType.BINARY:
                return None
            data = bytes(message.data)
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel not in self._started:
                self._started.add(channel)
                payload = payload[framing.PORT_PREFIX_BYTES :]
            if channel == framing.PORT_DATA and payload:
                return payload
            if channel == framing.PORT_ERROR:
                self._error += payload

    def error(self) -> str:
        """Return what the error channel carried, as text."""
        return self._error.decode("utf-8", errors="replace")

    async def close(self) -> None:
        """Close the WebSocket."""
        await self._ws.close()
