"""One virtual node: informers, controllers and metrics around a provider; start order; stop.

Start order (virtual-kubelet's): every informer runs and has synced before any worker
starts; the pod controller cleans up dangling backend pods; the node controller registers
the Node. `stop()` (SIGTERM) stops the queues from handing out keys, lets in-flight work
finish for up to `shutdown_timeout` seconds, then cancels everything; every task is
named, owned by a TaskGroup and awaited.
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
from typing import Any, Protocol

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
from vnode.controllers.pods import PodController, PodProvider
from vnode.controllers.status import node_addresses
from vnode.kube.client import ApiClient
from vnode.kube.events import EventRecorder
from vnode.kube.informer import Informer
from vnode.kube.workqueue import FairQueuing
from vnode.provider import (
    ExecProvider,
    LogsProvider,
    MetricsProvider,
    NodeProvider,
    PortForwardProvider,
)
from vnode.serving import endpoints
from vnode.serving.sockets import bound_socket
from vnode.serving.tls import RotatingTls, reload_certificates, tls_context
from vnode.settings import ApiSettings, Settings, default_cert_dir

logger = logging.getLogger(__name__)


class Provider(
    PodProvider,
    NodeProvider,
    LogsProvider,
    ExecProvider,
    PortForwardProvider,
    MetricsProvider,
    Protocol,
):
    """A full provider: pods, node, and its own informers and workers."""

    def informers(self) -> Sequence[Informer]:
        """Informers that must run and sync before any worker starts."""

    async def run(self, *, workers: int) -> None:
        """Run the provider's own workers until `shut_down`."""

    async def shut_down(self) -> None:
        """Stop the provider's queues."""


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
        clock: Clock | None = None,
    ) -> None:
        """`clock` (default: the system clock) times serving-certificate renewals."""
        self.settings = settings
        self._clock = clock
        self._clients = upper
        self._upper = upper.main
        self._provider = provider
        self._stop = asyncio.Event()
        recorder = EventRecorder(
            upper.events, component=f"{settings.node.name}/pod-controller", host=settings.node.name
        )
        self.pods = PodController(
            upper=upper.main,
            provider=provider,
            node_name=settings.node.name,
            namespace=settings.pods.namespace,
            workers=settings.pods.workers,
            recorder=recorder,
            fairness=FairQueuing(weights=dict(settings.pods.namespace_weights)),
        )
        self.node = NodeController(
            upper=upper.main, heartbeat=upper.heartbeat, provider=provider, settings=settings.node
        )
        self.node.on_recovered(self._backend_recovered)

    def _backend_recovered(self) -> None:
        logger.info("the provider is reachable again: resuming watches and pending pods")
        for informer in self._provider.informers():
            informer.retry_now()
        self.pods.resync()

    def stop(self) -> None:
        """Ask `run` to stop gracefully (safe to call from a signal handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Run until `stop()`; raises StartupError if the caches do not sync in time."""
        informers = [*self._provider.informers(), self.pods.informer, self.node.informer]
        async with (
            endpoints.metrics_server(self.settings.metrics_addr),
            self._kubelet_api() as keep_certificate,
            asyncio.TaskGroup() as group,
        ):
            background = [group.create_task(i.run(), name=f"informer-{i.name}") for i in informers]
            if keep_certificate is not None:
                # Registration, lease and pods never wait for this task: a CSR may wait
                # for a human to approve it.
                background.append(
                    group.create_task(keep_certificate(), name="kubelet-api-certificates")
                )
            stop = group.create_task(self._stop.wait(), name="stop-signal")
            await self._wait_synced(informers, stop)
            if stop.done():
                for task in background:
                    task.cancel()
                return
            logger.info("caches synced; starting workers")
            work = [
                group.create_task(
                    self._provider.run(workers=self.settings.pods.workers), name="provider-workers"
                ),
                group.create_task(self.pods.run(), name="pod-controller"),
            ]
            background.append(group.create_task(self.node.run(), name="node-controller"))
            await stop
            await self._drain(work)
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
            with contextlib.suppress(asyncio.CancelledError):
                await synced

    async def _drain(self, work: list[asyncio.Task[None]]) -> None:
        logger.info(
            "stopping: finishing in-flight work (up to %.0fs)", self.settings.shutdown_timeout
        )
        await self.pods.shut_down()
        await self._provider.shut_down()
        _done, pending = await asyncio.wait(work, timeout=self.settings.shutdown_timeout)
        if pending:
            logger.warning(
                "stopping: abandoning work still in flight after %.0fs",
                self.settings.shutdown_timeout,
            )

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
        api = self.settings.api
        if not api.cert_file and not api.rotate_server_certificates:
            logger.warning(
                "kubelet API disabled: no APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION and "
                "--rotate-server-certificates=false (kubectl logs/exec on this node's pods "
                "will fail)"
            )
            yield None
            return
        host, port = self.settings.node.internal_ip, self.settings.node.kubelet_port
        try:
            sock = bound_socket(host, port)
        except OSError as exc:
            raise StartupError(
                f"kubelet API: cannot listen on {host}:{port} (KUBELET_PORT): {exc}"
            ) from exc
        try:
            app = make_app(self._api_context())
            runner = web.AppRunner(
                app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0
            )
            await runner.setup()
            try:
                yield await self._start_serving(runner=runner, sock=sock)
            finally:
                await runner.cleanup()
        finally:
            sock.close()  # closed already once served; never served: ours to close

    def _api_context(self) -> ApiContext:
        api = self.settings.api
        verify = api.verify_clients
        gate = auth.ReviewGate()
        reviews = self._clients.reviews
        return ApiContext(
            node_name=self.settings.node.name,
            pod=lambda ns, name: self.pods.informer.store.get(f"{ns}/{name}"),
            pods=lambda: list(self.pods.informer.store),
            provider=self._provider,
            authenticator=auth.Authenticator(reviews, gate=gate, anonymous=api.anonymous_auth)
            if verify
            else None,
            authorizer=auth.Authorizer(reviews, gate=gate, node_name=self.settings.node.name)
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
        api = self.settings.api
        host, port = self.settings.node.internal_ip, self.settings.node.kubelet_port

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
        api = self.settings.api
        try:
            identity = identity_from_addresses(
                node_name=self.settings.node.name,
                addresses=node_addresses(self.settings.node),
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
        return Path(self.settings.api.cert_dir or default_cert_dir(self.settings.node.name))


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
