"""Reading the lower kubelets' resource metrics for one virtual node (the I/O of `metrics`).

Each round fetches `/metrics/resource` (or the path a node's
`metrics.k8s.io/resource-metrics-path` annotation names) from every lower node that runs
one of this virtual node's pods, concurrently and bounded in time, either through the
lower apiserver's node proxy (`ThroughApiserver`: needs `get nodes/proxy`, which also
allows exec into any container of the node, and no network path to the lower nodes) or
straight from the kubelets (`ToKubelets`, as metrics-server does: no load on the lower
apiserver, but the nodes must be reachable; best with a credential of its own,
`BearerTokenFile`, allowed only `get nodes/metrics` and `nodes/stats`). A round's answer is
cached for `ttl` seconds, so scrapes of the node do not fan out per request. A lower node
that cannot be read, or answers more than BODY_LIMIT bytes, leaves its pods out of that
round (and marks the answer incomplete); it is logged when it starts failing and when it
recovers, not per round.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp

from tensile.contracts.objects import Obj, name_of
from tensile.kube import errors
from tensile.kube.client import ApiClient, read_bounded
from tensile.kube.config import ConnectionInfo
from tensile.kube.store import Store
from vnode.provider import NodeUsage, PodUsage
from vnode.providers.k2k import resource_usage
from vnode.providers.k2k.resource_usage import LowerKey, OwnedPod

logger = logging.getLogger(__name__)


BODY_LIMIT = 4 * 1024 * 1024
"""Bytes read at most from one kubelet's answer; a longer one fails that node's scrape. A
real node's answer is 100-300 KB (110 pods make about 100 KiB), so 4 MiB leaves room more
than tenfold, and parses in ~0.7 s (parsing runs ~0.16-0.2 s/MB)."""
ERROR_BODY_LIMIT = 4096
"""Bytes of a kubelet's error answer read at most (for the message)."""
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
"""The text format first (never OpenMetrics, which `resource_usage.parse` does not read); the
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
    """Kubelets read through the lower apiserver: GET /api/v1/nodes/<node>/proxy<path>.

    Needs `get` on nodes/proxy, which is not read-only (WebSocket exec and attach arrive
    as GETs): see manifests/vnode/lower-rbac-metrics-proxy.yaml."""

    def __init__(self, lower: ApiClient) -> None:
        self._lower = lower

    async def fetch(self, node: Obj, path: str, *, limit: int) -> str:
        name = name_of(node)
        # Error answers are read bounded by the client (ApiClient.stream).
        async with self._lower.stream(
            f"/api/v1/nodes/{name}/proxy{path}", accept=ACCEPT
        ) as response:
            return await _read(response, limit=limit)


class BearerTokenFile:
    """A bearer token kept in a file, as a projected ServiceAccount token is (the kubelet
    rewrites it before it expires): read again whenever the file changes.

    For `ToKubelets`: a credential allowed only `get nodes/metrics` and `nodes/stats` (see
    manifests/vnode/lower-rbac-kubelet-metrics.yaml), so that what the lower nodes are sent
    cannot read Secrets, create pods or exec.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int, int] | None = None
        self._header = ""

    def authorization(self) -> str:
        """Return the Authorization header value ("Bearer <token>").

        Stats the file at each call and reads it again when its inode, device, size or
        modification time changed. Raises OSError when the file cannot be read, ValueError
        when it holds no token (empty, or more than one printable word).
        """
        stat = os.stat(self.path)
        seen = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)
        if seen != self._seen:
            with open(self.path, encoding="utf-8") as file:
                self._header = bearer(file.read(), source=self.path)
            self._seen = seen
        return self._header


def bearer(text: str, *, source: str) -> str:
    """Return the Authorization header value of a token file's `text` ("Bearer <token>",
    surrounding whitespace dropped). Raises ValueError, naming `source`, when it is empty or
    not one printable word (it would not be a valid header value)."""
    token = text.strip()
    if not token or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError(f"{source} does not hold a bearer token")
    return f"Bearer {token}"


