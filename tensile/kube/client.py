"""One asyncio HTTP client per cluster: authenticated JSON requests, streams, rate limits.

Requests go out through one aiohttp session with the cluster's TLS settings and a
client-side token bucket (client-go's QPS/burst). Answers >= 400 become `errors.ApiError`;
unreachable servers `errors.ApiUnavailable`. Throttling (429) is retried after its
Retry-After for every verb; connection failures and 5xx only for reads.

Fencing: `ApiClient.fenced(gate)` is the same client (connections, rate budget, metrics)
whose writes (POST, PUT, PATCH, DELETE) are sent only while `gate.may_write()` says so,
checked right before each is sent, after any wait for the rate limiter; a refused write
raises `errors.Fenced` and sends nothing. Reads, watches, logs and streams always go. A
leader-election elector is such a gate (`tensile.kube.leaderelection`): the components that
act only while leading get fenced clients, so a deposed or partitioned process writes
nothing once its Lease is past the renew deadline, whatever its tasks still try.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from tensile.contracts.objects import Obj, meta_of
from tensile.kube import codec, errors, metadata_protobuf, metrics
from tensile.kube.backoff import ExponentialBackoff, TokenBucket, jittered
from tensile.kube.config import ConnectionInfo

logger = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
"""Accept header of a GET answered with the object's metadata only (PartialObjectMetadata,
as client-go's metadata client asks; plain JSON from a server that cannot)."""
METADATA_LIST = (
    f"{metadata_protobuf.PROTOBUF};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, "
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
)
"""Accept header of a list answered with its items' metadata only: in Kubernetes' protobuf
encoding where the server has it (decoded to the few fields the cache audit compares,
`metadata_protobuf`), else in JSON (custom resources, older servers)."""

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The verbs a fenced client sends only while its gate allows (every other verb reads)."""
_READ_RETRIES = 3
_THROTTLE_RETRIES = 5
_RETRY_BACKOFF = ExponentialBackoff(base=0.2, cap=5.0)


class WriteGate(Protocol):
    """Whether this process may write now: the check of a fenced client (`ApiClient.fenced`)
    right before each write it sends."""

    def may_write(self) -> bool:
        """Tell whether a write may be sent now (called right before each one)."""

    def refusal(self) -> str:
        """Say why writes are refused now (the message of `errors.Fenced`)."""


class ApiClient:
    """Requests to one kube-apiserver. Use as `async with ApiClient(...) as client:`."""

    def __init__(
        self,
        info: ConnectionInfo,
        *,
        name: str,
        qps: float = 50.0,
        burst: int = 100,
        user_agent: str = "tensile",
        timeout: float = 30.0,
        connections: int = 16,
    ) -> None:
        """`name` labels logs and metrics ("upper", "lower"); `qps`/`burst` as in client-go
        (qps <= 0 disables client-side limiting); `timeout` (seconds) bounds non-streaming
        requests."""
        self.info = info
        self.name = name
        self.timeout = timeout
        self._limiter = TokenBucket(rate=qps, burst=max(1, burst)) if qps > 0 else None
        self._user_agent = user_agent
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._streams: aiohttp.ClientSession | None = None
        self._root: ApiClient = self
        """The client whose sessions this one uses: itself, or the one it is a fenced view
        of (`fenced`)."""
        self._gate: WriteGate | None = None
        self._refusing = False
        """Whether the last write this view tried was refused (its first refusal is logged)."""
        # Labelled metric children by (verb, code) and verb, looked up once each: a lookup
        # costs several microseconds, on every request.
        self._counters: dict[tuple[str, int], Any] = {}
        self._histograms: dict[str, Any] = {}

    def _count(self, verb: str, code: int) -> None:
        counter = self._counters.get((verb, code))
        if counter is None:
            counter = metrics.API_REQUESTS.labels(self.name, verb, str(code))
            self._counters[(verb, code)] = counter
        counter.inc()

    def _latency(self, verb: str) -> Any:
        histogram = self._histograms.get(verb)
        if histogram is None:
            histogram = self._histograms[verb] = metrics.API_LATENCY.labels(self.name, verb)
        return histogram

    def sibling(
        self, *, name: str, qps: float, burst: int, timeout: float, connections: int
    ) -> ApiClient:
        """Return a new client (not yet open) to the same cluster with the same credentials
        and user agent, but its own connections and rate budget: traffic that must never
        wait behind another kind gets one (the kubelet's separate heartbeat and event
        clients)."""
        return ApiClient(
            self.info,
            name=name,
            qps=qps,
            burst=burst,
            user_agent=self._user_agent,
            timeout=timeout,
            connections=connections,
        )

    def fenced(self, gate: WriteGate | None) -> ApiClient:
        """Return this client with its writes (POST, PUT, PATCH, DELETE) fenced by `gate`:
        each is sent only if `gate.may_write()` right before it goes out, and otherwise
        raises `errors.Fenced` (counted in `tensile_api_fenced_writes_total`) having sent
        nothing; reads, watches and streams are not gated. It is a view: the same
        connections, rate budget and metrics as this client, opened and closed with it
        (opening or closing the view opens or closes this client). `gate` None returns
        this client itself. `sibling` of a view is not fenced."""
        if gate is None:
            return self
        view = copy.copy(self)
        view._gate = gate
        view._refusing = False
        return view

    @property
    def unfenced(self) -> ApiClient:
        """The client this one is a fenced view of (`fenced`); itself when it is none. Two
        views of one client are one cluster connection: caches key on this."""
        return self._root

    def admit(self, method: str, path: str) -> None:
        """Raise `errors.Fenced` when `method` writes and this client's gate refuses writes
        now (see `fenced`); return otherwise. Called right before a request is sent."""
        gate = self._gate
        if gate is None or method not in WRITES:
            return
        if gate.may_write():
            self._refusing = False
            return
        metrics.FENCED_WRITES.labels(self.name, method).inc()
        reason = gate.refusal()
        if not self._refusing:
            # Once per run of refusals: a deposed leader's workers may try many at once.
            logger.warning(
                "%s cluster: refusing to send %s %s: %s", self.name, method, path, reason
            )
        self._refusing = True
        raise errors.Fenced(f"{method} {path} to the {self.name} cluster not sent: {reason}")

    async def __aenter__(self) -> ApiClient:
        if self._root is not self:
            await self._root.__aenter__()
            return self
        # Requests share a small pool of keep-alive connections: each TLS connection holds
        # a 256 KiB read buffer, and past a dozen or so the apiserver gains nothing from
        # more. Streams (watches, logs) live long, so they get a pool of their own and never
        # starve requests.
        self._session = self._new_session(limit=self._connections)
        self._streams = self._new_session(limit=0, raise_for_status=_refused_upgrade)
        return self

    def _new_session(
        self,
        *,
        limit: int,
        raise_for_status: bool | Callable[[aiohttp.ClientResponse], Awaitable[None]] = False,
    ) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, ssl=self.info.ssl_context or False),
            headers={"User-Agent": self._user_agent},
            timeout=aiohttp.ClientTimeout(total=None, connect=10),
            raise_for_status=raise_for_status,
            # No cookies, as client-go (Go's http.Client keeps none): filtering a cookie
            # jar on every request is a cost for nothing.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session and its connections (a fenced view's: those of the client it
        was made from)."""
        if self._root is not self:
            await self._root.close()
            return
        for session in (self._session, self._streams):
            if session is not None:
                await session.close()
        self._session = self._streams = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session (for WebSocket connections made by callers)."""
        session = self._root._session
        if session is None:
            raise RuntimeError(f"{self.name} client is not open (use `async with`)")
        return session

    @property
    def _stream_session(self) -> aiohttp.ClientSession:
        streams = self._root._streams
        if streams is None:
            raise RuntimeError(f"{self.name} client is not open (use `async with`)")
        return streams

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Return the headers of a request: authorization plus `extra`."""
        headers = dict(extra or {})
        auth = self.info.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def url(self, path: str) -> str:
        """Return the absolute URL of an API path."""
        return self.info.server + path

    def _unreachable(self, method: str, path: str, exc: BaseException) -> str:
        detail = str(exc) or type(exc).__name__
        where = f"{self.info.server} ({method} {path})"
        return f"cannot reach the {self.name} cluster at {where}: {detail}"

    async def _throttle(self) -> None:
        if self._limiter is not None:
            wait = self._limiter.reserve(time.monotonic())
            if wait > 0:
                try:
                    await asyncio.sleep(wait)
                except asyncio.CancelledError:
                    self._limiter.give_back()
                    raise

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
        retry_throttled: bool = True,
        accept: str = JSON,
        decode: bool = True,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON answer (`{}` when empty or not JSON).

        Raises errors.ApiError subclasses for HTTP errors and errors.ApiUnavailable when the
        server cannot be reached. `timeout` (seconds) defaults to the client's.
        `retry_throttled=False` raises a 429 at once: for answers whose 429 is a verdict
        the caller reports and schedules itself (an eviction a disruption budget refused).
        `accept` is the Accept header (e.g. `METADATA_LIST`: metadata-only lists).
        `decode=False` returns `{}` for a success without decoding its body: for writes whose
        answer the caller does not read (a status patch is answered with the whole pod, and
        decoding it was a tenth of the node's JSON work per pod); errors are decoded as ever.
        """
        read = method == "GET"
        failures = 0
        throttled = 0
        while True:
            try:
                return await self._once(
                    method,
                    path,
                    params=params,
                    body=body,
                    content_type=content_type,
                    timeout=timeout,
                    accept=accept,
                    decode=decode,
                )
            except errors.TooManyRequests as exc:
                throttled += 1
                if throttled > _THROTTLE_RETRIES or not retry_throttled:
                    raise
                delay = exc.retry_after if exc.retry_after is not None else 1.0
                await asyncio.sleep(min(delay, 10.0))
            except (errors.ApiUnavailable, errors.ServerError):
                failures += 1
                if not read or failures >= _READ_RETRIES:
                    raise
                await asyncio.sleep(jittered(_RETRY_BACKOFF.delay(failures - 1)))

    async def pages(
        self,
        path: str,
        *,
        limit: int,
        params: Mapping[str, str] | None = None,
        accept: str = JSON,
        restarts: int = 3,
    ) -> AsyncIterator[Page]:
        """List `path` in pages of at most `limit` items (limit/continue) and yield each
        page as it arrives; the last has `last` set and the list's resourceVersion.

        `params`: the list's other parameters (labelSelector, fieldSelector); `accept` as
        `request`'s (`METADATA_LIST` for metadata only).

        An expired continue token: the apiserver keeps a list's snapshot only as long as
        etcd keeps its revision (compaction, every five minutes by default) and then answers
        the next page with 410 Gone (reason Expired) and a token that would go on from the
        current state instead ("API concepts: retrieving large results sets in chunks").
        Pages from two states make an inconsistent list, whose resourceVersion a watch
        cannot resume from, and whose missing items would read as deletions. So the list
        starts over from its first page, as client-go's pager does (it lists again in
        full, unpaged; here the pages keep their bound on memory): the next page comes with
        `restarted` set, telling the caller to forget what the abandoned list's pages
        named. After `restarts` such restarts in a row (a list slower than compaction),
        the 410 is raised.

        Raises errors.Gone for a 410 on the first page (a resourceVersion or a proxy the
        caller must back off from) or after `restarts` restarts; other errors as `request`.
        """
        query = {**(params or {}), "limit": str(limit)}
        restarted = False
        left = restarts
        while True:
            try:
                answer = await self.request("GET", path, params=query, accept=accept)
            except errors.Gone:
                if "continue" not in query or left <= 0:
                    raise
                left -= 1
                logger.info(
                    "%s: the continue token of a list of %s expired; listing again", self.name, path
                )
                del query["continue"]
                restarted = True
                continue
            meta = meta_of(answer)
            token = meta.get("continue")
            items = answer.get("items")
            page = Page(
                items=items if isinstance(items, list) else [],
                last=not token,
                resource_version=str(meta.get("resourceVersion") or ""),
                restarted=restarted,
            )
            del answer, items
            restarted = False
            yield page
            if page.last:
                return
            query["continue"] = str(token)

    async def _once(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
        accept: str = JSON,
        decode: bool = True,
    ) -> dict[str, Any]:
        await self._throttle()
        # The gate is asked after any wait for a rate slot, right before the request goes.
        self.admit(method, path)
        data = None if body is None else codec.dumps(body)
        headers = self.headers({"Accept": accept})
        if data is not None:
            headers["Content-Type"] = content_type
        started = time.monotonic()
        code = 0
        try:
            async with self.session.request(
                method,
                self.url(path),
                params=params,
                data=data,
                headers=headers,
                proxy=self.info.proxy,
                server_hostname=self.info.tls_server_name,
                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
            ) as response:
                code = response.status
                payload = await response.read()
                json_body = response.content_type in ("application/json", "")
                protobuf_body = response.content_type == metadata_protobuf.PROTOBUF
                if code >= 400:
                    if protobuf_body:  # a Status, in the encoding the request preferred
                        payload = _status_as_json(payload)
                    raise errors.from_response(
                        code=code, body=payload, retry_after=response.headers.get("Retry-After")
                    )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise errors.ApiUnavailable(self._unreachable(method, path, exc)) from exc
        finally:
            self._count(method, code)
            self._latency(method).observe(time.monotonic() - started)
        if payload and protobuf_body:
            # Only a request whose Accept named it (`METADATA_LIST`) is answered so.
            return metadata_protobuf.decode(payload)
        if not payload or not json_body or not decode:
            return {}  # e.g. /readyz answers "ok": success is all a caller learns
        result = codec.loads(payload)
        return result if isinstance(result, dict) else {"items": result}

    async def websocket(
        self, path: str, *, params: Sequence[tuple[str, str]], protocols: Sequence[str]
    ) -> aiohttp.ClientWebSocketResponse:
        """Open a WebSocket to `path` offering `protocols` (exec, attach, port-forward).

        Raises errors.ApiError subclasses when the server refuses the upgrade (with its
        HTTP status and the message of the Status it answered with), errors.ApiUnavailable
        when it cannot be reached. Close it when done.
        """
        streams = self._stream_session
        await self._throttle()
        try:
            return await streams.ws_connect(
                self.url(path),
                params=list(params),
                protocols=tuple(protocols),
                headers=self.headers(),
                proxy=self.info.proxy,
                server_hostname=self.info.tls_server_name,
                max_msg_size=16 * 1024 * 1024,
                autoping=True,
                heartbeat=30.0,  # a silently dead path is noticed, not waited on forever
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise errors.from_response(code=exc.status, body=exc.message) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise errors.ApiUnavailable(self._unreachable("GET", path, exc)) from exc

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        accept: str = JSON,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET a streaming answer (watch, log follow) and yield the open response.

        `read_timeout` (seconds) fails the read when no bytes arrive for that long. Raises
        like `request` when the answer is an error or the server cannot be reached.
        """
        await self._throttle()
        code = 0
        try:
            async with self._stream_session.get(
                self.url(path),
                params=params,
                headers=self.headers({"Accept": accept}),
                proxy=self.info.proxy,
                server_hostname=self.info.tls_server_name,
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=read_timeout),
            ) as response:
                code = response.status
                if code >= 400:
                    # Bounded: a Status is small, and whatever answers on the way (a lower
                    # kubelet behind the node proxy, a load balancer) may stream forever.
                    raise errors.from_response(
                        code=code,
                        body=await read_bounded(response, limit=ERROR_BODY_LIMIT),
                        retry_after=response.headers.get("Retry-After"),
                    )
                self._count("WATCH", code)
                yield response
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if code == 0:
                self._count("WATCH", 0)
            raise errors.ApiUnavailable(self._unreachable("GET", path, exc)) from exc


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of a list (`ApiClient.pages`)."""

    items: list[Obj]
    """The page's objects (the caller's to consume: nothing else holds them)."""
    last: bool
    """Whether the list ends with this page."""
    resource_version: str
    """The list's resourceVersion (ListMeta), "" when the server sent none; a watch of the
    same selection resumes from the last page's."""
    restarted: bool
    """Whether this page begins the list again after an expired continue token: what the
    pages before it named belongs to an abandoned list."""


