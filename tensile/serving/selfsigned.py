"""A private CA and the serving certificates it signs (`cryptography`), for servers only the
apiserver calls (an admission webhook): the apiserver is told to trust the CA (a
webhook configuration's `caBundle`), so no public or cluster CA is involved.

ECDSA P-256 keys, SHA-256 signatures. The CA: `BasicConstraints(ca=True, path_length=0)`,
key usage certificate and CRL signing. A serving certificate: the subjectAltNames asked
for (Go's TLS stack ignores the subject CN), extended key usage server auth. Time is an
argument (aware UTC datetimes); randomness comes from the OS.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_BACKDATE = dt.timedelta(minutes=5)
"""Certificates start a little in the past: a peer whose clock is slightly behind must not
see a certificate from its future."""


@dataclass(frozen=True, kw_only=True)
class SubjectNames:
    """What a serving certificate must name: DNS names and IP addresses."""

    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()

    @classmethod
    def of(cls, names: Sequence[str]) -> SubjectNames:
        """Sort `names` into IP addresses (those that parse as one) and DNS names, without
        repeats, in order."""
        ips: list[str] = []
        dns: list[str] = []
        for name in names:
            try:
                text = str(ipaddress.ip_address(name))
            except ValueError:
                if name not in dns:
                    dns.append(name)
            else:
                if text not in ips:
                    ips.append(text)
        return cls(dns_names=tuple(dns), ip_addresses=tuple(ips))


@dataclass(frozen=True, kw_only=True)
class KeyPair:
    """A certificate and its private key, PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        """The parsed certificate. Raises ValueError for bad PEM."""
        return x509.load_pem_x509_certificate(self.cert_pem)


def new_authority(*, common_name: str, now: dt.datetime, lifetime: dt.timedelta) -> KeyPair:
    """Return a new self-signed CA named `common_name`, valid from `now` for `lifetime`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_pem(key))


def issue(
    authority: KeyPair,
    *,
    names: SubjectNames,
    now: dt.datetime,
    lifetime: dt.timedelta,
) -> KeyPair:
    """Return a serving certificate for `names`, signed by `authority`, valid from `now`
    for `lifetime` (but never past the CA). Raises ValueError when `names` is empty or the
    authority's PEM is bad."""
    if not names.dns_names and not names.ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca_cert = authority.certificate
    ca_key = serialization.load_pem_private_key(authority.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in names.ip_addresses]
    common_name = (names.dns_names or names.ip_addresses)[0][:64]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + lifetime, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_pem(key))


def problem(
    serving: KeyPair,
    authority_pem: bytes,
    *,
    names: SubjectNames,
    now: dt.datetime,
    renew_before: dt.timedelta,
) -> str | None:
    """Return why `serving` cannot be served (any more) for `names`, or None when it can:
    unparseable, a key that is not the certificate's, not signed by the CA in
    `authority_pem`, missing a name, not yet valid, or expiring within `renew_before` of
    `now`."""
    try:
        cert = serving.certificate
        ca = x509.load_pem_x509_certificate(authority_pem)
        key = serialization.load_pem_private_key(serving.key_pem, password=None)
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound) as exc:
        return f"unusable: {exc or type(exc).__name__}"
    if not _same_key(cert, key):
        return "unusable: the key is not the certificate's"
    have_dns = set(sans.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    missing = [n for n in names.dns_names if n not in have_dns]
    missing += [ip for ip in names.ip_addresses if ip not in have_ips]
    if missing:
        return f"does not name {', '.join(missing)}"
    if now < cert.not_valid_before_utc:
        return f"not valid before {cert.not_valid_before_utc.isoformat()}"
    if now + renew_before >= cert.not_valid_after_utc:
        return f"expires at {cert.not_valid_after_utc.isoformat()}"
    return None


def issuing_problem(authority: KeyPair) -> str | None:
    """Return why `authority` cannot sign serving certificates with `issue`, or None when it
    can: no key, unparseable, not a CA certificate, a key that is not ECDSA (what `issue`
    signs with) or not the CA certificate's own (what it signed would not verify against
    the caBundle)."""
    if not authority.key_pem:
        return "no key"
    try:
        cert = authority.certificate
        key = serialization.load_pem_private_key(authority.key_pem, password=None)
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (ValueError, TypeError, x509.ExtensionNotFound) as exc:
        return f"unusable: {exc or type(exc).__name__}"
    if not constraints.ca:
        return "not a CA certificate"
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return "the key is not an ECDSA key"
    if not _same_key(cert, key):
        return "the key is not the CA's"
    return None


def _same_key(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