class ToKubelets:
    """Kubelets read directly at the address and port each lower node publishes.

    The credential is `token`'s when given (and the lower client certificate is then not
    presented either), else the lower client's own: the latter can read Secrets and create
    pods, and goes to addresses the lower nodes report about themselves (see
    `access_warnings`). Serving certificates are verified against the lower cluster's CA,
    or not at all with `verify=False` (metrics-server's --kubelet-insecure-tls). Use as
    `async with ToKubelets(...) as kubelets:` (it owns a connection pool).
    """

    def __init__(
        self,
        lower: ApiClient,
        *,
        verify: bool,
        token: BearerTokenFile | None = None,
        connections: int = 16,
    ) -> None:
        self._lower = lower
        self._token = token
        self._ssl = kubelet_tls(lower.info, verify=verify, client_certificate=token is None)
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
        url = resource_usage.kubelet_url(node, path)
        async with self._session.get(url, headers=self._headers()) as response:
            if response.status != 200:
                body = await read_bounded(response, limit=ERROR_BODY_LIMIT)
                raise errors.from_response(code=response.status, body=body)
            return await _read(response, limit=limit)

    def _headers(self) -> Mapping[str, str]:
        if self._token is None:
            return self._lower.headers({"Accept": ACCEPT})
        return {"Accept": ACCEPT, "Authorization": self._token.authorization()}


def access_warnings(*, direct: bool, insecure_tls: bool, token_file: bool) -> list[tuple[int, str]]:
    """Return the (logging level, message) to log at start about the credential sent to
    the lower kubelets; none for the node proxy (it sends nothing to the nodes)."""
    if not direct:
        return []
    if token_file and insecure_tls:
        return [
            (
                logging.WARNING,
                "--lower-kubelet-insecure-tls: the --lower-kubelet-token-file token goes to "
                "whatever answers at each lower node's reported address, unverified; keep "
                "that token limited to get nodes/metrics and nodes/stats",
            )
        ]
    if token_file:
        return []
    main = (
        "--lower-kubelet-access=direct without --lower-kubelet-token-file: the lower "
        "cluster's main credential (it can read Secrets and create pods) is sent to the "
        "address each lower node reports about itself; give the scrapes a credential of "
        "their own (manifests/vnode/lower-rbac-kubelet-metrics.yaml)"
    )
    if insecure_tls:
        return [
            (
                logging.ERROR,
                f"INSECURE: {main}, and with --lower-kubelet-insecure-tls nothing verifies "
                "who receives it: a compromised lower node can report another address and "
                "capture the credential",
            )
        ]
    return [(logging.WARNING, main)]


def kubelet_tls(
    info: ConnectionInfo, *, verify: bool, client_certificate: bool = True
) -> ssl.SSLContext:
    """Return the TLS context toward kubelets.

    Verifying: against the lower cluster's CA (the system's CAs for a plain-HTTP lower
    apiserver); with `client_certificate`, the lower client's own context (its CA, its
    client certificate). Not verifying: a context that verifies nothing, presenting the
    client certificate, if any, only with `client_certificate`. Raises OSError /
    ssl.SSLError when the CA or certificate files cannot be loaded.
    """
    if verify:
        if client_certificate:
            return info.ssl_context or ssl.create_default_context()
        return ssl.create_default_context(cafile=info.ca_file)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if client_certificate and info.client_certificate is not None:
        cert, key = info.client_certificate
        context.load_cert_chain(cert, key)
    return context


