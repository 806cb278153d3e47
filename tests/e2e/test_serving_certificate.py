"""The kubelet API's serving certificate from a CSR, against the real upper cluster.

The upper kube-apiserver verifies kubelet serving certificates against the upper CA
(--kubelet-certificate-authority) and its kube-controller-manager signs kubelet-serving
CSRs with that CA, so `kubectl logs` through the apiserver working proves the certificate
is right for the node's address. Nodes here start without APISERVER_CERT_LOCATION.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import secrets
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from devcluster import cluster
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.kube import config
from tensile.kube.backoff import ExponentialBackoff
from tensile.kube.client import ApiClient
from tensile.serving import selfsigned
from tensile.serving.tls import RotatingTls
from tests.e2e.helpers import (
    create,
    node_csrs,
    phase,
    pod_manifest,
    serving_secret,
    token_kubeconfig,
    wait_for,
)
from vnode.api.certificates import identity_from_addresses, load_chain
from vnode.api.certmanager import (
    CertificateManagerSettings,
    ServingCertificate,
    ServingCertificateManager,
)
from vnode.api.certstore import CertificateStore, StoreError
from vnode.api.secretstore import SecretStore, check_access, entry_key

MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"
SERVICE_ACCOUNT = "system:serviceaccount:tensile-system:tensile-virtual-node"


def _conditions(csr: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["type"], c.get("reason", "")) for c in csr.get("status", {}).get("conditions", [])]


def _served_certificate(fleet: Fleet, port: int) -> x509.Certificate | None:
    """The certificate the node serves on `port`, verified against the upper CA for the
    node address as the apiserver verifies it; None while nothing listens."""
    context = ssl.create_default_context(cafile=str(fleet.upper.ca))
    try:
        with (
            socket.create_connection((fleet.node_ip, port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=fleet.node_ip) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except ConnectionRefusedError:
        return None
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _issued(csr: dict[str, Any]) -> x509.Certificate:
    return load_chain(base64.b64decode(csr["status"]["certificate"]))[0]


def _kubectl_logs_work(fleet: Fleet, namespace: str, node: str) -> None:
    upper = fleet.upper.rest()
    create(upper, namespace, pod_manifest("web", node=node))
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    out = fleet.upper.kubectl("logs", "web", "-n", namespace).stdout
    assert out.splitlines() == list(cluster.LOG_LINES)


def test_a_node_approves_its_own_csr_and_reuses_the_certificate_after_a_restart(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    upper = fleet.upper.rest()
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-csr-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        certificate_from_csr=True,
    )
    node.start()
    try:
        served = wait_for(
            "the kubelet API serving",
            lambda: _served_certificate(fleet, node.kubelet_port),
            timeout=60,
        )
        [csr] = node_csrs(upper, node.name)
        spec = csr["spec"]
        assert spec["signerName"] == "kubernetes.io/kubelet-serving"
        assert sorted(spec["usages"]) == ["digital signature", "server auth"]
        assert "expirationSeconds" not in spec
        assert csr["metadata"]["name"].startswith("csr-")
        request = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
        assert request.subject.rfc4514_string() == f"CN=system:node:{node.name},O=system:nodes"
        sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [fleet.node_ip]
        assert sans.get_values_for_type(x509.DNSName) == []
        assert ("Approved", "TensileSelfApproved") in _conditions(csr)
        assert served.serial_number == _issued(csr).serial_number
        _kubectl_logs_work(fleet, namespace, node.name)

        current = node.cert_dir / "kubelet-server-current.pem"
        stored = current.resolve()
        assert current.is_symlink()
        assert stored.name.startswith("kubelet-server-")
        assert stored.parent == node.cert_dir.resolve()
        assert stored.stat().st_mode & 0o777 == 0o600

        assert node.stop() == 0
        node.start()
        again = wait_for(
            "the kubelet API serving again",
            lambda: _served_certificate(fleet, node.kubelet_port),
            timeout=60,
        )
        assert again.serial_number == served.serial_number
        assert len(node_csrs(upper, node.name)) == 1
        assert "reusing the serving certificate" in node.log.read_text()
    finally:
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


def test_without_approval_rights_the_node_waits_for_an_administrator(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    upper = fleet.upper.rest()
    name = f"vn-csr-wait-{secrets.token_hex(3)}"
    node = VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=tmp_path,
        upper_kubeconfig=token_kubeconfig(
            fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=name
        ),
        certificate_from_csr=True,
    )
    node.start()  # the Node is Ready without a certificate: nothing waits for one
    try:
        wait_for(
            "the waiting warning", lambda: "waits for an administrator" in node.log.read_text()
        )
        [first] = node_csrs(upper, node.name)
        assert first["spec"]["username"] == SERVICE_ACCOUNT
        assert _conditions(first) == []
        assert _served_certificate(fleet, node.kubelet_port) is None

        # A denied request is logged and replaced by a new one (after a backoff of ~5 s).
        fleet.upper.kubectl("certificate", "deny", first["metadata"]["name"])

        def replacement() -> dict[str, Any] | None:
            csrs = node_csrs(upper, node.name)
            return csrs[-1] if len(csrs) > 1 else None

        second = wait_for("a new CSR after the denial", replacement, timeout=30)
        assert "denied: KubectlDeny" in node.log.read_text()
        assert _conditions(second) == []
        assert _served_certificate(fleet, node.kubelet_port) is None

        fleet.upper.kubectl("certificate", "approve", second["metadata"]["name"])
        served = wait_for(
            "the kubelet API serving",
            lambda: _served_certificate(fleet, node.kubelet_port),
            timeout=30,
        )
        uid = second["metadata"]["uid"]
        [approved] = [c for c in node_csrs(upper, node.name) if c["metadata"]["uid"] == uid]
        assert served.serial_number == _issued(approved).serial_number
        _kubectl_logs_work(fleet, namespace, node.name)
    finally:
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


def test_the_optional_manifest_lets_a_service_account_node_approve_its_own_csr(
    fleet: Fleet, tmp_path: Path
) -> None:
    upper = fleet.upper.rest()
    optional = MANIFESTS / "upper-rbac-csr-self-approve.yaml"
    name = f"vn-csr-sa-{secrets.token_hex(3)}"
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=name
    )
    fleet.upper.kubectl("apply", "-f", str(optional))
    node = VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=tmp_path,
        upper_kubeconfig=kubeconfig,
        certificate_from_csr=True,
    )
    try:
        node.start()
        served = wait_for(
            "the kubelet API serving",
            lambda: _served_certificate(fleet, node.kubelet_port),
            timeout=60,
        )
        [csr] = node_csrs(upper, node.name)
        assert csr["spec"]["username"] == SERVICE_ACCOUNT
        assert ("Approved", "TensileSelfApproved") in _conditions(csr)
        assert served.serial_number == _issued(csr).serial_number
    finally:
        # Other tests need a ServiceAccount that may NOT approve.
        fleet.upper.kubectl("delete", "-f", str(optional))
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


# -- kept in a Secret upstairs (--cert-secret): a restart needs no new approval -----------


def _secret(fleet: Fleet, name: str) -> None:
    """Make Secret tensile-system/`name` (empty, as upper-rbac.yaml makes the shipped ones)."""
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "tensile-system"},
        "type": "Opaque",
    }
    create(fleet.upper.rest(), "tensile-system", body)


def _entries(fleet: Fleet, name: str) -> dict[str, bytes]:
    secret = fleet.upper.rest().request("GET", f"/api/v1/namespaces/tensile-system/secrets/{name}")
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def test_a_node_keeping_its_certificate_in_a_secret_needs_no_new_approval_after_a_restart(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    """The node runs as upper-rbac.yaml's account (get and update on its own Secret by
    name, no create on Secrets, no approval rights): an administrator approves its first
    CSR; stopped and started again with nothing on disk (no --cert-dir at all), it serves
    the same certificate from the Secret, makes no CSR, and `kubectl logs` works."""
    upper = fleet.upper.rest()
    name = f"vn-secret-{secrets.token_hex(3)}"
    secret = serving_secret(name)
    node = VirtualNodeProcess(
        fleet,
        name=name,
        log_dir=tmp_path,
        upper_kubeconfig=token_kubeconfig(
            fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=name
        ),
        certificate_from_csr=True,
        args=[f"--cert-secret=tensile-system/{secret}"],
    )
    try:
        # Without its Secret (which this account may not create) it stops at once, saying
        # what to do, before any CSR.
        log = _start_failure(node)
        assert f"Secret tensile-system/{secret}, which does not exist" in log
        assert f"kubectl -n tensile-system create secret generic {secret}" in log
        assert node_csrs(upper, name) == []

        _secret(fleet, secret)
        node.start()
        [csr] = wait_for("the node's CSR", lambda: node_csrs(upper, name) or None, timeout=60)
        fleet.upper.kubectl("certificate", "approve", csr["metadata"]["name"])
        served = wait_for(
            "the kubelet API serving",
            lambda: _served_certificate(fleet, node.kubelet_port),
            timeout=60,
        )
        key = f"kubelet-server-{fleet.node_ip}.pem"
        stored = wait_for("the certificate in the Secret", lambda: _entries(fleet, secret).get(key))
        assert load_chain(stored)[0].serial_number == served.serial_number
        assert b"PRIVATE KEY" in stored
        assert not node.cert_dir.exists()

        assert node.stop() == 0
        node.start()
        again = wait_for(
            "the kubelet API serving again",
            lambda: _served_certificate(fleet, node.kubelet_port),
            timeout=60,
        )
        assert again.serial_number == served.serial_number
        assert len(node_csrs(upper, name)) == 1
        assert f"reusing the serving certificate in Secret tensile-system/{secret} key {key}" in (
            node.log.read_text()
        )
        _kubectl_logs_work(fleet, namespace, name)
    finally:
        code = node.stop()
        node.delete_node()
        fleet.upper.kubectl(
            "delete", "secret", secret, "-n", "tensile-system", "--ignore-not-found"
        )
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


# -- what can fail is checked at start, not when the certificate arrives -----------------


def _start_failure(node: VirtualNodeProcess) -> str:
    """Start `node`, wait for it to exit, and return its log; it must exit 1."""
    node.start(wait=False)
    wait_for(
        "the node to exit",
        lambda: node.process is not None and node.process.returncode is not None,
        timeout=60,
    )
    assert node.process is not None
    log = node.log.read_text()
    assert node.process.returncode == 1, log
    assert "Traceback" not in log
    return log


def test_a_busy_kubelet_port_fails_at_start_before_any_csr(fleet: Fleet, tmp_path: Path) -> None:
    upper = fleet.upper.rest()
    with socket.create_server((fleet.node_ip, 0)) as taken:
        port = taken.getsockname()[1]
        node = VirtualNodeProcess(
            fleet,
            name=f"vn-csr-busy-{secrets.token_hex(3)}",
            log_dir=tmp_path,
            certificate_from_csr=True,
            env={"KUBELET_PORT": str(port)},
        )
        try:
            log = _start_failure(node)
        finally:
            node.stop()
            node.delete_node()
    assert f"cannot listen on {fleet.node_ip}:{port} (KUBELET_PORT)" in log
    assert "Address already in use" in log
    assert node_csrs(upper, node.name) == []


def test_a_bad_client_ca_fails_at_start_before_any_csr(fleet: Fleet, tmp_path: Path) -> None:
    upper = fleet.upper.rest()
    bad = tmp_path / "not-a-ca.crt"
    bad.write_text("not a certificate\n")
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-csr-ca-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        certificate_from_csr=True,
        env={"APISERVER_CA_CERT_LOCATION": str(bad)},
    )
    try:
        log = _start_failure(node)
    finally:
        node.stop()
        node.delete_node()
    assert f"cannot load the client CA file --client-verify-ca={bad}" in log
    assert "NO_CERTIFICATE_OR_CRL_FOUND" in log
    assert node_csrs(upper, node.name) == []


# -- rotation, driven in-process with a clock the test moves ------------------------------


class JumpingClock:
    """Real time plus an offset the test sets; sleeping ends only when a jump passes the
    moment (real time alone never gets there within a test)."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)
        self._moved = asyncio.Event()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset

    async def sleep_until(self, moment: dt.datetime) -> None:
        while self.now() < moment:
            self._moved.clear()
            await self._moved.wait()

    def jump_to(self, moment: dt.datetime) -> None:
        self.offset = moment - dt.datetime.now(dt.UTC)
        self._moved.set()


