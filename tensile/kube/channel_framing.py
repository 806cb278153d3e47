"""The framing of Kubernetes' WebSocket stream protocols (`channel.k8s.io` family), pure.

Shared by the two ends tensile speaks: the kubelet API serves these protocols to the upper
apiserver (`vnode.api.channels` negotiates and lays out the channels), and the k2k provider
speaks them as a client to the lower apiserver (`vnode.providers.k2k.streams`). The facts
come from apimachinery's wsstream and the kubelet's cri/streaming packages.

Every WebSocket message carries one channel's bytes. Binary protocols prefix the payload
with the channel number as one byte; `base64` protocols send text messages made of the
channel number as an ASCII digit ('0' + n) followed by the payload in standard base64.
Version 5 adds a CLOSE signal: the binary message `[255, n]` ends channel n (a client's
stdin EOF).

exec/attach channels: 0 stdin, 1 stdout, 2 stderr, 3 error (the status), 4 resize.
port-forward channels: for the i-th port of the request, 2i data and 2i+1 error; the
server first writes the port (uint16, little-endian) on both.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
"""exec/attach channel numbers."""
CLOSE = 255
"""v5 only: `[CLOSE, n]` half-closes channel n."""
PORT_DATA, PORT_ERROR = 0, 1
"""port-forward channel numbers of the first (or only) port of a request."""
PORT_PREFIX_BYTES = 2
"""Bytes of the port that open each port-forward channel (uint16, little-endian)."""

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
V4_BASE64 = "v4.base64.channel.k8s.io"
V1_BASE64 = "base64.channel.k8s.io"
V1 = "channel.k8s.io"
NONE = ""
"""What a client that names no sub-protocol gets: the binary v1 protocol (kubelet)."""


def binary_frame(channel: int, data: bytes) -> bytes:
    """Return the message of a binary protocol carrying `data` on `channel` (0-255)."""
    return bytes((channel,)) + data


def has_close_signal(protocol: str) -> bool:
    """Tell whether the protocol has the CLOSE signal (v5)."""
    return protocol == V5


def close_signal(channel: int) -> bytes:
    """Return the v5 message that half-closes `channel` (0-255)."""
    return bytes((CLOSE, channel))


def close_signal_target(payload: bytes) -> int | None:
    """Return the channel a v5 CLOSE message's payload names, or None if it names none."""
    return payload[0] if payload else None


def port_prefix(port: int) -> bytes:
    """Return the two bytes that open both channels of a forwarded port (uint16 LE)."""
    return struct.pack("<H", port)


@dataclass(frozen=True, kw_only=True)
class Codec:
    """How messages of one negotiated sub-protocol are framed."""

    base64: bool
    """True: text messages, ASCII channel digit + base64 payload; False: binary."""

    @classmethod
    def of(cls, protocol: str) -> Codec:
        """Return the codec of a negotiated sub-protocol."""
        return cls(base64=protocol in (V4_BASE64, V1_BASE64))

    def encode(self, channel: int, data: bytes) -> bytes | str:
        """Return the message carrying `data` on `channel` (str: send as a text message)."""
        if self.base64:
            return chr(ord("0") + channel) + base64.b64encode(data).decode("ascii")
        return binary_frame(channel, data)

    def decode(self, message: bytes | str) -> tuple[int, bytes]:
        """Return (channel, payload) of a received message, text or binary alike.

        Raises ValueError for an empty message, a bad channel character or bad base64.
        """
        raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
        if not raw:
            raise ValueError("empty message")
        if not self.base64:
            return raw[0], raw[1:]
        channel = raw[0] - ord("0")
        if not 0 <= channel <= 255:
            raise ValueError(f"bad channel character {raw[:1]!r}")
        try:
            return channel, base64.b64decode(raw[1:], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"bad base64 payload on channel {channel}: {exc}") from exc