async def _read(response: aiohttp.ClientResponse, *, limit: int) -> str:
    """Return the body as text; raises ValueError when it is longer than `limit` bytes
    (told by Content-Length before reading, else once read that far) or not UTF-8."""
    if response.content_length is not None and response.content_length > limit:
        raise ValueError(f"answer longer than {limit} bytes ({response.content_length})")
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
        made: Callable[[Mapping[str, Any]], bool],
        ttl: float = 10.0,
        timeout: float = 5.0,
        deadline: float = 8.0,
        warmup: float = 1.0,
        parallel: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`pods`/`nodes`: the provider's caches of lower pods (slim) and nodes. `ttl`:
        seconds an answer is reused; `timeout`: seconds one kubelet may take; `deadline`:
        seconds a whole round may take (nodes still pending then count as failed);
        `warmup`: seconds between the two passes of a round whose answer lacks CPU rates
        (0: one pass only, see `resource_usage`); `parallel`: kubelets read at once;
        `clock`: unix seconds (tests)."""
        self._access = access
        self._pods = pods
        self._nodes = nodes
        self._made = made
        self._ttl = ttl
        self._timeout = timeout
        self._deadline = deadline
        self._warmup = warmup
        self._parallel = asyncio.Semaphore(parallel)
        self._clock = clock
        self._lock = asyncio.Lock()
        self._answer: NodeUsage | None = None
        self._answered_at = 0.0
        self._answered_for: frozenset[tuple[str, float | None]] = frozenset()
        """The placed pods (and start times) the cached answer was measured for: a pod that
        started since is in no cached answer, so its arrival ends the cache's life early (a
        kubelet lists a pod as soon as it runs)."""
        self._history = resource_usage.History()
        self._failing: set[str] = set()

    async def resource_usage(self) -> NodeUsage:
        """Return this round's usage: cached for `ttl` s, or until a pod of the node is placed,
        started or gone; one round at a time (callers that arrive during a round get its
        answer). Takes at most `deadline` s (plus queueing).

        A CPU rate (usageNanoCores) needs two measurements. When this round's answer lacks
        one (the first round, a pod seen for the first time, a container that restarted),
        the lower kubelets are read a second time `warmup` s later and that second pass is
        the answer, if the deadline leaves time for it: so /stats/summary has the rates
        that metrics-server before 0.4 requires (it drops a pod or node without
        usageNanoCores) from the first scrape on. Rates are never invented: where the
        second pass has no newer sample either (a kubelet serving cached values), the
        rate stays absent, as in the kubelet's own summary.
        """
        async with self._lock:
            placed = _placement(self._pods, made=self._made)
            if (
                self._answer is not None
                and time.monotonic() - self._answered_at < self._ttl
                and placed == self._answered_for
            ):
                return self._answer
            loop = asyncio.get_running_loop()
            deadline_at = loop.time() + self._deadline
            answer = await self._round(deadline_at=deadline_at)
            time_left = deadline_at - loop.time()
            if (
                self._warmup > 0
                and (resource_usage.lacks_rates(answer) or _unmeasured(placed, answer))
                and time_left >= self._warmup + self._timeout
            ):
                await asyncio.sleep(self._warmup)
                answer = await self._round(deadline_at=deadline_at)
            self._answer = answer
            # An answer without some running pod (its kubelet has no usage for it yet) is
            # kept only briefly: the next scrape should find it.
            ttl = min(self._ttl, self._warmup) if _unmeasured(placed, answer) else self._ttl
            self._answered_at = time.monotonic() - (self._ttl - ttl)
            self._answered_for = placed
            return self._answer

    async def _round(self, *, deadline_at: float) -> NodeUsage:
        owned = resource_usage.owned_pods(self._pods, made=self._made)
        nodes = sorted({p.node for p in owned.values()})
        self._failing &= set(nodes)
        results: dict[str, list[PodUsage]] = {}
        try:
            async with asyncio.timeout_at(deadline_at), asyncio.TaskGroup() as group:
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
        usage, self._history = resource_usage.snapshot(
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
        owned: dict[LowerKey, OwnedPod],
        results: dict[str, list[PodUsage]],
    ) -> None:
        node = self._nodes.get(name)
        if node is None:
            self._failed(name, "the node is not in the lower cluster's node cache")
            return
        path = resource_usage.metrics_path(node)
        async with self._parallel:
            fetched_ms = round(self._clock() * 1000)
            try:
                async with asyncio.timeout(self._timeout):
                    text = await self._access.fetch(node, path, limit=BODY_LIMIT)
                # Parsed in a worker thread, whatever the size: parsing runs ~0.16-0.2 s/MB
                # here (15 ms for 100 pods, 35 ms for 250, 0.6 s at 3.6 MB), all of it a
                # stall of every other request of the node if done on the event loop,
                # while a hand-off to a thread costs ~0.1 ms; the GIL still lets the loop
                # run every switch interval (measured: < 10 ms lag while parsing 0.9 MB).
                # A thread cannot be cancelled: a round that times out leaves it to
                # finish (BODY_LIMIT bounds it) and drops its result. parse and measure
                # are pure and `owned` is not changed once built, so this is thread-safe.
                measured = await asyncio.to_thread(
                    _measure, text, node=name, owned=owned, fetched_ms=fetched_ms
                )
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
        results[name] = measured

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


def _measure(
    text: str,
    *,
    node: str,
    owned: Mapping[LowerKey, OwnedPod],
    fetched_ms: int,
) -> list[PodUsage]:
    """Parse one kubelet's answer and measure this node's pods in it (runs in a thread).
    Raises ValueError when `text` is not Prometheus text."""
    return resource_usage.measure(
        resource_usage.parse(text), node=node, pods=owned, fetched_ms=fetched_ms
    )


def _placement(
    pods: Store, *, made: Callable[[Mapping[str, Any]], bool]
) -> frozenset[tuple[str, float | None]]:
    # What decides whether a cached answer still covers the node's pods: (upper UID, start).
    owned = resource_usage.owned_pods(pods, made=made)
    return frozenset((pod.uid, pod.start_time) for pod in owned.values())


def _unmeasured(placed: frozenset[tuple[str, float | None]], answer: NodeUsage) -> bool:
    # A started pod of the node that the answer does not report.
    reported = {p.uid for p in answer.pods}
    return any(start is not None and uid not in reported for uid, start in placed)
