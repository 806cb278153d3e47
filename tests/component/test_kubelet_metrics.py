"""The kubelet API's metrics, summary, running pods and /run routes, and the k2k scraper,
over real HTTP (aiohttp on 127.0.0.1) with FAKE backends.

Fakes on purpose: a lower kubelet that hangs, fails for a while and recovers, or a command
that runs forever or floods its output cannot be produced on demand by the real control
plane; tests/e2e/test_kubelet_metrics.py covers the same routes against kwok.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import ssl
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from devcluster.pki import CertificateAuthority
from tensile.contracts import ownership
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.store import Store
from vnode import provider_errors
from vnode.api import run, stats
from vnode.api.server import ApiContext, make_app
from vnode.provider import ContainerUsage, NodeUsage, PodUsage, RemoteCommand, Usage
from vnode.providers.k2k import resource_usage
from vnode.providers.k2k.lowerpods import LowerPodBook
from vnode.providers.k2k.scrape import (
    BODY_LIMIT,
    BearerTokenFile,
    KubeletAccess,
    ResourceScraper,
    ThroughApiserver,
    ToKubelets,
)
from vnode.testing.fakeprovider import FakeProvider, FakeSession

NODE = "vn-1"
CLUSTER_ID = "0f3c2a9e-7b1d-4c55-8e2f-5a6b7c8d9e01"
OWNER = ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)
NOW = 1_700_000_000.0

# -- the API routes, with a fake provider ------------------------------------------------

SUCCESS = (3, b'{"metadata":{},"status":"Success"}')
EXIT_2 = (
    3,
    b'{"metadata":{},"status":"Failure","reason":"NonZeroExitCode",'
    b'"details":{"causes":[{"reason":"ExitCode","message":"2"}]}}',
)


def upper_pod(name: str, *, running: bool = True) -> dict[str, Any]:
    state = {"running": {}} if running else {"waiting": {}}
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "main", "image": "img"}]},
        "status": {"containerStatuses": [{"name": "main", "image": "img", "state": state}]},
    }


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], FakeProvider]]:
    provider = FakeProvider(script=[(1, b"out\n"), (2, b"err\n"), SUCCESS])
    pods = {("team", "web"): upper_pod("web"), ("team", "idle"): upper_pod("idle", running=False)}
    context = ApiContext(
        node_name=NODE,
        pod=lambda ns, name: pods.get((ns, name)),
        pods=lambda: list(pods.values()),
        provider=provider,
        authenticator=None,
        authorizer=None,
    )
    async with TestClient(TestServer(make_app(context))) as client:
        yield client, provider


def usage(cpu: float, memory: float) -> Usage:
    return Usage(time_ms=1_700_000_000_500, cpu_seconds=cpu, memory_bytes=memory)


async def test_metrics_and_summary_render_the_providers_usage(
    api: tuple[TestClient[web.Request, web.Application], FakeProvider],
) -> None:
    client, provider = api
    provider.usage = NodeUsage(
        pods=(
            PodUsage(
                namespace="team",
                name="web",
                uid="uid-web",
                start_time=NOW,
                containers=(ContainerUsage(name="main", start_time=NOW, usage=usage(1.5, 2e6)),),
                usage=usage(1.5, 2e6),
            ),
        ),
        node=usage(1.5, 2e6),
        complete=True,
    )
    response = await client.get("/metrics/resource")
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    [cpu] = families["container_cpu_usage_seconds"].samples
    assert cpu.labels == {"container": "main", "pod": "web", "namespace": "team"}
    assert cpu.value == 1.5
    summary = await (await client.get("/stats/summary?only_cpu_and_memory=true")).json()
    assert summary["node"]["nodeName"] == NODE
    assert summary["pods"][0]["podRef"] == {"name": "web", "namespace": "team", "uid": "uid-web"}
    assert (await client.post("/metrics/resource")).status == 405


@pytest.mark.parametrize("path", ["/runningpods/", "/runningpods"])
async def test_running_pods_list_the_pods_with_running_containers(
    api: tuple[TestClient[web.Request, web.Application], FakeProvider], path: str
) -> None:
    client, _ = api
    body = await (await client.get(path)).json()
    assert [p["metadata"]["name"] for p in body["items"]] == ["web"]


def _answered(path: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "tensile_kubelet_api_requests_total", {"path": path, "code": code}
    )
    return value or 0.0


async def test_every_answer_is_counted_by_route_and_code(
    api: tuple[TestClient[web.Request, web.Application], FakeProvider],
) -> None:
    """tensile_kubelet_api_requests_total: by the route's first segment (never a pod's
    name), with the code the caller got; a path no route serves is "other"."""
    client, _ = api
    calls = [
        ("GET", "/pods", "pods", "200"),
        ("GET", "/containerLogs/team/web/main?tailLines=x", "containerLogs", "400"),
        ("GET", "/containerLogs/team/nobody/main", "containerLogs", "404"),
        ("GET", "/configz", "other", "404"),
        ("POST", "/pods", "other", "405"),
    ]
    before = {(path, code): _answered(path, code) for _, _, path, code in calls}
    for method, url, _, code in calls:
        response = await client.request(method, url)
        assert response.status == int(code), url
    for (path, code), count in before.items():
        times = sum(1 for _, _, p, c in calls if (p, c) == (path, code))
        assert _answered(path, code) == count + times, (path, code)
    in_flight = REGISTRY.get_sample_value(
        "tensile_kubelet_api_inflight_requests", {"path": "containerLogs"}
    )
    assert in_flight == 0


async def test_run_answers_stdout_then_stderr(
    api: tuple[TestClient[web.Request, web.Application], FakeProvider],
) -> None:
    client, provider = api
    response = await client.post("/run/team/web/uid-web/main?cmd=sh -c hi")
    assert response.status == 200
    assert await response.read() == b"out\nerr\n"
    assert response.headers["Content-Type"] == "application/json"
    assert provider.execs[0].options.command == ("sh", "-c", "hi")
    assert not provider.execs[0].attach
    session = provider.sessions[0]
    assert session.closed
    assert session.sent == [], "/run sends no input"
    assert not session.stdin_closed, "/run sends no input"


@pytest.mark.parametrize(
    ("path", "status", "text"),
    [
        ("/run/team/web/main", 400, "cmd is required"),
        ("/run/team/nope/main?cmd=x", 404, "not found on this node"),
        ("/run/team/web/other-uid/main?cmd=x", 404, "not found on this node"),
        ("/run/team/web/sidecar?cmd=x", 404, "container 'sidecar' not found"),
    ],
)
async def test_bad_run_requests_get_kubelet_statuses(
    api: tuple[TestClient[web.Request, web.Application], FakeProvider],
    path: str,
    status: int,
    text: str,
) -> None:
    client, _ = api
    response = await client.post(path)
    assert response.status == status
    assert text in await response.text()
    assert (await client.get("/run/team/web/main?cmd=x")).status == 405


async def test_a_failing_command_is_a_500_with_the_kubelets_words(
    api: tuple[TestClient[web.Request, web.Application], FakeProvider],
) -> None:
    client, provider = api
    provider.script = [(1, b"partial"), (2, b"bad thing\n"), EXIT_2]
    response = await client.post("/run/team/web/main?cmd=false")
    assert response.status == 500
    assert await response.text() == "command 'false' exited with 2: bad thing\n"
    provider.exec_error = provider_errors.PodNotFound(
        "pod team/web has no pod in the lower cluster"
    )
    assert (await client.post("/run/team/web/main?cmd=false")).status == 404
    provider.exec_error = provider_errors.BackendUnavailable("lower cluster down")
    assert (await client.post("/run/team/web/main?cmd=false")).status == 503
    assert not any(call.attach for call in provider.execs)
    assert provider.sessions[0].sent == [], "/run sends no input"
    assert not provider.sessions[0].stdin_closed, "/run sends no input"


async def test_run_is_bounded_in_time_and_output() -> None:
    options = RemoteCommand(command=("yes",), stdin=False, stdout=True, stderr=True, tty=False)
    hanging = FakeSession([(1, b"y\n")])  # never ends
    with pytest.raises(run.RunError, match=r"timed out after 0\.1s"):
        await run.collect(hanging, options=options, timeout=0.1)
    assert hanging.closed
    flood = FakeSession([(1, b"y" * 600), (2, b"n" * 600), SUCCESS], ended=True)
    with pytest.raises(run.RunError, match="wrote more than 1000 bytes"):
        await run.collect(flood, options=options, limit=1000)
    assert flood.closed
    silent = FakeSession([(1, b"y")], ended=True)
    with pytest.raises(run.RunError, match="without a status"):
        await run.collect(silent, options=options)


# -- the scraper, with fake kubelets -----------------------------------------------------


def lower_pod(name: str, *, node: str, uid: str, owner: str = NODE) -> dict[str, Any]:
    labels, annotations = ownership.owner_marks(
        ownership.NodeIdentity(node_name=owner, cluster_id=CLUSTER_ID)
    )
    annotations[ownership.UPPER_UID_ANNOTATION] = uid
    annotations[ownership.UPPER_NAMESPACE_ANNOTATION] = "team"
    return {
        "metadata": {
            "name": name,
            "namespace": "lo-team",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"nodeName": node},
        "status": {"startTime": "2023-11-14T22:00:00Z"},
    }


def kubelet_text(pod: str, cpu: float) -> str:
    labels = f'container="main",namespace="lo-team",pod="{pod}"'
    return (
        f"container_cpu_usage_seconds_total{{{labels}}} {cpu}\n"
        f"container_memory_working_set_bytes{{{labels}}} 1000\n"
    )


class FakeKubelets:
    """Answers per node: text (or a function making it, called per fetch), an exception to
    raise, or a delay before the text."""

    def __init__(self) -> None:
        self.answers: dict[str, str | Exception | Callable[[], str]] = {}
        self.delays: dict[str, float] = {}
        self.calls: list[tuple[str, str]] = []

    async def fetch(self, node: dict[str, Any], path: str, *, limit: int) -> str:
        name = node["metadata"]["name"]
        self.calls.append((name, path))
        await asyncio.sleep(self.delays.get(name, 0.0))
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, str) else answer()


def scraper(
    kubelets: KubeletAccess, *, nodes: tuple[str, ...] = ("n1", "n2"), **kwargs: Any
) -> ResourceScraper:
    pod_store, node_store = Store(), Store()
    for i, name in enumerate(nodes):
        pod_store.upsert(lower_pod(f"p{i}", node=name, uid=f"u{i}"))
        annotations = {"metrics.k8s.io/resource-metrics-path": f"/m/{name}"} if i == 0 else {}
        node_store.upsert({"metadata": {"name": name, "annotations": annotations}})
    pod_store.upsert(lower_pod("theirs", node="n1", uid="x", owner="vn-2"))
    clock: Callable[[], float] = kwargs.pop("clock", lambda: NOW)
    # No second pass for rates unless a test asks for one (the fixed clock gives none).
    kwargs.setdefault("warmup", 0.0)
    return ResourceScraper(
        access=kubelets,
        pods=pod_store,
        nodes=node_store,
        made=LowerPodBook(owner=OWNER).made,
        clock=clock,
        **kwargs,
    )


async def test_a_failing_node_leaves_its_pods_out_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kubelets = FakeKubelets()
    kubelets.answers = {
        "n1": kubelet_text("p0", 1.0) + kubelet_text("theirs", 5.0),
        "n2": errors.ApiUnavailable("connection refused"),
    }
    usage_source = scraper(kubelets, ttl=0.0)
    caplog.set_level(logging.INFO, logger="vnode.providers.k2k.scrape")
    for _ in range(3):
        usage = await usage_source.resource_usage()
        assert [p.name for p in usage.pods] == ["p0"]
        assert usage.complete is False
    assert sorted(set(kubelets.calls)) == [("n1", "/m/n1"), ("n2", "/metrics/resource")]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "lower node n2" in warnings[0].getMessage()
    kubelets.answers["n2"] = kubelet_text("p1", 2.0)
    usage = await usage_source.resource_usage()
    assert [p.name for p in usage.pods] == ["p0", "p1"]
    assert usage.complete is True
    assert any("can be read again" in r.getMessage() for r in caplog.records)


async def test_slow_kubelets_are_cut_off_and_the_round_is_bounded() -> None:
    kubelets = FakeKubelets()
    kubelets.answers = {"n1": kubelet_text("p0", 1.0), "n2": kubelet_text("p1", 1.0)}
    kubelets.delays = {"n2": 30.0}
    usage_source = scraper(kubelets, timeout=0.2, deadline=5.0)
    started = asyncio.get_running_loop().time()
    usage = await usage_source.resource_usage()
    assert asyncio.get_running_loop().time() - started < 2.0
    assert [p.name for p in usage.pods] == ["p0"]
    assert usage.complete is False
    # With a per-kubelet timeout longer than the round's deadline, the deadline wins.
    bounded = scraper(kubelets, timeout=30.0, deadline=0.2)
    usage = await bounded.resource_usage()
    assert [p.name for p in usage.pods] == ["p0"]


async def test_answers_are_cached_and_concurrent_callers_share_one_round() -> None:
    kubelets = FakeKubelets()
    kubelets.answers = {"n1": kubelet_text("p0", 1.0), "n2": kubelet_text("p1", 1.0)}
    kubelets.delays = {"n1": 0.1}
    usage_source = scraper(kubelets, ttl=60.0)
    answers = await asyncio.gather(*(usage_source.resource_usage() for _ in range(5)))
    assert all(a is answers[0] for a in answers)
    assert len(kubelets.calls) == 2  # one round: one fetch per node
    await usage_source.resource_usage()
    assert len(kubelets.calls) == 2


async def test_garbage_from_a_kubelet_is_a_failed_node() -> None:
    kubelets = FakeKubelets()
    kubelets.answers = {"n1": 'container_cpu_usage_seconds_total{pod="p0" 1\n'}
    usage = await scraper(kubelets, nodes=("n1",)).resource_usage()
    assert usage.pods == ()
    assert usage.complete is False


async def test_the_first_answer_already_has_cpu_rates() -> None:
    """metrics-server before 0.4 reads usageNanoCores from /stats/summary and drops a pod or
    node without it: a round whose answer lacks rates reads the kubelets a second time,
    `warmup` s later, and answers with rates; later rounds need one pass."""
    ticks = itertools.count()
    cpu = itertools.count(1)
    kubelets = FakeKubelets()
    kubelets.answers = {"n1": lambda: kubelet_text("p0", float(next(cpu)))}
    usage_source = scraper(
        kubelets, nodes=("n1",), ttl=0.0, warmup=0.05, clock=lambda: NOW + next(ticks)
    )
    usage = await usage_source.resource_usage()
    assert len(kubelets.calls) == 2
    [pod] = usage.pods
    assert pod.usage.cpu_nano_cores is not None
    assert all(c.usage.cpu_nano_cores is not None for c in pod.containers)
    assert usage.node is not None
    assert usage.node.cpu_nano_cores is not None
    summary = stats.summary(usage, node_name=NODE)
    assert "usageNanoCores" in summary["node"]["cpu"]
    assert "usageNanoCores" in summary["pods"][0]["cpu"]
    assert "usageNanoCores" in summary["pods"][0]["containers"][0]["cpu"]
    usage = await usage_source.resource_usage()
    assert len(kubelets.calls) == 3
    assert not resource_usage.lacks_rates(usage)


async def test_answers_are_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    parse = resource_usage.parse

    def spy(text: str) -> list[resource_usage.Sample]:
        threads.append(threading.get_ident())
        return parse(text)

    monkeypatch.setattr(resource_usage, "parse", spy)
    kubelets = FakeKubelets()
    kubelets.answers = {"n1": kubelet_text("p0", 1.0), "n2": kubelet_text("p1", 1.0)}
    usage = await scraper(kubelets).resource_usage()
    assert [p.name for p in usage.pods] == ["p0", "p1"]
    assert len(threads) == 2
    assert threading.get_ident() not in threads


# -- reaching the kubelets: the node proxy, and directly over TLS -----------------------


def padded(size: int) -> str:
    """Valid kubelet text for pod p0 on n1, padded with comment lines to `size` bytes."""
    text = kubelet_text("p0", 1.0)
    line = "# " + "x" * 1021 + "\n"
    text += line * ((size - len(text)) // len(line))
    return text + "#" * (size - len(text) - 1) + "\n"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_answer_over_4_mib_fails_its_node_and_is_logged_once(
    caplog: pytest.LogCaptureFixture, chunked: bool
) -> None:
    four_mib = 4 * 1024 * 1024  # a real node answers 100-300 KB
    body = padded(four_mib + 1)

    async def proxy(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(text=body)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        data = body.encode()
        for i in range(0, len(data), 256 * 1024):
            await response.write(data[i : i + 256 * 1024])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{node}/proxy/{path:.*}", proxy)
    caplog.set_level(logging.INFO, logger="vnode.providers.k2k.scrape")
    async with TestServer(app) as server:
        info = ConnectionInfo(server=str(server.make_url("")).rstrip("/"), ssl_context=None)
        async with ApiClient(info, name="lower") as lower:
            usage_source = scraper(ThroughApiserver(lower), nodes=("n1",), ttl=0.0)
            for _ in range(3):
                usage = await usage_source.resource_usage()
                assert usage.pods == ()
                assert usage.complete is False
            body = padded(four_mib)  # at the limit: read and parsed
            usage = await usage_source.resource_usage()
            assert [p.name for p in usage.pods] == ["p0"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"longer than {four_mib} bytes" in warnings[0]
    assert four_mib == BODY_LIMIT


async def test_an_endless_error_answer_of_the_node_proxy_is_read_bounded() -> None:
    written = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal written
        response = web.StreamResponse(status=500)
        response.content_type = "text/plain"
        await response.prepare(request)
        try:
            for _ in range(100_000):  # 6.5 GB: endless for this test, yet bounded
                await response.write(b"x" * 65536)
                written += 65536
        except (ConnectionError, RuntimeError):
            pass  # the client hung up: what the test wants
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{node}/proxy/{path:.*}", endless)
    async with TestServer(app) as server:
        info = ConnectionInfo(server=str(server.make_url("")).rstrip("/"), ssl_context=None)
        async with ApiClient(info, name="lower") as lower, asyncio.timeout(10):
            with pytest.raises(errors.ServerError) as failure:
                await ThroughApiserver(lower).fetch(
                    {"metadata": {"name": "n1"}}, "/metrics/resource", limit=1000
                )
    assert failure.value.code == 500
    assert len(str(failure.value)) < 4096
    assert written < 64 * 1024 * 1024


async def test_the_node_proxy_path_and_headers() -> None:
    seen: list[tuple[str, str | None]] = []

    async def proxy(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Accept")))
        return web.Response(text="body")

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{node}/proxy/{path:.*}", proxy)
    async with TestServer(app) as server:
        info = ConnectionInfo(server=str(server.make_url("")).rstrip("/"), ssl_context=None)
        async with ApiClient(info, name="lower") as lower:
            access = ThroughApiserver(lower)
            node = {"metadata": {"name": "n1"}}
            assert (
                await access.fetch(node, "/metrics/nodes/n1/metrics/resource", limit=100) == "body"
            )
            with pytest.raises(ValueError, match="longer than 2 bytes"):
                await access.fetch(node, "/metrics/resource", limit=2)
    assert seen[0] == (
        "/api/v1/nodes/n1/proxy/metrics/nodes/n1/metrics/resource",
        "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    )


async def test_kubelets_are_read_directly_with_the_clients_certificate(tmp_path: Path) -> None:
    kubelet_ca = CertificateAuthority.create(directory=tmp_path, name="kubelet-ca")
    client_ca = CertificateAuthority.create(directory=tmp_path, name="client-ca")
    serving = kubelet_ca.issue(
        directory=tmp_path, name="kubelet", common_name="n1", ip_addresses=("127.0.0.1",),
        server=True,
    )  # fmt: skip
    client = client_ca.issue(directory=tmp_path, name="vnode", common_name="vnode", client=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(serving.cert, serving.key)
    server_tls.load_verify_locations(client_ca.pair.cert)
    server_tls.verify_mode = ssl.CERT_REQUIRED  # a kubelet that wants the client certificate

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(text=f"served {request.path}")

    app = web.Application()
    app.router.add_get("/metrics/resource", metrics_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    node = {
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        },
    }

    def lower_info(ca: Path) -> ConnectionInfo:
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(client.cert, client.key)
        return ConnectionInfo(
            server="https://127.0.0.1:1",
            ssl_context=context,
            client_certificate=(str(client.cert), str(client.key)),
        )

    try:
        async with (
            ApiClient(lower_info(kubelet_ca.pair.cert), name="lower") as lower,
            ToKubelets(lower, verify=True) as kubelets,
        ):
            text = await kubelets.fetch(node, "/metrics/resource", limit=1000)
            assert text == "served /metrics/resource"
        # The kubelet's certificate is not signed by the lower cluster's CA: refused when
        # verifying, read when not (and the client certificate is still presented).
        async with ApiClient(lower_info(client_ca.pair.cert), name="lower") as lower:
            async with ToKubelets(lower, verify=True) as kubelets:
                with pytest.raises(Exception, match="certificate verify failed"):
                    await kubelets.fetch(node, "/metrics/resource", limit=1000)
            async with ToKubelets(lower, verify=False) as kubelets:
                text = await kubelets.fetch(node, "/metrics/resource", limit=1000)
                assert text == "served /metrics/resource"
                with pytest.raises(errors.NotFound):
                    await kubelets.fetch(node, "/nope", limit=1000)
    finally:
        await runner.cleanup()


async def test_direct_scrapes_send_the_kubelet_token_not_the_lower_credential(
    tmp_path: Path,
) -> None:
    """With --lower-kubelet-token-file, the kubelets get that file's token (read again when
    it changes), and neither the lower kubeconfig's token nor its client certificate.

    A FAKE kubelet on purpose: kwok's kubelet endpoint, which the e2e lower cluster has,
    accepts any caller and ignores credentials, so only a server that records what it
    receives can show which credential is sent (tests/e2e/test_kubelet_metrics.py runs a
    node with a token file against kwok)."""
    kubelet_ca = CertificateAuthority.create(directory=tmp_path, name="kubelet-ca")
    client_ca = CertificateAuthority.create(directory=tmp_path, name="client-ca")
    serving = kubelet_ca.issue(
        directory=tmp_path, name="kubelet", common_name="n1", ip_addresses=("127.0.0.1",),
        server=True,
    )  # fmt: skip
    client = client_ca.issue(directory=tmp_path, name="vnode", common_name="vnode", client=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(serving.cert, serving.key)
    server_tls.load_verify_locations(client_ca.pair.cert)
    server_tls.verify_mode = ssl.CERT_OPTIONAL  # records a client certificate if presented
    seen: list[tuple[str | None, bool]] = []

    async def metrics_handler(request: web.Request) -> web.Response:
        assert request.transport is not None
        peer = request.transport.get_extra_info("peercert")
        seen.append((request.headers.get("Authorization"), bool(peer)))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics/resource", metrics_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    node = {
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        },
    }
    context = ssl.create_default_context(cafile=str(kubelet_ca.pair.cert))
    context.load_cert_chain(client.cert, client.key)
    info = ConnectionInfo(
        server="https://127.0.0.1:1",
        ssl_context=context,
        client_certificate=(str(client.cert), str(client.key)),
        ca_file=str(kubelet_ca.pair.cert),
        _authorization=lambda: "Bearer main-credential",
    )
    token_path = tmp_path / "kubelet-token"
    token_path.write_text("scrape-token-1\n")
    try:
        async with ApiClient(info, name="lower") as lower:
            for verify in (True, False):
                token = BearerTokenFile(str(token_path))
                async with ToKubelets(lower, verify=verify, token=token) as kubelets:
                    assert await kubelets.fetch(node, "/metrics/resource", limit=100) == "ok"
                    (tmp_path / "next").write_text("scrape-token-2\n")
                    os.replace(tmp_path / "next", token_path)  # as projected tokens rotate
                    assert await kubelets.fetch(node, "/metrics/resource", limit=100) == "ok"
                token_path.write_text("scrape-token-1\n")
            # Without a token file: the lower client's own credentials, both of them.
            async with ToKubelets(lower, verify=True) as kubelets:
                await kubelets.fetch(node, "/metrics/resource", limit=100)
    finally:
        await runner.cleanup()
    assert seen == [
        ("Bearer scrape-token-1", False),
        ("Bearer scrape-token-2", False),
        ("Bearer scrape-token-1", False),
        ("Bearer scrape-token-2", False),
        ("Bearer main-credential", True),
    ]
