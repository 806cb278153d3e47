"""One CSR's life (`vnode.api.csr`) against a scripted FAKE certificates API (aiohttp, plain
HTTP on 127.0.0.1).

A fake is used for what a real kube-apiserver does not do on demand: hand back a CSR that
is not the one we created (as if it had been replaced behind our back), refuse an approval
that a SelfSubjectAccessReview allowed, or fail one approval with a 500. The ordinary paths
(self-approval, waiting for `kubectl certificate approve`, denial) run against the real
upper cluster in tests/e2e/test_serving_certificate.py.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from vnode.api import certificates as certs
from vnode.api import csr

Obj = dict[str, Any]
NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
IDENTITY = certs.ServingIdentity(node_name="vn-1", ip_addresses=("127.0.0.1",))


class FakeCertificatesApi:
    """One CSR: created by POST (through `on_create`), listed, watched, approved by PUT
    (answering with the next of `approval_codes`, 200 when empty)."""

    def __init__(self) -> None:
        self.csr: Obj | None = None
        self.on_create: Callable[[Obj], Obj] = lambda body: body
        self.approval_codes: deque[int] = deque()
        self.approvals: list[Obj] = []
        self._rv = 1
        self._events: asyncio.Queue[Obj | None] = asyncio.Queue()
        """Watch events; None ends the watch stream."""
        app = web.Application()
        app.router.add_post(CSRS, self._create)
        app.router.add_get(CSRS, self._list_or_watch)
        app.router.add_put(CSRS + "/{name}/approval", self._approve)
        self._server = TestServer(app, host="127.0.0.1")

    async def __aenter__(self) -> FakeCertificatesApi:
        await self._server.start_server(shutdown_timeout=1.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._events.put_nowait(None)
        await self._server.close()

    def client(self) -> ApiClient:
        url = f"http://127.0.0.1:{self._server.port}"
        return ApiClient(ConnectionInfo(server=url, ssl_context=None), name="fake")

    def update(self, change: Callable[[Obj], None]) -> None:
        """Change the CSR as a controller or an administrator would, and tell watchers."""
        assert self.csr is not None
        obj = copy.deepcopy(self.csr)
        change(obj)
        self._store(obj)
        self._events.put_nowait({"type": "MODIFIED", "object": obj})

    def delete(self) -> None:
        assert self.csr is not None
        gone, self.csr = self.csr, None
        self._events.put_nowait({"type": "DELETED", "object": gone})

    def _store(self, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self.csr = obj

    async def _create(self, request: web.Request) -> web.Response:
        body = self.on_create(await request.json())
        body["metadata"] = {"name": "csr-fake1", "uid": "uid-1"}
        body.setdefault("status", {})
        self._store(body)
        return web.json_response(body, status=201)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") not in ("1", "true"):
            items = [self.csr] if self.csr else []
            return web.json_response({"items": items, "metadata": {"resourceVersion": "1"}})
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        while (event := await self._events.get()) is not None:
            await response.write(json.dumps(event).encode() + b"\n")
        return response

    async def _approve(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.approvals.append(body)
        code = self.approval_codes.popleft() if self.approval_codes else 200
        if code != 200:
            message = {"kind": "Status", "code": code, "reason": "Scripted", "message": "no"}
            return web.json_response(message, status=code)
        self.update(lambda obj: obj.update(status=body["status"]))
        assert self.csr is not None
        return web.json_response(self.csr)


@pytest.fixture
async def api() -> AsyncIterator[FakeCertificatesApi]:
    async with FakeCertificatesApi() as server:
        yield server


def _manifest() -> Obj:
    key = certs.new_private_key()
    return certs.csr_manifest(
        request_pem=certs.certificate_request(IDENTITY, key), usages=certs.key_usages(key)
    )


def _issue(obj: Obj) -> None:
    obj["status"]["certificate"] = base64.b64encode(b"CHAIN").decode()


def _approve_by_admin(obj: Obj) -> None:
    condition = {"type": "Approved", "status": "True", "reason": "KubectlApprove"}
    obj["status"]["conditions"] = [condition]


async def _until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


async def _request(client: ApiClient, manifest: Obj) -> csr.Issued:
    return await csr.request_certificate(
        client, manifest=manifest, node_name="vn-1", self_approve=True, now=lambda: NOW
    )


async def test_a_csr_that_is_not_what_we_asked_for_is_never_approved(
    api: FakeCertificatesApi,
) -> None:
    other = _manifest()["spec"]["request"]
    api.on_create = lambda body: {**body, "spec": {**body["spec"], "request": other}}
    async with api.client() as client:
        with pytest.raises(certs.CertificateRejected, match="not our certificate request"):
            async with asyncio.timeout(10):
                await _request(client, _manifest())
    assert api.approvals == []


async def test_self_approval_puts_one_approved_condition_then_takes_the_certificate(
    api: FakeCertificatesApi,
) -> None:
    manifest = _manifest()
    async with api.client() as client:
        task = asyncio.create_task(_request(client, manifest), name="request")
        await _until(lambda: api.approvals)
        api.update(_issue)
        issued = await asyncio.wait_for(task, 10)
    assert issued == csr.Issued(name="csr-fake1", certificate=b"CHAIN")
    [approval] = api.approvals
    assert approval["metadata"]["uid"] == "uid-1"
    assert approval["spec"] == manifest["spec"]
    [condition] = approval["status"]["conditions"]
    assert (condition["type"], condition["reason"]) == ("Approved", "TensileSelfApproved")


async def test_a_refused_approval_falls_back_to_waiting_for_an_administrator(
    api: FakeCertificatesApi, caplog: pytest.LogCaptureFixture
) -> None:
    api.approval_codes.append(403)
    async with api.client() as client:
        with caplog.at_level(logging.WARNING, logger="vnode.api.csr"):
            task = asyncio.create_task(_request(client, _manifest()), name="request")
            await _until(lambda: "waits for an administrator" in caplog.text)
        assert "may not approve CSR csr-fake1 after all" in caplog.text
        api.update(_approve_by_admin)
        api.update(_issue)
        assert (await asyncio.wait_for(task, 10)).certificate == b"CHAIN"
    assert len(api.approvals) == 1  # no second try once refused


async def test_a_failed_approval_is_tried_again(api: FakeCertificatesApi) -> None:
    api.approval_codes.append(500)
    async with api.client() as client:
        task = asyncio.create_task(_request(client, _manifest()), name="request")
        await _until(lambda: len(api.approvals) == 2)  # after about a second
        api.update(_issue)
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda api: api.delete(), "CSR csr-fake1 was deleted"),
        (
            lambda api: api.update(
                lambda obj: obj["status"].update(
                    conditions=[
                        {"type": "Failed", "status": "True", "reason": "SignerValidationFailure"}
                    ]
                )
            ),
            "CSR csr-fake1 failed: SignerValidationFailure",
        ),
    ],
    ids=["deleted", "failed"],
)
async def test_a_csr_that_can_no_longer_be_issued_is_rejected(
    api: FakeCertificatesApi, change: Callable[[FakeCertificatesApi], None], message: str
) -> None:
    async with api.client() as client:
        task = asyncio.create_task(
            csr.request_certificate(
                client, manifest=_manifest(), node_name="vn-1", self_approve=False, now=lambda: NOW
            ),
            name="request",
        )
        await _until(lambda: api.csr is not None)
        change(api)
        with pytest.raises(certs.CertificateRejected, match=message):
            await asyncio.wait_for(task, 10)
