"""Keeps the kubelet API's serving certificate: reuse, request through a CSR, rotate.

What the kubelet's certificate manager does for its serving certificate
(`--rotate-server-certificates`): on start, the stored current certificate is reused while
it is valid for the node's addresses; otherwise a new key and a CSR (signer
kubernetes.io/kubelet-serving) are made and the issued certificate is stored. At 80 % of
its lifetime (`certificates.rotation_deadline`) the next one is requested while the old
one keeps serving. A denied, failed or unusable CSR is logged and retried with a new key
after an exponential backoff. The clock is injectable so tests can jump past a deadline.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cryptography import x509

from vnode.api import csr
from vnode.api.certificates import (
    CertificateRejected,
    ServingIdentity,
    bundle,
    certificate_request,
    check_certificate,
    csr_manifest,
    key_usages,
    load_chain,
    new_private_key,
    reuse_problem,
    rotation_deadline,
)
from vnode.api.certstore import CertificateStore
from vnode.kube import errors
from vnode.kube.backoff import ExponentialBackoff, jittered
from vnode.kube.client import ApiClient
from vnode.kube.reflector import ReflectorSettings

logger = logging.getLogger(__name__)


class Clock(Protocol):
    """Wall-clock time for certificate validity (aware UTC datetimes)."""

    def now(self) -> dt.datetime:
        """Return the current time."""

    async def sleep_until(self, moment: dt.datetime) -> None:
        """Return at or after `moment` (at once if it has passed)."""


class SystemClock:
    """The real clock. Sleeps in naps of at most `max_nap` seconds and looks at the time
    again after each, so a wall-clock jump (suspend, NTP step) delays rotation by one nap
    at most instead of by the whole monotonic sleep."""

    def __init__(self, *, max_nap: float = 300.0) -> None:
        self._max_nap = max_nap

    def now(self) -> dt.datetime:
        """Return the current UTC time."""
        return dt.datetime.now(dt.UTC)

    async def sleep_until(self, moment: dt.datetime) -> None:
        """Sleep until `moment` by the wall clock."""
        while True:
            remaining = (moment - self.now()).total_seconds()
            if remaining <= 0:
                return
            await asyncio.sleep(min(remaining, self._max_nap))


@dataclass(frozen=True, kw_only=True)
class CertificateManagerSettings:
    """How the serving certificate is requested; durations in seconds."""

    expiration_seconds: int | None = None
    """`spec.expirationSeconds` of each CSR (None: the signer's default)."""
    retry: ExponentialBackoff = field(
        default_factory=lambda: ExponentialBackoff(base=5.0, cap=300.0)
    )
    """Delay before a new CSR after a denied, failed or unusable one or an API error."""
    watch: ReflectorSettings | None = None
    """How a pending CSR is watched (None: the reflector's defaults)."""


OnCertificate = Callable[[Path], Awaitable[None]]
"""Called with the store file (chain + key) of each certificate to serve from now on."""


class ServingCertificateManager:
    """Obtains and renews one node's kubelet serving certificate; see the module doc."""

    def __init__(
        self,
        *,
        upper: ApiClient,
        identity: ServingIdentity,
        store: CertificateStore,
        settings: CertificateManagerSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._upper = upper
        self._identity = identity
        self._store = store
        self._settings = settings or CertificateManagerSettings()
        self._clock = clock or SystemClock()

    async def run(self, *, on_certificate: OnCertificate) -> None:
        """Hand `on_certificate` the first usable certificate (stored or newly issued),
        then each renewed one; run until cancelled. Waits as long as a CSR needs
        (approval may take a human); never raises for API or CSR failures (they are
        logged and retried), only what `on_certificate` raises."""
        stored = self._stored()
        if stored is None:
            path, leaf = await self._obtain()
        else:
            path, leaf = stored
        await on_certificate(path)
        while True:
            deadline = rotation_deadline(
                not_before=leaf.not_valid_before_utc, not_after=leaf.not_valid_after_utc
            )
            logger.info(
                "kubelet API: serving certificate valid until %s; renewing it from %s",
                _text(leaf.not_valid_after_utc),
                _text(deadline),
            )
            await self._clock.sleep_until(deadline)
            logger.info("kubelet API: renewing the serving certificate")
            path, leaf = await self._obtain()
            await on_certificate(path)

    def _stored(self) -> tuple[Path, x509.Certificate] | None:
        try:
            pem = self._store.load_current()
        except OSError as exc:
            pem = None
            logger.warning("kubelet API: cannot read %s: %s", self._store.current, exc)
        problem = reuse_problem(pem, identity=self._identity, now=self._clock.now())
        if problem is not None or pem is None:
            logger.info(
                "kubelet API: not serving a stored certificate from %s (%s); requesting one "
                "from the upper cluster; the API starts serving once it is issued",
                self._store.directory,
                problem,
            )
            return None
        path = self._store.current_target() or self._store.current
        logger.info("kubelet API: reusing the serving certificate in %s", path)
        return path, load_chain(pem)[0]

    async def _obtain(self) -> tuple[Path, x509.Certificate]:
        failures = 0
        while True:
            try:
                return await self._obtain_once()
            except CertificateRejected as exc:
                logger.error("kubelet API: no serving certificate: %s", exc)
            except (errors.ApiError, errors.ApiUnavailable) as exc:
                logger.warning("kubelet API: requesting a serving certificate failed: %s", exc)
            except OSError as exc:
                logger.error(
                    "kubelet API: cannot store the serving certificate in %s: %s",
                    self._store.directory,
                    exc,
                )
            delay = jittered(self._settings.retry.delay(failures))
            failures += 1
            logger.info("kubelet API: requesting a new serving certificate in %.0fs", delay)
            await asyncio.sleep(delay)

    async def _obtain_once(self) -> tuple[Path, x509.Certificate]:
        key = new_private_key()
        manifest = csr_manifest(
            request_pem=certificate_request(self._identity, key),
            usages=key_usages(key),
            expiration_seconds=self._settings.expiration_seconds,
        )
        self_approve = await csr.may_approve(self._upper)
        issued = await csr.request_certificate(
            self._upper,
            manifest=manifest,
            node_name=self._identity.node_name,
            self_approve=self_approve,
            now=self._clock.now,
            watch=self._settings.watch,
        )
        try:
            chain = load_chain(issued.certificate)
        except ValueError as exc:
            raise CertificateRejected(f"CSR {issued.name}: unreadable certificate: {exc}") from exc
        try:
            check_certificate(chain, key=key, identity=self._identity, now=self._clock.now())
        except CertificateRejected as exc:
            raise CertificateRejected(f"CSR {issued.name}: {exc}") from exc
        path = self._store.save(bundle(issued.certificate, key), now=self._clock.now())
        logger.info(
            "kubelet API: serving certificate from CSR %s stored in %s (valid until %s)",
            issued.name,
            path,
            _text(chain[0].not_valid_after_utc),
        )
        return path, chain[0]


def _text(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
