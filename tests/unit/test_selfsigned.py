"""Bootstrapped certificates (`tensile.serving.selfsigned`): what the CA and a serving
certificate hold, and when one can no longer be served; the one a server without
certificate files makes at start (`tensile.serving.generated`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from prometheus_client import REGISTRY

from tensile.serving import generated, selfsigned
from tensile.serving.selfsigned import SubjectNames
from tensile.serving.tls import RotatingTls

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
NAMES = SubjectNames.of(["hook.tensile-system.svc", "192.0.2.1", "hook", "192.0.2.1"])
AUTHORITY = selfsigned.new_authority(common_name="test CA", now=NOW, lifetime=3650 * DAY)


def test_names_are_sorted_into_dns_and_ip_without_repeats() -> None:
    dns, ips = ("hook.tensile-system.svc", "hook"), ("192.0.2.1",)
    assert (NAMES.dns_names, NAMES.ip_addresses) == (dns, ips)


def test_a_serving_certificate_names_what_was_asked_and_chains_to_the_ca(tmp_path: Path) -> None:
    serving = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=365 * DAY)
    cert = serving.certificate
    cert.verify_directly_issued_by(AUTHORITY.certificate)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["hook.tensile-system.svc", "hook"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["192.0.2.1"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert AUTHORITY.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # What Python's ssl (and so aiohttp) loads.
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    path = tmp_path / "serving.pem"
    path.write_bytes(serving.cert_pem + serving.key_pem)
    context.load_cert_chain(str(path))
    assert (
        selfsigned.problem(serving, AUTHORITY.cert_pem, names=NAMES, now=NOW, renew_before=30 * DAY)
        is None
    )


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    short = selfsigned.new_authority(common_name="short", now=NOW, lifetime=10 * DAY)
    serving = selfsigned.issue(short, names=NAMES, now=NOW, lifetime=365 * DAY)
    assert serving.certificate.not_valid_after_utc == short.certificate.not_valid_after_utc


@pytest.mark.parametrize(
    ("names", "now", "reason"),
    [
        (SubjectNames.of(["other.svc"]), NOW, "does not name other.svc"),
        (SubjectNames.of(["192.0.2.9"]), NOW, "does not name 192.0.2.9"),
        (NAMES, NOW + 340 * DAY, "expires at"),
        (NAMES, NOW - DAY, "not valid before"),
    ],
)
def test_what_cannot_be_served(names: SubjectNames, now: dt.datetime, reason: str) -> None:
    serving = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=365 * DAY)
    problem = selfsigned.problem(
        serving, AUTHORITY.cert_pem, names=names, now=now, renew_before=30 * DAY
    )
    assert problem is not None
    assert reason in problem


def test_a_certificate_of_another_ca_or_garbage_cannot_be_served() -> None:
    other = selfsigned.new_authority(common_name="other", now=NOW, lifetime=DAY)
    serving = selfsigned.issue(other, names=NAMES, now=NOW, lifetime=DAY)
    assert "unusable" in str(
        selfsigned.problem(serving, AUTHORITY.cert_pem, names=NAMES, now=NOW, renew_before=DAY)
    )
    garbage = selfsigned.KeyPair(cert_pem=b"x", key_pem=b"y")
    assert "unusable" in str(
        selfsigned.problem(garbage, AUTHORITY.cert_pem, names=NAMES, now=NOW, renew_before=DAY)
    )
    with pytest.raises(ValueError, match="at least one DNS name or IP address"):
        selfsigned.issue(AUTHORITY, names=SubjectNames(), now=NOW, lifetime=DAY)


def test_a_certificate_with_another_key_cannot_be_served() -> None:
    """ssl refuses such a pair (key values mismatch) when it is loaded: served as it is, a
    Secret edited by hand or half restored would stop the webhook at every start."""
    serving = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=DAY)
    other = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=DAY)
    mismatched = selfsigned.KeyPair(cert_pem=serving.cert_pem, key_pem=other.key_pem)
    problem = selfsigned.problem(
        mismatched, AUTHORITY.cert_pem, names=NAMES, now=NOW, renew_before=DAY / 2
    )
    assert problem == "unusable: the key is not the certificate's"


def test_only_a_ca_certificate_with_its_own_ecdsa_key_can_issue() -> None:
    other = selfsigned.new_authority(common_name="other", now=NOW, lifetime=DAY)
    leaf = selfsigned.issue(AUTHORITY, names=NAMES, now=NOW, lifetime=DAY)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert selfsigned.issuing_problem(AUTHORITY) is None
    for pair, reason in [
        (selfsigned.KeyPair(cert_pem=AUTHORITY.cert_pem, key_pem=other.key_pem), "not the CA's"),
        (selfsigned.KeyPair(cert_pem=AUTHORITY.cert_pem, key_pem=rsa_key), "not an ECDSA key"),
        (selfsigned.KeyPair(cert_pem=AUTHORITY.cert_pem, key_pem=b""), "no key"),
        (leaf, "not a CA"),
        (selfsigned.KeyPair(cert_pem=b"x", key_pem=AUTHORITY.key_pem), "unusable"),
    ]:
        assert reason in str(selfsigned.issuing_problem(pair))


def test_a_server_without_certificate_files_serves_one_made_at_start_for_its_names() -> None:
    """`generated.GeneratedCertificate`: a certificate for the host's names and the listen
    address (not a wildcard one), signed by a CA of its own, loaded into the server's
    context, its expiry exported."""
    assert generated.host_names("0.0.0.0")[1:] == ("localhost", "127.0.0.1")
    assert generated.host_names("10.1.2.3")[-1] == "10.1.2.3"
    served: list[ssl.SSLContext] = []

    async def serve(context: ssl.SSLContext) -> None:
        served.append(context)

    async def load() -> None:
        tls = RotatingTls(client_ca_file="", serve=serve, name="test-generated")
        source = generated.GeneratedCertificate(
            names=("host-a", "localhost", "127.0.0.1"), label="test-generated", now=lambda: NOW
        )
        await source.load(tls)

    asyncio.run(load())
    assert len(served) == 1
    expiry = REGISTRY.get_sample_value(
        "tensile_serving_certificate_expiry_timestamp_seconds", {"server": "test-generated"}
    )
    assert expiry == (NOW + generated.LIFETIME).timestamp()
