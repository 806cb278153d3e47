"""One HTTPS server component for every program that serves its callers over HTTPS (the
webhook, the scheduler extender, the kubelet API): the socket, the aiohttp runner, the
certificate from a `tls.TlsSource`, `--metrics-addr`, readiness and a graceful stop, as a
`tensile.serving.lifecycle.Component`. The program brings its application and its source.

Life:
- `start()`: the port is bound (a busy one fails the start), the TLS context is made with
  the client CA (an unreadable CA fails the start), the application runner is set up,
  `--metrics-addr` serves the same /metrics, /healthz and /readyz over plain HTTP, and a
  certificate at hand (files) is loaded (one that cannot be fails the start). Every failure
  is a StartupError naming the flag to fix.
- The port listens once a certificate is there and the informers its calls are judged
  against (`wait_for`) have synced: at start with files and nothing to wait for, otherwise
  in `run()`, maybe hours later (a CSR waits for its approval). Until then a client is
  refused at once (the socket is bound, not listening: `sockets.bound_socket`).
- `run()`: the source keeps the certificate current, beside its informers and the
  `background` ones (which calls wait for by themselves), as owned, named tasks.
- `shut_down()`: `/readyz` fails at once; a server that served answers calls for
  `shutdown_delay` more (endpoints take a moment to stop sending them), then stops
  listening, and calls in flight get `shutdown_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web

from tensile.kube.informer import Informer
from tensile.serving import endpoints, runners
from tensile.serving.bootstrap import SecretSettings
from tensile.serving.lifecycle import StartupError
from tensile.serving.sockets import bound_socket
from tensile.serving.tls import FILE_CHECK_INTERVAL, CertificateFiles, RotatingTls, TlsSource

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
"""aiohttp's own bound of a request body."""


@dataclass(frozen=True, kw_only=True)
class FlagNames:
    """How a program's command line names a server's settings, so that a message says
    which one to fix."""

    port: str = "--port"
    cert_file: str = "--tls-cert-file"
    key_file: str = "--tls-private-key-file"
    client_ca_file: str = "--client-ca-file"
    metrics_addr: str = "--metrics-addr"


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Where and how an HTTPS server serves; durations in seconds."""

    address: str = "0.0.0.0"  # noqa: S104 - its callers reach it from wherever they run
    """Listen address."""
    port: int = 8443
    """Listen port."""
    cert_file: str = ""
    """The serving certificate's file (with `key_file`), reloaded when it changes; "": the
    certificate comes from `secret`, or from the program's own source."""
    key_file: str = ""
    """Its private key's file."""
    secret: SecretSettings | None = None
    """Where a certificate is bootstrapped when there are no files (None: no bootstrap)."""
    resync: float = 60.0
    """Seconds between two checks of the certificate's source (files: every
    FILE_CHECK_INTERVAL seconds, or this if shorter)."""
    client_ca_file: str = ""
    """Callers' client certificates are verified against this CA ("": none asked for)."""
    require_client_certificate: bool = True
    """With `client_ca_file`: every caller must present one (a port only the apiserver or
    kube-scheduler calls); False: verified when presented (a kubelet, whose bearer-token
    callers must still connect)."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest request body accepted; larger gets 413."""
    metrics_addr: str = ""
    """host:port of a plain-HTTP /metrics, /healthz, /readyz as well ("": none)."""
    shutdown_delay: float = 0.0
    """Seconds calls are still answered after a stop was asked, not ready."""
    shutdown_timeout: float = 5.0
    """Seconds calls in flight get to finish after that."""
    flags: FlagNames = FlagNames()
    """How the command line names these settings."""

    @property
    def from_files(self) -> bool:
        """Whether the certificate comes from files."""
        return bool(self.cert_file)


def certificate_files(settings: ServerSettings, *, label: str) -> CertificateFiles:
    """Return the source of `settings`' certificate files (`label` prefixes its log lines
    and messages)."""
    return CertificateFiles(
        cert_file=settings.cert_file,
        key_file=settings.key_file,
        cert_flag=settings.flags.cert_file,
        key_flag=settings.flags.key_file,
        interval=min(FILE_CHECK_INTERVAL, settings.resync),
        label=label,
    )


@dataclass(frozen=True, kw_only=True)
class _Bound:
    """What `start` claimed."""

    sock: socket.socket
    port: int
    """The port bound (the one chosen when the settings say 0)."""
    app_runner: web.AppRunner
    tls: RotatingTls


