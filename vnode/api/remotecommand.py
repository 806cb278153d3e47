"""exec and attach over SPDY/3.1 or a WebSocket channel protocol, bridged to the provider's
remote session: one session, run by `streaming.serve` on either transport.

Kubelet semantics (pkg/kubelet/server, cri/streaming/remotecommand): the query names the
streams (`input`, `output`, `error`, `tty`; exec also `command`, repeated). Over SPDY the
client offers sub-protocols in `X-Stream-Protocol-Version`, we take the first we serve,
and after the 101 the client opens one stream per stdio channel plus `error` (and `resize`
with a tty on v3+). Over WebSocket the sub-protocol comes from `Sec-WebSocket-Protocol`
and the channels exist from the start; the server first sends an empty message on the
lowest channel it writes (stdout, else stderr, else error). Only once the streams exist is
the command started below; when it ends, stdout and stderr are finished, the status is
written to the error stream (v4+: a JSON Status, whose ExitCode cause becomes kubectl's
exit code; older: the message text, nothing on success), and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web

from tensile.kube import channel_framing as framing
from tensile.kube.channel_framing import ERROR, RESIZE, STDERR, STDIN, STDOUT
from vnode import provider_errors
from vnode.api import channels, streaming
from vnode.api.streaming import STREAM_CREATION_TIMEOUT, ChannelStream, Connection
from vnode.provider import RemoteCommand, RemoteSession

logger = logging.getLogger(__name__)

V3, V2 = "v3.channel.k8s.io", "v2.channel.k8s.io"  # SPDY only
PROTOCOLS = (framing.V5, framing.V4, V3, V2, framing.V1)
"""The SPDY sub-protocols of exec/attach, ours first."""
SPDY_WITHOUT_RESIZE = frozenset({V2, framing.V1})
"""SPDY sub-protocols that have no resize stream (it came with v3); every WebSocket
channel protocol has a resize channel."""
FIRST_SIZE_WAIT = 1.0
"""Seconds a terminal command waits for the client's first size before it starts anyway."""
MAX_RESIZE_PENDING = 4096
"""Bytes of resize data that may be parsed at once (what waits for the end of an object
included); beyond it the resize stream is dropped: memory and parsing stay bounded."""

OpenSession = Callable[[], Awaitable[RemoteSession]]


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
        options = dataclasses.replace(options, stderr=False)
    return options


def negotiate(offered: Sequence[str]) -> str:
    """Return the first offered sub-protocol we serve. Raises RequestError (400, 403)."""
    wanted = channels.header_values(offered)
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

    v4 and v5 clients (SPDY or WebSocket, binary or base64) get the JSON Status as it is;
    older ones the message of a failure and nothing on success.
    """
    if channels.structured_status(protocol):
        return payload
    try:
        status = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(status, dict) and status.get("status") == "Failure":
        return str(status.get("message", "")).encode()
    return b""


def failure_status(message: str) -> bytes:
    """Return an InternalError metav1.Status (code 500) saying `message`, as JSON bytes:
    what a kubelet writes when its runtime cannot run the session."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "code": 500,
    }
    return json.dumps(status).encode()


def take_sizes(pending: str) -> tuple[list[dict[str, int]], str]:
    """Split the resize stream's text `pending` into the complete terminal sizes it starts
    with (`{"Width":w,"Height":h}`, re-encoded with just those two keys) and what is left of
    a size not complete yet.

    Raises ValueError for a complete JSON value that is not a size of two integers in
    0-65535 (the kubelet decodes a TerminalSize of two uint16 and stops reading the stream
    at the first that fails). Linear in `pending`: parsing goes by index, never by copying
    what is left after each object.
    """
    decoder = json.JSONDecoder()
    sizes: list[dict[str, int]] = []
    index, end = 0, len(pending)
    while True:
        while index < end and pending[index] in " \t\r\n":
            index += 1
        if index == end:
            return sizes, ""
        try:
            value, after = decoder.raw_decode(pending, index)
        except RecursionError:
            raise ValueError("a terminal size is a flat JSON object, got deep nesting") from None
        except ValueError:
            return sizes, pending[index:]  # wait for the rest of the object
        sizes.append(_terminal_size(value, text=pending[index:after]))
        index = after


