"""One extender process: the upper virtual-node informer, the summaries it keeps, the HTTPS
server (`tensile.serving.https`); start order; graceful stop.

Start: the listen port is bound at once (a busy one fails the start), the certificate files
are loaded (an unreadable pair fails the start), the informer lists the virtual Nodes, then
the port listens. `/readyz` says ready once the informer has listed. Stop (SIGTERM):
`/readyz` fails at once, calls are answered `shutdown_delay` seconds more, then the server
closes and calls in flight get `shutdown_timeout` seconds. The server is a
`tensile.serving.lifecycle.Component` run by a `lifecycle.Runner`, as every program's parts
are; every task is named, owned by a TaskGroup and awaited.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any

from scheduler import metrics
from scheduler.latency import GcPauses, LoopLag
from scheduler.server import Judge, make_app
from scheduler.settings import Settings
from scheduler.slices.controller import SliceController
from scheduler.summaries import Summaries
from tensile.contracts import lowerhealth
from tensile.contracts.objects import meta_of, name_of
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import NODES
from tensile.placement import summary
from tensile.serving import delegated, endpoints, lifecycle
from tensile.serving.https import HttpsServer, certificate_files

logger = logging.getLogger(__name__)


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the informer keeps of a Node: its name, labels and summary annotation, and
    whether its lower control plane answers (the LowerControlPlaneReachable condition's
    type and status only)."""
    meta = meta_of(node)
    annotations = meta.get("annotations") or {}
    kept = {k: meta[k] for k in ("name", "resourceVersion", "labels") if k in meta}
    if summary.ANNOTATION in annotations:
        kept["annotations"] = {summary.ANNOTATION: annotations[summary.ANNOTATION]}
    slim: dict[str, Any] = {"metadata": kept}
    if lowerhealth.lower_unreachable(node):
        condition = {"type": lowerhealth.LOWER_REACHABLE_CONDITION, "status": "False"}
        slim["status"] = {"conditions": [condition]}
    return slim


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
        settings = self.settings
        async with (
            ApiClient(
                self._upper, name="upper", qps=20.0, burst=40, user_agent="tensile-scheduler"
            ) as client,
            delegated.review_client(client) as reviews,
        ):
            nodes = VirtualNodes(client, selector=settings.virtual_node_selector)
            slices = SliceController(
                client=client,
                events=client,
                settings=settings.slices,
                identity=socket.gethostname(),
                node_selector=settings.virtual_node_selector,
            )
            # `/readyz`: not while stopping, until the virtual Nodes are listed and the
            # HTTPS port listens (a call before that is refused, and kube-scheduler goes on
            # without), until the quota slices are listed.
            health = endpoints.Health()
            app = make_app(
                Judge(summaries=nodes.summaries, policy=settings.policy, slices=slices.refusals),
                health=health,
                max_request_bytes=settings.server.max_request_bytes,
                callers=settings.callers,
                reviews=delegated.reviews(reviews),
            )
            server = HttpsServer(
                settings.server,
                app=app,
                tls=certificate_files(settings.server, label="extender"),
                name="extender",
                label="extender",
                health=health,
                wait_for=[nodes.informer],  # calls are judged against them
                routes=" (filter, prioritize)",
            )
            health.add_check(
                "informers",
                lambda: None if nodes.informer.has_synced() else "virtual nodes not listed",
            )
            health.add_check("serving", server.not_serving)
            health.add_check(
                "quota-slices", lambda: None if slices.ready() else "quota slices not listed"
            )
            # Where a call's time goes besides its own work, and short collections
            # (`scheduler.latency`).
            await self._runner.run([GcPauses(), server, slices, LoopLag()])


class VirtualNodes:
    """The upper virtual Nodes' informer and the placement summaries it keeps."""

    def __init__(self, client: ApiClient, *, selector: str) -> None:
        """`client` reads the upper cluster's Nodes selected by label `selector`."""
        self.summaries = Summaries()
        self.informer = Informer(
            client,
            NODES,
            name="upper-virtual-nodes",
            label_selector=selector,
            transform=slim_node,
        )
        self.informer.add_handlers(
            Handlers(
                on_add=self._put,
                on_modify=self._put,
                on_delete=lambda node: self._remove(name_of(node)),
            )
        )

    def _put(self, node: Mapping[str, Any]) -> None:
        name = name_of(node)
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
