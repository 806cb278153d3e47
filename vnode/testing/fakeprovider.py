"""A provider whose backend is the test: it records what the kubelet API asks of it and
answers as scripted.

`FakeProvider` plays the roles the kubelet API needs (`vnode.provider.LogsProvider`,
`ExecProvider`, `PortForwardProvider`, `MetricsProvider`), so a test can start the API
(`vnode.api.server.make_app`) over it without a cluster below. Faults a real backend cannot
produce on demand (a session that never ends, a backend that is down) are one attribute
away. Single event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tensile.contracts.objects import Obj
from vnode import provider_errors
from vnode.provider import (
    ExecProvider,
    LogsProvider,
    MetricsProvider,
    NodeUsage,
    PortForwardProvider,
    PortSession,
    RemoteCommand,
    RemoteSession,
)


class FakeSession(RemoteSession):
    """A command in the fake backend: keeps what it was sent, says what the test queues.

    `output` holds (channel, bytes) messages and then None, the command's end; a session
    made with `ended=False` waits for the test to put them (`output.put_nowait`), and never
    ends by itself. Once it returned None, `receive` keeps returning None.
    """

    def __init__(self, output: Iterable[tuple[int, bytes]] = (), *, ended: bool = False) -> None:
        self.output: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        for message in output:
            self.output.put_nowait(message)
        if ended:
            self.output.put_nowait(None)
        self.sent: list[tuple[int, bytes]] = []
        """Every (channel, bytes) the API sent, in order (stdin, resize)."""
        self.stdin_closed = False
        self.closed = False
        self._ended = False

    async def send(self, channel: int, data: bytes) -> None:
        self.sent.append((channel, data))

    async def close_stdin(self) -> None:
        self.stdin_closed = True

    async def receive(self) -> tuple[int, bytes] | None:
        if self._ended:
            return None
        message = await self.output.get()
        self._ended = message is None
        return message

    async def close(self) -> None:
        self.closed = True
        self.output.put_nowait(None)


class FakePort(PortSession):
    """A forwarded connection that answers the first bytes it gets, upper-cased, and ends."""

    def __init__(self) -> None:
        self._echo: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def send(self, data: bytes) -> None:
        self._echo.put_nowait(data.upper())
        self._echo.put_nowait(None)

    async def receive(self) -> bytes | None:
        return await self._echo.get()

    def error(self) -> str:
        return ""

    async def close(self) -> None:
        self._echo.put_nowait(None)


@dataclass(frozen=True, kw_only=True)
class ExecCall:
    """One `open_exec` call, as the API made it."""

    pod: Obj
    container: str
    options: RemoteCommand
    attach: bool


class FakeProvider(LogsProvider, ExecProvider, PortForwardProvider, MetricsProvider):
    """The kubelet API's provider roles, scripted by the test through its attributes.

    - exec and attach: every `open_exec` is recorded in `execs` and sets `opened`; it raises
      `exec_error` if set, otherwise returns a new `FakeSession` (also kept in `sessions`)
      that plays `script` and ends, or, with `script` None, waits for the test to feed it.
    - port-forward: a `FakePort` per connection; ports in `refused_ports` raise
      `ProviderError` ("nothing listens on PORT").
    - logs: the chunks of `logs[container]`; a container not in `logs` raises `NotFound`.
    - metrics: `usage` (no pods, nothing measured, complete, unless set).
    """

    def __init__(
        self,
        *,
        script: Sequence[tuple[int, bytes]] | None = None,
        refused_ports: Iterable[int] = (),
    ) -> None:
        self.script = script
        """What each new exec session says before it ends; None: the test feeds it."""
        self.exec_error: Exception | None = None
        """Raised by `open_exec` while set (e.g. `NotFound`, `BackendUnavailable`)."""
        self.execs: list[ExecCall] = []
        self.sessions: list[FakeSession] = []
        self.opened = asyncio.Event()
        """Set by the first `open_exec` call (before `exec_error` is raised)."""
        self.refused_ports = set(refused_ports)
        self.logs: dict[str, list[bytes]] = {}
        self.usage = NodeUsage(pods=(), node=None, complete=True)

    async def open_exec(
        self, pod: Obj, *, container: str, options: RemoteCommand, attach: bool
    ) -> FakeSession:
        self.execs.append(ExecCall(pod=pod, container=container, options=options, attach=attach))
        self.opened.set()
        if self.exec_error is not None:
            raise self.exec_error
        ended = self.script is not None
        session = FakeSession(self.script or (), ended=ended)
        self.sessions.append(session)
        return session

    async def open_port_forward(self, pod: Obj, *, port: int) -> FakePort:
        if port in self.refused_ports:
            raise provider_errors.ProviderError(f"nothing listens on {port}")
        return FakePort()

    async def container_logs(
        self, pod: Obj, *, container: str, options: Mapping[str, str]
    ) -> AsyncGenerator[bytes, None]:
        if container not in self.logs:
            raise provider_errors.PodNotFound(f"container {container!r} has no log here")
        for chunk in self.logs[container]:
            yield chunk

    async def resource_usage(self) -> NodeUsage:
        return self.usage
