"""A `tls.TlsSource` for a server given no certificate files: a self-signed certificate made
in memory at start, as kube-controller-manager and the Kubernetes descheduler make one when
`--tls-cert-file` is not given (k8s.io/apiserver `SecureServingOptions.
MaybeDefaultWithSelfSignedCerts`, client-go `cert.GenerateSelfSignedCertKey`: a CA of its own
signing a certificate for the host's names, one year).

Nobody can verify it against a CA they were given: a caller trusts it by choice (a
Prometheus `tlsConfig.insecureSkipVerify`), or gives the server certificate files instead.
The key never leaves the process (`tls.load_pem_chain`); a new pair is made before this one
expires, and on every start.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tensile.kube.informer import Informer
from tensile.serving import selfsigned
from tensile.serving.lifecycle import StartupError
from tensile.serving.selfsigned import SubjectNames
from tensile.serving.tls import RotatingTls

logger = logging.getLogger(__name__)

LIFETIME = dt.timedelta(days=365)
"""How long a generated certificate is valid (client-go's self-signed ones: a year)."""
RENEW_BEFORE = dt.timedelta(days=30)
"""A new one is made this long before the one in use expires."""


def host_names(address: str) -> tuple[str, ...]:
    """The names a generated certificate carries for a server listening on `address` (an IP
    address, "0.0.0.0" or "::" for all): the host's name, "localhost", 127.0.0.1, and
    `address` itself when it is a specific one (pure but for the host's name)."""
    names = [socket.gethostname(), "localhost", "127.0.0.1"]
    if address and address not in ("0.0.0.0", "::"):  # noqa: S104 - compared, not bound
        names.append(address)
    return tuple(dict.fromkeys(n for n in names if n))


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, kw_only=True)
class GeneratedCertificate:
    """A `TlsSource`: a self-signed certificate for `names`, made at `load` and again
    `RENEW_BEFORE` its expiry (see the module docstring)."""

    names: tuple[str, ...]
    """DNS names and IP addresses the certificate carries (`host_names`)."""
    label: str = "server"
    """Prefixes the log lines and messages ("descheduler")."""
    lifetime: dt.timedelta = LIFETIME
    now: Callable[[], dt.datetime] = field(default=_utcnow)
    """The clock (aware UTC)."""

    def informers(self) -> Sequence[Informer]:
        """None: nothing is watched."""
        return ()

    def _pem(self) -> tuple[bytes, dt.datetime]:
        """A new serving certificate and key (PEM, one block) and when it expires."""
        now = self.now()
        authority = selfsigned.new_authority(
            common_name=f"{self.names[0]}-ca@{int(now.timestamp())}",
            now=now,
            lifetime=self.lifetime,
        )
        serving = selfsigned.issue(
            authority, names=SubjectNames.of(self.names), now=now, lifetime=self.lifetime
        )
        return serving.cert_pem + serving.key_pem, serving.certificate.not_valid_after_utc

    async def load(self, tls: RotatingTls) -> None:
        """Make a certificate and hand it to `tls`. Raises StartupError when it cannot be
        served."""
        pem, expires = await asyncio.to_thread(self._pem)
        try:
            await tls.use(pem)
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(
                f"{self.label}: cannot serve a self-signed certificate: {exc}"
            ) from exc
        logger.info(
            "%s: serving a self-signed certificate for %s, until %s (no certificate files given)",
            self.label,
            ", ".join(self.names),
            expires.isoformat(),
        )

    async def keep(self, tls: RotatingTls) -> None:
        """Make a new certificate `RENEW_BEFORE` each one expires, until cancelled."""
        lifetime = self.lifetime
        while True:
            await asyncio.sleep(max(1.0, (lifetime - RENEW_BEFORE).total_seconds()))
            pem, _expires = await asyncio.to_thread(self._pem)
            try:
                await tls.use(pem)
            except (OSError, ssl.SSLError) as exc:
                logger.warning(
                    "%s: cannot serve a new self-signed certificate: %s", self.label, exc
                )
