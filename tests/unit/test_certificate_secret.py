"""The serving certificate kept in a Secret (--cert-secret): the entry each serving identity
has in it, how an entry is written beside the others, and the flag. The Secret store's API
calls are tested against a real upper cluster (tests/e2e/test_serving_certificate.py)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import re

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tensile.serving import flags
from vnode import cli, preflight
from vnode.api import certificates as certs
from vnode.api.secretstore import entry_key, entry_of, with_entry

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
BASE = ["--client-kubeconfig=lower", "--nodename=vn-1"]


def _pem(*, ends: dt.datetime) -> bytes:
    """A self-signed certificate valid until `ends`, then its key (an entry's content)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:node:vn-1")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ends - dt.timedelta(days=30))
        .not_valid_after(ends)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("10.0.0.5"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return certs.bundle(cert.public_bytes(serialization.Encoding.PEM), key)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("ips", "dns", "key"),
    [
        (("192.0.2.11",), (), "kubelet-server-192.0.2.11.pem"),
        (("10.0.0.5", "203.0.113.9"), (), "kubelet-server-10.0.0.5_203.0.113.9.pem"),
        (("fd00::1",), (), "kubelet-server-fd00--1.pem"),
        (("10.0.0.5",), ("vn-1.example",), "kubelet-server-10.0.0.5_vn-1.example.pem"),
        ((), ("vn-1.example",), "kubelet-server-vn-1.example.pem"),
    ],
)
def test_each_serving_identity_has_its_own_entry(
    ips: tuple[str, ...], dns: tuple[str, ...], key: str
) -> None:
    identity = certs.ServingIdentity(node_name="vn-1", ip_addresses=ips, dns_names=dns)
    assert entry_key(identity) == key


def test_an_entry_key_that_would_be_no_valid_key_is_a_digest() -> None:
    long = tuple(f"host-{i}.example.com" for i in range(20))
    zoned = ("fe80::1%eth0",)  # a zone index: '%' is not allowed in a key
    keys = set()
    for dns, ips in ((long, ()), ((), zoned)):
        key = entry_key(certs.ServingIdentity(node_name="vn-1", ip_addresses=ips, dns_names=dns))
        assert re.fullmatch(r"kubelet-server-[0-9a-f]{32}\.pem", key), key
        keys.add(key)
    assert len(keys) == 2
    # The node name is not part of it: one Secret is one node's.
    a = certs.ServingIdentity(node_name="a", ip_addresses=("10.0.0.5",))
    b = certs.ServingIdentity(node_name="b", ip_addresses=("10.0.0.5",))
    assert entry_key(a) == entry_key(b)


def test_an_entry_is_read_back_or_missing_or_malformed() -> None:
    pem = _pem(ends=NOW + dt.timedelta(days=1))
    secret = {"data": {"kubelet-server-10.0.0.5.pem": _b64(pem), "bad": "not base64!"}}
    assert entry_of(secret, "kubelet-server-10.0.0.5.pem") == pem
    assert entry_of(secret, "kubelet-server-10.0.0.6.pem") is None
    assert entry_of({}, "kubelet-server-10.0.0.5.pem") is None
    assert entry_of({"data": None}, "kubelet-server-10.0.0.5.pem") is None
    with pytest.raises(ValueError, match="key bad is not base64"):
        entry_of(secret, "bad")


def test_writing_an_entry_keeps_the_live_ones_and_what_is_no_entry() -> None:
    own = "kubelet-server-10.0.0.5.pem"
    sibling = "kubelet-server-10.0.0.6.pem"  # another replica's, still valid
    expired = "kubelet-server-10.0.0.7.pem"
    garbled = "kubelet-server-10.0.0.8.pem"
    data = {
        own: _b64(_pem(ends=NOW + dt.timedelta(hours=1))),
        sibling: _b64(_pem(ends=NOW + dt.timedelta(days=3))),
        expired: _b64(_pem(ends=NOW)),  # notAfter == now: over
        garbled: _b64(b"not a certificate"),
        "note": _b64(b"an administrator's"),
    }
    fresh = _pem(ends=NOW + dt.timedelta(days=30))
    written = with_entry(data, key=own, pem=fresh, now=NOW)
    assert sorted(written) == sorted([own, sibling, "note"])
    assert base64.b64decode(written[own]) == fresh
    assert written[sibling] == data[sibling]
    assert written["note"] == data["note"]
    # The input is left as it was; a first entry in an empty Secret.
    assert expired in data
    assert with_entry({}, key=own, pem=fresh, now=NOW) == {own: _b64(fresh)}


def test_the_cert_secret_flag() -> None:
    api = cli.parse([*BASE, "--cert-secret=tensile-system/tensile-vn-vn-1-serving"], env={}).api
    assert api.cert_secret == ("tensile-system", "tensile-vn-vn-1-serving")
    assert cli.parse(BASE, env={}).api.cert_secret is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cert-secret=just-a-name"], "--cert-secret must be NAMESPACE/NAME"),
        (["--cert-secret=/name"], "--cert-secret must be NAMESPACE/NAME"),
        (["--cert-secret=ns/"], "--cert-secret must be NAMESPACE/NAME"),
        (["--cert-secret=Tensile/name"], "--cert-secret must be NAMESPACE/NAME"),
        (["--cert-secret=ns/a/b"], "--cert-secret must be NAMESPACE/NAME"),
        (
            ["--cert-secret=ns/name", "--cert-dir=/var/lib/tensile/pki"],
            "--cert-secret and --cert-dir both say where",
        ),
    ],
)
def test_a_bad_cert_secret_is_a_usage_error(args: list[str], message: str) -> None:
    with pytest.raises(flags.UsageError, match=re.escape(message)):
        cli.parse([*BASE, *args], env={})


def test_the_secret_is_checked_at_start_only_where_it_keeps_a_csr_certificate() -> None:
    secret = ["--cert-secret=ns/name"]
    settings = cli.parse([*BASE, *secret], env={})
    assert preflight.certificate_secret(settings) == ("ns", "name")
    # No --cert-dir to write then: its check passes whatever the working directory.
    cli.check_cert_dir(settings.api)
    files = {"APISERVER_CERT_LOCATION": "c.pem", "APISERVER_KEY_LOCATION": "k.pem"}
    assert preflight.certificate_secret(cli.parse([*BASE, *secret], env=files)) is None
    off = cli.parse([*BASE, *secret, "--rotate-server-certificates=false"], env={})
    assert preflight.certificate_secret(off) is None
    assert preflight.certificate_secret(cli.parse(BASE, env={})) is None