@pytest.fixture
async def upper_client(fleet: Fleet) -> AsyncIterator[ApiClient]:
    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as c:
        yield c


async def test_rotation_requests_a_new_certificate_that_new_handshakes_get(
    fleet: Fleet, upper_client: ApiClient, tmp_path: Path
) -> None:
    name = f"vn-rotate-{secrets.token_hex(3)}"
    clock = JumpingClock()
    servers: list[asyncio.Server] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()

    async def serve(tls: ssl.SSLContext) -> None:
        servers.append(await asyncio.start_server(echo, "127.0.0.1", 0, ssl=tls))

    tls = RotatingTls(client_ca_file="", serve=serve)
    files: list[Path] = []
    changed = asyncio.Event()

    async def on_certificate(certificate: ServingCertificate) -> None:
        await tls.use(certificate.pem)
        assert certificate.stored_at is not None
        files.append(Path(certificate.stored_at))
        if len(files) == 2:
            clock.jump_to(dt.datetime.now(dt.UTC))  # back to now: no third renewal
        changed.set()

    manager = ServingCertificateManager(
        upper=upper_client,
        identity=identity_from_addresses(
            node_name=name, addresses=[{"type": "InternalIP", "address": "127.0.0.1"}]
        ),
        store=CertificateStore(tmp_path / "pki"),
        settings=CertificateManagerSettings(
            expiration_seconds=600, retry=ExponentialBackoff(base=0.5, cap=1.0)
        ),
        clock=clock,
    )
    task = asyncio.create_task(manager.run(on_certificate=on_certificate), name="rotation")
    try:
        async with asyncio.timeout(60):
            await changed.wait()
        changed.clear()
        port = servers[0].sockets[0].getsockname()[1]
        first = _leaf(files[0])
        lifetime = first.not_valid_after_utc - first.not_valid_before_utc
        assert lifetime <= dt.timedelta(minutes=16)  # expirationSeconds was honoured

        client = ssl.create_default_context(cafile=str(fleet.upper.ca))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
        )
        assert _peer(writer).serial_number == first.serial_number
        clock.jump_to(first.not_valid_before_utc + lifetime * 0.85)  # past the 80 % mark
        async with asyncio.timeout(60):
            await changed.wait()
        second = _leaf(files[1])
        assert second.serial_number != first.serial_number
        assert (tmp_path / "pki" / "kubelet-server-current.pem").resolve() == files[1]
        assert [os.stat(f).st_mode & 0o777 for f in files] == [0o600, 0o600]

        # The open connection keeps working; a new handshake gets the new certificate.
        writer.write(b"still here\n")
        await writer.drain()
        assert await reader.readline() == b"still here\n"
        _, fresh = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
        )
        assert _peer(fresh).serial_number == second.serial_number
        for stream in (writer, fresh):
            stream.close()
            await stream.wait_closed()
        assert len(node_csrs(fleet.upper.rest(), name)) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for server in servers:
            server.close()
            await server.wait_closed()


