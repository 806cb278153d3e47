"""One virtual node: a list of components around a provider; start order; stop.

The node is a list of components (`vnode.provider.Component`): the provider and what it
brings (mirrors of pods' dependencies, of Services and volumes as --enable-controllers
chose), the pod controller, the kubelet API server and the node controller. Start order
(virtual-kubelet's): each component's `start()` in list order; then every informer runs
(one per selection, shared through an `InformerFactory`) and has synced before any
component's `run()` begins, so the node controller registers the Node only once pods can
be served. `stop()` (SIGTERM) shuts every component down, lets in-flight work finish for
up to `shutdown_timeout` seconds, then cancels everything; every task is named, owned by a
TaskGroup and awaited.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from vnode.api.certmanager import (
    Clock,
)
from vnode.api.component import KubeletApiServer
from vnode.controllers.node import NodeController
from vnode.controllers.node_objects import node_addresses
from vnode.controllers.pods import PodController
from vnode.kube.client import ApiClient
from vnode.kube.events import EventRecorder
from vnode.kube.informer import Informer
from vnode.kube.informer_factory import InformerFactory
from vnode.kube.workqueue import FairQueuing
from vnode.provider import Component, Provider
from vnode.serving import endpoints
from vnode.serving.lifecycle import StartupError
from vnode.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class UpperClients:
    """The node's clients of the upper cluster. Each has its own connections and rate
    budget, so no kind of traffic waits behind another: the kubelet splits its main,
    heartbeat and event clients the same way (cmd/kubelet/app/server.go), and hostile
    kubelet API callers get a fourth, so their reviews never cost a pod status write."""

    main: ApiClient
    """Informers, pods and their statuses, CSRs: --kube-api-qps/--kube-api-burst."""
    heartbeat: ApiClient
    """Node registration, node status and Lease renewals: no client-side limit (as the
    kubelet's heartbeat client) and a few connections of its own."""
    events: ApiClient
    """Events recorded and mirrored from below: --event-qps/--event-burst."""
    reviews: ApiClient
    """TokenReviews and SubjectAccessReviews of kubelet API callers, bounded in concurrency
    by `auth.ReviewGate`."""

    @classmethod
    def sharing(cls, client: ApiClient) -> UpperClients:
        """All four roles on one client (tests and tools that do not need the split)."""
        return cls(main=client, heartbeat=client, events=client, reviews=client)


class VirtualNode:
    """Runs one virtual node until `stop()` or cancellation."""

    def __init__(
        self,
        *,
        settings: Settings,
        upper: UpperClients,
        provider: Provider,
        informers: InformerFactory,
        clock: Clock | None = None,
    ) -> None:
        """`informers` is the factory the provider made its informers with (so the node's
        own components share them); `clock` (default: the system clock) times
        serving-certificate renewals."""
        self.settings = settings
        self._stop = asyncio.Event()
        recorder = EventRecorder(
            upper.events, component=f"{settings.node.name}/pod-controller", host=settings.node.name
        )
        self.pods = PodController(
            upper=upper.main,
            informers=informers,
            provider=provider,
            node_name=settings.node.name,
            namespace=settings.pods.namespace,
            workers=settings.pods.workers,
            recorder=recorder,
            fairness=FairQueuing(weights=dict(settings.pods.namespace_weights)),
        )
        self.node = NodeController(
            upper=upper.main,
            informers=informers,
            heartbeat=upper.heartbeat,
            provider=provider,
            settings=settings.node,
        )
        self.node.on_recovered(self._backend_recovered)
        self.components: list[Component] = [
            provider,
            *provider.components(),
            self.pods,
            KubeletApiServer(
                settings=settings,
                upper=upper.main,
                reviews=upper.reviews,
                pods=self.pods.informer,
                provider=provider,
                addresses=node_addresses(settings.node),
                clock=clock,
            ),
            self.node,
        ]
        """Everything the node runs, in start order (see the module docstring)."""

    def informers(self) -> list[Informer]:
        """Every informer of every component, each once."""
        seen: dict[int, Informer] = {}
        for component in self.components:
            for informer in component.informers():
                seen.setdefault(id(informer), informer)
        return list(seen.values())

    def ready(self) -> bool:
        """Whether every component does its work (the Node registered included)."""
        return all(component.ready() for component in self.components)

    def _health(self) -> endpoints.Health:
        """`/readyz` on --metrics-addr: one check per component (its caches synced, the
        Node registered, ...), so a probe says which part is not ready."""
        health = endpoints.Health()
        for component in self.components:
            health.add_check(component.name, functools.partial(_readiness, component))
        return health

    def _backend_recovered(self) -> None:
        logger.info("the provider is reachable again: resuming watches and pending pods")
        for informer in self.informers():
            informer.retry_now()
        self.pods.resync()

    def stop(self) -> None:
        """Ask `run` to stop gracefully (safe to call from a signal handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Run until `stop()`. Raises StartupError if the caches do not sync in time, and
        whatever a component's `start()` raised."""
        started: list[Component] = []
        shut: set[int] = set()

        async def shut_down(components: Sequence[Component]) -> None:
            for component in reversed(components):
                if id(component) not in shut:
                    shut.add(id(component))
                    await component.shut_down()

        async with endpoints.metrics_server(self.settings.metrics_addr, health=self._health()):
            try:
                for component in self.components:
                    if self._stop.is_set():
                        return
                    await component.start()
                    started.append(component)
                await self._run_started(shut_down)
            finally:
                await shut_down(started)

    async def _run_started(
        self, shut_down: Callable[[Sequence[Component]], Awaitable[None]]
    ) -> None:
        informers = self.informers()
        async with asyncio.TaskGroup() as group:
            background = [group.create_task(i.run(), name=f"informer-{i.name}") for i in informers]
            stop = group.create_task(self._stop.wait(), name="stop-signal")
            await self._wait_synced(informers, stop)
            if stop.done():
                for task in background:
                    task.cancel()
                return
            logger.info("caches synced; starting workers")
            work = [group.create_task(c.run(), name=c.name) for c in self.components]
            await stop
            await self._drain(work, shut_down)
            for task in background + work:
                task.cancel()

    async def _wait_synced(self, informers: Sequence[Informer], stop: asyncio.Task[bool]) -> None:
        timeout = self.settings.startup_timeout or None

        async def all_synced() -> None:
            for informer in informers:
                await informer.wait_synced()

        synced = asyncio.create_task(all_synced(), name="wait-synced")
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait([synced, stop], return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            missing = [f"{i.name} ({i.last_sync_error})" for i in informers if not i.has_synced()]
            self.stop()
            raise StartupError(
                f"caches not synced after {timeout}s: {', '.join(missing)}"
            ) from None
        finally:
            synced.cancel()
            # gather returns the child's cancellation instead of raising it, while a
            # cancellation of this task itself still propagates (suppress would eat both).
            await asyncio.gather(synced, return_exceptions=True)

    async def _drain(
        self,
        work: list[asyncio.Task[None]],
        shut_down: Callable[[Sequence[Component]], Awaitable[None]],
    ) -> None:
        logger.info(
            "stopping: finishing in-flight work (up to %.0fs)", self.settings.shutdown_timeout
        )
        await shut_down(self.components)
        _done, pending = await asyncio.wait(work, timeout=self.settings.shutdown_timeout)
        if pending:
            logger.warning(
                "stopping: abandoning work still in flight after %.0fs",
                self.settings.shutdown_timeout,
            )


def _readiness(component: Component) -> str | None:
    return None if component.ready() else "not ready"
