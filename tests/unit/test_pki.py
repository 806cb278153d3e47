"""Certificates the harness makes are what kube-apiserver and kubectl expect."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster.pki import CertificateAuthority, write_signing_key


def test_issued_client_certificate_names_user_and_groups_and_verifies(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(directory=tmp_path, name="ca")
    pair = ca.issue(
        directory=tmp_path, name="admin", common_name="kubernetes-admin",
        organizations=("system:masters", "devs"), client=True,
    )  # fmt: skip
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    ca_cert = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes-admin"
    groups = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert groups == ["system:masters", "devs"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600


def test_serving_certificate_carries_its_names(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(directory=tmp_path, name="ca")
    pair = ca.issue(
        directory=tmp_path, name="srv", common_name="kube-apiserver",
        dns_names=("localhost",), ip_addresses=("127.0.0.1",), server=True,
    )  # fmt: skip
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    ca_cert = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_signing_key_pair_matches(tmp_path: Path) -> None:
    pair = write_signing_key(directory=tmp_path, name="sa")
    private = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    public = serialization.load_pem_public_key(pair.cert.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert private.public_key().public_numbers() == public.public_numbers()
