"""The extender's HTTPS side (`scheduler.server`) on a real TLS socket on 127.0.0.1, with
the context the program serves with (client certificates verified when presented): answers
in kube-scheduler's extender/v1 shapes to a caller presenting a client certificate of the
client CA, 401 (and nothing judged, no metrics, no check's reason) to one presenting none,
a refused handshake to one presenting a certificate of another CA, 429 beyond the calls in
flight, precise 400s for what is not an ExtenderArgs, a fallback when a decision raises,
and metrics. The summaries are filled from Node objects as the informer would (the informer
itself, and kube-scheduler presenting its certificate, run against the real clusters in
tests/e2e/test_scheduler.py); a decision that raises is injected through summaries whose
lookup raises, a fault no real cluster produces on demand."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from devcluster.pki import CertificateAuthority
from scheduler import extender
from scheduler.server import Callers, Judge, make_app
from scheduler.summaries import NodeSummary, Summaries
from tensile.placement import fit, summary
from tensile.serving import endpoints
from tensile.serving.tls import tls_context


def _virtual(name: str, cpu: str) -> dict[str, Any]:
    lower = {
        "metadata": {"name": f"{name}-1"},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    room = fit.node_room(lower, requested={"pods": Fraction(0)})
    text = summary.render(summary.summarize([room]))
    return {"metadata": {"name": name, "annotations": {summary.ANNOTATION: text}}}


@dataclass(frozen=True)
class Tls:
    """The certificates of a test: the extender's, kube-scheduler's (of the client CA) and
    a stranger's (a client certificate of another CA, as a cluster CA's user holds)."""

    serving_ca: Path
    server: tuple[Path, Path]
    client_ca: Path
    client: tuple[Path, Path]
    stranger: tuple[Path, Path]

    def session(self, cert: tuple[Path, Path] | bool | None = True) -> aiohttp.ClientSession:
        """A session presenting kube-scheduler's certificate (True), `cert`, or none."""
        context = ssl.create_default_context(cafile=str(self.serving_ca))
        chosen = self.client if cert is True else cert
        if isinstance(chosen, tuple):
            context.load_cert_chain(str(chosen[0]), str(chosen[1]))
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))

    @contextlib.asynccontextmanager
    async def serving(
        self,
        summaries: Summaries,
        *,
        callers: Callers | None = None,
        health: endpoints.Health | None = None,
    ) -> AsyncIterator[str]:
        """Serve the application over HTTPS on 127.0.0.1 with the context the program
        serves with (callers' certificates verified when presented); yield its URL."""
        app = make_app(
            Judge(summaries=summaries, policy=extender.Policy()),
            health=health or endpoints.Health(),
            max_request_bytes=64 * 1024,
            callers=callers,
        )
        context = tls_context(client_ca_file=str(self.client_ca), require_client_certificate=False)
        context.load_cert_chain(str(self.server[0]), str(self.server[1]))
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        try:
            yield f"https://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    directory = tmp_path_factory.mktemp("extender-pki")
    serving = CertificateAuthority.create(directory=directory, name="serving-ca")
    callers = CertificateAuthority.create(directory=directory, name="client-ca")
    server = serving.issue(
        directory=directory, name="server", common_name="x", ip_addresses=("127.0.0.1",),
        server=True,
    )  # fmt: skip
    client = callers.issue(
        directory=directory, name="client", common_name="system:kube-scheduler", client=True
    )
    stranger = serving.issue(directory=directory, name="stranger", common_name="u", client=True)
    return Tls(
        serving_ca=serving.pair.cert,
        server=(server.cert, server.key),
        client_ca=callers.pair.cert,
        client=(client.cert, client.key),
        stranger=(stranger.cert, stranger.key),
    )


POD = {
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
}


async def test_filter_and_prioritize_answer_in_the_extender_shapes(tls: Tls) -> None:
    summaries = Summaries()
    summaries.put(_virtual("small", "1"))
    summaries.put(_virtual("big", "4"))
    async with tls.serving(summaries) as url, tls.session() as client:
        args = {"Pod": POD, "NodeNames": ["small", "big", "plain"]}
        async with client.post(f"{url}/filter", json=args) as answer:
            assert answer.status == 200
            body = await answer.json()
        assert body["NodeNames"] == ["big", "plain"]
        assert body["FailedNodes"] == {
            "small": "lower cluster of small: 0/1 nodes are available: 1 Insufficient cpu."
        }
        async with client.post(f"{url}/prioritize", json=args) as answer:
            assert await answer.json() == [
                {"Host": "small", "Score": 0},
                {"Host": "big", "Score": 5},  # 1 + round(9 * 0.5), half to even
                {"Host": "plain", "Score": 0},
            ]


