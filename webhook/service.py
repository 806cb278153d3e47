"""One webhook process: informers, the serving certificate and the HTTPS server; start
order; graceful stop.

Start: the listen port is bound at once (a busy one fails the start), the informers start
listing, the certificate is loaded (files) or bootstrapped (Secret, retried while the
apiserver is away), and only then does the port listen: the apiserver never meets a
webhook without a certificate. `/readyz` says ready once the caches have listed and a
certificate is served. Stop (SIGTERM): `/readyz` fails at once, calls are still answered for
`shutdown_delay` seconds (endpoints take a moment to stop sending them), then the server
closes and in-flight calls get `shutdown_timeout` seconds. The server is a
`tensile.serving.lifecycle.Component` run by a `lifecycle.Runner`, as every program's parts
are; every task is named, owned by a TaskGroup and awaited.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Sequence

from aiohttp import web

from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.informer import Informer
from tensile.serving import endpoints, lifecycle, runners
from tensile.serving.lifecycle import StartupError
from tensile.serving.sockets import bound_socket
from webhook.caches import Caches
from webhook.server import Admission, make_app
from webhook.settings import Settings
from webhook.tls import ServingTls, TlsError

logger = logging.getLogger(__name__)


class Webhook:
    """Runs the webhook until `stop()` or cancellation."""

    def __init__(self, settings: Settings, *, upper: ConnectionInfo) -> None:
        self.settings = settings
        self._upper = upper
        # The caches do not hold the server back (calls wait for them, `Admission`), so
        # nothing bounds their first list: the webhook stays up, not ready, until they list.
        self._runner = lifecycle.Runner(
            startup_timeout=0, shutdown_timeout=settings.server.shutdown_timeout
        )

    def stop(self) -> None:
        """Ask `run` to stop gracefully (safe from a signal handler)."""
        self._runner.stop()

    async def run(self) -> None:
        """Serve until `stop()`. Raises StartupError (see the module docstring)."""
        server = self.settings.server
        try:
            sock = bound_socket(server.address, server.port)
        except OSError as exc:
            raise StartupError(f"cannot listen on {server.address}:{server.port}: {exc}") from exc
        with sock:
            async with ApiClient(
                self._upper, name="upper", qps=20.0, burst=40, user_agent="tensile-webhook"
            ) as client:
                try:
                    webhook = WebhookServer(self.settings, client=client, sock=sock)
                except TlsError as exc:
                    raise StartupError(str(exc)) from exc
                try:
                    async with endpoints.metrics_server(server.metrics_addr, health=webhook.health):
                        await self._runner.run([webhook])
                except TlsError as exc:
                    raise StartupError(str(exc)) from None
                except OSError as exc:
                    raise StartupError(f"cannot serve: {exc}") from None
                finally:
                    await webhook.close()


class WebhookServer:
    """The caches, the serving certificate and the HTTPS server, as a `Component`."""

    name = "webhook"

    def __init__(self, settings: Settings, *, client: ApiClient, sock: socket.socket) -> None:
        """Serve on `sock` (bound, not yet listening); `client` reads the upper cluster.
        Raises TlsError for a client CA file that cannot be loaded."""
        self._settings = settings
        self._sock = sock
        self._stopping = False
        self._failed = False
        self._stop_asked = asyncio.Event()
        self._drained = asyncio.Event()
        self._caches = Caches(
            client,
            virtual_node_selector=settings.virtual_node_selector,
            avoid_configmap=settings.avoid_configmap,
        )
        self.health = endpoints.Health()
        """`/readyz`: not while stopping, until the caches listed, until a certificate."""
        self.health.add_check("shutdown", lambda: "shutting down" if self._stopping else None)
        self.health.add_check("caches", self._caches.not_synced)
        app = make_app(
            Admission(
                settings=settings.mutation,
                lookups=self._caches.lookups,
                ready=lambda: self._caches.not_synced() is None,
                wait_ready=self._caches.wait_synced,
            ),
            health=self.health,
            max_request_bytes=settings.server.max_request_bytes,
        )
        self._app_runner = runners.app_runner(
            app, shutdown_timeout=settings.server.shutdown_timeout
        )
        self._tls = ServingTls(settings.tls, client=client, serve=self._serve)
        self.health.add_check("certificate", self._tls.not_ready)

    def informers(self) -> Sequence[Informer]:
        """None to wait for: calls wait for the caches (`Admission`), `/readyz` reports
        them, and the informers run in `run` beside the certificate's start."""
        return ()

    async def start(self) -> None:
        """Prepare the server (it listens once a certificate is there)."""
        await self._app_runner.setup()

    def ready(self) -> bool:
        """Whether every `/readyz` check passes."""
        return not self._stopping and (
            self._caches.not_synced() is None and self._tls.not_ready() is None
        )

    async def run(self) -> None:
        """Run the informers, get the certificate and serve with it, keep it current; until
        `shut_down` has drained. Raises TlsError for certificate files that cannot be
        loaded, OSError when the port cannot listen."""
        try:
            async with asyncio.TaskGroup() as group:
                background = [
                    group.create_task(i.run(), name=f"informer-{i.name}")
                    for i in (*self._caches.informers, *self._tls.informers)
                ]
                started = group.create_task(self._tls.start(), name="webhook-certificate-start")
                asked = group.create_task(self._stop_asked.wait(), name="stop-signal")
                await asyncio.wait([started, asked], return_when=asyncio.FIRST_COMPLETED)
                if started.done():
                    started.result()  # a certificate that cannot be loaded ends the start
                    keep = group.create_task(self._tls.keep(), name="webhook-certificate")
                    background.append(keep)
                else:
                    started.cancel()
                await self._drained.wait()
                for task in [*background, asked]:
                    task.cancel()
        except BaseExceptionGroup:
            self._failed = True
            raise

    async def shut_down(self) -> None:
        """Fail `/readyz`, answer calls for the shutdown delay more, then stop listening and
        give calls in flight the shutdown timeout (no delay when `run` failed: nothing was
        served)."""
        self._stopping = True
        self._stop_asked.set()
        if not self._failed:
            delay = self._settings.server.shutdown_delay
            logger.info("stopping: not ready; answering calls for %.1fs more", delay)
            await asyncio.sleep(delay)
        await self._app_runner.cleanup()  # stops listening, then waits for calls in flight
        if not self._failed:
            logger.info("stopped")
        self._drained.set()

    async def close(self) -> None:
        """Release the server, whatever happened (idempotent)."""
        await self._app_runner.cleanup()

    async def _serve(self, context: ssl.SSLContext) -> None:
        await web.SockSite(self._app_runner, self._sock, ssl_context=context).start()
        server = self._settings.server
        logger.info("webhook on https://%s:%s/mutate", server.address, server.port)
