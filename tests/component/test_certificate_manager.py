"""The serving-certificate manager (`vnode.api.certmanager`) against a FAKE signer: an
aiohttp certificates API on 127.0.0.1 that signs each CSR as kube-controller-manager's
kubelet-serving signer would (notBefore five minutes before its clock), with a clock of
the test's own for the node.

A fake, because these are the failures a real control plane does not produce on demand:
a malformed answer, a malformed certificate, a SelfSubjectAccessReview that is Forbidden,
a signer whose clock disagrees with the node's, a store that cannot be written. The
ordinary paths run against the real upper cluster in tests/e2e/test_serving_certificate.py.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import errno
import ipaddress
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from tensile.kube.backoff import ExponentialBackoff
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from vnode.api import certificates as certs
from vnode.api.certmanager import (
    CertificateManagerSettings,
    ServingCertificate,
    ServingCertificateManager,
)
from vnode.api.certstore import CertificateStore

Obj = dict[str, Any]
NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
"""The signer's clock."""
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
IDENTITY = certs.ServingIdentity(node_name="vn-1", ip_addresses=("127.0.0.1",))
CA_KEY = ec.generate_private_key(ec.SECP256R1())
FAST = CertificateManagerSettings(retry=ExponentialBackoff(base=0.01, cap=0.05))

Plan = Literal["issue", "pending", "malformed"]