@pytest.mark.parametrize(
    ("data", "content_type", "status", "text"),
    [
        (b"{", "application/json", 400, "not JSON"),
        (b"[]", "application/json", 400, "not an ExtenderArgs: the body must be a JSON object"),
        (b'{"pod": {"spec": {}}}', "application/json", 400, 'neither "NodeNames"'),
        (b'{"NodeNames": []}', "application/json", 400, '"Pod" must be a Pod'),
        (b"{}", "text/plain", 415, "is not application/json"),
        (b"[" * 70_000, "application/json", 413, ""),
    ],
)
async def test_what_is_not_extender_args_gets_a_precise_4xx(
    tls: Tls, data: bytes, content_type: str, status: int, text: str
) -> None:
    async with tls.serving(Summaries()) as url, tls.session() as client:
        for verb in ("filter", "prioritize"):
            async with client.post(
                f"{url}/{verb}", data=data, headers={"Content-Type": content_type}
            ) as answer:
                assert answer.status == status
                assert text in await answer.text()


class _Broken(Summaries):
    def get(self, name: str) -> NodeSummary | None:
        raise RuntimeError("a bug")


async def test_a_decision_that_raises_lets_every_node_pass(tls: Tls) -> None:
    async with tls.serving(_Broken()) as url, tls.session() as client:
        args = {"Pod": POD, "NodeNames": ["a", "b"]}
        async with client.post(f"{url}/filter", json=args) as answer:
            assert answer.status == 200
            assert (await answer.json())["NodeNames"] == ["a", "b"]
        async with client.post(f"{url}/prioritize", json=args) as answer:
            assert await answer.json() == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
        async with client.get(f"{url}/metrics") as answer:
            text = await answer.text()
        assert 'tensile_scheduler_extender_requests_total{result="error",verb="filter"}' in text


async def test_a_caller_without_a_client_certificate_learns_nothing(tls: Tls) -> None:
    summaries = Summaries()
    summaries.put(_virtual("small", "1"))
    health = endpoints.Health()
    health.add_check("informers", lambda: "virtual nodes not listed")
    async with tls.serving(summaries, health=health) as url, tls.session(None) as anonymous:
        args = {"Pod": POD, "NodeNames": ["small"]}
        for verb in ("filter", "prioritize"):
            async with anonymous.post(f"{url}/{verb}", json=args) as answer:
                assert answer.status == 401
                text = await answer.text()
                assert "a client certificate is required" in text
                assert "small" not in text  # nothing judged, no failure reason
        async with anonymous.get(f"{url}/metrics") as answer:
            assert answer.status == 401
            assert "tensile_scheduler" not in await answer.text()
        # kubelet probes present no certificate: they learn whether, not why
        async with anonymous.get(f"{url}/healthz") as answer:
            assert (answer.status, await answer.text()) == (200, "ok")
        async with anonymous.get(f"{url}/readyz?verbose") as answer:
            assert (answer.status, await answer.text()) == (503, "not ready")
        async with tls.session() as client, client.get(f"{url}/readyz") as answer:
            assert answer.status == 503
            assert "virtual nodes not listed" in await answer.text()  # to a caller it knows


async def test_a_certificate_of_another_ca_is_refused_at_the_handshake(tls: Tls) -> None:
    async with tls.serving(Summaries()) as url, tls.session(tls.stranger) as stranger:
        with pytest.raises(aiohttp.ClientError):
            async with stranger.get(f"{url}/healthz"):
                pass


async def test_calls_beyond_the_bound_in_flight_get_429_at_once(tls: Tls) -> None:
    """One call holds the only place (its body still coming); the next gets 429 without
    waiting, and once the first is answered calls are taken again."""
    async with (
        tls.serving(Summaries(), callers=Callers(max_in_flight=1)) as url,
        tls.session() as client,
        tls.session() as other,
    ):
        release = asyncio.Event()
        body = b'{"Pod": {"spec": {}}, "NodeNames": []}'

        async def slow_body() -> AsyncIterator[bytes]:
            yield body[:10]
            await release.wait()
            yield body[10:]

        slow = asyncio.create_task(
            client.post(
                f"{url}/filter", data=slow_body(), headers={"Content-Type": "application/json"}
            ),
            name="slow-call",
        )
        try:
            for _ in range(200):  # until the slow call holds the place
                async with other.post(f"{url}/filter", json={"Pod": POD, "NodeNames": []}) as a:
                    if a.status == 429:
                        assert a.headers["Retry-After"] == "1"
                        assert "--max-requests-inflight" in await a.text()
                        break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("no 429 while a call was in flight")
        finally:
            release.set()
            answer = await slow
        assert answer.status == 200
        answer.release()
        async with other.post(f"{url}/filter", json={"Pod": POD, "NodeNames": []}) as after:
            assert after.status == 200
