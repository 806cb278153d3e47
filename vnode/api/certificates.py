"""The kubelet serving certificate from a CSR: every decision, no I/O (pure).

What a kubelet with `serverTLSBootstrap` / `--rotate-server-certificates` asks for and
checks, and the rules of the `kubernetes.io/kubelet-serving` signer (Kubernetes
"Certificates and Certificate Signing Requests" page): subject O exactly `system:nodes`,
CN `system:node:<node>`; at least one DNS or IP subjectAltName and no other kind; usages
`digital signature` + `server auth` (`key encipherment` is allowed, and only meaningful,
for RSA keys: since Kubernetes 1.27 the signer accepts either set). The issued certificate
is kept like the kubelet's certificate store keeps it: one PEM file per certificate
(certificate chain, then the private key) named `kubelet-server-<timestamp>.pem`, and
`kubelet-server-current.pem` pointing at the one in use (unlike the kubelet, only the
current and the previous file are kept: see `stale_files`).

Time is always an argument (aware UTC datetimes); the callers own the clock.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tensile.contracts.objects import Obj
from tensile.kube.timestamps import rfc3339

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

SIGNER = "kubernetes.io/kubelet-serving"
NODES_GROUP = "system:nodes"
APPROVED_REASON = "TensileSelfApproved"
MIN_EXPIRATION_SECONDS = 600
"""The API refuses a `spec.expirationSeconds` below ten minutes."""
MAX_EXPIRATION_SECONDS = 2**31 - 1
"""`spec.expirationSeconds` is an int32."""
ROTATION_FRACTION = 0.8
"""Share of a certificate's lifetime after which a new one is requested. The kubelet picks
at random between 70 % and 90 % so that a fleet of nodes does not renew at once; a virtual
node is one process per lower cluster, so a fixed, predictable 80 % is used."""
CURRENT_FILE = "kubelet-server-current.pem"
_FILE_PREFIX = "kubelet-server-"
_STAMPED_FILE = re.compile(r"kubelet-server-\d{4}(-\d{2}){5}\.pem")
_IP_ADDRESS_TYPES = ("InternalIP", "ExternalIP")
_DNS_ADDRESS_TYPES = ("Hostname", "InternalDNS", "ExternalDNS")


class CertificateRejected(Exception):
    """A CSR or the certificate it produced is unusable (denied, failed, or not what was
    asked for); the message says why. A new CSR is the way out."""


@dataclass(frozen=True, kw_only=True)
class ServingIdentity:
    """Who the serving certificate names: the node and the addresses it publishes."""

    node_name: str
    ip_addresses: tuple[str, ...]
    """IP subjectAltNames, normalised (`ipaddress` text form)."""
    dns_names: tuple[str, ...] = ()
    """DNS subjectAltNames."""

    @property
    def common_name(self) -> str:
        """`system:node:<node>`, the subject CN the signer demands."""
        return f"system:node:{self.node_name}"


def identity_from_addresses(
    *, node_name: str, addresses: Iterable[Mapping[str, str]]
) -> ServingIdentity:
    """Return the identity for a Node's `status.addresses`: IP SANs for InternalIP and
    ExternalIP, DNS SANs for Hostname/InternalDNS/ExternalDNS (in order, without repeats),
    as the kubelet builds its serving CSR from the addresses it reports.

    Raises ValueError when no address is usable (the signer needs at least one SAN) or an
    IP address does not parse.
    """
    ips: list[str] = []
    names: list[str] = []
    for address in addresses:
        kind, value = address.get("type", ""), address.get("address", "")
        if not value:
            continue
        if kind in _IP_ADDRESS_TYPES:
            text = str(ipaddress.ip_address(value))
            if text not in ips:
                ips.append(text)
        elif kind in _DNS_ADDRESS_TYPES and value not in names:
            names.append(value)
    if not ips and not names:
        raise ValueError(f"node {node_name} publishes no address to name in its certificate")
    return ServingIdentity(node_name=node_name, ip_addresses=tuple(ips), dns_names=tuple(names))


def new_private_key() -> ec.EllipticCurvePrivateKey:
    """Return a fresh ECDSA P-256 key (the kubelet's default key type)."""
    return ec.generate_private_key(ec.SECP256R1())


def key_usages(key: PrivateKey) -> tuple[str, ...]:
    """Return the CSR `spec.usages` for `key`: `key encipherment` only for RSA (where the
    key exchange may encrypt with the key), then `digital signature`, `server auth`."""
    usages = ("digital signature", "server auth")
    return ("key encipherment", *usages) if isinstance(key, rsa.RSAPrivateKey) else usages


def certificate_request(identity: ServingIdentity, key: PrivateKey) -> bytes:
    """Return the PEM PKCS#10 request for `identity`, signed with `key` (SHA-256).

    Subject: O=system:nodes, CN=system:node:<node>; subjectAltName: the identity's IPs and
    DNS names, nothing else.
    """
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP),
            x509.NameAttribute(NameOID.COMMON_NAME, identity.common_name),
        ]
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in identity.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in identity.ip_addresses]
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM)