class FakeSigner:
    """Certificates API of one cluster: SelfSubjectAccessReviews answer `review` (allowed
    or not, or an HTTP error code); each created CSR follows the next of `plans` ("issue",
    the default: issued at once; "pending": left for an approval PUT, answered with the
    next of `approval_answers`; "malformed": issued with a certificate whose
    subjectAltName does not parse). `create_answers` replace the answers to creations
    (raw JSON bodies, status 201). Watches stay silent: nothing changes a CSR after its
    creation."""

    def __init__(self) -> None:
        self.review: bool | int = False
        self.plans: deque[Plan] = deque()
        self.create_answers: deque[bytes] = deque()
        self.approval_answers: deque[bytes] = deque()
        self.lifetime = dt.timedelta(days=10)
        self.csrs: list[Obj] = []
        self.approvals: list[Obj] = []
        self._serial = itertools.count(1)
        self._closing = asyncio.Event()
        app = web.Application()
        app.router.add_post(REVIEWS, self._review)
        app.router.add_post(CSRS, self._create)
        app.router.add_get(CSRS, self._list_or_watch)
        app.router.add_put(CSRS + "/{name}/approval", self._approve)
        self._server = TestServer(app, host="127.0.0.1")

    async def __aenter__(self) -> FakeSigner:
        await self._server.start_server(shutdown_timeout=1.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        await self._server.close()

    def client(self) -> ApiClient:
        url = f"http://127.0.0.1:{self._server.port}"
        return ApiClient(ConnectionInfo(server=url, ssl_context=None), name="fake")

    def _issue(self, obj: Obj, *, malformed: bool = False) -> None:
        request = base64.b64decode(obj["spec"]["request"])
        pem = sign(request, serial=next(self._serial), lifetime=self.lifetime, malformed=malformed)
        obj["status"]["certificate"] = base64.b64encode(pem).decode()

    async def _review(self, request: web.Request) -> web.Response:
        if not isinstance(self.review, bool):
            status = {"kind": "Status", "code": self.review, "reason": "Scripted", "message": "no"}
            return web.json_response(status, status=self.review)
        body = await request.json()
        return web.json_response({**body, "status": {"allowed": self.review}}, status=201)

    async def _create(self, request: web.Request) -> web.Response:
        if self.create_answers:
            answer = self.create_answers.popleft()
            return web.Response(body=answer, status=201, content_type="application/json")
        body = await request.json()
        number = len(self.csrs) + 1
        obj = {
            **body,
            "metadata": {"name": f"csr-{number}", "uid": f"uid-{number}", "resourceVersion": "1"},
            "spec": {**body["spec"], "username": "system:serviceaccount:ns:vn"},
            "status": {},
        }
        plan = self.plans.popleft() if self.plans else "issue"
        if plan != "pending":
            self._issue(obj, malformed=plan == "malformed")
        self.csrs.append(obj)
        return web.json_response(obj, status=201)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("1", "true"):
            response = web.StreamResponse()
            response.content_type = "application/json"
            await response.prepare(request)
            await self._closing.wait()
            return response
        wanted = request.query.get("fieldSelector", "").removeprefix("metadata.name=")
        items = [c for c in self.csrs if c["metadata"]["name"] == wanted]
        return web.json_response({"items": items, "metadata": {"resourceVersion": "1"}})

    async def _approve(self, request: web.Request) -> web.Response:
        self.approvals.append(await request.json())
        answer = self.approval_answers.popleft()
        return web.Response(body=answer, status=200, content_type="application/json")


def sign(
    request_pem: bytes, *, serial: int, lifetime: dt.timedelta, malformed: bool = False
) -> bytes:
    """Return the PEM certificate the kubelet-serving signer issues for `request_pem` at
    NOW (valid from five minutes earlier, for `lifetime`); with `malformed`, its
    subjectAltName extension holds bytes that do not parse."""
    request = x509.load_pem_x509_csr(request_pem)
    extension: x509.ExtensionType = request.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value
    if malformed:
        extension = x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"0\x03")
    start = NOW - dt.timedelta(minutes=5)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(request.subject)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-ca")]))
        .public_key(request.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(start + lifetime)
        .add_extension(extension, critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(CA_KEY, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


class FakeClock:
    """The node's clock: stands still except when the manager sleeps, which jumps it to
    the moment slept to. Records how long each sleep was; the sleeps after the first
    `free` ones never end."""

    def __init__(self, now: dt.datetime, *, free: int = 0) -> None:
        self.moment = now
        self.free = free
        self.sleeps: list[dt.timedelta] = []

    def now(self) -> dt.datetime:
        return self.moment

    async def sleep_until(self, moment: dt.datetime) -> None:
        self.sleeps.append(moment - self.moment)
        if len(self.sleeps) > self.free:
            await asyncio.Event().wait()
        self.moment = max(self.moment, moment)
        await asyncio.sleep(0)


class Served:
    """An `on_certificate` that records what it is handed; raises for the first
    `failures` calls."""

    def __init__(self, *, failures: int = 0) -> None:
        self.certificates: list[ServingCertificate] = []
        self.failures = failures
        self.calls = 0

    async def __call__(self, certificate: ServingCertificate) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("the listener is not ready")
        self.certificates.append(certificate)


@pytest.fixture
async def signer() -> AsyncIterator[FakeSigner]:
    async with FakeSigner() as fake:
        yield fake


async def _run_until(
    manager: ServingCertificateManager,
    served: Served,
    condition: Callable[[], object],
    *,
    timeout: float = 10.0,
) -> None:
    """Run `manager` until `condition` holds, then cancel it. The manager must still be
    running then: it ends only on cancellation."""
    task = asyncio.create_task(manager.run(on_certificate=served), name="certificate-manager")
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                if task.done():
                    task.result()  # raises what ended it
                    pytest.fail("the certificate manager returned")
                await asyncio.sleep(0.01)
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _manager(
    client: ApiClient,
    store: CertificateStore,
    clock: FakeClock,
    settings: CertificateManagerSettings = FAST,
) -> ServingCertificateManager:
    return ServingCertificateManager(
        upper=client, identity=IDENTITY, store=store, settings=settings, clock=clock
    )


# -- finding: nothing but cancellation ends the manager -------------------------------------


async def test_a_current_file_that_is_a_copy_not_a_link_is_reused(
    signer: FakeSigner, tmp_path: Path
) -> None:
    key = certs.new_private_key()
    request = certs.certificate_request(IDENTITY, key)
    store = CertificateStore(tmp_path / "pki")
    store.directory.mkdir()
    # Restored with `cp -L`: a regular file where the symlink was (readlink says EINVAL).
    pem = sign(request, serial=99, lifetime=dt.timedelta(days=10))
    store.current.write_bytes(certs.bundle(pem, key))
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, store, FakeClock(NOW))
        await _run_until(manager, served, lambda: served.certificates)
    [certificate] = served.certificates
    assert certificate.stored_at == str(store.current)
    assert certs.matches_key(certificate.leaf, key)
    assert signer.csrs == []


async def test_an_unreadable_current_file_is_reported_as_such_and_replaced(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CertificateStore(tmp_path / "pki")
    (store.directory / "elsewhere").mkdir(parents=True)
    store.current.symlink_to("elsewhere")  # reading it: EISDIR
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, store, FakeClock(NOW))
        with caplog.at_level(logging.INFO, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: served.certificates)
    assert f"cannot read {store.current}: [Errno 21] Is a directory" in caplog.text
    assert "there is no stored certificate" not in caplog.text
    assert served.certificates[0].stored_at == str(store.current_target())
    assert len(signer.csrs) == 1


async def test_a_malformed_api_answer_is_logged_and_retried(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer.create_answers.append(b"{not json")  # a broken proxy, say
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), FakeClock(NOW))
        with caplog.at_level(logging.INFO, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: served.certificates)
    [failure] = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert failure.levelno == logging.ERROR
    assert "JSONDecodeError: unexpected character" in failure.getMessage()
    assert "requesting a new serving certificate in" in caplog.text
    assert len(signer.csrs) == 1


async def test_a_failure_inside_the_csr_watch_is_logged_by_its_cause_and_retried(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Self-approval's PUT gets a malformed answer: raised inside request_certificate's
    # TaskGroup, so it arrives wrapped in an ExceptionGroup.
    signer.review = True
    signer.plans.append("pending")
    signer.approval_answers.append(b"[broken")
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), FakeClock(NOW))
        with caplog.at_level(logging.INFO, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: served.certificates)
    [failure] = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert "JSONDecodeError" in failure.getMessage()
    assert "unhandled errors in a TaskGroup" not in failure.getMessage()
    assert len(signer.csrs) == 2
    assert "certificate" not in signer.csrs[0]["status"]  # the approval failed
    assert [c.leaf.serial_number for c in served.certificates] == [1]


