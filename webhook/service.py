"""One webhook process: its caches, the serving certificate and the HTTPS server
(`tensile.serving.https`); start order; graceful stop.

Start: the listen port is bound at once (a busy one fails the start), the informers start
listing, the certificate is loaded (files) or bootstrapped (Secret, retried while the
apiserver is away, `tensile.serving.bootstrap`), and only then does the port listen: the
apiserver never meets a webhook without a certificate. Calls do not wait for the caches'
first list (they answer "allowed, unchanged" before the apiserver's deadline instead,
`webhook.server`). `/readyz` says ready once the caches have listed and a certificate is
served. Stop (SIGTERM): `/readyz` fails at once, calls are still answered for
`shutdown_delay` seconds (endpoints take a moment to stop sending them), then the server
closes and in-flight calls get `shutdown_timeout` seconds. The server is a
`tensile.serving.lifecycle.Component` run by a `lifecycle.Runner`, as every program's parts
are; every task is named, owned by a TaskGroup and awaited.
"""

from __future__ import annotations

import logging

from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.serving import delegated, endpoints, lifecycle
from tensile.serving.bootstrap import SecretBootstrap
from tensile.serving.https import HttpsServer, certificate_files
from tensile.serving.tls import TlsSource
from webhook.caches import Caches
from webhook.server import Admission, make_app
from webhook.settings import Settings
from webhook.tls import CaBundle

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
        settings = self.settings
        async with (
            ApiClient(
                self._upper, name="upper", qps=20.0, burst=40, user_agent="tensile-webhook"
            ) as client,
            delegated.review_client(client) as reviews,
        ):
            caches = Caches(
                client,
                virtual_node_selector=settings.virtual_node_selector,
                avoid_configmap=settings.avoid_configmap,
            )
            # `/readyz`: not while stopping, until the caches listed, until a certificate.
            health = endpoints.Health()
            app = make_app(
                Admission(
                    settings=settings.mutation,
                    lookups=caches.lookups,
                    ready=lambda: caches.not_synced() is None,
                    wait_ready=caches.wait_synced,
                ),
                health=health,
                max_request_bytes=settings.server.max_request_bytes,
                reviews=delegated.reviews(reviews),
            )
            server = HttpsServer(
                settings.server,
                app=app,
                tls=self._certificate(client),
                name="webhook",
                label="webhook",
                health=health,
                background=caches.informers,
                routes="/mutate",
            )
            health.add_check("caches", caches.not_synced)
            health.add_check("certificate", server.not_serving)
            await self._runner.run([server])

    def _certificate(self, client: ApiClient) -> TlsSource:
        """The serving certificate's source: --tlscert/--tlskey, else the Secret."""
        server = self.settings.server
        if server.from_files or server.secret is None:
            return certificate_files(server, label="webhook")
        return SecretBootstrap(
            server.secret,
            client=client,
            resync=server.resync,
            manager="tensile-webhook",
            publication=CaBundle(client, configuration=self.settings.webhook_configuration),
            label="webhook",
        )
