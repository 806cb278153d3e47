"""Reading the lower kubelets' resource metrics for one virtual node (the I/O of `metrics`).

Each round fetches `/metrics/resource` (or the path a node's
`metrics.k8s.io/resource-metrics-path` annotation names) from every lower node that runs
one of this virtual node's pods, concurrently and bounded in time, either through the
lower apiserver's node proxy (`ThroughApiserver`, the default: needs only `nodes/proxy`
and no network path to the lower nodes) or straight from the kubelets (`ToKubelets`, as
metrics-server does: no load on the lower apiserver, but the nodes must be reachable). A
round's answer is cached for `ttl` seconds, so scrapes of the node do not fan out per
request. A lower node that cannot be read leaves its pods out of that round (and marks the
answer incomplete); it is logged when it starts failing and when it recovers, not per round.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from vnode.kube import errors
from vnode.kube.client import ApiClient
from vnode.kube.config import ConnectionInfo
from vnode.kube.store import Store
from vnode.provider import NodeUsage, PodUsage
from vnode.providers.k2k import metrics

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

BODY_LIMIT = 16 * 1024 * 1024
"""Bytes read at most from one kubelet's answer (110 pods make about 100 KiB)."""
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
"""The text format first (never OpenMetrics, which `metrics.parse` does not read); the
`*/*` because some servers (go-restful routes without `Produces`, as kwok's) refuse
requests that accept only text/plain."""


class KubeletAccess(Protocol):
    """How the lower kubelets are reached."""

    async def fetch(self, node: Obj, path: str, *, limit: int) -> str:
        """Return the text the kubelet of `node` serves at `path` (at most `limit` bytes).

        Raises errors.ApiError / errors.ApiUnavailable / OSError / aiohttp.ClientError /
        ValueError (too long, not text) when it cannot be read.
        """


class ThroughApiserver:
    """Kubelets read through the lower apiserver: GET /api/v1/nodes/<node>/proxy<path>."""

    def __init__(self, lower: ApiClient) -> None:
        self._lower = lower

    async def fetch(self, node: Obj, path: str, *, limit: int) -> str:
        name = node["metadata"]["name"]
        async with self._lower.stream(
            f"/api/v1/nodes/{name}/proxy{path}", accept=ACCEPT
        ) as response:
            return await _read(response, limit=limit)


class ToKubelets:
    """Kubelets read directly at their address and port, with the lower client's credentials.

    Their serving certificates are verified against the lower cluster's CA, or not at all
    with `verify=False` (metrics-server's --kubelet-insecure-tls). Use as
    `async with ToKubelets(...) as kubelets:` (it owns a connection pool).
    """

    def __init__(self, lower: ApiClient, *, verify: bool, connections: int = 16) -> None:
        self._lower = lower
        self._ssl = kubelet_tls(lower.info, verify=verify)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ToKubelets:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._connections, ssl=self._ssl),
            timeout=aiohttp.ClientTimeout(total=None, connect=5),
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None

    async def fetch(self, node: Obj, path: str, *, limit: int) -> str:
        if self._session is None:
            raise errors.ApiUnavailable("the kubelet client is not open (use `async with`)")
        url = metrics.kubelet_url(node, path)
        headers = self._lower.headers({"Accept": ACCEPT})
        async with self._session.get(url, headers=headers) as response:
            if response.status != 200:
                body = await response.content.read(512)
                raise errors.from_response(code=response.status, body=body)
            return await _read(response, limit=limit)


def kubelet_tls(info: ConnectionInfo, *, verify: bool) -> ssl.SSLContext:
    """Return the TLS context toward kubelets: when verifying, the lower client's own (its
    CA, its client certificate), or the system's CAs for a plain-HTTP lower apiserver; else
    one that verifies nothing and presents the client certificate, if any."""
    if verify:
        return info.ssl_context or ssl.create_default_context()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if info.client_certificate is not None:
        cert, key = info.client_certificate
        context.load_cert_chain(cert, key)
    return context


async def _read(response: aiohttp.ClientResponse, *, limit: int) -> str:
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise ValueError(f"answer longer than {limit} bytes")
    return body.decode("utf-8")