async def test_a_malformed_certificate_is_rejected_and_a_new_one_requested(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer.plans.append("malformed")
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), FakeClock(NOW))
        with caplog.at_level(logging.INFO, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: served.certificates)
    assert "no serving certificate: CSR csr-1: unusable certificate: error parsing" in (caplog.text)
    assert [c.leaf.serial_number for c in served.certificates] == [2]


async def test_a_certificate_that_cannot_be_served_yet_is_handed_over_again(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = Served(failures=2)
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), FakeClock(NOW))
        with caplog.at_level(logging.ERROR, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: served.certificates)
    assert caplog.text.count("cannot serve the new certificate: RuntimeError") == 2
    assert len(signer.csrs) == 1


# -- finding: an issued certificate is never thrown away ------------------------------------


class ReadOnlyStore(CertificateStore):
    """A store whose first `failures` saves fail as on a read-only file system."""

    def __init__(self, directory: Path, *, failures: int) -> None:
        super().__init__(directory)
        self.failures = failures

    def save(self, content: bytes, *, now: dt.datetime) -> Path:
        if self.failures > 0:
            self.failures -= 1
            raise OSError(errno.EROFS, "Read-only file system", str(self.directory))
        return super().save(content, now=now)


async def test_an_issued_certificate_is_served_from_memory_until_it_can_be_stored(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ReadOnlyStore(tmp_path / "pki", failures=3)
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, store, FakeClock(NOW))
        with caplog.at_level(logging.INFO, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: "at last" in caplog.text)
    [certificate] = served.certificates
    assert certificate.stored_at is None  # handed over before it could be stored
    assert store.load_current() == certificate.pem
    assert len(signer.csrs) == 1  # no new key, no new CSR, no new approval
    errors_logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors_logged) == 3
    assert "it is NOT persisted, so a restart now will need a new CSR" in (
        errors_logged[0].getMessage()
    )
    assert "Read-only file system" in errors_logged[0].getMessage()


# -- finding: clocks that disagree ------------------------------------------------------------


async def test_a_node_clock_behind_the_signer_serves_the_certificate_with_a_warning(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(NOW - dt.timedelta(minutes=10))  # notBefore is 5 min in its future
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), clock)
        with caplog.at_level(logging.WARNING, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: served.certificates)
    assert len(signer.csrs) == 1
    assert "is valid only from 2026-03-01T11:55:00Z, 300s after this node's clock" in (caplog.text)
    # Renewed at 80 % of its lifetime, by the signer's dates.
    assert clock.sleeps == [NOW - dt.timedelta(minutes=5) + dt.timedelta(days=8) - clock.now()]


async def test_certificates_due_at_once_are_renewed_at_a_doubling_interval(
    signer: FakeSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The node's clock is 9 days ahead: every 10-day certificate is past its 80 % mark
    # (but still valid) the moment it arrives.
    clock = FakeClock(NOW + dt.timedelta(days=9), free=4)
    served = Served()
    settings = CertificateManagerSettings(
        retry=FAST.retry, min_renewal_interval=ExponentialBackoff(base=1.0, cap=4.0)
    )
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), clock, settings)
        with caplog.at_level(logging.WARNING, logger="vnode.api.certmanager"):
            await _run_until(manager, served, lambda: len(clock.sleeps) == 5)
    assert [s.total_seconds() for s in clock.sleeps] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert len(signer.csrs) == len(served.certificates) == 5
    assert "is due for renewal already" in caplog.text


# -- finding: access reviews we may not make --------------------------------------------------


@pytest.mark.parametrize("code", [403, 404])
async def test_an_access_review_we_may_not_make_means_waiting_for_an_administrator(
    signer: FakeSigner, tmp_path: Path, code: int
) -> None:
    signer.review = code
    served = Served()
    async with signer.client() as client:
        manager = _manager(client, CertificateStore(tmp_path / "pki"), FakeClock(NOW))
        await _run_until(manager, served, lambda: served.certificates)
    assert len(signer.csrs) == 1
    assert signer.approvals == []  # never tried to approve it itself


def test_the_fake_signer_names_what_we_asked_for() -> None:
    # The fake's certificates are ones `check_certificate` accepts (the tests above rely
    # on it), except the "malformed" one.
    key = certs.new_private_key()
    pem = sign(certs.certificate_request(IDENTITY, key), serial=1, lifetime=dt.timedelta(1))
    leaf = certs.load_chain(pem)[0]
    certs.check_certificate([leaf], key=key, identity=IDENTITY, now=NOW)
    assert certs.subject_alt_names(leaf) == ([str(ipaddress.ip_address("127.0.0.1"))], [])
