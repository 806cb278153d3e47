"""The serving certificate from a CSR: request contents, CSR states, checks of what was
issued, the rotation deadline, reuse after a restart, the file store, and the flags."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tensile.serving import flags
from vnode import cli
from vnode.__main__ import main
from vnode.api import certificates as certs
from vnode.api.certstore import CertificateStore
from vnode.controllers.node_objects import node_addresses
from vnode.settings import NodeSettings

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
NODE = certs.ServingIdentity(node_name="vn-1", ip_addresses=("10.0.0.5",))
CA_KEY = ec.generate_private_key(ec.SECP256R1())


def _issue(
    key: certs.PrivateKey,
    *,
    cn: str = "system:node:vn-1",
    orgs: tuple[str, ...] = ("system:nodes",),
    ips: tuple[str, ...] = ("10.0.0.5",),
    not_before: dt.datetime = NOW - dt.timedelta(minutes=5),
    lifetime: dt.timedelta = dt.timedelta(days=30),
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH,
) -> bytes:
    """A PEM certificate for `key`, signed by a throw-away CA, as the signer would issue."""
    name = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    name.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(name))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + lifetime)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(i)) for i in ips]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(CA_KEY, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


# -- what we ask for -----------------------------------------------------------------------


def test_the_request_names_the_node_its_group_and_only_its_addresses() -> None:
    identity = certs.ServingIdentity(
        node_name="vn-1", ip_addresses=("10.0.0.5", "203.0.113.9"), dns_names=("vn-1.example",)
    )
    key = certs.new_private_key()
    request = x509.load_pem_x509_csr(certs.certificate_request(identity, key))
    assert request.is_signature_valid
    assert request.subject.rfc4514_string() == "CN=system:node:vn-1,O=system:nodes"
    sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [
        "10.0.0.5",
        "203.0.113.9",
    ]
    assert sans.get_values_for_type(x509.DNSName) == ["vn-1.example"]
    assert len(list(sans)) == 3  # no email or URI names: the signer refuses those
    assert [e.oid for e in request.extensions] == [x509.SubjectAlternativeName.oid]
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert request.public_key() == key.public_key()


def test_usages_add_key_encipherment_only_for_rsa() -> None:
    assert certs.key_usages(certs.new_private_key()) == ("digital signature", "server auth")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert certs.key_usages(rsa_key) == ("key encipherment", "digital signature", "server auth")


def test_the_csr_object_uses_the_kubelet_serving_signer_and_a_generated_name() -> None:
    pem = certs.certificate_request(NODE, certs.new_private_key())
    manifest = certs.csr_manifest(request_pem=pem, usages=("digital signature", "server auth"))
    assert manifest == {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": base64.b64encode(pem).decode(),
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "server auth"],
        },
    }
    timed = certs.csr_manifest(request_pem=pem, usages=(), expiration_seconds=600)
    assert timed["spec"]["expirationSeconds"] == 600
    for bad in (599, 2**31):
        with pytest.raises(ValueError, match="expirationSeconds must be 600"):
            certs.csr_manifest(request_pem=pem, usages=(), expiration_seconds=bad)


def test_the_identity_is_the_published_addresses() -> None:
    settings = NodeSettings(name="vn-1", internal_ip="10.0.0.5", external_ip="203.0.113.9")
    identity = certs.identity_from_addresses(node_name="vn-1", addresses=node_addresses(settings))
    # The node publishes no Hostname, so the certificate holds no DNS name.
    assert identity == certs.ServingIdentity(
        node_name="vn-1", ip_addresses=("10.0.0.5", "203.0.113.9"), dns_names=()
    )
    mixed = certs.identity_from_addresses(
        node_name="n",
        addresses=[
            {"type": "InternalIP", "address": "fd00::0:1"},
            {"type": "Hostname", "address": "n.local"},
            {"type": "ExternalIP", "address": "fd00::1"},  # the same address, written out
            {"type": "InternalIP", "address": ""},
        ],
    )
    assert mixed.ip_addresses == ("fd00::1",)
    assert mixed.dns_names == ("n.local",)
    with pytest.raises(ValueError, match="publishes no address"):
        certs.identity_from_addresses(node_name="n", addresses=[])


# -- the CSR as the API shows it -----------------------------------------------------------


def _csr(**status: Any) -> dict[str, Any]:
    pem = certs.certificate_request(NODE, certs.new_private_key())
    manifest = certs.csr_manifest(request_pem=pem, usages=("digital signature", "server auth"))
    return {
        **manifest,
        "metadata": {"name": "csr-abcde", "uid": "u1", "resourceVersion": "7"},
        "spec": {**manifest["spec"], "username": "system:serviceaccount:ns:vn"},
        "status": status,
    }


def _condition(kind: str, reason: str = "", status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": f"{kind} by test"}


def test_csr_states() -> None:
    assert certs.csr_status(_csr()).phase == "Pending"
    approved = _csr(conditions=[_condition("Approved", "KubectlApprove")])
    assert certs.csr_status(approved) == certs.CsrStatus(
        phase="Approved", reason="KubectlApprove", message="Approved by test"
    )
    issued = _csr(
        conditions=[_condition("Approved")], certificate=base64.b64encode(b"PEM").decode()
    )
    assert certs.csr_status(issued) == certs.CsrStatus(phase="Issued", certificate=b"PEM")
    denied = certs.csr_status(_csr(conditions=[_condition("Denied", "KubectlDeny")]))
    assert (denied.phase, denied.reason, denied.message) == (
        "Denied",
        "KubectlDeny",
        "Denied by test",
    )
    # A failure wins over a certificate; a condition that is not True does not count.
    failed = _csr(conditions=[_condition("Failed", "SignerValidationFailure")], certificate="UEVN")
    assert certs.csr_status(failed).phase == "Failed"
    assert certs.csr_status(_csr(conditions=[_condition("Denied", status="False")])).phase == (
        "Pending"
    )
    assert certs.csr_status(_csr(certificate="not base64!")).reason == "BadCertificate"


def test_approval_adds_one_condition_and_keeps_the_resource_version() -> None:
    csr = _csr(conditions=[])
    body = certs.approved(csr, node_name="vn-1", now=NOW)
    [condition] = body["status"]["conditions"]
    assert condition["type"] == "Approved"
    assert condition["status"] == "True"
    assert condition["reason"] == "TensileSelfApproved"
    assert "vn-1" in condition["message"]
    assert "system:serviceaccount:ns:vn" in condition["message"]
    assert condition["lastUpdateTime"] == "2026-03-01T12:00:00Z"
    assert body["metadata"]["resourceVersion"] == "7"
    assert csr["status"]["conditions"] == []  # the input is not changed


def test_only_a_csr_holding_exactly_our_request_is_approved() -> None:
    csr = _csr()
    wanted = {"spec": {k: v for k, v in csr["spec"].items() if k != "username"}}
    assert certs.differences(csr, wanted=wanted) == []
    reordered = {**csr, "spec": {**csr["spec"], "usages": ["server auth", "digital signature"]}}
    assert certs.differences(reordered, wanted=wanted) == []
    other = certs.certificate_request(NODE, certs.new_private_key())
    for change, problem in (
        ({"request": base64.b64encode(other).decode()}, "not our certificate request"),
        ({"signerName": "example.com/x"}, "spec.signerName"),
        ({"usages": ["digital signature", "server auth", "client auth"]}, "spec.usages"),
        ({"expirationSeconds": 86400}, "spec.expirationSeconds"),
    ):
        changed = {**csr, "spec": {**csr["spec"], **change}}
        [found] = certs.differences(changed, wanted=wanted)
        assert problem in found


# -- what we got ---------------------------------------------------------------------------


def test_an_issued_certificate_must_match_our_key_and_identity() -> None:
    key = certs.new_private_key()
    good = certs.load_chain(_issue(key))
    certs.check_certificate(good, key=key, identity=NODE, now=NOW)
    assert certs.matches_key(good[0], key)
    assert not certs.matches_key(good[0], certs.new_private_key())
    for chain, problem in (
        (_issue(certs.new_private_key()), "not for our private key"),
        (_issue(key, cn="system:node:other"), "names CN=['system:node:other']"),
        (_issue(key, orgs=()), "O=[]"),
        (_issue(key, ips=("10.0.0.6",)), "does not cover 10.0.0.5"),
        (_issue(key, usage=ExtendedKeyUsageOID.CLIENT_AUTH), "server auth"),
        (
            _issue(key, lifetime=dt.timedelta(minutes=4)),
            "it has expired (now 2026-03-01T12:00:00Z)",
        ),
        (_issue(key, lifetime=dt.timedelta(minutes=5)), "it has expired"),  # notAfter == now
        (_issue(key, lifetime=dt.timedelta(0)), "never valid"),
    ):
        with pytest.raises(certs.CertificateRejected, match=re.escape(problem)):
            certs.check_certificate(certs.load_chain(chain), key=key, identity=NODE, now=NOW)


def test_a_certificate_that_starts_after_the_nodes_clock_is_accepted() -> None:
    # The signer backdates notBefore by 5 min: later than that, the node's clock is behind.
    # The kubelet serves such a certificate; its clients judge it by their own clocks.
    key = certs.new_private_key()
    [leaf] = certs.load_chain(_issue(key, not_before=NOW + dt.timedelta(minutes=7)))
    certs.check_certificate([leaf], key=key, identity=NODE, now=NOW)
    assert certs.not_yet_valid_for(leaf, now=NOW) == dt.timedelta(minutes=7)
    assert certs.not_yet_valid_for(leaf, now=NOW + dt.timedelta(hours=1)) == dt.timedelta(0)
    stored = certs.bundle(_issue(key, not_before=NOW + dt.timedelta(minutes=7)), key)
    assert certs.reuse_problem(stored, identity=NODE, now=NOW) is None


def test_renewal_waits_at_least_the_minimum_interval() -> None:
    later = NOW + dt.timedelta(days=8)
    assert certs.renewal_time(deadline=later, now=NOW, min_interval=1.0) == (later, False)
    # Passed already (clock ahead, tiny lifetime), or nearer than the minimum: held back.
    for deadline in (NOW - dt.timedelta(days=1), NOW, NOW + dt.timedelta(seconds=0.5)):
        assert certs.renewal_time(deadline=deadline, now=NOW, min_interval=4.0) == (
            NOW + dt.timedelta(seconds=4),
            True,
        )
    exact = NOW + dt.timedelta(seconds=4)
    assert certs.renewal_time(deadline=exact, now=NOW, min_interval=4.0) == (exact, False)


def test_rotation_is_due_at_80_percent_of_the_lifetime() -> None:
    start = NOW
    assert certs.rotation_deadline(
        not_before=start, not_after=start + dt.timedelta(days=10)
    ) == start + dt.timedelta(days=8)
    assert certs.rotation_deadline(
        not_before=start, not_after=start + dt.timedelta(minutes=15), fraction=0.5
    ) == start + dt.timedelta(minutes=7, seconds=30)
    with pytest.raises(ValueError, match="fraction"):
        certs.rotation_deadline(not_before=start, not_after=start, fraction=0.0)
    with pytest.raises(ValueError, match="before it starts"):
        certs.rotation_deadline(not_before=start, not_after=start - dt.timedelta(seconds=1))


def test_a_stored_certificate_is_reused_only_while_it_fits() -> None:
    key = certs.new_private_key()
    stored = certs.bundle(_issue(key), key)
    assert certs.reuse_problem(stored, identity=NODE, now=NOW) is None
    # Past its rotation deadline but still valid: reused (and renewed right away).
    assert certs.reuse_problem(stored, identity=NODE, now=NOW + dt.timedelta(days=29)) is None
    expired = certs.reuse_problem(stored, identity=NODE, now=NOW + dt.timedelta(days=31))
    assert "it has expired" in str(expired)
    moved = certs.ServingIdentity(node_name="vn-1", ip_addresses=("10.0.0.9",))
    assert "does not cover 10.0.0.9" in str(certs.reuse_problem(stored, identity=moved, now=NOW))
    renamed = certs.ServingIdentity(node_name="vn-2", ip_addresses=("10.0.0.5",))
    assert "system:node:vn-2" in str(certs.reuse_problem(stored, identity=renamed, now=NOW))
    other_key = certs.bundle(_issue(key), certs.new_private_key())
    assert "not for our private key" in str(certs.reuse_problem(other_key, identity=NODE, now=NOW))
    assert certs.reuse_problem(None, identity=NODE, now=NOW) == "there is no stored certificate"
    assert "no private key" in str(certs.reuse_problem(_issue(key), identity=NODE, now=NOW))
    assert certs.reuse_problem(b"garbage", identity=NODE, now=NOW) is not None


def test_the_bundle_is_the_chain_then_the_key() -> None:
    key = certs.new_private_key()
    chain = _issue(key)
    content = certs.bundle(chain, key)
    assert content.startswith(chain)
    assert content.rstrip().endswith(b"-----END PRIVATE KEY-----")
    loaded_key, loaded_chain = certs.split_bundle(content)
    assert certs.matches_key(loaded_chain[0], loaded_key)
    assert certs.stamped_file_name(NOW) == "kubelet-server-2026-03-01-12-00-00.pem"


# -- the store -----------------------------------------------------------------------------


def test_the_store_keeps_private_files_and_a_relative_current_pointer(tmp_path: Path) -> None:
    store = CertificateStore(tmp_path / "pki" / "vn-1")
    assert store.load_current() is None
    assert store.current_target() is None
    first = store.save(b"first", now=NOW)
    assert first.name == "kubelet-server-2026-03-01-12-00-00.pem"
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    assert os.readlink(store.current) == first.name
    assert store.load_current() == b"first"
    second = store.save(b"second", now=NOW + dt.timedelta(days=24))
    assert store.current_target() == second
    assert store.load_current() == b"second"
    assert first.read_bytes() == b"first"  # the previous one is kept
    assert sorted(p.name for p in store.directory.iterdir()) == sorted(
        [first.name, second.name, "kubelet-server-current.pem"]
    )
    third = store.save(b"third", now=NOW + dt.timedelta(days=48))
    # Only the current and the previous one: rotations do not pile up files.
    assert sorted(p.name for p in store.directory.iterdir()) == sorted(
        [second.name, third.name, "kubelet-server-current.pem"]
    )


def test_only_stamped_certificate_files_are_ever_deleted() -> None:
    names = [
        "kubelet-server-2026-03-01-12-00-00.pem",
        "kubelet-server-2026-03-09-12-00-00.pem",
        "kubelet-server-2026-03-17-12-00-00.pem",
        "kubelet-server-2026-03-17-12-00-00.pem.tmp",
        "kubelet-server-current.pem",
        "kubelet-server-current.pem.tmp",
        "kubelet-server-notes.pem",
        "ca.crt",
    ]
    keep = {"kubelet-server-2026-03-17-12-00-00.pem", "kubelet-server-2026-03-01-12-00-00.pem"}
    assert certs.stale_files(names, keep=keep) == ["kubelet-server-2026-03-09-12-00-00.pem"]


def test_a_current_file_that_is_not_a_symlink_is_its_own_target(tmp_path: Path) -> None:
    store = CertificateStore(tmp_path)
    store.current.write_bytes(b"restored with cp -L")  # readlink: EINVAL
    assert store.current_target() == store.current
    assert store.load_current() == b"restored with cp -L"
    # Saving replaces it with the pointer, and keeps the new file.
    new = store.save(b"new", now=NOW)
    assert store.current.is_symlink()
    assert store.current_target() == new


def test_a_writable_cert_dir_is_made_and_left_clean(tmp_path: Path) -> None:
    store = CertificateStore(tmp_path / "a" / "b")
    store.check_writable()
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    assert list(store.directory.iterdir()) == []
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(NotADirectoryError):
        CertificateStore(afile / "pki").check_writable()


# -- flags ---------------------------------------------------------------------------------

BASE = ["--client-kubeconfig=lower", "--nodename=vn-1"]


def test_serving_certificate_flags_and_defaults() -> None:
    api = cli.parse(BASE, env={}).api
    assert (api.cert_file, api.rotate_server_certificates) == ("", True)
    assert api.cert_dir == ".tensile-pki/vn-1"
    assert api.server_certificate_duration == 0
    api = cli.parse(
        [*BASE, "--cert-dir=/var/lib/tensile/pki", "--server-certificate-duration=24h",
         "--rotate-server-certificates=false"],
        env={"APISERVER_CERT_LOCATION": "c.pem", "APISERVER_KEY_LOCATION": "k.pem"},
    ).api  # fmt: skip
    assert api.cert_dir == "/var/lib/tensile/pki"
    assert api.server_certificate_duration == 86400
    assert not api.rotate_server_certificates
    assert (api.cert_file, api.key_file) == ("c.pem", "k.pem")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--server-certificate-duration=5m"],
            {},
            "must be 0 (the signer's default) or between 10m",
        ),
        (["--server-certificate-duration=700ms"], {}, "must be whole seconds"),
        (["--server-certificate-duration=1000000h"], {}, "between 10m and 2147483647s"),
        (["--server-certificate-duration=soon"], {}, "not a duration"),
        (["--cert-dir="], {}, "--cert-dir must name a directory"),
        (["--rotate-server-certificates=perhaps"], {}, "not a boolean"),
        ([], {"APISERVER_CERT_LOCATION": "c.pem"}, "APISERVER_KEY_LOCATION is not"),
        ([], {"APISERVER_KEY_LOCATION": "k.pem"}, "APISERVER_CERT_LOCATION is not"),
    ],
)
def test_bad_serving_certificate_settings_are_usage_errors(
    args: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(flags.UsageError, match=re.escape(message)):
        cli.parse([*BASE, *args], env=env)


def test_a_cert_dir_that_cannot_be_made_exits_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    cert_dir = afile / "pki"  # its parent is a file: mkdir fails with ENOTDIR, even as root
    # (The lower kubeconfig "lower" does not exist: the check comes before it is read.)
    assert main([*BASE, f"--cert-dir={cert_dir}"]) == 2
    err = capsys.readouterr().err
    assert f"--cert-dir: cannot create or write in '{cert_dir}'" in err
    assert "Not a directory" in err
    assert "persistent storage" in err


def test_a_cert_dir_that_cannot_be_written_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.mkstemp", read_only)  # root writes through 0500 modes
    settings = cli.parse([*BASE, f"--cert-dir={tmp_path}"], env={})
    message = f"{str(tmp_path)!r} ([Errno 30] Read-only"
    with pytest.raises(flags.UsageError, match=re.escape(message)):
        cli.check_cert_dir(settings.api)
    # Not needed, so not checked, with certificate files or without rotation.
    files = {"APISERVER_CERT_LOCATION": "c.pem", "APISERVER_KEY_LOCATION": "k.pem"}
    cli.check_cert_dir(cli.parse([*BASE, f"--cert-dir={tmp_path}"], env=files).api)
    off = ["--rotate-server-certificates=false", f"--cert-dir={tmp_path}"]
    cli.check_cert_dir(cli.parse([*BASE, *off], env={}).api)


def test_the_cert_dir_help_asks_for_persistent_storage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.parse(["--help"], env={})
    help_text = " ".join(capsys.readouterr().out.split())
    assert "put it on persistent storage" in help_text


def test_a_cert_dir_that_is_a_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    assert main([*BASE, f"--cert-dir={afile}"]) == 2
    assert f"--cert-dir must be a directory, but '{afile}' is a file" in capsys.readouterr().err