def csr_manifest(
    *, request_pem: bytes, usages: Sequence[str], expiration_seconds: int | None = None
) -> Obj:
    """Return the `certificates.k8s.io/v1` CertificateSigningRequest to create: a generated
    name `csr-xxxxx` (as kubelets' CSRs are named), signer kubernetes.io/kubelet-serving,
    and `spec.expirationSeconds` only when asked (None: the signer's default, which is
    kube-controller-manager's --cluster-signing-duration, one year by default).

    Raises ValueError for an expiration outside 600..2**31-1 seconds.
    """
    spec: Obj = {
        "request": base64.b64encode(request_pem).decode(),
        "signerName": SIGNER,
        "usages": list(usages),
    }
    if expiration_seconds is not None:
        if not MIN_EXPIRATION_SECONDS <= expiration_seconds <= MAX_EXPIRATION_SECONDS:
            raise ValueError(
                f"expirationSeconds must be {MIN_EXPIRATION_SECONDS}..{MAX_EXPIRATION_SECONDS}, "
                f"got {expiration_seconds}"
            )
        spec["expirationSeconds"] = expiration_seconds
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": spec,
    }


def differences(csr: Obj, *, wanted: Obj) -> list[str]:
    """Return how the CSR object `csr` differs from the manifest `wanted` we created it
    from: request bytes, signer, usages (as a set, like the API) and expiration. Empty when
    it holds exactly what we asked for, the condition for approving it ourselves."""
    have, want = csr.get("spec") or {}, wanted.get("spec") or {}
    found = []
    if have.get("request") != want.get("request"):
        found.append("spec.request is not our certificate request")
    if have.get("signerName") != want.get("signerName"):
        found.append(f"spec.signerName is {have.get('signerName')!r}, not {SIGNER!r}")
    if set(have.get("usages") or ()) != set(want.get("usages") or ()):
        found.append(f"spec.usages is {have.get('usages')}, not {want.get('usages')}")
    if have.get("expirationSeconds") != want.get("expirationSeconds"):
        found.append(
            f"spec.expirationSeconds is {have.get('expirationSeconds')}, "
            f"not {want.get('expirationSeconds')}"
        )
    return found


Phase = Literal["Pending", "Approved", "Issued", "Denied", "Failed"]


@dataclass(frozen=True, kw_only=True)
class CsrStatus:
    """Where a CSR stands. `certificate` is the PEM chain once Issued."""

    phase: Phase
    reason: str = ""
    message: str = ""
    certificate: bytes = b""


def csr_status(csr: Obj) -> CsrStatus:
    """Return the state of a CSR object: Denied or Failed win over everything; then Issued
    (status.certificate set); Approved; Pending. Denied, Failed and Approved carry their
    condition's reason and message.
    Raises nothing: a malformed certificate field is reported as Failed."""
    status = csr.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("status", "True") == "True"]
    for kind in ("Denied", "Failed"):
        for condition in conditions:
            if condition.get("type") == kind:
                return CsrStatus(
                    phase=kind,
                    reason=str(condition.get("reason") or ""),
                    message=str(condition.get("message") or ""),
                )
    encoded = status.get("certificate")
    if encoded:
        try:
            certificate = base64.b64decode(encoded, validate=True)
        except ValueError:
            return CsrStatus(phase="Failed", reason="BadCertificate", message="not base64")
        return CsrStatus(phase="Issued", certificate=certificate)
    for condition in conditions:
        if condition.get("type") == "Approved":
            return CsrStatus(
                phase="Approved",
                reason=str(condition.get("reason") or ""),
                message=str(condition.get("message") or ""),
            )
    return CsrStatus(phase="Pending")