def _certificate(common_name: str, *, now: dt.datetime) -> bytes:
    """A valid certificate and its key: an entry no write drops."""
    pair = selfsigned.new_authority(common_name=common_name, now=now, lifetime=dt.timedelta(1))
    return pair.cert_pem + pair.key_pem


async def test_replicas_writing_their_certificates_at_once_keep_each_others(
    fleet: Fleet, upper_client: ApiClient
) -> None:
    """The replicas of one node each keep their own address's certificate in the node's
    one Secret; writes at the same moment conflict (409) and are read again and merged,
    never lost. A Secret that does not exist is made by the first write where the identity
    may create it (here the administrator's)."""
    name = f"tensile-vn-secret-race-{secrets.token_hex(3)}"
    now = dt.datetime.now(dt.UTC)
    identities = [
        identity_from_addresses(
            node_name="vn-race", addresses=[{"type": "InternalIP", "address": f"192.0.2.{i}"}]
        )
        for i in range(20, 26)
    ]
    stores = [
        SecretStore(client=upper_client, namespace="tensile-system", name=name, identity=i)
        for i in identities
    ]
    try:
        for round_ in range(3):
            pems = [_certificate(f"round {round_} of {i}", now=now) for i in range(len(stores))]
            written = await asyncio.gather(
                *(store.write(pem, now=now) for store, pem in zip(stores, pems, strict=True))
            )
            assert written == [
                f"Secret tensile-system/{name} key {entry_key(i)}" for i in identities
            ]
            read = [await store.read() for store in stores]
            assert [r.pem if r else None for r in read] == pems
        secret = fleet.upper.rest().request(
            "GET", f"/api/v1/namespaces/tensile-system/secrets/{name}"
        )
        assert secret["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "tensile-virtual-node",
            "tensile.io/virtual-node": "vn-race",
        }
        assert len(secret["data"]) == len(stores)
    finally:
        fleet.upper.kubectl("delete", "secret", name, "-n", "tensile-system", "--ignore-not-found")


