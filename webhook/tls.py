"""The webhook's serving certificate: from files (tensile-kube's `--tlscert`/`--tlskey`),
reloaded when they change; or bootstrapped: a CA and a serving certificate kept in a Secret
(`tensile.serving.certsecret`, shared by every replica), and the CA published as the
`caBundle` of the webhook's own MutatingWebhookConfiguration.

A bootstrapped certificate is checked again every `resync` seconds: a certificate another
replica renewed (or that is due) is picked up for new connections. The configuration is
watched (an informer on that one object), so a caBundle that is missing or stale (the
configuration created after the webhook, or replaced without it) is set again at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tensile.kube import errors, retry
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.serving import certsecret, tls
from tensile.serving.selfsigned import SubjectNames
from webhook import cabundle, metrics

logger = logging.getLogger(__name__)

_RETRIED: tuple[type[Exception], ...] = (*retry.API_ERRORS, certsecret.SecretError)
FILE_CHECK_INTERVAL = 10.0
"""Seconds between checks of --tlscert/--tlskey for a new certificate (at most)."""


class TlsError(Exception):
    """The serving certificate or the client CA could not be loaded; the message says which."""


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """Where the serving certificate comes from (flags in parentheses)."""

    cert_file: str = ""
    """Serving certificate file (--tlscert); with `key_file`, nothing is bootstrapped."""
    key_file: str = ""
    """Its key (--tlskey)."""
    client_ca_file: str = ""
    """Clients must present a certificate signed by this CA (--CA; tensile-kube's)."""
    secret_namespace: str = "tensile-system"  # noqa: S105 - a namespace, not a password
    secret_name: str = "tensile-webhook-tls"  # noqa: S105 - a Secret's name
    """The Secret a bootstrapped certificate is kept in (--tls-secret)."""
    webhook_configuration: str = "tensile-webhook"
    """The MutatingWebhookConfiguration whose caBundle is set, "" for none
    (--webhook-configuration)."""
    names: tuple[str, ...] = ()
    """DNS names and IP addresses the bootstrapped certificate names (--service, --tls-san)."""
    resync: float = 60.0
    """Seconds between checks of a bootstrapped certificate and of the caBundle (files are
    checked every FILE_CHECK_INTERVAL seconds, or this if shorter)."""
    lifetimes: certsecret.Lifetimes = field(default_factory=certsecret.Lifetimes)

    @property
    def from_files(self) -> bool:
        """Whether the certificate comes from files."""
        return bool(self.cert_file)


class ServingTls:
    """Gets the serving certificate, starts serving with it, and keeps it current."""

    def __init__(
        self,
        settings: TlsSettings,
        *,
        client: ApiClient,
        serve: Callable[[ssl.SSLContext], Awaitable[None]],
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        """`serve` starts listening with the context, once a certificate is in it; `clock`
        is the time certificates are checked against. Raises TlsError for a client CA file
        that cannot be loaded."""
        self._settings = settings
        self._client = client
        self._serve = serve
        self._clock = clock
        self._pem: bytes | None = None
        self._authority: bytes | None = None
        self._wake = asyncio.Event()
        self.informers: tuple[Informer, ...] = ()
        """Informers to run beside `keep` (the configuration's, when one is kept)."""
        if not settings.from_files and settings.webhook_configuration:
            configurations = Informer(
                client,
                cabundle.MUTATING_WEBHOOK_CONFIGURATIONS,
                name="webhook-configuration",
                field_selector=f"metadata.name={settings.webhook_configuration}",
            )
            configurations.add_handlers(
                Handlers(on_add=self._changed, on_update=lambda _old, new: self._changed(new))
            )
            self.informers = (configurations,)
        require = bool(settings.client_ca_file)
        try:
            self._rotating = tls.RotatingTls(
                client_ca_file=settings.client_ca_file,
                serve=serve,
                require_client_certificate=require,
                name="webhook",
            )
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(
                f"cannot load the client CA file --CA={settings.client_ca_file}: {exc}"
            ) from exc

    def not_ready(self) -> str | None:
        """A readiness check: None once a certificate is served."""
        return None if self._pem is not None else "no serving certificate yet"

    async def start(self) -> None:
        """Load the certificate and start serving: at once from files (raises TlsError when
        they cannot be loaded), else once the Secret could be read or written (retried,
        with backoff, until it can; cancel to give up)."""
        settings = self._settings
        if settings.from_files:
            try:
                self._rotating.context.load_cert_chain(settings.cert_file, settings.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise TlsError(
                    f"cannot load the serving certificate --tlscert={settings.cert_file} "
                    f"with --tlskey={settings.key_file}: {exc}"
                ) from exc
            await self._serve(self._rotating.context)
            self._pem = b"files"
            return
        bundle = await retry.until_done(
            "webhook: reading or writing the serving certificate's Secret",
            self._ensure,
            retried=_RETRIED,
        )
        await self._use(bundle)
        await self._publish(bundle)

    async def keep(self) -> None:
        """Keep the certificate current until cancelled (see the module docstring)."""
        settings = self._settings
        if settings.from_files:
            await tls.reload_certificates(
                self._rotating.context,
                cert_file=settings.cert_file,
                key_file=settings.key_file,
                interval=min(FILE_CHECK_INTERVAL, settings.resync),
                name="webhook",
            )
            return
        while True:
            try:
                async with asyncio.timeout(settings.resync):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                bundle = await self._ensure()
                await self._use(bundle)
                await self._publish(bundle)
            except _RETRIED as exc:
                logger.warning("webhook: cannot check the serving certificate: %s", exc)

    async def _ensure(self) -> certsecret.Bundle:
        settings = self._settings
        return await certsecret.ensure(
            self._client,
            namespace=settings.secret_namespace,
            name=settings.secret_name,
            names=SubjectNames.of(settings.names),
            manager="tensile-webhook",
            lifetimes=settings.lifetimes,
            clock=self._clock,
        )

    def _changed(self, configuration: dict[str, object]) -> None:
        """Informer handler: wake `keep` when a webhook of the configuration does not trust
        the CA in use (only looks; `keep` does the writing)."""
        if self._authority is None:
            return
        if cabundle.stale(configuration, ca_pem=self._authority):
            self._wake.set()

    async def _use(self, bundle: certsecret.Bundle) -> None:
        pem = bundle.serving_pem
        if pem == self._pem:
            return
        await self._rotating.use(pem)
        self._pem = pem
        metrics.CERTIFICATE_EXPIRY.set(bundle.serving.certificate.not_valid_after_utc.timestamp())

    async def _publish(self, bundle: certsecret.Bundle) -> None:
        configuration = self._settings.webhook_configuration
        if not configuration:
            return
        self._authority = bundle.authority.cert_pem
        try:
            await cabundle.publish(
                self._client, configuration=configuration, ca_pem=bundle.authority.cert_pem
            )
        except errors.NotFound:
            logger.warning(
                "webhook: MutatingWebhookConfiguration %s not found yet; its caBundle is set "
                "once it exists",
                configuration,
            )
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("webhook: cannot set the caBundle of %s: %s", configuration, exc)