def _terminal_size(value: object, *, text: str) -> dict[str, int]:
    if isinstance(value, dict):
        width, height = value.get("Width", 0), value.get("Height", 0)
        if all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 0xFFFF
            for n in (width, height)
        ):
            return {"Width": width, "Height": height}
    raise ValueError(f"a terminal size is {{Width, Height}} in 0-65535, got {text[:80]!r}")


def stream_kinds(options: RemoteCommand, *, resize: bool = True) -> frozenset[str]:
    """Return the kinds of stream an exec/attach session for `options` has: error, the
    stdio streams it asked for, and resize with a terminal where the protocol has one
    (`resize`)."""
    kinds = {"error"}
    if options.stdin:
        kinds.add("stdin")
    if options.stdout:
        kinds.add("stdout")
    if options.stderr:
        kinds.add("stderr")
    if options.tty and resize:
        kinds.add("resize")
    return frozenset(kinds)


async def serve(
    request: web.Request,
    *,
    transport: streaming.Transport,
    open_session: OpenSession,
    attach: bool,
    idle_timeout: float,
    creation_timeout: float = STREAM_CREATION_TIMEOUT,
) -> web.StreamResponse:
    """Upgrade `request` over `transport`, wait (`creation_timeout` seconds) for the
    client's streams (`transport.kinds`), then start the session (`open_session`) and
    bridge them until it ends, the client leaves, or the connection idles for
    `idle_timeout` seconds (<= 0: no limit)."""

    async def session(connection: Connection) -> None:
        streams = await _streams(connection, kinds=transport.kinds, timeout=creation_timeout)
        if streams is None:
            return
        async with asyncio.TaskGroup() as group:
            late = group.create_task(_discard_late(connection), name="exec-late-streams")
            await _run(
                streams, open_session=open_session, protocol=transport.protocol, attach=attach
            )
            late.cancel()

    return await streaming.serve(
        request,
        transport=transport,
        session=session,
        idle_timeout=idle_timeout,
        name="attach" if attach else "exec",
    )


async def _discard_late(connection: Connection) -> None:
    """Discard the streams a client opens once the session runs: nobody reads them, and
    unread data on one would pause reading for the whole connection."""
    while (stream := await connection.accept()) is not None:
        stream.discard()


async def _streams(
    connection: Connection, *, kinds: frozenset[str], timeout: float
) -> dict[str, ChannelStream] | None:
    """Return one stream of each of `kinds` once the client opened them all, or None if it
    leaves first or does not open them within `timeout` seconds."""
    streams: dict[str, ChannelStream] = {}
    try:
        async with asyncio.timeout(timeout):
            while not kinds <= set(streams):
                stream = await connection.accept()
                if stream is None:
                    return None
                if stream.kind not in kinds or stream.kind in streams:
                    # Unasked-for or repeated: never read, so it must not hold data back.
                    stream.discard()
                    continue
                streams[stream.kind] = stream
    except TimeoutError:
        logger.info("kubelet API: exec streams not created in %.0fs", timeout)
        return None
    return streams


async def _run(
    streams: Mapping[str, ChannelStream],
    *,
    open_session: OpenSession,
    protocol: str,
    attach: bool,
) -> None:
    """Start the session now that the client's streams exist, and bridge them to it."""
    sizes = _TerminalSizes(streams["resize"]) if "resize" in streams else None
    first_sizes: list[dict[str, int]] = []
    if sizes is not None:
        # kubectl sends the terminal's size as soon as the streams exist; a command started
        # before it arrives would see a 0x0 terminal (`stty size`, full-screen programs).
        try:
            async with asyncio.timeout(FIRST_SIZE_WAIT):
                first_sizes = await sizes.next() or []
        except TimeoutError:
            pass
        except ValueError as exc:
            logger.info("kubelet API: dropping a resize stream: %s", exc)
            sizes.stream.discard()
            sizes = None
    what = "attaching to container" if attach else "executing command in container"
    try:
        # Bounded: the lower side may accept the connection and never answer the upgrade.
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT):
            session = await open_session()
    except Exception as exc:  # whatever it is, the client gets a status
        # As a kubelet whose runtime fails: an InternalError status, after the upgrade.
        if isinstance(exc, TimeoutError):
            reason = f"the lower cluster did not start it in {STREAM_CREATION_TIMEOUT:.0f}s"
        elif isinstance(exc, provider_errors.ProviderError):
            reason = str(exc)
        else:
            logger.warning("kubelet API: opening a lower session failed", exc_info=exc)
            reason = f"{type(exc).__name__}: {exc}"
        status = failure_status(f"Internal error occurred: error {what}: {reason}")
        await _finish(streams, protocol=protocol, status=status)
        return
    try:
        await _bridge(
            streams, session=session, protocol=protocol, sizes=sizes, first_sizes=first_sizes
        )
    finally:
        await session.close()


