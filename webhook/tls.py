"""The webhook's serving certificate: from files (tensile-kube's `--tlscert`/`--tlskey`),
reloaded when they change; or bootstrapped: a CA and a serving certificate kept in a Secret
(`vnode.serving.certsecret`, shared by every replica), and the CA published as the
`caBundle` of the webhook's own MutatingWebhookConfiguration.

A bootstrapped certificate is checked again every `resync` seconds: a certificate another
replica renewed (or that is due) is picked up for new connections, and a caBundle someone
reset (a `kubectl apply` of the configuration with an empty one) is put back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from vnode.kube import errors
from vnode.kube.client import ApiClient
from vnode.serving import certsecret, tls
from vnode.serving.selfsigned import SubjectNames
from webhook import cabundle, metrics

logger = logging.getLogger(__name__)

_RETRIED = (errors.ApiError, errors.ApiUnavailable, certsecret.SecretError)


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
    """Seconds between checks of a bootstrapped certificate and of the caBundle."""
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
        self._published: bytes | None = None
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
        bundle = await _retrying(
            "reading or writing the serving certificate's Secret", self._ensure
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
                name="webhook",
            )
            return
        while True:
            # Until the caBundle is in place (the configuration may be applied after the
            # webhook starts), look again soon.
            published = self._published is not None or not settings.webhook_configuration
            await asyncio.sleep(settings.resync if published else min(5.0, settings.resync))
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
            self._published = None
            return
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("webhook: cannot set the caBundle of %s: %s", configuration, exc)
            self._published = None
            return
        self._published = bundle.authority.cert_pem


async def _retrying(
    what: str, step: Callable[[], Awaitable[certsecret.Bundle]]
) -> certsecret.Bundle:
    """Run `step` until it returns, retrying API failures with jittered backoff (0.5 s
    doubling to 30 s), each logged; other exceptions and cancellation propagate."""

    def warn(state: RetryCallState) -> None:
        outcome = state.outcome
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.warning(
            "webhook: %s failed (attempt %d): %s; retrying in %.1fs",
            what,
            state.attempt_number,
            outcome.exception() if outcome else "?",
            delay,
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_RETRIED),
        wait=wait_exponential_jitter(initial=0.5, max=30.0),
        before_sleep=warn,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await step()
    raise AssertionError("unreachable")  # pragma: no cover - tenacity retries forever
