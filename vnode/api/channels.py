"""The WebSocket channel protocols of the kubelet API, as pure functions (no I/O).

What the kubelet end decides: which sub-protocol a client gets, which channels a session
has and what each carries first, the ports a port-forward asks for. The framing itself
(channel numbers, protocol names, the codecs) is `tensile.kube.channel_framing`, shared with
the provider's client end.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tensile.kube.channel_framing import (
    ERROR,
    NONE,
    RESIZE,
    STDERR,
    STDIN,
    STDOUT,
    V1,
    V1_BASE64,
    V4,
    V4_BASE64,
    V5,
    port_prefix,
)

STATUS_LIMIT = 64 * 1024
"""Bytes of a backend's error channel (its exec Status) kept at most."""

EXEC_PROTOCOLS = (V5, V4, V4_BASE64, V1_BASE64, V1, NONE)
"""Sub-protocols of exec/attach: the kubelet's (v1 to v4, binary and base64) plus v5."""
PORT_FORWARD_PROTOCOLS = (V4, V4_BASE64, NONE)
"""Sub-protocols of the legacy WebSocket port-forward (kubelet portforward/websocket.go)."""


class NoCommonProtocol(ValueError):
    """The client offers no sub-protocol the endpoint serves (a kubelet answers 403)."""


def header_values(values: Sequence[str]) -> list[str]:
    """Split header `values` (each possibly a comma-separated list) into their non-empty
    items, in order: how protocol offers arrive in X-Stream-Protocol-Version and
    Sec-WebSocket-Protocol."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def parse_port(text: str) -> int:
    """Parse one port number. Raises ValueError unless it is ASCII digits for 1-65535."""
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise ValueError(f"{text!r} is not a port (1-65535)")
    return int(text)


def negotiate(offered: Sequence[str], *, supported: Sequence[str]) -> str:
    """Return the first sub-protocol of the client's `Sec-WebSocket-Protocol` values
    (`offered`, each possibly comma-separated) that is in `supported`.

    A client that offers nothing gets "" (the binary v1 protocol) if `supported` has it,
    as the kubelet's wsstream handshake does. Raises NoCommonProtocol otherwise.
    """
    wanted = header_values(offered)
    for protocol in wanted or [NONE]:
        if protocol in supported:
            return protocol
    shown = ", ".join(p for p in supported if p)
    raise NoCommonProtocol(
        f"none of the offered WebSocket sub-protocols is supported: "
        f"{', '.join(wanted) or '(none)'}; supported: {shown}"
    )


def structured_status(protocol: str) -> bool:
    """Tell whether the error channel carries a JSON Status (v4, v5) rather than the text
    of a failure (older protocols)."""
    return protocol in (V5, V4, V4_BASE64)


MAX_PORTS = 128
"""Ports one WebSocket port-forward may carry: port i uses channels 2i and 2i+1, and a
channel number is one byte."""


def parse_ports(values: Sequence[str]) -> tuple[int, ...]:
    """Parse the `port` query values of a WebSocket port-forward (each may be a comma-
    separated list) into ports 1-65535, in order. Raises ValueError with the kubelet's kind
    of message when there is none, one is empty, one is not a port, or there are more than
    MAX_PORTS."""
    if not values:
        raise ValueError('query parameter "port" is required')
    ports: list[int] = []
    for value in values:
        if not value:
            raise ValueError('query parameter "port" cannot be empty')
        ports.extend(parse_port(text) for text in value.split(","))
    if len(ports) > MAX_PORTS:
        raise ValueError(f"at most {MAX_PORTS} ports per request, got {len(ports)}")
    return tuple(ports)


@dataclass(frozen=True, kw_only=True)
class ChannelSpec:
    """A channel of a WebSocket session: its role, whether the client's data on it is
    read, what the server sends on it first, and the headers a SPDY stream in the same
    role would have been opened with."""

    kind: str
    """"stdin", "stdout", ..., or "data" / "error" for port-forward."""
    readable: bool
    greeting: bytes | None = None
    """Sent on the channel as the connection opens (None: nothing): exec's empty "the
    session is up" message, port-forward's port prefix."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Port-forward: `port` and `requestid`, so pairs form as over SPDY."""


_EXEC_CHANNELS = {
    "stdin": STDIN,
    "stdout": STDOUT,
    "stderr": STDERR,
    "error": ERROR,
    "resize": RESIZE,
}


def exec_layout(kinds: Collection[str]) -> dict[int, ChannelSpec]:
    """Return the channels of a WebSocket exec/attach whose session has streams `kinds`
    (of stdin, stdout, stderr, error, resize): stdin and resize are read; the lowest
    channel the server writes gets the empty message that tells the client the session
    is up (kubelet remotecommand/websocket.go)."""
    numbers = sorted(_EXEC_CHANNELS[kind] for kind in kinds)
    written = [n for n in numbers if n in (STDOUT, STDERR, ERROR)]
    kind_of = {n: kind for kind, n in _EXEC_CHANNELS.items()}
    return {
        n: ChannelSpec(
            kind=kind_of[n],
            readable=n in (STDIN, RESIZE),
            greeting=b"" if written and n == written[0] else None,
        )
        for n in numbers
    }


def port_forward_layout(ports: Sequence[int]) -> dict[int, ChannelSpec]:
    """Return the channels of a WebSocket port-forward: for the i-th port, data (read) on
    2i and error on 2i+1, both opened by the port's two-byte prefix, and both carrying
    the port and request id i, as the streams of one SPDY pair would."""
    layout: dict[int, ChannelSpec] = {}
    for i, port in enumerate(ports):
        headers = {"port": str(port), "requestid": str(i)}
        prefix = port_prefix(port)
        layout[2 * i] = ChannelSpec(kind="data", readable=True, greeting=prefix, headers=headers)
        layout[2 * i + 1] = ChannelSpec(
            kind="error", readable=False, greeting=prefix, headers=headers
        )
    return layout
