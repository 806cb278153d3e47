"""One extender process: the upper virtual-node informer, the summaries it keeps, the HTTPS
server; start order; graceful stop.

Start: the listen port is bound at once (a busy one fails the start), the certificate files
are loaded (an unreadable pair fails the start), the informer lists the virtual Nodes, then
the port listens. `/readyz` says ready once the informer has listed. Stop (SIGTERM):
`/readyz` fails at once, calls are answered `shutdown_delay` seconds more, then the server
closes and calls in flight get `shutdown_timeout` seconds. The server is a
`tensile.serving.lifecycle.Component` run by a `lifecycle.Runner`, as every program's parts
are; every task is named, owned by a TaskGroup and awaited.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from scheduler import metrics
from scheduler.server import Judge, make_app
from scheduler.settings import Settings
from scheduler.slices.controller import SliceController
from scheduler.slices.filter import Refusals
from scheduler.summaries import Summaries
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import NODES
from tensile.placement import summary
from tensile.serving import endpoints, lifecycle, runners, tls
from tensile.serving.lifecycle import StartupError
from tensile.serving.sockets import bound_socket

logger = logging.getLogger(__name__)


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the informer keeps of a Node: its name, labels and summary annotation."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kept = {k: meta[k] for k in ("name", "resourceVersion", "labels") if k in meta}
    if summary.ANNOTATION in annotations:
        kept["annotations"] = {summary.ANNOTATION: annotations[summary.ANNOTATION]}
    return {"metadata": kept}


class Extender:
    """Runs the extender until `stop()` or cancellation."""

    def __init__(self, settings: Settings, *, upper: ConnectionInfo) -> None:
        self.settings = settings
        self._upper = upper
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
            context = tls.tls_context(
                client_ca_file=server.client_ca_file, require_client_certificate=True
            )
            context.load_cert_chain(server.cert_file, server.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(f"cannot load the serving certificate or client CA: {exc}") from exc
        try:
            sock = bound_socket(server.address, server.port)
        except OSError as exc:
            raise StartupError(f"cannot listen on {server.address}:{server.port}: {exc}") from exc
        with sock:
            async with ApiClient(
                self._upper, name="upper", qps=20.0, burst=40, user_agent="tensile-scheduler"
            ) as client:
                slices = SliceController(
                    client=client,
                    events=client,
                    settings=self.settings.slices,
                    identity=socket.gethostname(),
                    node_selector=self.settings.virtual_node_selector,
                )
                component = ExtenderServer(
                    self.settings,
                    client=client,
                    sock=sock,
                    context=context,
                    slices=slices.refusals,
                )
                component.health.add_check(
                    "quota-slices", lambda: None if slices.ready() else "quota slices not listed"
                )
                try:
                    async with endpoints.metrics_server(
                        server.metrics_addr, health=component.health
                    ):
                        await self._runner.run([component, slices])
                except OSError as exc:
                    raise StartupError(f"cannot serve: {exc}") from None
                finally:
                    await component.close()


class ExtenderServer:
    """The virtual-node informer, the summaries and the HTTPS server, as a `Component`."""

    name = "extender"

    def __init__(
        self,
        settings: Settings,
        *,
        client: ApiClient,
        sock: socket.socket,
        context: ssl.SSLContext,
        slices: Refusals | None = None,
    ) -> None:
        """Serve on `sock` (bound, not yet listening) with `context` (its certificate
        loaded); `client` reads the upper cluster's virtual Nodes; `slices` holds
        quota'd namespaces' pods to their slices (None: not)."""
        self._settings = settings
        self._sock = sock
        self._context = context
        self._stopping = False
        self._listening = False
        self._drained = asyncio.Event()
        self.summaries = Summaries()
        self.nodes = Informer(
            client,
            NODES,
            name="upper-virtual-nodes",
            label_selector=settings.virtual_node_selector,
            transform=slim_node,
        )
        self.nodes.add_handlers(
            Handlers(
                on_add=self._put,
                on_modify=self._put,
                on_delete=lambda node: self._remove(str(node["metadata"]["name"])),
            )
        )
        self.health = endpoints.Health()
        """`/readyz`: not while stopping, until the virtual Nodes are listed and the HTTPS
        port listens (a call before that is refused, and kube-scheduler goes on without)."""
        self.health.add_check("shutdown", lambda: "shutting down" if self._stopping else None)
        self.health.add_check(
            "informers", lambda: None if self.nodes.has_synced() else "virtual nodes not listed"
        )
        self.health.add_check(
            "serving", lambda: None if self._listening else "the HTTPS port is not listening yet"
        )
        app = make_app(
            Judge(summaries=self.summaries, policy=settings.policy, slices=slices),
            health=self.health,
            max_request_bytes=settings.server.max_request_bytes,
        )
        self._app_runner = runners.app_runner(
            app, shutdown_timeout=settings.server.shutdown_timeout
        )

    def _put(self, node: Mapping[str, Any]) -> None:
        name = str((node.get("metadata") or {}).get("name"))
        self.summaries.put(node)
        if name in self.summaries.unreadable:
            logger.warning(
                "virtual node %s: summary unreadable: %s", name, self.summaries.unreadable[name]
            )
        self._count()

    def _remove(self, name: str) -> None:
        self.summaries.remove(name)
        self._count()

    def _count(self) -> None:
        metrics.VIRTUAL_NODES.labels("readable").set(len(self.summaries))
        metrics.VIRTUAL_NODES.labels("unreadable").set(len(self.summaries.unreadable))

    def informers(self) -> Sequence[Informer]:
        """The virtual Nodes: calls are judged against them, so they list first."""
        return [self.nodes]

    async def start(self) -> None:
        """Prepare the server."""
        await self._app_runner.setup()

    def ready(self) -> bool:
        """Whether it serves with listed caches."""
        return not self._stopping and self._listening and self.nodes.has_synced()

    async def run(self) -> None:
        """Listen, keep the certificate current, until `shut_down` has drained."""
        server = self._settings.server
        await web.SockSite(self._app_runner, self._sock, ssl_context=self._context).start()
        self._listening = True
        logger.info("extender on https://%s:%s (filter, prioritize)", server.address, server.port)
        async with asyncio.TaskGroup() as group:
            reload = group.create_task(
                tls.reload_certificates(
                    self._context,
                    cert_file=server.cert_file,
                    key_file=server.key_file,
                    name="extender",
                ),
                name="extender-certificate",
            )
            await self._drained.wait()
            reload.cancel()

    async def shut_down(self) -> None:
        """Fail `/readyz`, answer calls for the shutdown delay more, then stop listening."""
        self._stopping = True
        await asyncio.sleep(self._settings.server.shutdown_delay)
        await self._app_runner.cleanup()
        self._drained.set()

    async def close(self) -> None:
        """Release the server, whatever happened (idempotent)."""
        await self._app_runner.cleanup()