def approved(csr: Obj, *, node_name: str, now: dt.datetime) -> Obj:
    """Return `csr` with an Approved condition added: the body of a PUT on its `/approval`
    subresource (metadata, resourceVersion included, kept so a concurrent change
    conflicts instead of being overwritten)."""
    requester = (csr.get("spec") or {}).get("username") or "unknown"
    condition = {
        "type": "Approved",
        "status": "True",
        "reason": APPROVED_REASON,
        "message": f"the virtual node {node_name} (as {requester}) approved its own kubelet "
        "serving certificate after checking it names only the node and its addresses",
        "lastUpdateTime": rfc3339(now),
    }
    status = dict(csr.get("status") or {})
    status["conditions"] = [*(status.get("conditions") or []), condition]
    return {**csr, "status": status}


def load_chain(pem: bytes) -> list[x509.Certificate]:
    """Return the certificates of a PEM chain (leaf first). Raises ValueError if none."""
    certificates = x509.load_pem_x509_certificates(pem)
    if not certificates:  # pragma: no cover - the loader already raises for none
        raise ValueError("no certificate in the PEM data")
    return certificates


def matches_key(certificate: x509.Certificate, key: PrivateKey) -> bool:
    """Tell whether `certificate` certifies the public half of `key`."""
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return certificate.public_key().public_bytes(der, fmt) == key.public_key().public_bytes(
        der, fmt
    )


