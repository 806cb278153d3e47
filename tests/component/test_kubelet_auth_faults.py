"""The kubelet API's authentication and authorization when the upper cluster misbehaves,
over real HTTP (aiohttp on 127.0.0.1) with a FAKE upper apiserver.

A fake is used on purpose: a real kube-apiserver cannot be made to answer TokenReviews or
SubjectAccessReviews with 404 or 500, or to hang on them, on demand. What the tests check is
what a caller of the kubelet API sees: a bounded 401 / 403 / 429 / 503, never a hang or a
500, and that callers who hung up cost the upper cluster no review. The paths against the
real control plane are in tests/e2e/test_kubelet_api.py and test_hostile.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.serving import auth
from vnode.api.server import ApiContext, make_app


class FakeUpper:
    """Answers reviews as told: an HTTP status, or never (`hang`); counts what it got."""

    def __init__(self) -> None:
        self.token_status = 200
        self.sar_status = 200
        self.hang = False
        self.delay = 0.0
        self.reviews = 0
        self.in_flight = 0
        self.most_in_flight = 0

    async def _answer(self, status: int, body: dict[str, Any]) -> web.Response:
        self.reviews += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hang:
                await asyncio.Event().wait()
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if status != 200:
            return web.json_response(
                {"kind": "Status", "status": "Failure", "message": "injected", "code": status},
                status=status,
            )
        return web.json_response(body)

    async def token_review(self, _request: web.Request) -> web.Response:
        user = {"username": "alice", "groups": ["team"]}
        return await self._answer(
            self.token_status, {"status": {"authenticated": True, "user": user}}
        )

    async def subject_access_review(self, _request: web.Request) -> web.Response:
        return await self._answer(self.sar_status, {"status": {"allowed": True}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.token_review)
        app.router.add_post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews", self.subject_access_review
        )
        return app


@contextlib.asynccontextmanager
async def _node_api(
    upper: FakeUpper, *, gate: auth.ReviewGate | None = None
) -> AsyncIterator[TestServer]:
    upper_server = TestServer(upper.app())
    await upper_server.start_server()
    info = ConnectionInfo(server=str(upper_server.make_url("")).rstrip("/"), ssl_context=None)
    gate = gate or auth.ReviewGate()
    try:
        async with ApiClient(info, name="upper-reviews", qps=0) as client:
            context = ApiContext(
                node_name="n1",
                pod=lambda _ns, _name: None,
                pods=list,
                provider=None,  # type: ignore[arg-type]
                authenticator=auth.Authenticator(client, gate=gate),
                authorizer=auth.Authorizer(client, gate=gate),
            )
            server = TestServer(make_app(context))
            await server.start_server()
            try:
                yield server
            finally:
                await server.close()
    finally:
        await upper_server.close()


async def _get(server: TestServer, *, token: str = "t0k3n") -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.make_url("/pods"), headers={"Authorization": f"Bearer {token}"}) as r,
    ):
        return r.status, await r.text()


@pytest.fixture(autouse=True)
def _short_review_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "REVIEW_TIMEOUT", 0.5)


@pytest.mark.parametrize(
    ("token_status", "sar_status", "expected"),
    [
        (200, 200, 200),
        (404, 200, 401),  # the review API refused the token: not authenticated
        (403, 200, 401),  # the node may not ask: nobody is authenticated
        (500, 200, 503),
        (429, 200, 503),
        (200, 404, 403),
        (200, 403, 403),
        (200, 500, 503),
    ],
)
async def test_review_failures_get_bounded_kubelet_answers(
    token_status: int, sar_status: int, expected: int
) -> None:
    upper = FakeUpper()
    upper.token_status, upper.sar_status = token_status, sar_status
    async with _node_api(upper) as server:
        async with asyncio.timeout(15):
            status, body = await _get(server)
    assert status == expected, body
    if expected == 503:
        assert "cannot check the caller now" in body


@pytest.mark.parametrize("hang", ["TokenReview", "SubjectAccessReview"])
async def test_a_review_that_never_answers_is_a_503_after_the_timeout(hang: str) -> None:
    upper = FakeUpper()
    async with _node_api(upper) as server:
        if hang == "SubjectAccessReview":
            assert (await _get(server, token="warm"))[0] == 200  # token cached, SAR not
            upper.hang = True
            async with (
                aiohttp.ClientSession() as http,
                asyncio.timeout(5),
                http.get(
                    server.make_url("/stats/summary"), headers={"Authorization": "Bearer warm"}
                ) as response,
            ):
                status, body = response.status, await response.text()
        else:
            upper.hang = True
            async with asyncio.timeout(5):
                status, body = await _get(server)
    assert status == 503
    assert f"{hang} failed" in body


async def test_reviews_in_flight_are_bounded_and_the_queue_answers_429_when_full() -> None:
    upper = FakeUpper()
    upper.delay = 0.2
    gate = auth.ReviewGate(in_flight=2, waiting=3)
    async with _node_api(upper, gate=gate) as server:
        async with asyncio.timeout(15):
            answers = await asyncio.gather(*(_get(server, token=f"t{i}") for i in range(8)))
    statuses = sorted(status for status, _ in answers)
    # 2 reviewed at once, 3 waiting; the other 3 are told to come back.
    assert statuses == [200] * 5 + [429] * 3
    assert upper.most_in_flight <= 2


async def test_callers_who_hung_up_cost_no_review() -> None:
    upper = FakeUpper()
    upper.delay = 0.3
    gate = auth.ReviewGate(in_flight=1, waiting=100)
    async with _node_api(upper, gate=gate) as server:
        for i in range(30):
            _reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(
                f"GET /pods HTTP/1.1\r\nHost: n\r\nAuthorization: Bearer r{i}\r\n\r\n".encode()
            )
            await writer.drain()
            writer.close()
        await asyncio.sleep(1.5)
        # A caller who waits is still served.
        async with asyncio.timeout(5):
            assert (await _get(server, token="patient"))[0] == 200
    # The first caller's review had started before it left; each later one found its
    # caller gone when its turn came (one SAR for the patient caller and its token).
    assert upper.reviews <= 4, upper.reviews
