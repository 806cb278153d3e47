"""SPDY/3.1 frames, as kube-apiserver and kubectl speak them to a kubelet (SPDY draft 3.1).

Kubernetes uses SPDY for exec, attach and port-forward between the apiserver and nodes.
Only framing matters (no HTTP semantics, no server push, no flow control: the Go side
ignores WINDOW_UPDATE and SETTINGS). Header blocks are zlib-compressed with the SPDY/3
dictionary, with ONE compression context per direction for the whole connection, so a
`FrameReader` and a `FrameWriter` each live as long as their connection.

`FrameReader.feed(bytes)` returns the complete frames (and keeps a partial one); malformed
input raises ProtocolError, after which the connection must be closed.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
MAX_FRAME = 16 * 1024 * 1024 - 1
"""The 24-bit length field's limit."""
MAX_HEADER_BLOCK = 256 * 1024
"""Refuse header blocks that inflate beyond this (a zlib bomb)."""

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = (
    1,
    2,
    3,
    4,
    6,
    7,
    8,
    9,
)
FLAG_FIN = 0x01
RST_PROTOCOL_ERROR, RST_INVALID_STREAM, RST_REFUSED_STREAM, RST_CANCEL = 1, 2, 3, 5


def _dictionary() -> bytes:
    # The SPDY/3 header dictionary: length-prefixed tokens, then a raw tail (1423 bytes;
    # zlib checks its Adler-32, 0xe3c6a7c2, on every connection).
    tokens = (  # noqa: SIM905 - kept as the spec lists them, one run of text
        "options head post put delete trace accept accept-charset accept-encoding "
        "accept-language accept-ranges age allow authorization cache-control connection "
        "content-base content-encoding content-language content-length content-location "
        "content-md5 content-range content-type date etag expect expires from host if-match "
        "if-modified-since if-none-match if-range if-unmodified-since last-modified location "
        "max-forwards pragma proxy-authenticate proxy-authorization range referer retry-after "
        "server te trailer transfer-encoding upgrade user-agent vary via warning "
        "www-authenticate method get status"
    ).split()
    tokens += ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive"]
    tokens += ["origin"]
    tail = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417"
        "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
        "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct "
        "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
        "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,"
        "publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
    )
    return b"".join(struct.pack(">I", len(t)) + t.encode() for t in tokens) + tail.encode()


DICTIONARY = _dictionary()


class ProtocolError(Exception):
    """The peer sent something that is not SPDY/3.1; close the connection."""


Headers = dict[str, list[str]]
"""Header names (lower-case) to their values (SPDY joins several values with NUL)."""


@dataclass(frozen=True)
class SynStream:
    stream_id: int
    headers: Headers
    flags: int = 0
    associated_id: int = 0
    priority: int = 0


@dataclass(frozen=True)
class SynReply:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    flags: int = 0


@dataclass(frozen=True)
class Headers_:
    stream_id: int
    headers: Headers
    flags: int = 0


@dataclass(frozen=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True)
class Settings:
    entries: tuple[tuple[int, int, int], ...]
    """(flags, id, value) triples."""
    flags: int = 0


@dataclass(frozen=True)
class Ping:
    ping_id: int


@dataclass(frozen=True)
class GoAway:
    last_good_stream_id: int
    status: int = 0


