"""One webhook process: informers, the serving certificate and the HTTPS server; start
order; graceful stop.

Start: the listen port is bound at once (a busy one fails the start), the informers start
listing, the certificate is loaded (files) or bootstrapped (Secret, retried while the
apiserver is away), and only then does the port listen: the apiserver never meets a
webhook without a certificate. `/readyz` says ready once the caches have listed and a
certificate is served. Stop (SIGTERM): `/readyz` fails at once, calls are still answered for
`shutdown_delay` seconds (endpoints take a moment to stop sending them), then the server
closes and in-flight calls get `shutdown_timeout` seconds. Every task is named, owned by a
TaskGroup and awaited.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl

from aiohttp import web

from vnode.kube.client import ApiClient
from vnode.kube.config import ConnectionInfo
from vnode.serving import endpoints
from vnode.serving.sockets import bound_socket
from webhook.caches import Caches
from webhook.server import Admission, make_app
from webhook.settings import Settings
from webhook.tls import ServingTls, TlsError

logger = logging.getLogger(__name__)


class StartupError(Exception):
    """The webhook could not start (a busy port, a certificate that cannot be loaded)."""


class Webhook:
    """Runs the webhook until `stop()` or cancellation."""

    def __init__(self, settings: Settings, *, upper: ConnectionInfo) -> None:
        self.settings = settings
        self._upper = upper
        self._stop = asyncio.Event()
        self._stopping = False

    def stop(self) -> None:
        """Ask `run` to stop gracefully (safe from a signal handler)."""
        self._stop.set()

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
                await self._serve(client, sock)

    async def _serve(self, client: ApiClient, sock: socket.socket) -> None:
        settings = self.settings
        caches = Caches(
            client,
            virtual_node_selector=settings.virtual_node_selector,
            avoid_configmap=settings.avoid_configmap,
        )
        health = endpoints.Health()
        health.add_check("shutdown", lambda: "shutting down" if self._stopping else None)
        health.add_check("caches", caches.not_synced)
        app = make_app(
            Admission(
                settings=settings.mutation,
                lookups=caches.lookups,
                ready=lambda: caches.not_synced() is None,
                wait_ready=caches.wait_synced,
            ),
            health=health,
            max_request_bytes=settings.server.max_request_bytes,
        )
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=settings.server.shutdown_timeout,
        )
        await runner.setup()
        address = f"{settings.server.address}:{settings.server.port}"

        async def serve(context: ssl.SSLContext) -> None:
            await web.SockSite(runner, sock, ssl_context=context).start()
            logger.info("webhook on https://%s/mutate", address)

        try:
            tls = ServingTls(settings.tls, client=client, serve=serve)
        except TlsError as exc:
            await runner.cleanup()
            raise StartupError(str(exc)) from exc
        health.add_check("certificate", tls.not_ready)
        try:
            async with (
                endpoints.metrics_server(settings.server.metrics_addr, health=health),
                asyncio.TaskGroup() as group,
            ):
                background = [
                    group.create_task(i.run(), name=f"informer-{i.name}")
                    for i in (*caches.informers, *tls.informers)
                ]
                started = group.create_task(tls.start(), name="webhook-certificate-start")
                stop = group.create_task(self._stop.wait(), name="stop-signal")
                await asyncio.wait([started, stop], return_when=asyncio.FIRST_COMPLETED)
                if started.done():
                    started.result()  # a certificate that cannot be loaded ends the start
                    background.append(group.create_task(tls.keep(), name="webhook-certificate"))
                else:
                    started.cancel()
                await stop
                await self._drain(runner)
                for task in background:
                    task.cancel()
        except* TlsError as group_error:
            raise StartupError(str(_first(group_error))) from None
        except* OSError as group_error:
            raise StartupError(f"cannot serve: {_first(group_error)}") from None
        finally:
            await runner.cleanup()

    async def _drain(self, runner: web.AppRunner) -> None:
        self._stopping = True
        delay = self.settings.server.shutdown_delay
        logger.info("stopping: not ready; answering calls for %.1fs more", delay)
        await asyncio.sleep(delay)
        await runner.cleanup()  # stops listening, then waits for calls in flight
        logger.info("stopped")


def _first(group: BaseExceptionGroup[Exception]) -> Exception:
    """The first exception of a task group's failure (the start's own error)."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
