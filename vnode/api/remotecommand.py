"""exec and attach over SPDY/3.1, bridged to the provider's remote session.

Kubelet semantics (pkg/kubelet/server, apimachinery remotecommand): the query names the
streams (`input`, `output`, `error`, `tty`; exec also `command`, repeated); the client
offers sub-protocols in `X-Stream-Protocol-Version` and we take the first we serve; after
the 101 the client opens one stream per stdio channel plus `error` (and `resize` with a
tty on v3+); when the command ends, stdout and stderr are finished, the status is written
to the error stream (v4+: a JSON Status, whose ExitCode cause becomes kubectl's exit code;
older: the message text, nothing on success), and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence

from aiohttp import web

from vnode.api.spdy_session import SpdyConnection, Stream, upgrade
from vnode.provider import RemoteCommand, RemoteSession

logger = logging.getLogger(__name__)

PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)
STREAM_CREATION_TIMEOUT = 30.0
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4


class RequestError(ValueError):
    """A bad exec/attach request; `status` is the HTTP status (400, 403)."""

    def __init__(
        self, message: str, *, status: int = 400, headers: Mapping[str, str] | None = None
    ):
        self.status = status
        self.headers = dict(headers or {})
        super().__init__(message)


def parse(query: Mapping[str, str], commands: Sequence[str], *, exec_: bool) -> RemoteCommand:
    """Parse the kubelet's exec/attach query. Raises RequestError (400)."""

    def flag(name: str) -> bool:
        return query.get(name, "").lower() in ("1", "true")

    options = RemoteCommand(
        command=tuple(commands),
        stdin=flag("input"),
        stdout=flag("output"),
        stderr=flag("error"),
        tty=flag("tty"),
    )
    if exec_ and not options.command:
        raise RequestError("command is required")
    if not (options.stdin or options.stdout or options.stderr):
        raise RequestError("you must specify at least one of stdin, stdout, stderr")
    if options.tty and options.stderr:
        # A terminal merges stderr into stdout; a kubelet drops the stderr stream.
        options = RemoteCommand(
            command=options.command,
            stdin=options.stdin,
            stdout=options.stdout,
            stderr=False,
            tty=True,
        )
    return options


def negotiate(offered: Sequence[str]) -> str:
    """Return the first offered sub-protocol we serve. Raises RequestError (400, 403)."""
    wanted = [p.strip() for value in offered for p in value.split(",") if p.strip()]
    if not wanted:
        raise RequestError("missing X-Stream-Protocol-Version")
    for protocol in wanted:
        if protocol in PROTOCOLS:
            return protocol
    raise RequestError(
        f"none of the offered protocols is supported: {', '.join(wanted)}",
        status=403,
        headers={"X-Accepted-Stream-Protocol-Versions": ", ".join(PROTOCOLS)},
    )


def status_for(protocol: str, payload: bytes) -> bytes:
    """Return what the error stream carries for a backend status (v4 JSON Status).

    v4 and v5 clients get the JSON Status as it is; older ones the message of a failure
    and nothing on success.
    """
    if protocol in ("v4.channel.k8s.io", "v5.channel.k8s.io"):
        return payload
    try:
        status = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(status, dict) and status.get("status") == "Failure":
        return str(status.get("message", "")).encode()
    return b""


async def serve_spdy(
    request: web.Request, *, protocol: str, options: RemoteCommand, session: RemoteSession
) -> web.StreamResponse:
    """Upgrade `request` to SPDY/3.1 and bridge its streams to `session` until it ends."""
    connection = None
    try:
        connection = await upgrade(request, protocol=protocol)
        streams = await _streams(connection, options=options, protocol=protocol)
        if streams is not None:
            await _bridge(streams, session=session, protocol=protocol)
    finally:
        await session.close()
        if connection is not None:
            connection.close()
    assert connection.response is not None
    return connection.response


async def _streams(
    connection: SpdyConnection, *, options: RemoteCommand, protocol: str
) -> dict[str, Stream] | None:
    expected = {"error"}
    if options.stdin:
        expected.add("stdin")
    if options.stdout:
        expected.add("stdout")
    if options.stderr:
        expected.add("stderr")
    if options.tty and protocol not in {"channel.k8s.io", "v2.channel.k8s.io"}:
        expected.add("resize")
    streams: dict[str, Stream] = {}
    try:
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT):
            while not expected <= set(streams):
                stream = await connection.accept()
                if stream is None:
                    return None
                streams[stream.kind] = stream
    except TimeoutError:
        logger.info("kubelet API: exec streams not created in %.0fs", STREAM_CREATION_TIMEOUT)
        return None
    return streams


async def _bridge(streams: dict[str, Stream], *, session: RemoteSession, protocol: str) -> None:
    async def pump_stdin(stream: Stream) -> None:
        # The command may end (and its session close) while stdin still streams: stop
        # quietly; the status tells how it ended.
        with contextlib.suppress(Exception):
            while data := await stream.read():
                await session.send(STDIN, data)
            await session.close_stdin()
        stream.discard()

    async def pump_resize(stream: Stream) -> None:
        decoder = json.JSONDecoder()
        buffer = ""
        while data := await stream.read():
            buffer += data.decode("utf-8", errors="replace")
            while buffer.strip():
                try:
                    size, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # wait for the rest of the object
                buffer = buffer.lstrip()[end:]
                await session.send(RESIZE, json.dumps(size).encode())

    async with asyncio.TaskGroup() as group:
        inputs = []
        if "stdin" in streams:
            inputs.append(group.create_task(pump_stdin(streams["stdin"]), name="exec-stdin"))
        if "resize" in streams:
            inputs.append(group.create_task(pump_resize(streams["resize"]), name="exec-resize"))
        status: bytes | None = None
        while (message := await session.receive()) is not None:
            channel, data = message
            if channel == STDOUT and "stdout" in streams:
                await streams["stdout"].write(data)
            elif channel == STDERR and "stderr" in streams:
                await streams["stderr"].write(data)
            elif channel == ERROR:
                status = (status or b"") + data
        for name in ("stdout", "stderr"):
            if name in streams:
                await streams[name].close()
        if not status:
            # Ended with no word from the backend (its connection dropped): never let that
            # read as success.
            status = json.dumps(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "reason": "InternalError",
                    "code": 500,
                    "message": "the command's session in the lower cluster ended without a status",
                }
            ).encode()
        payload = status_for(protocol, status)
        if payload:
            await streams["error"].write(payload)
        await streams["error"].close()
        for task in inputs:
            task.cancel()
    for stream in streams.values():
        stream.discard()