@dataclass(frozen=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class Data:
    stream_id: int
    data: bytes
    flags: int = 0

    @property
    def fin(self) -> bool:
        """Whether this is the sender's last frame on the stream."""
        return bool(self.flags & FLAG_FIN)


Frame = SynStream | SynReply | Headers_ | RstStream | Settings | Ping | GoAway | WindowUpdate | Data


class FrameReader:
    """Decodes the frames of one connection direction (keeps the inflater and a partial frame)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflater = zlib.decompressobj(zdict=DICTIONARY)

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return the frames now complete. Raises ProtocolError."""
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= 8:
            length = int.from_bytes(self._buffer[5:8], "big")
            if len(self._buffer) < 8 + length:
                break
            head = bytes(self._buffer[:8])
            body = bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            frames.append(self._decode(head, body))
        return frames

    def _decode(self, head: bytes, body: bytes) -> Frame:
        flags = head[4]
        if not head[0] & 0x80:
            stream_id = int.from_bytes(head[:4], "big") & 0x7FFFFFFF
            return Data(stream_id=stream_id, data=body, flags=flags)
        version = int.from_bytes(head[:2], "big") & 0x7FFF
        if version != VERSION:
            raise ProtocolError(f"unsupported SPDY version {version}")
        kind = int.from_bytes(head[2:4], "big")
        try:
            return self._control(kind, flags, body)
        except (struct.error, IndexError) as exc:
            raise ProtocolError(f"truncated control frame of type {kind}") from exc

    def _control(self, kind: int, flags: int, body: bytes) -> Frame:  # noqa: PLR0911 - a dispatch
        if kind == SYN_STREAM:
            stream_id, associated = struct.unpack(">II", body[:8])
            return SynStream(
                stream_id=stream_id & 0x7FFFFFFF,
                associated_id=associated & 0x7FFFFFFF,
                priority=body[8] >> 5,
                flags=flags,
                headers=self._headers(body[10:]),
            )
        if kind == SYN_REPLY:
            (stream_id,) = struct.unpack(">I", body[:4])
            return SynReply(
                stream_id=stream_id & 0x7FFFFFFF, flags=flags, headers=self._headers(body[4:])
            )
        if kind == HEADERS:
            (stream_id,) = struct.unpack(">I", body[:4])
            return Headers_(
                stream_id=stream_id & 0x7FFFFFFF, flags=flags, headers=self._headers(body[4:])
            )
        if kind == RST_STREAM:
            stream_id, status = struct.unpack(">II", body[:8])
            return RstStream(stream_id=stream_id & 0x7FFFFFFF, status=status)
        if kind == SETTINGS:
            (count,) = struct.unpack(">I", body[:4])
            if len(body) != 4 + 8 * count:
                raise ProtocolError("SETTINGS length does not match its entry count")
            entries = []
            for i in range(count):
                word, value = struct.unpack(">II", body[4 + 8 * i : 12 + 8 * i])
                entries.append((word >> 24, word & 0xFFFFFF, value))
            return Settings(entries=tuple(entries), flags=flags)
        if kind == PING:
            (ping_id,) = struct.unpack(">I", body[:4])
            return Ping(ping_id=ping_id)
        if kind == GOAWAY:
            last, status = struct.unpack(">II", body[:8])
            return GoAway(last_good_stream_id=last & 0x7FFFFFFF, status=status)
        if kind == WINDOW_UPDATE:
            stream_id, delta = struct.unpack(">II", body[:8])
            return WindowUpdate(stream_id=stream_id & 0x7FFFFFFF, delta=delta & 0x7FFFFFFF)
        raise ProtocolError(f"unknown control frame type {kind}")

    def _headers(self, block: bytes) -> Headers:
        try:
            raw = self._inflater.decompress(block, MAX_HEADER_BLOCK + 1)
        except zlib.error as exc:
            raise ProtocolError(f"bad header block: {exc}") from exc
        if len(raw) > MAX_HEADER_BLOCK or self._inflater.unconsumed_tail:
            raise ProtocolError("header block too large")
        return parse_header_block(raw)


def parse_header_block(raw: bytes) -> Headers:
    """Parse an uncompressed name/value block. Raises ProtocolError."""
    try:
        (count,) = struct.unpack(">I", raw[:4])
        offset = 4
        headers: Headers = {}
        for _ in range(count):
            (size,) = struct.unpack(">I", raw[offset : offset + 4])
            name = raw[offset + 4 : offset + 4 + size]
            offset += 4 + size
            (size,) = struct.unpack(">I", raw[offset : offset + 4])
            value = raw[offset + 4 : offset + 4 + size]
            offset += 4 + size
            if offset > len(raw) or not name:
                raise ProtocolError("truncated header block")
            key = name.decode("latin-1").lower()
            headers.setdefault(key, []).extend(value.decode("latin-1").split("\x00"))
    except struct.error as exc:
        raise ProtocolError("truncated header block") from exc
    return headers


class FrameWriter:
    """Encodes the frames of one connection direction (keeps the deflater)."""

    def __init__(self) -> None:
        self._deflater = zlib.compressobj(zdict=DICTIONARY)

    def encode(self, frame: Frame) -> bytes:  # noqa: PLR0911 - a dispatch
        """Return the wire bytes of `frame`."""
        if isinstance(frame, Data):
            if len(frame.data) > MAX_FRAME:
                raise ValueError("DATA payload too large for one frame")
            return struct.pack(">IB", frame.stream_id & 0x7FFFFFFF, frame.flags) + (
                len(frame.data).to_bytes(3, "big") + frame.data
            )
        if isinstance(frame, SynStream):
            body = struct.pack(
                ">IIBB", frame.stream_id, frame.associated_id, (frame.priority & 7) << 5, 0
            ) + self._block(frame.headers)
            return _control(SYN_STREAM, frame.flags, body)
        if isinstance(frame, SynReply):
            return _control(
                SYN_REPLY,
                frame.flags,
                struct.pack(">I", frame.stream_id) + self._block(frame.headers),
            )
        if isinstance(frame, Headers_):
            return _control(
                HEADERS,
                frame.flags,
                struct.pack(">I", frame.stream_id) + self._block(frame.headers),
            )
        if isinstance(frame, RstStream):
            return _control(RST_STREAM, 0, struct.pack(">II", frame.stream_id, frame.status))
        if isinstance(frame, Settings):
            body = struct.pack(">I", len(frame.entries)) + b"".join(
                struct.pack(">II", (f << 24) | i, v) for f, i, v in frame.entries
            )
            return _control(SETTINGS, frame.flags, body)
        if isinstance(frame, Ping):
            return _control(PING, 0, struct.pack(">I", frame.ping_id))
        if isinstance(frame, GoAway):
            return _control(GOAWAY, 0, struct.pack(">II", frame.last_good_stream_id, frame.status))
        return _control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id, frame.delta))

    def _block(self, headers: Headers) -> bytes:
        raw = struct.pack(">I", len(headers))
        for name, values in headers.items():
            key = name.lower().encode("latin-1")
            value = "\x00".join(values).encode("latin-1")
            raw += struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value
        return self._deflater.compress(raw) + self._deflater.flush(zlib.Z_SYNC_FLUSH)


def _control(kind: int, flags: int, body: bytes) -> bytes:
    return struct.pack(">HHB", 0x8000 | VERSION, kind, flags) + len(body).to_bytes(3, "big") + body
