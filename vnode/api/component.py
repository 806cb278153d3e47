"""The kubelet HTTPS API as a component of the virtual node
(`tensile.serving.lifecycle.Component`): the aiohttp application of `vnode.api.server`,
served by the HTTPS server every program shares (`tensile.serving.https`) on the node's
InternalIP:KUBELET_PORT (what the upper apiserver connects to), with the serving
certificate from files (APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION, reloaded when they
change) or from CSRs to the upper cluster (`vnode.api.certmanager`, renewed before expiry,
kept in --cert-dir or, with --cert-secret, in a Secret upstairs: `vnode.api.secretstore`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.serving.https import FlagNames, HttpsServer, ServerSettings, certificate_files
from tensile.serving.lifecycle import StartupError
from tensile.serving.tls import TlsSource
from vnode.api import auth
from vnode.api.certificates import identity_from_addresses
from vnode.api.certmanager import (
    CertificateManagerSettings,
    Clock,
    CsrCertificates,
    ServingCertificateManager,
)
from vnode.api.certstore import CertificateStore, ServingCertificateStore
from vnode.api.secretstore import SecretStore
from vnode.api.server import ApiContext, make_app
from vnode.provider import Provider
from vnode.settings import Settings, default_cert_dir

logger = logging.getLogger(__name__)

FLAGS = FlagNames(
    port="KUBELET_PORT",
    cert_file="APISERVER_CERT_LOCATION",
    key_file="APISERVER_KEY_LOCATION",
    client_ca_file="--client-verify-ca",
)
"""How virtual-kubelet names the kubelet API's settings (environment variables and flags)."""
SHUTDOWN_TIMEOUT = 2.0
"""Seconds requests in flight get at a stop (exec and log streams end with the node)."""


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
        self._server: HttpsServer | None = None
        self._stopped = asyncio.Event()
        self._started = False

    def informers(self) -> Sequence[Informer]:
        """None of its own: it reads the pod controller's cache."""
        return []

    async def start(self) -> None:
        """Set up the kubelet API (see `HttpsServer.start`); with certificate files it
        listens at once. Raises StartupError naming the culprit: a busy KUBELET_PORT, a
        client CA file (--client-verify-ca / APISERVER_CA_CERT_LOCATION) or certificate
        files that cannot be loaded, no address to put in a CSR.

        Otherwise, with --rotate-server-certificates, it listens once a certificate from a
        CSR exists (connections are refused until then), maybe hours later: by then
        nothing is left that could fail and take down a node that is serving pods."""
        api = self._settings.api
        if not api.cert_file and not api.rotate_server_certificates:
            logger.warning(
                "kubelet API disabled: no APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION and "
                "--rotate-server-certificates=false (kubectl logs/exec on this node's pods "
                "will fail)"
            )
            self._started = True
            return
        settings = ServerSettings(
            address=self._settings.node.internal_ip,
            port=self._settings.node.kubelet_port,
            cert_file=api.cert_file,
            key_file=api.key_file,
            client_ca_file=api.client_ca_file,
            # A kubelet verifies a client certificate when one is presented: its
            # bearer-token callers (metrics-server, kubectl through a token) must connect.
            require_client_certificate=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
            flags=FLAGS,
        )
        server = HttpsServer(
            settings,
            app=make_app(self._api_context()),
            tls=self._certificate(settings),
            name=self.name,
            label="kubelet API",
        )
        await server.start()
        self._server = server
        self._started = True

    def ready(self) -> bool:
        """Whether the API is set up (it may still wait for a certificate from a CSR)."""
        return self._started

    async def run(self) -> None:
        """Keep the serving certificate fresh until `shut_down`. Registration, lease and
        pods never wait for this: a CSR may wait for a human to approve it."""
        if self._server is None:
            await self._stopped.wait()
            return
        await self._server.run()

    async def shut_down(self) -> None:
        """Stop serving (requests in flight get a moment to finish)."""
        self._stopped.set()
        if self._server is not None:
            await self._server.shut_down()

    def _certificate(self, settings: ServerSettings) -> TlsSource:
        """The serving certificate's source: the files, else CSRs."""
        if settings.from_files:
            return certificate_files(settings, label="kubelet API")
        return CsrCertificates(self._certificate_manager())

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
                allowed_ttl=api.authorized_cache_ttl,
                denied_ttl=api.unauthorized_cache_ttl,
            )
            if verify
            else None,
            idle_timeout=api.streaming_idle_timeout,
        )

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
        store: ServingCertificateStore = CertificateStore(self._cert_dir())
        if api.cert_secret is not None:
            namespace, name = api.cert_secret
            store = SecretStore(
                client=self._upper, namespace=namespace, name=name, identity=identity
            )
        return ServingCertificateManager(
            upper=self._upper,
            identity=identity,
            store=store,
            settings=CertificateManagerSettings(
                expiration_seconds=api.server_certificate_duration or None
            ),
            clock=self._clock,
        )

    def _cert_dir(self) -> Path:
        return Path(self._settings.api.cert_dir or default_cert_dir(self._settings.node.name))
