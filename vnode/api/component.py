"""The kubelet HTTPS API as a component of the virtual node
(`tensile.serving.lifecycle.Component`):
the listening socket, the serving certificate (files, reloaded when they change, or a CSR to
the upper cluster, renewed before expiry) and the aiohttp application of `vnode.api.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.serving import runners
from tensile.serving.lifecycle import StartupError
from tensile.serving.sockets import bound_socket
from tensile.serving.tls import RotatingTls, reload_certificates, tls_context
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
from vnode.provider import Provider
from vnode.settings import ApiSettings, Settings, default_cert_dir

logger = logging.getLogger(__name__)


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
        addresses: Sequence[Mapping[str, str]],
        clock: Clock | None = None,
    ) -> None:
        """`upper` makes the serving certificate's CSRs, `reviews` authenticates and
        authorizes callers (TokenReview, SubjectAccessReview), `pods` is the cache of the
        upper pods bound to the node (read, not run, by this component); `addresses` are the
        Node's status.addresses (`{"type": "InternalIP", "address": ...}`), which a
        certificate from a CSR must name; `clock` (default: the system clock) times
        certificate renewals."""
        self._settings = settings
        self._addresses = [dict(a) for a in addresses]
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
            authenticator=auth.Authenticator(
                reviews, gate=gate, anonymous=api.anonymous_auth, cache_ttl=api.token_cache_ttl
            )
            if verify
            else None,
            authorizer=auth.Authorizer(
                reviews,
                gate=gate,
                node_name=self._settings.node.name,
                allowed_ttl=api.authorized_cache_ttl,
                denied_ttl=api.unauthorized_cache_ttl,
            )
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
                addresses=self._addresses,
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
