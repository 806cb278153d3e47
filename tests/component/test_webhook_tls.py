"""The webhook's certificate from files (`tensile.serving.https.HttpsServer` with
`tensile.serving.tls.CertificateFiles`, tensile-kube's `--tlscert`/`--tlskey`/`--CA`) on a
real socket on 127.0.0.1: served at once, replaced for new connections when the files
change, client certificates required with a CA. (The bootstrapped certificate needs the
apiserver: tests/e2e/test_webhook.py, tests/e2e/test_webhook_tls.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tensile.serving import selfsigned
from tensile.serving.https import HttpsServer, ServerSettings, certificate_files
from tensile.serving.lifecycle import StartupError
from tensile.serving.selfsigned import SubjectNames
from webhook.settings import DEFAULT_SERVER

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)
AUTHORITY = selfsigned.new_authority(common_name="files CA", now=NOW, lifetime=DAY)
NAMES = SubjectNames.of(["127.0.0.1"])


def _write(directory: Path) -> x509.Certificate:
    pair = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=DAY)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    return pair.certificate


def _client_certificate() -> selfsigned.KeyPair:
    """What the apiserver presents when its admission configuration names a client
    certificate: signed by the CA, extended key usage client auth."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(AUTHORITY.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(AUTHORITY.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + DAY)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return selfsigned.KeyPair(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_pem
    )


def _client(*, certificate: selfsigned.KeyPair | None = None, tmp: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=AUTHORITY.cert_pem.decode())
    if certificate is not None:
        (tmp / "client.pem").write_bytes(certificate.cert_pem + certificate.key_pem)
        context.load_cert_chain(str(tmp / "client.pem"))
    return context


async def _serial(port: int, context: ssl.SSLContext) -> int:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


async def _answered(port: int, context: ssl.SSLContext) -> bool:
    """Whether an HTTP request over TLS gets an answer (TLS 1.3 reports a refused client
    certificate only when the client reads)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    except (ssl.SSLError, ConnectionError):
        return False
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        return (await reader.read(4)) == b"HTTP"
    except (ssl.SSLError, ConnectionError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


def _settings(**files: str | float) -> ServerSettings:
    """The webhook's server settings (its flags' names) on 127.0.0.1, any free port."""
    return dataclasses.replace(
        DEFAULT_SERVER, address="127.0.0.1", port=0, shutdown_delay=0.0, shutdown_timeout=0.5,
        **files,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def _serving(settings: ServerSettings) -> AsyncIterator[tuple[int, HttpsServer]]:
    server = HttpsServer(
        settings,
        app=web.Application(),
        tls=certificate_files(settings, label="webhook"),
        name="webhook",
        label="webhook",
    )
    await server.start()
    try:
        yield server.port, server
    finally:
        await server.shut_down()


async def test_files_are_served_at_once_and_reloaded_when_they_change(tmp_path: Path) -> None:
    first = _write(tmp_path)
    settings = _settings(
        cert_file=str(tmp_path / "tls.crt"), key_file=str(tmp_path / "tls.key"), resync=0.1
    )
    async with _serving(settings) as (port, server):
        assert server.not_serving() is None
        client = _client(tmp=tmp_path)
        assert await _serial(port, client) == first.serial_number
        keeper = asyncio.create_task(server.run(), name="keep")
        try:
            await asyncio.sleep(0.05)
            second = _write(tmp_path)
            # A different mtime, whatever the file system's resolution.
            for name in ("tls.crt", "tls.key"):
                os.utime(tmp_path / name, (NOW.timestamp() + 10, NOW.timestamp() + 10))
            for _ in range(200):  # 10 s
                if await _serial(port, client) == second.serial_number:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the new certificate was never served")
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper


async def test_with_a_ca_clients_must_present_a_certificate_of_it(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "ca.crt").write_bytes(AUTHORITY.cert_pem)
    settings = _settings(
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        client_ca_file=str(tmp_path / "ca.crt"),
    )
    async with _serving(settings) as (port, _server):
        assert await _answered(port, _client(certificate=_client_certificate(), tmp=tmp_path))
        # A certificate of the CA, but for serving, not client authentication.
        server_only = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=DAY)
        assert not await _answered(port, _client(certificate=server_only, tmp=tmp_path))
        assert not await _answered(port, _client(tmp=tmp_path))


async def test_files_that_cannot_be_loaded_fail_the_start(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    settings = _settings(cert_file=str(tmp_path / "tls.crt"), key_file=str(tmp_path / "tls.key"))
    with pytest.raises(StartupError, match="cannot load the serving certificate --tlscert="):
        async with _serving(settings):
            pass
    with pytest.raises(StartupError, match="cannot load the client CA file --CA="):
        async with _serving(
            dataclasses.replace(settings, client_ca_file=str(tmp_path / "missing.crt"))
        ):
            pass
