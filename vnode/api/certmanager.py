"""Keeps the kubelet API's serving certificate: reuse, request through a CSR, rotate.

What the kubelet's certificate manager does for its serving certificate
(`--rotate-server-certificates`): on start, the stored current certificate is reused while
it is valid for the node's addresses; otherwise a new key and a CSR (signer
kubernetes.io/kubelet-serving) are made and the issued certificate is stored. At 80 % of
its lifetime (`certificates.rotation_deadline`) the next one is requested while the old
one keeps serving, but never sooner than a minimum interval after the last one (1 s,
doubling while each new certificate is due at once, up to 5 min). A denied, failed or
unusable CSR, an API error or any other failure while obtaining one is logged and retried
with a new key after an exponential backoff: nothing but cancellation ends `run`.

The store is a directory (`--cert-dir`) or a Secret upstairs (`--cert-secret`): see
`vnode.api.certstore`. An issued certificate is never thrown away because the store cannot
be written: it is served from memory and only the save is retried (a restart before it is
saved needs a new CSR). The clock is injectable so tests can jump past a deadline.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from cryptography import x509

from tensile.kube import errors
from tensile.kube.backoff import ExponentialBackoff, jittered
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.kube.reflector import ReflectorSettings
from tensile.kube.timestamps import rfc3339
from tensile.serving.tls import RotatingTls
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
    not_yet_valid_for,
    renewal_time,
    reuse_problem,
    rotation_deadline,
)
from vnode.api.certstore import ServingCertificateStore, StoreError

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
    """Delay before a new CSR after a denied, failed or unusable one or any other failure,
    and between attempts to store or to start serving a certificate already obtained."""
    min_renewal_interval: ExponentialBackoff = field(
        default_factory=lambda: ExponentialBackoff(base=1.0, cap=300.0)
    )
    """Least time from obtaining a certificate to requesting the next one; doubles for each
    certificate in a row that is due for renewal as soon as it arrives."""
    watch: ReflectorSettings | None = None
    """How a pending CSR is watched (None: the reflector's defaults)."""


@dataclass(frozen=True, kw_only=True)
class ServingCertificate:
    """A certificate to serve, held in memory."""

    pem: bytes
    """The PEM certificate chain, then the private key (`certificates.bundle`)."""
    leaf: x509.Certificate
    """The chain's first certificate (the one naming this node)."""
    stored_at: str | None
    """Where the store keeps it (a file, a Secret's key); None while it could not be
    stored (not persisted)."""


OnCertificate = Callable[[ServingCertificate], Awaitable[None]]
"""Called with each certificate to serve from now on (the first, then each renewed one)."""


class ServingCertificateManager:
    """Obtains and renews one node's kubelet serving certificate; see the module doc."""

    def __init__(
        self,
        *,
        upper: ApiClient,
        identity: ServingIdentity,
        store: ServingCertificateStore,
        settings: CertificateManagerSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._upper = upper
        self._identity = identity
        self._store = store
        self._settings = settings or CertificateManagerSettings()
        self._clock = clock or SystemClock()

    @property
    def location(self) -> str:
        """Where the certificates are stored (a directory, a Secret), for logs."""
        return self._store.location

    async def run(self, *, on_certificate: OnCertificate) -> None:
        """Hand `on_certificate` the first usable certificate (stored or newly issued),
        then each renewed one; run until cancelled. Waits as long as a CSR needs
        (approval may take a human). Raises nothing but CancelledError: failures to
        obtain, store or serve a certificate (what `on_certificate` raises included) are
        logged and retried."""
        certificate = await self._stored() or await self._obtain()
        held_back = 0
        while True:
            deadline = rotation_deadline(
                not_before=certificate.leaf.not_valid_before_utc,
                not_after=certificate.leaf.not_valid_after_utc,
            )
            renew_at, late = renewal_time(
                deadline=deadline,
                now=self._clock.now(),
                min_interval=self._settings.min_renewal_interval.delay(held_back),
            )
            held_back = held_back + 1 if late else 0
            if late:
                logger.warning(
                    "kubelet API: the serving certificate (valid %s to %s) is due for renewal "
                    "already (from %s, now %s): is this node's clock ahead of the signer's, "
                    "or the lifetime too short? Renewing it at %s, not sooner",
                    rfc3339(certificate.leaf.not_valid_before_utc),
                    rfc3339(certificate.leaf.not_valid_after_utc),
                    rfc3339(deadline),
                    rfc3339(self._clock.now()),
                    rfc3339(renew_at),
                )
            else:
                logger.info(
                    "kubelet API: serving certificate valid until %s; renewing it from %s",
                    rfc3339(certificate.leaf.not_valid_after_utc),
                    rfc3339(renew_at),
                )
            await self._settle(certificate, on_certificate=on_certificate, until=renew_at)
            await self._clock.sleep_until(renew_at)
            logger.info("kubelet API: renewing the serving certificate")
            certificate = await self._obtain()

    async def _stored(self) -> ServingCertificate | None:
        """Return the stored current certificate when it can serve now, else None (with a
        log saying why). Raises nothing but CancelledError."""
        problem: str | None
        try:
            try:
                stored = await self._store.read()
            except StoreError as exc:
                stored, problem = None, str(exc)
            else:
                problem = reuse_problem(
                    stored.pem if stored is not None else None,
                    identity=self._identity,
                    now=self._clock.now(),
                )
            if stored is not None and problem is None:
                leaf = load_chain(stored.pem)[0]
                self._warn_if_not_yet_valid(leaf, source=f"the certificate in {stored.where}")
                logger.info("kubelet API: reusing the serving certificate in %s", stored.where)
                return ServingCertificate(pem=stored.pem, leaf=leaf, stored_at=stored.where)
        except Exception as exc:  # noqa: BLE001 - a bad store must not stop the node
            problem = f"cannot use it: {_describe(exc)}"
        logger.info(
            "kubelet API: not serving a stored certificate from %s (%s); requesting one "
            "from the upper cluster; the API starts serving once it is issued",
            self._store.location,
            problem,
        )
        return None

    async def _obtain(self) -> ServingCertificate:
        """Return a new certificate from a CSR, trying again (new key, new CSR) after a
        backoff for as long as it takes. Raises nothing but CancelledError."""
        failures = 0
        while True:
            try:
                return await self._obtain_once()
            except Exception as exc:  # noqa: BLE001 - see _log_failure
                _log_failure(exc)
            delay = jittered(self._settings.retry.delay(failures))
            failures += 1
            logger.info("kubelet API: requesting a new serving certificate in %.0fs", delay)
            await asyncio.sleep(delay)

    async def _obtain_once(self) -> ServingCertificate:
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
            check_certificate(chain, key=key, identity=self._identity, now=self._clock.now())
        except (CertificateRejected, ValueError) as exc:
            raise CertificateRejected(f"CSR {issued.name}: unusable certificate: {exc}") from exc
        self._warn_if_not_yet_valid(chain[0], source=f"the certificate from CSR {issued.name}")
        certificate = ServingCertificate(
            pem=bundle(issued.certificate, key), leaf=chain[0], stored_at=None
        )
        stored = await self._save(certificate)
        if stored.stored_at is not None:
            logger.info(
                "kubelet API: serving certificate from CSR %s stored in %s (valid until %s)",
                issued.name,
                stored.stored_at,
                rfc3339(chain[0].not_valid_after_utc),
            )
        return stored

    async def _save(self, certificate: ServingCertificate) -> ServingCertificate:
        """Store `certificate`; return it with where it went, or unchanged (stored_at None)
        when the store cannot be written (logged at ERROR). Raises nothing but
        CancelledError."""
        try:
            where = await self._store.write(certificate.pem, now=self._clock.now())
        except StoreError as exc:
            logger.error(
                "kubelet API: cannot store the serving certificate: %s; serving it from "
                "memory: it is NOT persisted, so a restart now will need a new CSR (and maybe "
                "a new approval); trying to store it again",
                exc,
            )
            return certificate
        return replace(certificate, stored_at=where)

    async def _settle(
        self, certificate: ServingCertificate, *, on_certificate: OnCertificate, until: dt.datetime
    ) -> None:
        """Hand `certificate` to `on_certificate`, and store it if it is not yet; retry
        what failed after a backoff until both are done or `until` (the renewal, which
        brings a new certificate) is nearer than the next attempt. Raises nothing but
        CancelledError."""
        served = False
        failures = 0
        while True:
            if not served:
                try:
                    await on_certificate(certificate)
                    served = True
                except Exception as exc:  # noqa: BLE001 - the node must keep running
                    logger.error(
                        "kubelet API: cannot serve the new certificate: %s", _describe(exc)
                    )
            if certificate.stored_at is None:
                certificate = await self._save(certificate)
                if certificate.stored_at is not None:
                    logger.info(
                        "kubelet API: the serving certificate is stored in %s at last",
                        certificate.stored_at,
                    )
            if served and certificate.stored_at is not None:
                return
            delay = jittered(self._settings.retry.delay(failures))
            failures += 1
            if (until - self._clock.now()).total_seconds() <= delay:
                return
            await asyncio.sleep(delay)

    def _warn_if_not_yet_valid(self, leaf: x509.Certificate, *, source: str) -> None:
        ahead = not_yet_valid_for(leaf, now=self._clock.now())
        if ahead > dt.timedelta(0):
            logger.warning(
                "kubelet API: %s is valid only from %s, %.0fs after this node's clock: the "
                "clock is behind the signer's (check NTP); serving it anyway, as clients "
                "judge its validity by their own clocks",
                source,
                rfc3339(leaf.not_valid_before_utc),
                ahead.total_seconds(),
            )


class CsrCertificates:
    """A `tensile.serving.tls.TlsSource`: the serving certificate a manager obtains and
    renews through CSRs. Nothing is at hand at start; `keep` hands the server each
    certificate, the first one (stored, or issued once the CSR is approved, maybe hours
    later) starting to serve."""

    def __init__(self, manager: ServingCertificateManager) -> None:
        self._manager = manager

    def informers(self) -> Sequence[Informer]:
        """None: a pending CSR is watched by the manager itself."""
        return ()

    async def load(self, tls: RotatingTls) -> None:
        """Nothing: say where the certificate will come from."""
        logger.info(
            "kubelet API: no APISERVER_CERT_LOCATION; the serving certificate comes from a "
            "CSR to the upper cluster (kept in %s)",
            self._manager.location,
        )

    async def keep(self, tls: RotatingTls) -> None:
        """Run the manager until cancelled (it logs and retries every failure)."""

        async def use(certificate: ServingCertificate) -> None:
            await tls.use(certificate.pem)

        await self._manager.run(on_certificate=use)


def _leaves(exc: BaseException) -> list[BaseException]:
    """Return the exceptions inside `exc`, exception groups (as a TaskGroup raises them)
    flattened; `[exc]` for any other exception."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _describe(exc: BaseException) -> str:
    """Return what went wrong, for a log: each exception inside a group, separated by
    `; `; the ones we raise on purpose by their message, others by type and message."""
    texts = []
    for leaf in _leaves(exc):
        expected = isinstance(
            leaf,
            CertificateRejected | StoreError | errors.ApiError | errors.ApiUnavailable | OSError,
        )
        texts.append(str(leaf) if expected else f"{type(leaf).__name__}: {leaf}")
    return "; ".join(texts)


def _log_failure(exc: Exception) -> None:
    """Log a failure to obtain a certificate: a rejected CSR or certificate at ERROR, an
    API error at WARNING (the upper cluster may come back), anything else (a malformed
    answer, a bug) at ERROR with its traceback. The caller retries all of them."""
    leaves = _leaves(exc)
    cause = leaves[0] if len(leaves) == 1 else exc
    if isinstance(cause, CertificateRejected):
        logger.error("kubelet API: no serving certificate: %s", _describe(exc))
    elif isinstance(cause, errors.ApiError | errors.ApiUnavailable):
        logger.warning("kubelet API: requesting a serving certificate failed: %s", _describe(exc))
    else:
        logger.error(
            "kubelet API: requesting a serving certificate failed unexpectedly: %s",
            _describe(exc),
            exc_info=exc,
        )
