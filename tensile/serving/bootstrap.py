"""A `TlsSource` for a server that brings its own certificate: a CA and a serving
certificate made and kept in a Secret (`tensile.serving.certsecret`, shared by every
replica), the CA optionally published where the server's callers learn whom to trust (the
webhook: its MutatingWebhookConfiguration's caBundle, a `Publication`).

The first certificate is awaited as long as the apiserver takes (retried with backoff:
nothing is served before it). Then the Secret is checked again every `resync` seconds, and
at once when the publication finds itself stale: a certificate another replica renewed (or
that is due) is picked up for new connections, and a caBundle that is missing or stale (the
configuration created after the server, or replaced without it) is set again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tensile.kube import retry
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.serving import certsecret
from tensile.serving.selfsigned import SubjectNames
from tensile.serving.tls import RotatingTls

logger = logging.getLogger(__name__)

_RETRIED: tuple[type[Exception], ...] = (*retry.API_ERRORS, certsecret.SecretError)


@dataclass(frozen=True, kw_only=True)
class SecretSettings:
    """Where a bootstrapped certificate is kept and what it names."""

    namespace: str
    name: str
    """The Secret (kubernetes.io/tls) every replica reads and writes."""
    names: tuple[str, ...] = ()
    """DNS names and IP addresses the serving certificate names."""
    lifetimes: certsecret.Lifetimes = field(default_factory=certsecret.Lifetimes)


class Publication(Protocol):
    """Where a bootstrapped CA is published, so callers trust the serving certificate."""

    def informers(self) -> Sequence[Informer]:
        """What watches the published copy (run beside the source's `keep`)."""

    def on_stale(self, wake: Callable[[], None]) -> None:
        """Call `wake` whenever the published copy no longer names the CA last
        published (a loop callback: it only asks for a check)."""

    async def publish(self, bundle: certsecret.Bundle) -> None:
        """Publish `bundle`'s CA where it differs. Raises nothing but CancelledError (what
        fails is logged and tried again at the next check)."""


class SecretBootstrap:
    """A `tensile.serving.tls.TlsSource`: see the module docstring."""

    def __init__(
        self,
        settings: SecretSettings,
        *,
        client: ApiClient,
        resync: float,
        manager: str,
        publication: Publication | None = None,
        label: str = "server",
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        """`client` reads and writes the Secret; `resync` is the seconds between two
        checks; `manager` labels a Secret this makes (app.kubernetes.io/managed-by);
        `label` prefixes log lines; `clock` is the time certificates are checked
        against."""
        self._settings = settings
        self._client = client
        self._resync = resync
        self._manager = manager
        self._publication = publication
        self._label = label
        self._clock = clock
        self._pem: bytes | None = None
        self._wake = asyncio.Event()
        if publication is not None:
            publication.on_stale(self._wake.set)

    def informers(self) -> Sequence[Informer]:
        """The publication's."""
        return () if self._publication is None else self._publication.informers()

    async def load(self, tls: RotatingTls) -> None:
        """Nothing: the Secret may take a while (see `keep`)."""

    async def keep(self, tls: RotatingTls) -> None:
        """Read or make the certificate (retried, with backoff, until the apiserver
        answers; cancel to give up) and serve it; then check it every `resync` seconds and
        when woken. Raises what serving it raises."""
        bundle = await retry.until_done(
            f"{self._label}: reading or writing the serving certificate's Secret",
            self._ensure,
            retried=_RETRIED,
        )
        await self._use(tls, bundle)
        while True:
            try:
                async with asyncio.timeout(self._resync):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                bundle = await self._ensure()
            except _RETRIED as exc:
                logger.warning("%s: cannot check the serving certificate: %s", self._label, exc)
                continue
            await self._use(tls, bundle)

    async def _ensure(self) -> certsecret.Bundle:
        settings = self._settings
        return await certsecret.ensure(
            self._client,
            namespace=settings.namespace,
            name=settings.name,
            names=SubjectNames.of(settings.names),
            manager=self._manager,
            lifetimes=settings.lifetimes,
            clock=self._clock,
        )

    async def _use(self, tls: RotatingTls, bundle: certsecret.Bundle) -> None:
        """Serve `bundle` when it is new, and publish its CA."""
        if bundle.serving_pem != self._pem:
            await tls.use(bundle.serving_pem)
            self._pem = bundle.serving_pem
        if self._publication is not None:
            await self._publication.publish(bundle)