def check_certificate(
    chain: Sequence[x509.Certificate],
    *,
    key: PrivateKey,
    identity: ServingIdentity,
    now: dt.datetime,
) -> None:
    """Check that the leaf of `chain` can serve as this node's kubelet certificate at `now`:
    it certifies `key`, names CN system:node:<node> and O system:nodes, covers every
    address of `identity`, allows server auth, and has not expired (notAfter > `now`).

    A notBefore after `now` is accepted (see `not_yet_valid_for`): the signer backdates
    it by five minutes, so it is only in the future when this node's clock is more than
    that behind the signer's. The clients (the apiserver, metrics-server) judge validity
    by their own clocks, and the kubelet's certificate manager does not check notBefore
    either. Rejecting it would make a node whose clock is more than five minutes slow
    request certificate after certificate.

    Raises CertificateRejected saying the first problem found; ValueError (from the
    certificate parser) for a malformed extension.
    """
    leaf = chain[0]
    if not matches_key(leaf, key):
        raise CertificateRejected("the certificate is not for our private key")
    cns = [str(a.value) for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [str(a.value) for a in leaf.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    if cns != [identity.common_name] or orgs != [NODES_GROUP]:
        raise CertificateRejected(
            f"the certificate names CN={cns} O={orgs}, not {identity.common_name}/{NODES_GROUP}"
        )
    ips, names = subject_alt_names(leaf)
    missing = [ip for ip in identity.ip_addresses if ip not in ips]
    missing += [n for n in identity.dns_names if n not in names]
    if missing:
        raise CertificateRejected(f"the certificate does not cover {', '.join(missing)}")
    try:
        usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and ExtendedKeyUsageOID.SERVER_AUTH not in usage:
        raise CertificateRejected("the certificate does not allow server auth")
    not_before, not_after = leaf.not_valid_before_utc, leaf.not_valid_after_utc
    if not_after <= not_before:
        raise CertificateRejected(
            f"the certificate is never valid: it ends ({rfc3339(not_after)}) before it "
            f"starts ({rfc3339(not_before)})"
        )
    if not_after <= now:
        raise CertificateRejected(
            f"the certificate is valid from {rfc3339(not_before)} to {rfc3339(not_after)}: "
            f"it has expired (now {rfc3339(now)})"
        )


def not_yet_valid_for(certificate: x509.Certificate, *, now: dt.datetime) -> dt.timedelta:
    """Return how far the certificate's notBefore is after `now` (zero once it has
    started). For a certificate just issued, more than zero means this node's clock is
    behind the signer's by that much plus the five minutes the kubelet-serving signer
    backdates notBefore by."""
    return max(certificate.not_valid_before_utc - now, dt.timedelta(0))


def subject_alt_names(certificate: x509.Certificate) -> tuple[list[str], list[str]]:
    """Return the (IP addresses, DNS names) a certificate's subjectAltName holds."""
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    ips = [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    return ips, list(sans.get_values_for_type(x509.DNSName))


def rotation_deadline(
    *, not_before: dt.datetime, not_after: dt.datetime, fraction: float = ROTATION_FRACTION
) -> dt.datetime:
    """Return when to request the next certificate: `fraction` (0..1] of the way from
    `not_before` to `not_after`. Raises ValueError for a fraction outside (0, 1] or a
    validity that ends before it starts."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not_after < not_before:
        raise ValueError(f"validity ends ({not_after}) before it starts ({not_before})")
    return not_before + (not_after - not_before) * fraction


def renewal_time(
    *, deadline: dt.datetime, now: dt.datetime, min_interval: float
) -> tuple[dt.datetime, bool]:
    """Return (when to request the next certificate, whether that is later than
    `deadline`): the rotation `deadline`, but never sooner than `min_interval` seconds
    after `now`. A deadline that has passed already (this node's clock ahead of the
    signer's, or a lifetime of seconds) would otherwise make renewals follow each other
    as fast as CSRs are issued; the kubelet's certificate manager likewise waits between
    rotations (at least a second, and backs off while they fail). The caller doubles
    `min_interval` while renewals keep being held back."""
    earliest = now + dt.timedelta(seconds=min_interval)
    return (deadline, False) if deadline >= earliest else (earliest, True)


def bundle(chain_pem: bytes, key: PrivateKey) -> bytes:
    """Return the store file's content: the certificate chain, then the unencrypted PKCS#8
    private key (the layout of the kubelet's `kubelet-server-*.pem`, which both Go's and
    Python's TLS loaders read as one file)."""
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return chain_pem.rstrip(b"\n") + b"\n" + key_pem


def split_bundle(pem: bytes) -> tuple[PrivateKey, list[x509.Certificate]]:
    """Return (private key, chain) of a store file. Raises ValueError when either is
    missing or unreadable, or the key is neither ECDSA nor RSA."""
    start = _first_key_block(pem)
    if start < 0:
        raise ValueError("no private key in the PEM data")
    key = serialization.load_pem_private_key(pem[start:], password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"unsupported private key type {type(key).__name__}")
    return key, load_chain(pem)


def reuse_problem(pem: bytes | None, *, identity: ServingIdentity, now: dt.datetime) -> str | None:
    """Tell why the stored current certificate cannot be served at `now` (missing,
    unreadable, for other addresses, expired...), or None when it can: a restart then keeps
    the certificate it had instead of requesting a new one, as the kubelet does."""
    if pem is None:
        return "there is no stored certificate"
    try:
        key, chain = split_bundle(pem)
        check_certificate(chain, key=key, identity=identity, now=now)
    except (ValueError, CertificateRejected) as exc:
        return str(exc)
    return None


def stamped_file_name(now: dt.datetime) -> str:
    """Return the store file name of a certificate obtained at `now` (UTC):
    `kubelet-server-YYYY-MM-DD-HH-MM-SS.pem`."""
    return f"{_FILE_PREFIX}{now.astimezone(dt.UTC):%Y-%m-%d-%H-%M-%S}.pem"


def stale_files(names: Iterable[str], *, keep: Collection[str]) -> list[str]:
    """Return, sorted, the names among `names` of stored certificate files
    (`kubelet-server-<timestamp>.pem`, see `stamped_file_name`) that are not in `keep`:
    the ones to delete once a new certificate is current. Other names (the current
    pointer, a `.tmp` being written, anything else in the directory) are never returned.

    The kubelet keeps every old certificate file. Tensile keeps the current one and the
    previous one (`keep`, for an operator who wants to look at or go back to the last
    certificate): with short lifetimes (`--server-certificate-duration=10m` renews every
    8 minutes) the kubelet's way piles up about 180 files, each with a private key, a day.
    """
    return sorted(n for n in names if _STAMPED_FILE.fullmatch(n) and n not in keep)


def _first_key_block(pem: bytes) -> int:
    for marker in (b"-----BEGIN PRIVATE KEY", b"-----BEGIN EC PRIVATE KEY", b"-----BEGIN RSA"):
        index = pem.find(marker)
        if index >= 0:
            return index
    return -1
