"""The TLS side of a CSR-issued serving certificate (`tensile.serving`): the port is
claimed and the client CA loaded before any certificate exists; certificates are served
from memory and replaced for new handshakes; on real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import REGISTRY

from tensile.serving.sockets import bound_socket
from tensile.serving.tls import (
    CertificateFiles,
    RotatingTls,
    load_pem_chain,
    reload_certificates,
    tls_context,
)
from vnode.api import certificates as certs

NOW = dt.datetime.now(dt.UTC)
CA_KEY = ec.generate_private_key(ec.SECP256R1())
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
CA = (
    x509.CertificateBuilder()
    .subject_name(CA_NAME)
    .issuer_name(CA_NAME)
    .public_key(CA_KEY.public_key())
    .serial_number(1)
    .not_valid_before(NOW - dt.timedelta(hours=1))
    .not_valid_after(NOW + dt.timedelta(days=1))
    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    .sign(CA_KEY, hashes.SHA256())
)


def _serving_pem(serial: int, *, valid_for: dt.timedelta = dt.timedelta(hours=1)) -> bytes:
    """A store file (chain, then key) for 127.0.0.1, signed by CA, valid for `valid_for`."""
    key = certs.new_private_key()
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:node:vn")]))
        .issuer_name(CA_NAME)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + valid_for)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(CA_KEY, hashes.SHA256())
    )
    return certs.bundle(leaf.public_bytes(serialization.Encoding.PEM), key)


def _client(tmp_path: Path) -> ssl.SSLContext:
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(CA.public_bytes(serialization.Encoding.PEM))
    return ssl.create_default_context(cafile=str(ca_file))


async def _served_serial(port: int, client: ssl.SSLContext) -> int:
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


@contextlib.asynccontextmanager
async def _runner() -> AsyncIterator[web.AppRunner]:
    app_runner = web.AppRunner(web.Application(), shutdown_timeout=0.5)
    await app_runner.setup()
    try:
        yield app_runner
    finally:
        await app_runner.cleanup()


def _serve_on(
    runner: web.AppRunner, sock: socket.socket
) -> Callable[[ssl.SSLContext], Awaitable[None]]:
    async def serve(tls: ssl.SSLContext) -> None:
        await web.SockSite(runner, sock, ssl_context=tls).start()

    return serve


def test_a_busy_port_fails_when_it_is_bound() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="Address already in use"):
            bound_socket("127.0.0.1", port)


def test_a_bound_port_refuses_connections_until_it_is_served() -> None:
    with bound_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        # Refused at once, not queued for a TLS handshake that may come hours later.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        # Claimed: nobody else can bind it (SO_REUSEADDR or not) while we hold it.
        with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
            other.bind(("127.0.0.1", port))


@pytest.mark.parametrize("content", [b"", b"not a certificate"])
def test_a_bad_client_ca_fails_when_the_tls_side_is_made(tmp_path: Path, content: bytes) -> None:
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(content)

    async def never(_tls: ssl.SSLContext) -> None:
        raise AssertionError("must not serve")

    # Before any certificate exists (which, from a CSR, may be hours later).
    with pytest.raises(ssl.SSLError, match="NO_CERTIFICATE_OR_CRL_FOUND"):
        RotatingTls(client_ca_file=str(ca_file), serve=never)
    with pytest.raises(FileNotFoundError):
        RotatingTls(client_ca_file=str(tmp_path / "missing.crt"), serve=never)
    good = tmp_path / "good.crt"
    good.write_bytes(CA.public_bytes(serialization.Encoding.PEM))
    assert RotatingTls(client_ca_file=str(good), serve=never).context.verify_mode == (
        ssl.CERT_OPTIONAL
    )


async def test_certificates_from_memory_serve_and_rotate_on_the_bound_socket(
    tmp_path: Path,
) -> None:
    # The order of tensile.serving.https.HttpsServer: runner cleaned up, then the socket closed.
    with bound_socket("127.0.0.1", 0) as sock:
        async with _runner() as runner:
            port = sock.getsockname()[1]
            tls = RotatingTls(client_ca_file="", serve=_serve_on(runner, sock))
            client = _client(tmp_path)
            await tls.use(_serving_pem(serial=11))
            assert await _served_serial(port, client) == 11
            await tls.use(_serving_pem(serial=12))
            assert await _served_serial(port, client) == 12


def _expiry(server: str) -> float | None:
    return REGISTRY.get_sample_value(
        "tensile_serving_certificate_expiry_timestamp_seconds", {"server": server}
    )


def _not_after(valid_for: dt.timedelta) -> float:
    # Certificates keep whole seconds.
    return float(int((NOW + valid_for).timestamp()))


async def test_the_expiry_of_the_certificate_in_use_is_exported_by_server(
    tmp_path: Path,
) -> None:
    """tensile_serving_certificate_expiry_timestamp_seconds follows each certificate a
    server is handed, from memory (bootstrapped, CSR-issued) or from files, reloads too."""
    with bound_socket("127.0.0.1", 0) as sock:
        async with _runner() as runner:
            tls = RotatingTls(client_ca_file="", serve=_serve_on(runner, sock), name="memory")
            await tls.use(_serving_pem(serial=21, valid_for=dt.timedelta(days=3)))
            assert _expiry("memory") == _not_after(dt.timedelta(days=3))
            await tls.use(_serving_pem(serial=22, valid_for=dt.timedelta(days=30)))
            assert _expiry("memory") == _not_after(dt.timedelta(days=30))
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"

    def write(valid_for: dt.timedelta) -> None:
        pem = _serving_pem(serial=23, valid_for=valid_for)
        key_at = pem.index(b"-----BEGIN PRIVATE KEY-----")
        cert_file.write_bytes(pem[:key_at])
        key_file.write_bytes(pem[key_at:])

    write(dt.timedelta(days=2))
    with bound_socket("127.0.0.1", 0) as sock:
        async with _runner() as runner:
            tls = RotatingTls(client_ca_file="", serve=_serve_on(runner, sock), name="files")
            files = CertificateFiles(
                cert_file=str(cert_file), key_file=str(key_file), cert_flag="--c", key_flag="--k"
            )
            await files.load(tls)
            assert _expiry("files") == _not_after(dt.timedelta(days=2))
            reload = asyncio.create_task(
                reload_certificates(
                    tls.context,
                    cert_file=str(cert_file),
                    key_file=str(key_file),
                    interval=0.05,
                    name="files",
                ),
                name="reload",
            )
            try:
                await asyncio.sleep(0)  # it notes the files as they are now
                write(dt.timedelta(days=40))
                # A later modification time than the first files', whatever the clock's grain.
                later = os.stat(cert_file).st_mtime + 5
                os.utime(cert_file, (later, later))
                os.utime(key_file, (later, later))
                async with asyncio.timeout(10):
                    # The reload task has no event to wait on: poll the gauge.
                    while _expiry("files") != _not_after(dt.timedelta(days=40)):  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
            finally:
                reload.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reload


async def test_without_memfd_a_private_temporary_file_is_used_and_deleted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    seen: list[int] = []
    real_load = ssl.SSLContext.load_cert_chain

    def load(self: ssl.SSLContext, certfile: str, *args: object) -> None:
        seen.append(os.stat(certfile).st_mode & 0o777)
        assert Path(certfile).parent == tmp_path
        real_load(self, certfile)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", load)
    await load_pem_chain(tls_context(client_ca_file=""), _serving_pem(serial=1))
    assert seen == [0o600]
    assert os.listdir(tmp_path) == []  # deleted at once
    with pytest.raises(ssl.SSLError):
        await load_pem_chain(tls_context(client_ca_file=""), b"garbage")
    assert os.listdir(tmp_path) == []
