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
import contextlib
import functools
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from vnode.api import auth
from vnode.api.certificates import identity_from_addresses
from vnode.api.certmanager import (
    CertificateManagerSettings,
    Clock,
    ServingCertificate,
    ServingCertificateManager,
)
from vnode.api.certstore import CertificateStore
from vnode.api.server import ApiContext, make_app
from vnode.controllers.node import NodeController
from vnode.controllers.pods import PodController
from vnode.controllers.status import node_addresses
from vnode.kube.client import ApiClient
from vnode.kube.events import EventRecorder
from vnode.kube.informer import Informer
from vnode.kube.informers import InformerFactory
from vnode.kube.workqueue import FairQueuing
from vnode.provider import Component, Provider
from vnode.serving import endpoints, runners
from vnode.serving.sockets import bound_socket
from vnode.serving.tls import RotatingTls, reload_certificates, tls_context
from vnode.settings import ApiSettings, Settings, default_cert_dir

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


class StartupError(Exception):
    """The node could not start (caches did not sync in time); the message says which."""


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


class KubeletApiServer:
    """The kubelet HTTPS API as a component of the node: `start` binds KUBELET_PORT and
    loads what can be checked (raising StartupError), `run` keeps the serving certificate,
    `shut_down` stops serving."""

    name = "kubelet-api"

    def __init__(
        self,
        *,
        settings: Settings,
        upper: ApiClient,
        reviews: ApiClient,
        pods: Informer,
        provider: Provider,
        clock: Clock | None = None,
    ) -> None:
        """`upper` makes the serving certificate's CSRs, `reviews` authenticates and
        authorizes callers (TokenReview, SubjectAccessReview), `pods` is the cache of the
        upper pods bound to the node (read, not run, by this component); `clock` (default:
        the system clock) times certificate renewals."""
        self._settings = settings
        self._upper = upper
        self._reviews = reviews
        self._pods = pods
        self._provider = provider
        self._clock = clock
        self._stack = contextlib.AsyncExitStack()
        self._keep: Callable[[], Coroutine[Any, Any, None]] | None = None
        self._stopped = asyncio.Event()
        self._started = False

    def informers(self) -> Sequence[Informer]:
        """None of its own: it reads the pod controller's cache."""
        return []

    async def start(self) -> None:
        """Bind the port and start serving (or wait for a CSR's certificate)."""
        self._keep = await self._stack.enter_async_context(self._kubelet_api())
        self._started = True

    def ready(self) -> bool:
        """Whether the API is set up (it may still wait for a certificate from a CSR)."""
        return self._started

    async def run(self) -> None:
        """Keep the serving certificate fresh until `shut_down`."""
        if self._keep is None:
            await self._stopped.wait()
            return
        async with asyncio.TaskGroup() as group:
            # Registration, lease and pods never wait for this task: a CSR may wait for a
            # human to approve it.
            keeper = group.create_task(self._keep(), name="kubelet-api-certificates")
            await self._stopped.wait()
            keeper.cancel()

    async def shut_down(self) -> None:
        """Stop serving (requests in flight get a moment to finish)."""
        self._stopped.set()
        await self._stack.aclose()

    @contextlib.asynccontextmanager
    async def _kubelet_api(self) -> AsyncIterator[Callable[[], Coroutine[Any, Any, None]] | None]:
        """Set up the kubelet API on the node's InternalIP:KUBELET_PORT (what the upper
        apiserver connects to) and yield the coroutine function that keeps its serving
        certificate, to run as an owned task; None when the API is off.

        Whatever can be checked is checked here, before anything starts, and raises
        StartupError naming the culprit: the port is bound (a busy KUBELET_PORT), the
        client CA file (--client-verify-ca / APISERVER_CA_CERT_LOCATION) loaded, and
        APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION loaded when given. With those files
        the API listens at once and they are reloaded when they change. Otherwise, with
        --rotate-server-certificates, it listens once a certificate from a CSR exists
        (connections are refused until then), maybe hours later: by then nothing is left
        that could fail and take down a node that is serving pods.
        """
        api = self._settings.api
        if not api.cert_file and not api.rotate_server_certificates:
            logger.warning(
                "kubelet API disabled: no APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION and "
                "--rotate-server-certificates=false (kubectl logs/exec on this node's pods "
                "will fail)"
            )
            yield None
            return
        host, port = self._settings.node.internal_ip, self._settings.node.kubelet_port
        try:
            sock = bound_socket(host, port)
        except OSError as exc:
            raise StartupError(
                f"kubelet API: cannot listen on {host}:{port} (KUBELET_PORT): {exc}"
            ) from exc
        try:
            app = make_app(self._api_context())
            runner = runners.app_runner(app, shutdown_timeout=2.0)
            await runner.setup()
            try:
                yield await self._start_serving(runner=runner, sock=sock)
            finally:
                await runner.cleanup()
        finally:
            sock.close()  # closed already once served; never served: ours to close

    def _api_context(self) -> ApiContext:
        api = self._settings.api
        verify = api.verify_clients
        gate = auth.ReviewGate()
        reviews = self._reviews
        return ApiContext(
            node_name=self._settings.node.name,
            pod=lambda ns, name: self._pods.store.get(f"{ns}/{name}"),
            pods=lambda: list(self._pods.store),
            provider=self._provider,
            authenticator=auth.Authenticator(reviews, gate=gate, anonymous=api.anonymous_auth)
            if verify
            else None,
            authorizer=auth.Authorizer(reviews, gate=gate, node_name=self._settings.node.name)
            if verify
            else None,
            idle_timeout=api.streaming_idle_timeout,
        )

    async def _start_serving(
        self, *, runner: web.AppRunner, sock: socket.socket
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        """Serve `runner` on the bound `sock` now (certificate files) or once the first
        certificate from a CSR exists; return the coroutine function that keeps the
        certificate. Raises StartupError for files that cannot be loaded."""
        api = self._settings.api
        host, port = self._settings.node.internal_ip, self._settings.node.kubelet_port

        async def serve(tls: ssl.SSLContext) -> None:
            site = web.SockSite(runner, sock, ssl_context=tls)
            await site.start()
            logger.info("kubelet API on https://%s:%d", host, port)

        if api.cert_file:
            tls = _tls_from_files(api)
            await serve(tls)
            return functools.partial(
                reload_certificates,
                tls,
                cert_file=api.cert_file,
                key_file=api.key_file,
                name="kubelet API",
            )
        rotating = _rotating_tls(api, serve=serve)
        manager = self._certificate_manager()
        logger.info(
            "kubelet API: no APISERVER_CERT_LOCATION; the serving certificate comes from a "
            "CSR to the upper cluster (kept in %s)",
            self._cert_dir(),
        )

        async def use(certificate: ServingCertificate) -> None:
            await rotating.use(certificate.pem)

        return functools.partial(manager.run, on_certificate=use)

    def _certificate_manager(self) -> ServingCertificateManager:
        """Return the manager that obtains and renews the serving certificate through CSRs
        (see `ServingCertificateManager`). Raises StartupError when the node publishes no
        address to put in the certificate."""
        api = self._settings.api
        try:
            identity = identity_from_addresses(
                node_name=self._settings.node.name,
                addresses=node_addresses(self._settings.node),
            )
        except ValueError as exc:
            raise StartupError(f"kubelet API: {exc}") from exc
        return ServingCertificateManager(
            upper=self._upper,
            identity=identity,
            store=CertificateStore(self._cert_dir()),
            settings=CertificateManagerSettings(
                expiration_seconds=api.server_certificate_duration or None
            ),
            clock=self._clock,
        )

    def _cert_dir(self) -> Path:
        return Path(self._settings.api.cert_dir or default_cert_dir(self._settings.node.name))


def _readiness(component: Component) -> str | None:
    return None if component.ready() else "not ready"


def _tls_from_files(api: ApiSettings) -> ssl.SSLContext:
    """Return the TLS context serving APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION.
    Raises StartupError naming the file that could not be loaded."""
    try:
        context = tls_context(client_ca_file=api.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(_bad_client_ca(api, exc)) from exc
    try:
        context.load_cert_chain(api.cert_file, api.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(
            "kubelet API: cannot load the serving certificate APISERVER_CERT_LOCATION="
            f"{api.cert_file} with the key APISERVER_KEY_LOCATION={api.key_file}: {exc}"
        ) from exc
    return context


def _rotating_tls(
    api: ApiSettings, *, serve: Callable[[ssl.SSLContext], Awaitable[None]]
) -> RotatingTls:
    """Return the TLS side of a CSR-issued certificate. Raises StartupError for a bad
    client CA file."""
    try:
        return RotatingTls(client_ca_file=api.client_ca_file, serve=serve, name="kubelet API")
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(_bad_client_ca(api, exc)) from exc


def _bad_client_ca(api: ApiSettings, exc: Exception) -> str:
    return (
        f"kubelet API: cannot load the client CA file {api.client_ca_file} "
        f"(--client-verify-ca / APISERVER_CA_CERT_LOCATION): {exc}"
    )
