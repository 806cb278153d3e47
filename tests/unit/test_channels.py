"""The WebSocket channel protocols as pure functions: negotiation, framing, port-forward,
the channels of a session."""

from __future__ import annotations

import pytest

from tensile.kube import channel_framing as framing
from vnode.api import channels as ch


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        (["v5.channel.k8s.io,v4.channel.k8s.io"], "v5.channel.k8s.io"),
        (["v4.channel.k8s.io, v5.channel.k8s.io"], "v4.channel.k8s.io"),  # the client's order
        (["v9.channel.k8s.io", "base64.channel.k8s.io"], "base64.channel.k8s.io"),
        (["v4.base64.channel.k8s.io"], "v4.base64.channel.k8s.io"),
        (["channel.k8s.io"], "channel.k8s.io"),
        ([], ""),  # no sub-protocol: the binary v1 protocol, as a kubelet does
        ([" , "], ""),
    ],
)
def test_exec_negotiation_takes_the_first_offered_protocol_we_serve(
    offered: list[str], expected: str
) -> None:
    assert ch.negotiate(offered, supported=ch.EXEC_PROTOCOLS) == expected


def test_port_forward_serves_only_the_kubelets_legacy_set() -> None:
    supported = ch.PORT_FORWARD_PROTOCOLS
    assert ch.negotiate(["v4.base64.channel.k8s.io"], supported=supported) == (
        "v4.base64.channel.k8s.io"
    )
    assert ch.negotiate([], supported=supported) == ""
    for refused in ("v5.channel.k8s.io", "channel.k8s.io", "portforward.k8s.io"):
        with pytest.raises(ch.NoCommonProtocol, match=refused):
            ch.negotiate([refused], supported=supported)


def test_no_common_protocol_names_both_sides() -> None:
    with pytest.raises(ch.NoCommonProtocol) as info:
        ch.negotiate(["v9.channel.k8s.io"], supported=ch.EXEC_PROTOCOLS)
    assert "v9.channel.k8s.io" in str(info.value)
    assert "v5.channel.k8s.io" in str(info.value)


def test_what_each_protocol_carries() -> None:
    assert [p for p in ch.EXEC_PROTOCOLS if ch.structured_status(p)] == [
        "v5.channel.k8s.io",
        "v4.channel.k8s.io",
        "v4.base64.channel.k8s.io",
    ]
    assert [p for p in ch.EXEC_PROTOCOLS if framing.has_close_signal(p)] == ["v5.channel.k8s.io"]
    assert [p for p in ch.EXEC_PROTOCOLS if framing.Codec.of(p).base64] == [
        "v4.base64.channel.k8s.io",
        "base64.channel.k8s.io",
    ]


def test_binary_framing_is_a_channel_byte_then_the_payload() -> None:
    codec = framing.Codec.of("v5.channel.k8s.io")
    assert codec.encode(framing.STDOUT, b"hi") == b"\x01hi"
    assert codec.encode(framing.STDOUT, b"") == b"\x01"  # the "session is up" message
    assert codec.decode(b"\x00foo") == (framing.STDIN, b"foo")
    assert codec.decode(b"\xff\x00") == (framing.CLOSE, b"\x00")
    assert codec.decode("\x04{}") == (framing.RESIZE, b"{}")  # text frames read as bytes


def test_base64_framing_is_an_ascii_digit_then_base64() -> None:
    codec = framing.Codec.of("v4.base64.channel.k8s.io")
    assert codec.encode(framing.STDOUT, b"\n") == "1Cg=="
    assert codec.encode(framing.ERROR, b"") == "3"
    assert codec.decode("0Zm9vCg==") == (framing.STDIN, b"foo\n")
    assert codec.decode(b"4e30=") == (framing.RESIZE, b"{}")
    for data in (b"", b"\x00\xff binary \x80", bytes(range(256))):
        assert codec.decode(codec.encode(framing.STDERR, data)) == (framing.STDERR, data)


@pytest.mark.parametrize(
    ("protocol", "message", "error"),
    [
        ("channel.k8s.io", b"", "empty"),
        ("base64.channel.k8s.io", "", "empty"),
        ("base64.channel.k8s.io", "0not base64!", "bad base64"),
        ("base64.channel.k8s.io", "0Zm9", "bad base64"),  # missing padding
        ("base64.channel.k8s.io", "!Zm9v", "bad channel"),
    ],
)
def test_undecodable_messages_are_value_errors(
    protocol: str, message: bytes | str, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        framing.Codec.of(protocol).decode(message)


def test_the_close_signal_names_a_channel() -> None:
    assert framing.close_signal_target(b"\x00") == framing.STDIN
    assert framing.close_signal_target(b"") is None


def test_a_forwarded_port_opens_its_channels_little_endian() -> None:
    assert framing.port_prefix(8080) == b"\x90\x1f"
    assert framing.port_prefix(1) == b"\x01\x00"
    assert framing.port_prefix(65535) == b"\xff\xff"


def test_ports_come_repeated_or_comma_separated() -> None:
    assert ch.parse_ports(["8080"]) == (8080,)
    assert ch.parse_ports(["80,443", "9090"]) == (80, 443, 9090)
    assert len(ch.parse_ports([",".join(["80"] * 128)])) == 128


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ([], 'query parameter "port" is required'),
        ([""], "cannot be empty"),
        (["0"], "not a port"),
        (["65536"], "not a port"),
        (["80,x"], "'x' is not a port"),
        (["-1"], "not a port"),
        (["\uff18\uff10"], "not a port"),  # full-width digits are digits to str.isdigit
        ([",".join(["80"] * 129)], "at most 128 ports"),  # port 129 would need channel 257
    ],
)
def test_bad_ports_are_refused(values: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ch.parse_ports(values)


def test_exec_channels_follow_the_streams_of_the_session() -> None:
    layout = ch.exec_layout({"stdin", "stdout", "error", "resize"})
    assert {n: (s.kind, s.readable, s.greeting) for n, s in layout.items()} == {
        0: ("stdin", True, None),
        1: ("stdout", False, b""),  # the lowest channel written says the session is up
        3: ("error", False, None),
        4: ("resize", True, None),
    }
    plain = ch.exec_layout({"stderr", "error"})
    assert {n: s.greeting for n, s in plain.items()} == {2: b"", 3: None}
    assert {n: s.greeting for n, s in ch.exec_layout({"error"}).items()} == {3: b""}


def test_each_forwarded_port_gets_a_data_and_an_error_channel_paired_like_spdy() -> None:
    layout = ch.port_forward_layout([8080, 9090])
    assert {n: (s.kind, s.readable, s.greeting) for n, s in layout.items()} == {
        0: ("data", True, b"\x90\x1f"),
        1: ("error", False, b"\x90\x1f"),
        2: ("data", True, b"\x82\x23"),
        3: ("error", False, b"\x82\x23"),
    }
    assert layout[0].headers == layout[1].headers == {"port": "8080", "requestid": "0"}
    assert layout[2].headers == layout[3].headers == {"port": "9090", "requestid": "1"}