class HttpsServer:
    """Serves an aiohttp application over HTTPS, as a `Component` (see the module
    docstring)."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        app: web.Application,
        tls: TlsSource,
        name: str,
        label: str,
        health: endpoints.Health | None = None,
        wait_for: Sequence[Informer] = (),
        background: Sequence[Informer] = (),
        routes: str = "",
    ) -> None:
        """Serve `app` (its routes, /healthz, /readyz and /metrics among them, are the
        program's) with the certificate of `tls`.

        `name` names the component and its tasks ("webhook"); `label` prefixes log lines
        and messages ("kubelet API"); `health` holds the readiness checks of /readyz (this
        adds "shutdown" first; the program adds its own, `not_serving` among them);
        `wait_for` are the informers that must have synced before the port listens (calls
        are judged against them), `background` informers that run beside the server
        (calls wait for them by themselves); `routes` ends the "serving" log line."""
        self.name = name
        self._settings = settings
        self._app = app
        self._source = tls
        self._label = label
        self._wait_for = tuple(wait_for)
        self._background = tuple(background)
        self._routes = routes
        self.health = health if health is not None else endpoints.Health()
        self.health.add_check("shutdown", lambda: "shutting down" if self._stopping else None)
        self._stack = contextlib.AsyncExitStack()
        self._bound: _Bound | None = None
        self._started = False
        self._may_listen = not self._wait_for
        self._certified = False
        self._listening = False
        self._stopping = False
        self._failed = False
        self._stop_asked = asyncio.Event()
        self._drained = asyncio.Event()

    def informers(self) -> Sequence[Informer]:
        """`wait_for`: the port listens only once they have synced."""
        return self._wait_for

    @property
    def port(self) -> int:
        """The port bound (the one chosen when the settings say 0). Only once started."""
        assert self._bound is not None  # started
        return self._bound.port

    async def start(self) -> None:
        """Bind the port, load the client CA, set up the application, serve
        `--metrics-addr`, load a certificate at hand. Raises StartupError naming what
        failed (nothing stays claimed then)."""
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        self._started = True

    async def _start(self) -> None:
        settings, flags, label = self._settings, self._settings.flags, self._label
        try:
            sock = bound_socket(settings.address, settings.port)
        except OSError as exc:
            raise StartupError(
                f"{label}: cannot listen on {settings.address}:{settings.port} "
                f"({flags.port}): {exc}"
            ) from exc
        # Closed already once served (aiohttp owns it then); never served: ours to close.
        self._stack.callback(sock.close)
        try:
            tls = RotatingTls(
                client_ca_file=settings.client_ca_file,
                serve=self._certificate_ready,
                require_client_certificate=settings.require_client_certificate,
                name=label,
            )
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(
                f"{label}: cannot load the client CA file {flags.client_ca_file}="
                f"{settings.client_ca_file}: {exc}"
            ) from exc
        app_runner = runners.app_runner(self._app, shutdown_timeout=settings.shutdown_timeout)
        await app_runner.setup()
        # Stops listening, then waits for calls in flight: before the socket is closed.
        self._stack.push_async_callback(app_runner.cleanup)
        port = int(sock.getsockname()[1])
        self._bound = _Bound(sock=sock, port=port, app_runner=app_runner, tls=tls)
        try:
            await self._stack.enter_async_context(
                endpoints.metrics_server(settings.metrics_addr, health=self.health)
            )
        except OSError as exc:
            raise StartupError(
                f"{label}: cannot serve {flags.metrics_addr}={settings.metrics_addr}: {exc}"
            ) from exc
        await self._source.load(tls)

    def ready(self) -> bool:
        """Whether it is set up and not stopping (it may still wait for a certificate or
        for `wait_for`: `not_serving` says)."""
        return self._started and not self._stopping

    def not_serving(self) -> str | None:
        """A readiness check: None once the port listens with a certificate."""
        if self._listening:
            return None
        if not self._certified:
            return "no serving certificate yet"
        return "the HTTPS port is not listening yet"

    async def run(self) -> None:
        """Listen once a certificate is there, keep it current, until `shut_down` has
        drained. Raises StartupError when the port cannot listen, and what the source's
        `keep` raises."""
        assert self._bound is not None  # started
        tls = self._bound.tls
        try:
            self._may_listen = True
            if self._certified and not self._listening:
                await self._listen()
            async with asyncio.TaskGroup() as group:
                informers = [
                    group.create_task(i.run(), name=f"informer-{i.name}")
                    for i in (*self._background, *self._source.informers())
                ]
                keep = group.create_task(self._source.keep(tls), name=f"{self.name}-certificate")
                await self._stop_asked.wait()
                keep.cancel()  # no new certificate while stopping
                await self._drained.wait()  # calls answered meanwhile read the caches
                for task in informers:
                    task.cancel()
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._failed = True  # nothing to drain: no delay before the stop
            raise

    async def shut_down(self) -> None:
        """Fail `/readyz`; a server that served answers calls for the shutdown delay more;
        then stop listening and give calls in flight the shutdown timeout."""
        self._stopping = True
        self._stop_asked.set()
        served = self._listening and not self._failed
        delay = self._settings.shutdown_delay
        if served and delay > 0:
            logger.info(
                "%s: stopping: not ready; answering calls for %.1fs more", self._label, delay
            )
            await asyncio.sleep(delay)
        await self._stack.aclose()
        if served:
            logger.info("%s: stopped", self._label)
        self._drained.set()

    async def _certificate_ready(self, _context: ssl.SSLContext) -> None:
        """`RotatingTls`' serve: the first certificate is in the context."""
        self._certified = True
        if self._may_listen and not self._stopping:
            await self._listen()

    async def _listen(self) -> None:
        bound = self._bound
        assert bound is not None  # started
        settings = self._settings
        try:
            await web.SockSite(bound.app_runner, bound.sock, ssl_context=bound.tls.context).start()
        except OSError as exc:
            raise StartupError(
                f"{self._label}: cannot serve on {settings.address}:{settings.port}: {exc}"
            ) from exc
        self._listening = True
        logger.info(
            "%s on https://%s:%s%s", self._label, settings.address, settings.port, self._routes
        )


@contextlib.asynccontextmanager
async def serving(server: HttpsServer) -> AsyncIterator[HttpsServer]:
    """Serve with `server` for the body of an `async with`, for a program whose other parts
    end by themselves (the descheduler's one round) and so cannot share a `lifecycle.Runner`
    with a server that runs until stopped: `start()` on entry (raises its StartupError),
    `run()` as an owned task named after it, and on exit `shut_down()` and that task awaited
    (what it raised is raised then)."""
    await server.start()
    task: asyncio.Task[None] | None = None
    try:
        task = asyncio.create_task(server.run(), name=server.name)
        yield server
    finally:
        await server.shut_down()
        if task is not None:
            await task