class ResourceScraper:
    """The usage of one virtual node's pods, read from the lower kubelets (`MetricsProvider`)."""

    def __init__(
        self,
        *,
        access: KubeletAccess,
        pods: Store,
        nodes: Store,
        node_name: str,
        ttl: float = 10.0,
        timeout: float = 5.0,
        deadline: float = 8.0,
        parallel: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`pods`/`nodes`: the provider's caches of lower pods (slim) and nodes. `ttl`:
        seconds an answer is reused; `timeout`: seconds one kubelet may take; `deadline`:
        seconds a whole round may take (nodes still pending then count as failed);
        `parallel`: kubelets read at once; `clock`: unix seconds (tests)."""
        self._access = access
        self._pods = pods
        self._nodes = nodes
        self._node_name = node_name
        self._ttl = ttl
        self._timeout = timeout
        self._deadline = deadline
        self._parallel = asyncio.Semaphore(parallel)
        self._clock = clock
        self._lock = asyncio.Lock()
        self._answer: NodeUsage | None = None
        self._answered_at = 0.0
        self._history = metrics.History()
        self._failing: set[str] = set()

    async def resource_usage(self) -> NodeUsage:
        """Return this round's usage: cached for `ttl` s; one round at a time (callers that
        arrive during a round get its answer). Takes at most `deadline` s (plus queueing)."""
        async with self._lock:
            if self._answer is not None and time.monotonic() - self._answered_at < self._ttl:
                return self._answer
            self._answer = await self._round()
            self._answered_at = time.monotonic()
            return self._answer

    async def _round(self) -> NodeUsage:
        owned = metrics.owned_pods(self._pods, node_name=self._node_name)
        nodes = sorted({p.node for p in owned.values()})
        self._failing &= set(nodes)
        results: dict[str, list[PodUsage]] = {}
        try:
            async with asyncio.timeout(self._deadline), asyncio.TaskGroup() as group:
                for name in nodes:
                    group.create_task(
                        self._scrape(name, owned=owned, results=results),
                        name=f"k2k-metrics-{name}",
                    )
        except TimeoutError:
            for name in nodes:
                if name not in results:
                    self._failed(name, f"no answer within {self._deadline:.0f}s")
        measured = [p for name in nodes for p in results.get(name, [])]
        usage, self._history = metrics.snapshot(
            measured,
            history=self._history,
            alive={p.uid for p in owned.values()},
            complete_scrape=len(results) == len(nodes),
            now_ms=round(self._clock() * 1000),
        )
        return usage

    async def _scrape(
        self,
        name: str,
        *,
        owned: dict[metrics.LowerKey, metrics.OwnedPod],
        results: dict[str, list[PodUsage]],
    ) -> None:
        node = self._nodes.get(name)
        if node is None:
            self._failed(name, "the node is not in the lower cluster's node cache")
            return
        path = metrics.metrics_path(node)
        async with self._parallel:
            fetched_ms = round(self._clock() * 1000)
            try:
                async with asyncio.timeout(self._timeout):
                    text = await self._access.fetch(node, path, limit=BODY_LIMIT)
                samples = metrics.parse(text)
            except TimeoutError:
                self._failed(name, f"no answer from {path} within {self._timeout:.0f}s")
                return
            except (
                errors.ApiError,
                errors.ApiUnavailable,
                aiohttp.ClientError,
                OSError,
                ValueError,
            ) as exc:
                self._failed(name, f"{path}: {exc}")
                return
        if name in self._failing:
            self._failing.discard(name)
            logger.info("resource metrics of lower node %s can be read again", name)
        results[name] = metrics.measure(samples, node=name, pods=owned, fetched_ms=fetched_ms)

    def _failed(self, name: str, why: str) -> None:
        if name in self._failing:
            logger.debug("resource metrics of lower node %s: still failing: %s", name, why)
            return
        self._failing.add(name)
        logger.warning(
            "cannot read the resource metrics of lower node %s (its pods are left out of "
            "/metrics/resource and /stats/summary until it answers): %s",
            name,
            why,
        )