ERROR_BODY_LIMIT = 64 * 1024
"""Bytes of an error answer's body read at most (a Status is far smaller; the rest is left
unread, and the connection closed)."""
_REFUSAL_BODY_TIMEOUT = 5.0  # seconds


async def read_bounded(response: aiohttp.ClientResponse, *, limit: int) -> bytes:
    """Return the first `limit` bytes of `response`'s body (all of it when shorter); the
    rest is not read. Raises aiohttp.ClientError / OSError when the connection fails."""
    body = bytearray()
    while len(body) < limit:
        chunk = await response.content.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


async def _refused_upgrade(response: aiohttp.ClientResponse) -> None:
    """Raise the ApiError of a refused WebSocket upgrade, with the Status the server
    answered (aiohttp's handshake error drops the body, and with it the reason a lower
    apiserver gives, e.g. "container not found"). Other answers pass untouched."""
    upgrade = response.request_info.headers.get("Upgrade", "")
    if response.status >= 400 and upgrade.lower() == "websocket":
        # Bounded in size and time: a refusal whose body never comes still fails promptly.
        try:
            async with asyncio.timeout(_REFUSAL_BODY_TIMEOUT):
                body = await read_bounded(response, limit=ERROR_BODY_LIMIT)
        except (TimeoutError, aiohttp.ClientError, OSError):
            body = b""
        raise errors.from_response(
            code=response.status, body=body, retry_after=response.headers.get("Retry-After")
        )


def _status_as_json(payload: bytes) -> bytes:
    """An error answer in Kubernetes' protobuf encoding as the JSON Status `errors` reads;
    the bytes unchanged when they are not one (`errors.from_response` then quotes them)."""
    try:
        return codec.dumps(metadata_protobuf.decode(payload))
    except ValueError:
        return payload