class _TerminalSizes:
    """The terminal sizes a resize stream carries, read as they complete."""

    def __init__(self, stream: ChannelStream) -> None:
        self.stream = stream
        self._pending = ""

    async def next(self) -> list[dict[str, int]] | None:
        """Return the next complete sizes, or None once the stream ended. Raises ValueError
        for a value that is not a size, or more than MAX_RESIZE_PENDING bytes at once (a
        size is some 30 bytes; a client sending megabytes of them would only make us parse
        and forward what a terminal never needs). Safe to cancel: its only wait is the
        stream's read, which loses nothing when cancelled."""
        while True:
            sizes, self._pending = take_sizes(self._pending)
            if sizes:
                return sizes
            data = await self.stream.read()
            if not data:
                return None
            if len(self._pending) + len(data) > MAX_RESIZE_PENDING:
                raise ValueError(f"over {MAX_RESIZE_PENDING} bytes of resize data at once")
            self._pending += data.decode("utf-8", errors="replace")


async def _bridge(
    streams: Mapping[str, ChannelStream],
    *,
    session: RemoteSession,
    protocol: str,
    sizes: _TerminalSizes | None,
    first_sizes: list[dict[str, int]],
) -> None:
    async def pump_stdin(stream: ChannelStream) -> None:
        # The command may end (and its session close) while stdin still streams: stop
        # quietly; the status tells how it ended.
        with contextlib.suppress(Exception):
            while data := await stream.read():
                await session.send(STDIN, data)
            await session.close_stdin()
        stream.discard()

    async def pump_resize(sizes: _TerminalSizes) -> None:
        found: list[dict[str, int]] | None = first_sizes
        try:
            while found is not None:
                if found:  # sizes that came together: only the last one still holds
                    await session.send(RESIZE, json.dumps(found[-1]).encode())
                found = await sizes.next()
        except ValueError as exc:
            logger.info("kubelet API: dropping a resize stream: %s", exc)
        sizes.stream.discard()

    async with asyncio.TaskGroup() as group:
        inputs = []
        if "stdin" in streams:
            inputs.append(group.create_task(pump_stdin(streams["stdin"]), name="exec-stdin"))
        if sizes is not None:
            inputs.append(group.create_task(pump_resize(sizes), name="exec-resize"))
        status: bytes | None = None
        while (message := await session.receive()) is not None:
            channel, data = message
            if channel == STDOUT and "stdout" in streams:
                await streams["stdout"].write(data)
            elif channel == STDERR and "stderr" in streams:
                await streams["stderr"].write(data)
            elif channel == ERROR:
                # The backend's Status is small; a runaway error channel is cut, not held.
                status = ((status or b"") + data)[: channels.STATUS_LIMIT]
        # Ended with no word from the backend (its connection dropped): never let that read
        # as success.
        await _finish(
            streams,
            protocol=protocol,
            status=status
            or failure_status("the command's session in the lower cluster ended without a status"),
        )
        for task in inputs:
            task.cancel()
    for stream in streams.values():
        stream.discard()


async def _finish(streams: Mapping[str, ChannelStream], *, protocol: str, status: bytes) -> None:
    """End the output streams, then write the status (as `protocol` wants it) and end the
    error stream: the client returns once all of them ended."""
    for name in ("stdout", "stderr"):
        if name in streams:
            await streams[name].close()
    payload = status_for(protocol, status)
    if payload:
        await streams["error"].write(payload)
    await streams["error"].close()
