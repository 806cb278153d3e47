"""Serving TLS: server contexts, and where a server's certificate comes from.

A `TlsSource` gets a server's certificate and keeps it current: `CertificateFiles` (files
named by flags, reloaded when they change), `certsecret.SecretBootstrap` (made and kept in
a Secret every replica shares), the kubelet API's CSRs (`vnode.api.certmanager`). It hands
each certificate to the server's `RotatingTls`, whose first one starts serving.

Python's `ssl` reads a new certificate into a live context for the handshakes that follow
(`SSLContext.load_cert_chain`), so rotation never restarts a listener: established
connections keep the certificate they were made with.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography import x509
from prometheus_client import Gauge

from tensile.kube.informer import Informer
from tensile.serving.lifecycle import StartupError

logger = logging.getLogger(__name__)

FILE_CHECK_INTERVAL = 10.0
"""Seconds between two looks at certificate files for a new certificate (at most)."""
CERTIFICATE_EXPIRY = Gauge(
    "tensile_serving_certificate_expiry_timestamp_seconds",
    "When the serving certificate in use expires (Unix time), by server (kubelet API, "
    "webhook, extender, descheduler): files, bootstrapped, CSR-issued or self-signed, set "
    "each time one is loaded.",
    ["server"],
)


def record_expiry(*, server: str, pem: bytes) -> None:
    """Set `CERTIFICATE_EXPIRY` of `server` from the first certificate in `pem` (the
    serving certificate leads its chain; a key in the same block is skipped). A block
    without a readable certificate leaves the gauge as it was: `ssl` has refused it
    already, or will."""
    try:
        first = x509.load_pem_x509_certificates(pem)[0]
    except ValueError:
        return
    CERTIFICATE_EXPIRY.labels(server=server).set(first.not_valid_after_utc.timestamp())


def _record_file_expiry(*, server: str, cert_file: str) -> None:
    try:
        with open(cert_file, "rb") as file:
            pem = file.read()
    except OSError:
        return  # `ssl` has read it a moment ago; gone now: the next change is looked at
    record_expiry(server=server, pem=pem)


def tls_context(*, client_ca_file: str, require_client_certificate: bool = False) -> ssl.SSLContext:
    """Return a server TLS context without a certificate yet (TLS 1.2 or later).

    `client_ca_file` "" verifies no client certificate. Otherwise client certificates are
    verified against it: when presented (CERT_OPTIONAL, as a kubelet, whose bearer-token
    callers such as metrics-server must still connect) or, with
    `require_client_certificate`, always (CERT_REQUIRED: a port only the apiserver calls,
    as tensile-kube's webhook `--CA`). Raises OSError / ssl.SSLError for a missing,
    unreadable or invalid CA file."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if require_client_certificate else ssl.CERT_OPTIONAL
    return context


async def reload_certificates(
    context: ssl.SSLContext,
    *,
    cert_file: str,
    key_file: str,
    interval: float = 10.0,
    name: str = "server",
) -> None:
    """Load the serving certificate again whenever its files change (checked every
    `interval` seconds); new handshakes get the new one. A pair that cannot be loaded
    (half-written, mismatched) is logged and the previous one kept. `name` labels the log
    lines ("kubelet API", "webhook"). Runs until cancelled."""

    def stamp() -> tuple[float, float]:
        return os.stat(cert_file).st_mtime, os.stat(key_file).st_mtime

    last = stamp()
    while True:
        await asyncio.sleep(interval)
        try:
            current = stamp()
            if current != last:
                context.load_cert_chain(cert_file, key_file)
                _record_file_expiry(server=name, cert_file=cert_file)
                last = current
                logger.info("%s: serving certificate reloaded from %s", name, cert_file)
        except (OSError, ssl.SSLError) as exc:
            logger.warning("%s: cannot reload the serving certificate: %s", name, exc)


class RotatingTls:
    """The TLS side of a server whose certificate comes from a `TlsSource` (files,
    bootstrapped, CSR-issued, renewed): the context (`tls_context`) is made at once, so a
    bad client CA file fails at startup; the first certificate goes into it and starts
    serving; each later one replaces the certificate in that same context, so new
    handshakes get it while established connections keep theirs."""

    def __init__(
        self,
        *,
        client_ca_file: str,
        serve: Callable[[ssl.SSLContext], Awaitable[None]],
        require_client_certificate: bool = False,
        name: str = "server",
    ) -> None:
        """`serve` starts listening with the context (called on the first certificate,
        again on the next one if it raised); `name` labels log lines. Raises OSError /
        ssl.SSLError for a bad `client_ca_file`."""
        self._serve = serve
        self._serving = False
        self._name = name
        self.context = tls_context(
            client_ca_file=client_ca_file, require_client_certificate=require_client_certificate
        )

    async def use(self, pem: bytes) -> None:
        """Serve the certificate chain and private key in `pem` (PEM, in one block) from
        now on. Raises ssl.SSLError / OSError when they cannot be loaded, and what
        `serve` raises."""
        await load_pem_chain(self.context, pem)
        record_expiry(server=self._name, pem=pem)
        if not self._serving:
            await self._serve(self.context)
            self._serving = True
            return
        logger.info("%s: new connections get the renewed certificate", self._name)

    async def use_files(self, *, cert_file: str, key_file: str) -> None:
        """Serve the certificate in `cert_file` with the key in `key_file` (PEM) from now
        on. Raises ssl.SSLError / OSError when they cannot be loaded, and what `serve`
        raises."""
        self.context.load_cert_chain(cert_file, key_file)
        _record_file_expiry(server=self._name, cert_file=cert_file)
        if not self._serving:
            await self._serve(self.context)
            self._serving = True


class TlsSource(Protocol):
    """Where a server's certificate comes from, and how it is kept current."""

    def informers(self) -> Sequence[Informer]:
        """What the source watches: its server runs these beside `keep`."""

    async def load(self, tls: RotatingTls) -> None:
        """Hand `tls` the certificate now when it is at hand (files); a source whose
        certificate comes later (a Secret, a CSR) hands nothing here. Raises StartupError
        when it is at hand but cannot be used."""

    async def keep(self, tls: RotatingTls) -> None:
        """Hand `tls` the first certificate when `load` had none (it starts serving), then
        each new one; run until cancelled. Failures it can outlive are logged and retried;
        what it raises ends the server."""


@dataclass(frozen=True, kw_only=True)
class CertificateFiles:
    """A `TlsSource`: a certificate and its key in files (tensile-kube's `--tlscert`,
    the kubelet's `APISERVER_CERT_LOCATION`), loaded at start and again whenever they
    change; a pair that cannot be loaded later (half-written, mismatched) is logged and
    the previous one kept."""

    cert_file: str
    key_file: str
    cert_flag: str
    """How the command line names `cert_file` (for the message when it cannot be loaded)."""
    key_flag: str
    """How it names `key_file`."""
    interval: float = FILE_CHECK_INTERVAL
    """Seconds between two looks at the files."""
    label: str = "server"
    """Prefixes the log lines and messages ("webhook", "kubelet API")."""

    def informers(self) -> Sequence[Informer]:
        """None: the files are looked at, not watched."""
        return ()

    async def load(self, tls: RotatingTls) -> None:
        """Load the files into `tls`. Raises StartupError naming the flags when they
        cannot be loaded."""
        try:
            await tls.use_files(cert_file=self.cert_file, key_file=self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(
                f"{self.label}: cannot load the serving certificate {self.cert_flag}="
                f"{self.cert_file} with {self.key_flag}={self.key_file}: {exc}"
            ) from exc

    async def keep(self, tls: RotatingTls) -> None:
        """Load the files again whenever they change, until cancelled."""
        await reload_certificates(
            tls.context,
            cert_file=self.cert_file,
            key_file=self.key_file,
            interval=self.interval,
            name=self.label,
        )


async def load_pem_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """Load the certificate chain and private key in `pem` into `context`.

    `ssl` loads certificates from files only. `pem` goes into an anonymous in-memory file
    (memfd, Linux) read through /proc/self/fd: the key lands on no file system, and this
    works while no certificate store can be written. Elsewhere it goes into a private
    (0600) temporary file, deleted at once. The file is written in a thread; the context
    is changed on the event loop, where the handshakes that read it run. Raises
    ssl.SSLError for bad PEM data, OSError for a file that cannot be made."""
    path, close = await asyncio.to_thread(_pem_file, pem)
    try:
        context.load_cert_chain(path)
    finally:
        close()


def _pem_file(pem: bytes) -> tuple[str, Callable[[], None]]:
    """Return (a path to read `pem` from, what removes it)."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("tensile-serving-certificate", os.MFD_CLOEXEC)
        try:
            with open(fd, "wb", closefd=False) as file:
                file.write(pem)
        except BaseException:
            os.close(fd)
            raise
        return f"/proc/self/fd/{fd}", functools.partial(os.close, fd)
    fd, name = tempfile.mkstemp(prefix="tensile-serving-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(pem)
    except BaseException:
        os.unlink(name)
        raise
    return name, functools.partial(os.unlink, name)
