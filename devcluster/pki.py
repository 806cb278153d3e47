"""Certificates for the local control planes: one CA per cluster, serving and client pairs.

Only for the test harness and the demo: keys are EC P-256, validity is short, and every
file is written with mode 0600. The shapes (CN = user, O = groups, SANs, key usages)
follow what kube-apiserver expects of kubeadm-made material (the Kubernetes
"PKI certificates and requirements" page).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)
# Certificates are back-dated so that small clock differences between processes never
# make a freshly made certificate "not yet valid".
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True)
class KeyPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


@dataclass(frozen=True, kw_only=True)
class CertificateAuthority:
    """A CA whose certificate and key live in files; it signs leaf certificates."""

    pair: KeyPair

    @classmethod
    def create(cls, *, directory: Path, name: str) -> CertificateAuthority:
        """Make a self-signed CA `name` and write `<name>.crt` / `<name>.key` into `directory`."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(pair=_write_pair(directory=directory, name=name, cert=cert, key=key))

    def issue(
        self,
        *,
        directory: Path,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> KeyPair:
        """Sign a leaf certificate and write `<name>.crt` / `<name>.key` into `directory`.

        `common_name` becomes the Kubernetes user and each of `organizations` a group when
        the certificate is used as a client certificate. Valid from `not_before` (default
        5 minutes ago) to `not_after` (default 30 days from now).
        """
        ca_cert = x509.load_pem_x509_certificate(self.pair.cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.pair.key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"unexpected CA key type in {self.pair.key}")
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - _BACKDATE)
            .not_valid_after(not_after or now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return _write_pair(directory=directory, name=name, cert=cert, key=key)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates; a leaf signs handshakes (and may encipher keys, for RSA peers)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def write_signing_key(*, directory: Path, name: str) -> KeyPair:
    """Write a ServiceAccount token signing key (`name.key`) and its public key (`name.pub`)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / f"{name}.key"
    public = directory / f"{name}.pub"
    _write_private(private, key)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(cert=public, key=private)


def _write_pair(
    *, directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path = directory / f"{name}.crt"
    key_path = directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, key)
    return KeyPair(cert=cert_path, key=key_path)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
