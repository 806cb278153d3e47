"""A TCP proxy a test or a benchmark can freeze: the network between one process and an
apiserver cut on demand, as a partition that drops packets (connections stay open, nothing
arrives, nothing is refused), while every other process still reaches that apiserver
directly.

It runs its own event loop in a thread, so a synchronous test and an asyncio one use it
alike. TLS passes through untouched: a client verifies the apiserver's certificate as
usual, for an address the certificate names (the fleet's serving certificates name
127.0.0.1, where the proxy listens).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.parse
from collections.abc import Callable

from devcluster import ports

_CHUNK = 64 * 1024


class FreezableProxy:
    """Forwards 127.0.0.1:`port` to the server of `target` (an https:// URL); `freeze()`
    stops forwarding in both directions (bytes read are held, new connections are accepted
    and left waiting), `thaw()` resumes. Use as a context manager (`close()` after)."""

    def __init__(self, target: str) -> None:
        parsed = urllib.parse.urlsplit(target)
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"the target needs a host and a port, got {target!r}")
        self._target = (parsed.hostname, parsed.port)
        self.port = ports.pick()
        self.url = f"{parsed.scheme}://127.0.0.1:{self.port}"
        """Where clients connect instead of `target`."""
        self._loop = asyncio.new_event_loop()
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(started,), name="freezable-proxy", daemon=True
        )
        self._thread.start()
        if not started.wait(timeout=10):
            raise RuntimeError("the proxy did not start")

    def __enter__(self) -> FreezableProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def freeze(self) -> None:
        """Stop forwarding (at once: what is in flight stays where it is)."""
        self._call(lambda event: event.clear())

    def thaw(self) -> None:
        """Forward again, what was held first."""
        self._call(lambda event: event.set())

    def close(self) -> None:
        """Close every connection and stop the thread."""
        if self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._shut(), self._loop)
        future.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _call(self, change: Callable[[asyncio.Event], None]) -> None:
        done = threading.Event()

        def apply() -> None:
            assert self._open is not None
            change(self._open)
            done.set()

        self._loop.call_soon_threadsafe(apply)
        if not done.wait(timeout=10):
            raise RuntimeError("the proxy did not answer")

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._open = asyncio.Event()
            self._open.set()
            self._server = await asyncio.start_server(self._connected, "127.0.0.1", self.port)

        self._loop.run_until_complete(listen())
        started.set()
        self._loop.run_forever()

    async def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        assert self._open is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            await self._open.wait()  # frozen: a new connection goes nowhere
            upstream_reader, upstream = await asyncio.open_connection(*self._target)
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(reader, upstream))
                group.create_task(self._pump(upstream_reader, writer))
        except (OSError, ExceptionGroup):
            pass  # either side went away: so does the connection
        except asyncio.CancelledError:
            # Closed by `close`: the handler ends normally, since on Python 3.11
            # start_server's done-callback asks a cancelled handler for its exception,
            # which raises and logs a traceback per connection.
            pass
        finally:
            self._tasks.discard(task)
            for side in (writer, upstream):
                if side is not None:
                    await _close(side)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        assert self._open is not None
        while data := await source.read(_CHUNK):
            await self._open.wait()
            sink.write(data)
            await sink.drain()
        sink.close()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, asyncio.CancelledError):
        await writer.wait_closed()
