"""The WebSocket channel protocols of the virtual node's kubelet API, used directly (as Python
clients and UIs do when the apiserver passes their WebSocket through): exec with each
sub-protocol, stdin with the v5 CLOSE signal, exit codes, the legacy WebSocket port-forward,
refusals, and the idle timeout. The client holds the upper apiserver's kubelet client
certificate; everything behind the node is the real lower cluster.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import ssl
import struct
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from devcluster import cluster
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, phase, pod_manifest, wait_for

BINARY = ("v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io")
BASE64 = ("v4.base64.channel.k8s.io", "base64.channel.k8s.io")
STRUCTURED = ("v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io")


def _tls(fleet: Fleet) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(fleet.vnode.client_ca))
    client = fleet.upper.kubelet_client  # the upper apiserver's kubelet client certificate
    context.load_cert_chain(str(client.cert), str(client.key))
    return context


@dataclass
class Session:
    """What a channel session delivered: bytes per channel, the first message, and the
    WebSocket close code."""

    data: dict[int, bytes] = field(default_factory=dict)
    first: tuple[int, bytes] | None = None
    close_code: int | None = None

    def text(self, channel: int) -> str:
        return self.data.get(channel, b"").decode()


def _encode(protocol: str, channel: int, payload: bytes) -> bytes | str:
    if protocol in BASE64:
        return chr(ord("0") + channel) + base64.b64encode(payload).decode()
    return bytes([channel]) + payload


def _decode(protocol: str, message: aiohttp.WSMessage) -> tuple[int, bytes]:
    if protocol in BASE64:
        assert message.type == aiohttp.WSMsgType.TEXT, message
        text: str = message.data
        return ord(text[0]) - ord("0"), base64.b64decode(text[1:])
    assert message.type == aiohttp.WSMsgType.BINARY, message
    raw: bytes = message.data
    return raw[0], raw[1:]


async def _send(
    ws: aiohttp.ClientWebSocketResponse, protocol: str, channel: int, payload: bytes
) -> None:
    message = _encode(protocol, channel, payload)
    if isinstance(message, str):
        await ws.send_str(message)
    else:
        await ws.send_bytes(message)


async def _exec(
    fleet: Fleet,
    node: VirtualNodeProcess,
    path: str,
    *,
    protocol: str,
    stdin: bytes | None = None,
    close_stdin: bool = False,
) -> Session:
    session = Session()
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            f"https://{fleet.node_ip}:{node.kubelet_port}{path}",
            protocols=(protocol,),
            ssl=_tls(fleet),
            timeout=aiohttp.ClientWSTimeout(ws_close=10),
        ) as ws,
    ):
        assert ws.protocol == protocol
        if stdin is not None:
            await _send(ws, protocol, 0, stdin)
        if close_stdin:
            await ws.send_bytes(bytes([255, 0]))
        async with asyncio.timeout(30):
            async for message in ws:
                channel, payload = _decode(protocol, message)
                if session.first is None:
                    session.first = (channel, payload)
                session.data[channel] = session.data.get(channel, b"") + payload
        session.close_code = ws.close_code
    return session


def _command(namespace: str, pod: str, *args: str, stdin: bool = False) -> str:
    query = [("command", a) for a in args] + [("output", "1"), ("error", "1")]
    if stdin:
        query.append(("input", "1"))
    return f"/exec/{namespace}/{pod}/main?{urllib.parse.urlencode(query)}"


@pytest.mark.parametrize("protocol", [*BINARY, *BASE64])
async def test_exec_over_each_websocket_protocol(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str,
    running_pod: str, protocol: str,
) -> None:  # fmt: skip
    path = _command(namespace, running_pod, "sh", "-c", "echo hello; echo oops >&2; exit 3")
    got = await _exec(fleet, virtual_node, path, protocol=protocol)
    assert got.first == (1, b""), "the session opens with an empty message on stdout"
    assert got.text(1) == "hello\n"
    assert got.text(2) == "oops\n"
    if protocol in STRUCTURED:
        status = json.loads(got.data[3])
        assert status["status"] == "Failure"
        assert status["reason"] == "NonZeroExitCode"
        assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    else:
        assert "non-zero exit code" in got.text(3)
    assert got.close_code == aiohttp.WSCloseCode.OK


@pytest.mark.parametrize("protocol", STRUCTURED)
async def test_a_successful_exec_reports_success(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str,
    running_pod: str, protocol: str,
) -> None:  # fmt: skip
    path = _command(namespace, running_pod, "echo", "fine")
    got = await _exec(fleet, virtual_node, path, protocol=protocol)
    assert got.text(1) == "fine\n"
    assert json.loads(got.data[3])["status"] == "Success"


async def test_v5_stdin_and_its_end_reach_the_command(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    path = _command(namespace, running_pod, "sh", "-c", "wc -c; echo done", stdin=True)
    got = await _exec(
        fleet, virtual_node, path, protocol="v5.channel.k8s.io",
        stdin=b"x" * 100_000, close_stdin=True,
    )  # fmt: skip
    assert got.text(1).split() == ["100000", "done"]
    assert json.loads(got.data[3])["status"] == "Success"


async def test_base64_stdin_is_decoded(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    # Without a CLOSE signal the command cannot see the end of stdin: read one line.
    path = _command(namespace, running_pod, "sh", "-c", "read line; echo got $line", stdin=True)
    got = await _exec(
        fleet, virtual_node, path, protocol="v4.base64.channel.k8s.io", stdin=b"tensile\n"
    )
    assert got.text(1) == "got tensile\n"


@pytest.mark.parametrize("protocol", ["v4.channel.k8s.io", "v4.base64.channel.k8s.io", ""])
async def test_port_forward_over_the_legacy_websocket_protocol(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str,
    running_pod: str, protocol: str,
) -> None:  # fmt: skip
    # Two ports in one request: channels 0/1 for 8080, 2/3 for 9090 (kwok sends every pod
    # port to the fleet's forward target).
    codec = protocol or "channel.k8s.io"
    data: dict[int, bytes] = {}

    def answered(channel: int) -> bool:
        return data.get(channel, b"").endswith(cluster.FORWARD_TARGET_TEXT.encode())

    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            f"https://{fleet.node_ip}:{virtual_node.kubelet_port}"
            f"/portForward/{namespace}/{running_pod}?port=8080,9090",
            protocols=(protocol,) if protocol else (),
            ssl=_tls(fleet),
        ) as ws,
    ):
        for channel in (0, 2):
            await _send(ws, codec, channel, b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")
        async with asyncio.timeout(30):
            # The target answers and closes, but a forwarded connection over this protocol
            # ends with the WebSocket: a client closes it once it has what it wanted.
            while not (answered(0) and answered(2)):
                channel, payload = _decode(codec, await ws.receive())
                data[channel] = data.get(channel, b"") + payload
    for port, (data_channel, error_channel) in ((8080, (0, 1)), (9090, (2, 3))):
        assert data[data_channel][:2] == data[error_channel][:2] == struct.pack("<H", port)
        assert data[data_channel][2:].startswith(b"HTTP/1.")
        assert data[error_channel][2:] == b"", "no error on the error channel"


async def _refused_with(
    fleet: Fleet, node: VirtualNodeProcess, path: str, protocols: tuple[str, ...]
) -> int:
    """The HTTP status of a WebSocket handshake the node refuses."""
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(
                f"https://{fleet.node_ip}:{node.kubelet_port}{path}",
                protocols=protocols,
                ssl=_tls(fleet),
            )
        return info.value.status


async def test_refusals_are_the_kubelets(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    exec_path = _command(namespace, running_pod, "true")
    forward_path = f"/portForward/{namespace}/{running_pod}"
    for path, protocols, status in (
        # No sub-protocol in common: 403, as the kubelet's WebSocket handshake answers.
        (exec_path, ("v9.channel.k8s.io",), 403),
        (exec_path, ("v3.channel.k8s.io",), 403),  # a SPDY-only version
        (forward_path + "?port=8080", ("v5.channel.k8s.io",), 403),
        # A pod of another node; a port-forward without ports.
        ("/exec/kube-system/kube-apiserver/main?command=true&output=1", BINARY, 404),
        (forward_path, ("v4.channel.k8s.io",), 400),
    ):
        assert await _refused_with(fleet, virtual_node, path, protocols) == status, path


async def test_a_provider_error_after_the_upgrade_is_reported_on_the_error_channel(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    # The pod needs a ConfigMap that does not exist: the node holds it back, so it has no
    # lower pod and the session cannot start once the channels are up.
    upper = fleet.upper.rest()
    manifest = pod_manifest("held", node=virtual_node.name, spec={
        "volumes": [{"name": "cfg", "configMap": {"name": "absent"}}],
    })  # fmt: skip
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    create(upper, namespace, manifest)
    async with asyncio.timeout(30), aiohttp.ClientSession() as http:
        while True:  # until the node has the pod (bound to it, and seen by its informer)
            url = f"https://{fleet.node_ip}:{virtual_node.kubelet_port}/pods"
            async with http.get(url, ssl=_tls(fleet)) as response:
                names = [p["metadata"]["name"] for p in (await response.json())["items"]]
            if "held" in names:
                break
            await asyncio.sleep(0.2)
    for protocol in ("v4.channel.k8s.io", "channel.k8s.io"):
        got = await _exec(
            fleet, virtual_node, _command(namespace, "held", "true"), protocol=protocol
        )
        if protocol == "v4.channel.k8s.io":
            status = json.loads(got.data[3])
            assert (status["status"], status["reason"], status["code"]) == (
                "Failure", "InternalError", 500,
            )  # fmt: skip
            message = status["message"]
        else:
            message = got.text(3)
        assert "error executing command in container" in message
        assert "no pod in the lower cluster" in message


async def test_a_refusal_from_the_lower_cluster_reaches_the_client_with_its_message(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    # An ephemeral container added upstairs exists only there: the node lets the exec
    # through, and the lower apiserver refuses it with a Status naming the container.
    fleet.upper.rest().request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{running_pod}/ephemeralcontainers",
        body={"spec": {"ephemeralContainers": [
            {"name": "debugger", "image": "busybox", "targetContainerName": "main"},
        ]}},
        content_type="application/strategic-merge-patch+json",
    )  # fmt: skip
    path = _command(namespace, running_pod, "true").replace("/main?", "/debugger?")
    async with asyncio.timeout(30):
        while True:
            try:
                got = await _exec(fleet, virtual_node, path, protocol="v4.channel.k8s.io")
                break
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status != 404:  # 404: the node has not seen the new container yet
                    raise
                await asyncio.sleep(0.2)
    status = json.loads(got.data[3])
    assert status["reason"] == "InternalError"
    assert status["message"].startswith(
        "Internal error occurred: error executing command in container: "
    )
    assert "debugger" in status["message"]
    assert "is not valid for pod" in status["message"]


@pytest.fixture
def quick_idle_node(fleet: Fleet, tmp_path: Path) -> Iterator[VirtualNodeProcess]:
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-idle-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=["--streaming-connection-idle-timeout=2s"],
    )
    node.start()
    try:
        yield node
    finally:
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


async def test_an_idle_connection_is_closed(
    fleet: Fleet, quick_idle_node: VirtualNodeProcess, namespace: str
) -> None:
    upper = fleet.upper.rest()
    create(upper, namespace, pod_manifest("quiet", node=quick_idle_node.name))
    wait_for("Running", lambda: phase(upper, namespace, "quiet") == "Running")
    path = _command(namespace, "quiet", "sleep", "60")
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await _exec(fleet, quick_idle_node, path, protocol="v5.channel.k8s.io")
    elapsed = loop.time() - started
    assert 2 <= elapsed < 20, f"closed after {elapsed:.1f}s"
    assert got.close_code == aiohttp.WSCloseCode.OK
    assert 3 not in got.data, "an idle close is no command status"