async def test_a_secret_the_node_may_not_keep_is_refused_at_start_with_what_to_grant(
    fleet: Fleet, tmp_path: Path
) -> None:
    """upper-rbac.yaml's account may get and update its own Secret by name, nothing else:
    the check at start names what is missing, for another Secret that exists and for one
    that does not."""
    node = f"vn-secret-rbac-{secrets.token_hex(3)}"
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=node
    )
    other = f"tensile-vn-other-{secrets.token_hex(3)}"
    _secret(fleet, other)
    try:
        async with ApiClient(config.load(str(kubeconfig)), name="upper-sa") as client:
            with pytest.raises(StoreError) as refused:
                await check_access(client, namespace="tensile-system", name=other)
            assert f"needs get and update on secrets/{other} in namespace tensile-system" in str(
                refused.value
            )
            missing = serving_secret(node)
            with pytest.raises(StoreError) as absent:
                await check_access(client, namespace="tensile-system", name=missing)
            assert f"Secret tensile-system/{missing}, which does not exist" in str(absent.value)
            _secret(fleet, missing)
            await check_access(client, namespace="tensile-system", name=missing)
            # The dry runs stored nothing.
            assert _entries(fleet, missing) == {}
    finally:
        for name in (other, serving_secret(node)):
            fleet.upper.kubectl(
                "delete", "secret", name, "-n", "tensile-system", "--ignore-not-found"
            )


def _leaf(path: Path) -> x509.Certificate:
    return load_chain(path.read_bytes())[0]


def _peer(writer: asyncio.StreamWriter) -> x509.Certificate:
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der)
