"""The SPDY/3.1 codec against frames written by an independent implementation.

The vectors below were written, in this order and over one compression context, by the Go
framer kube-apiserver and kubectl use (github.com/moby/spdystream v0.5.1, spdy.Framer).
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vnode.api import spdy

GO_FRAMES = [
    (
        "syn_stream_error",
        "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a6800000000ffff",
    ),
    ("syn_stream_stdout", "800300010000001900000003000000000000c22ac5565c92925f5a02000000ffff"),
    (
        "syn_stream_data_port",
        "800300010100003d0000000500000000000002e50a48b15d04ce21160616060c0c0c9c459068ce04257f4690087b856e6e694e4926b8b86548c2300f546a2502000000ffff",
    ),
    ("syn_reply", "800300020000000e000000016260606000000000ffff"),
    ("data_fin", "000000030100000668656c6c6f0a"),
    ("data_empty_fin", "0000000101000000"),
    ("ping", "800300060000000400000007"),
    ("goaway", "80030007000000080000000500000000"),
    ("rst_stream", "80030003000000080000000300000005"),
    ("window_update", "80030009000000080000000300010000"),
    ("settings", "800300040000000c000000010000000700040000"),
    ("headers", "80030008000000150000000382dac656a19b03c9478c8600000000ffff"),
]


def _decoded() -> dict[str, spdy.Frame]:
    reader = spdy.FrameReader()
    out: dict[str, spdy.Frame] = {}
    for name, hexed in GO_FRAMES:
        frames = reader.feed(bytes.fromhex(hexed))
        assert len(frames) == 1, name
        out[name] = frames[0]
    return out


def test_the_dictionary_is_the_spdy3_one() -> None:
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2


def test_go_frames_decode() -> None:
    frames = _decoded()
    assert frames["syn_stream_error"] == spdy.SynStream(
        stream_id=1, headers={"streamtype": ["error"]}
    )
    assert frames["syn_stream_stdout"] == spdy.SynStream(
        stream_id=3, headers={"streamtype": ["stdout"]}
    )
    data_port = frames["syn_stream_data_port"]
    assert isinstance(data_port, spdy.SynStream)
    assert data_port.flags == spdy.FLAG_FIN
    assert data_port.headers == {
        "streamtype": ["data"],
        "port": ["8080"],
        "requestid": ["0"],
        "x-multi": ["a", "b"],
    }
    assert frames["syn_reply"] == spdy.SynReply(stream_id=1, headers={})
    assert frames["data_fin"] == spdy.Data(stream_id=3, data=b"hello\n", flags=spdy.FLAG_FIN)
    assert frames["data_empty_fin"] == spdy.Data(stream_id=1, data=b"", flags=spdy.FLAG_FIN)
    assert frames["ping"] == spdy.Ping(ping_id=7)
    assert frames["goaway"] == spdy.GoAway(last_good_stream_id=5, status=0)
    assert frames["rst_stream"] == spdy.RstStream(stream_id=3, status=spdy.RST_CANCEL)
    assert frames["window_update"] == spdy.WindowUpdate(stream_id=3, delta=65536)
    assert frames["settings"] == spdy.Settings(entries=((0, 7, 262144),))
    assert frames["headers"] == spdy.Headers_(stream_id=3, headers={"x-late": ["1"]})


def test_frames_arriving_in_pieces_decode_the_same() -> None:
    wire = b"".join(bytes.fromhex(h) for _, h in GO_FRAMES)
    reader = spdy.FrameReader()
    frames = []
    for i in range(0, len(wire), 7):
        frames += reader.feed(wire[i : i + 7])
    assert frames == list(_decoded().values())


def test_our_frames_round_trip_over_one_context() -> None:
    writer, reader = spdy.FrameWriter(), spdy.FrameReader()
    sent: list[spdy.Frame] = [
        spdy.SynReply(stream_id=1, headers={}),
        spdy.SynStream(stream_id=2, headers={"streamtype": ["stdout"]}, flags=spdy.FLAG_FIN),
        spdy.Data(stream_id=3, data=b"x" * 70000, flags=spdy.FLAG_FIN),
        spdy.Headers_(stream_id=3, headers={"a": ["1", "2"]}),
        spdy.Ping(ping_id=9),
        spdy.GoAway(last_good_stream_id=7),
        spdy.RstStream(stream_id=3, status=spdy.RST_PROTOCOL_ERROR),
        spdy.Settings(entries=((1, 4, 100),)),
        spdy.WindowUpdate(stream_id=1, delta=5),
    ]
    wire = b"".join(writer.encode(f) for f in sent)
    assert reader.feed(wire) == sent


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (bytes.fromhex("8002000100000000"), "unsupported SPDY version 2"),
        (bytes.fromhex("8003000500000000"), "unknown control frame type 5"),
        (bytes.fromhex("800300010000000200ff"), "truncated control frame"),
        (bytes.fromhex("80030001000000120000000100000000000078f9deadbeef0000"), "bad header block"),
        (bytes.fromhex("800300040000000400000002"), "SETTINGS length"),
    ],
)
def test_malformed_frames_are_protocol_errors(wire: bytes, message: str) -> None:
    with pytest.raises(spdy.ProtocolError, match=message):
        spdy.FrameReader().feed(wire)


def test_a_zlib_bomb_is_refused() -> None:
    raw = b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01a" + (4 * 1024 * 1024).to_bytes(4, "big")
    raw += b"b" * 4 * 1024 * 1024
    deflater = zlib.compressobj(zdict=spdy.DICTIONARY)
    block = deflater.compress(raw) + deflater.flush(zlib.Z_SYNC_FLUSH)
    frame = (
        b"\x80\x03\x00\x02\x00" + (4 + len(block)).to_bytes(3, "big") + b"\x00\x00\x00\x01" + block
    )
    with pytest.raises(spdy.ProtocolError, match="too large"):
        spdy.FrameReader().feed(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_reader(data: bytes) -> None:
    try:
        spdy.FrameReader().feed(data)
    except spdy.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12),
        st.lists(
            st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
            min_size=1,
            max_size=3,
        ),
        max_size=6,
    )
)
def test_any_headers_round_trip(headers: dict[str, list[str]]) -> None:
    frame = spdy.SynStream(stream_id=1, headers=headers)
    assert spdy.FrameReader().feed(spdy.FrameWriter().encode(frame)) == [frame]
