"""The kubelet HTTPS API of a virtual node (aiohttp): routes, auth, logs, streaming.

Routes and status codes follow the kubelet's (pkg/kubelet/server): `/healthz`, `/pods`,
`/runningpods/`, `/containerLogs/{ns}/{pod}/{container}`, `/exec`, `/attach` and
`/portForward` over SPDY/3.1 or WebSocket (`Upgrade:` picks the transport), `/run`,
`/metrics` (the node's own Prometheus metrics), `/metrics/resource` and `/stats/summary`.
Only pods bound to this node are reachable (404 otherwise). Every request is authenticated
and authorized (see `auth`; `/metrics` as `get nodes/metrics`) unless `verify_clients` is
off; answers are bounded in what they wait for, and bad input gets a
4xx, never a 500 (`/run` reports a failed command with a 500, as a kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NoReturn, Protocol

from aiohttp import typedefs, web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest

from tensile.contracts.objects import Obj, uid_of
from tensile.serving import delegated
from vnode import provider_errors
from vnode.api import auth, channels, logs, portforward, remotecommand, run, stats, streaming
from vnode.api.spdy_session import SpdyTransport
from vnode.api.streaming import DEFAULT_IDLE_TIMEOUT, STREAM_CREATION_TIMEOUT
from vnode.api.websocket_session import WebSocketTransport
from vnode.provider import (
    ExecProvider,
    LogsProvider,
    MetricsProvider,
    PortForwardProvider,
    PortSession,
    RemoteCommand,
    RemoteSession,
)

logger = logging.getLogger(__name__)

REQUESTS = Counter(
    "tensile_kubelet_api_requests",
    "Kubelet API requests answered, by path (the route's first segment, as the kubelet's "
    "kubelet_http_requests_total: containerLogs, exec, attach, portForward, run, stats, "
    "metrics, pods, runningpods, healthz; other: no route) and HTTP code (0: the caller left "
    "first).",
    ["path", "code"],
)
IN_FLIGHT = Gauge(
    "tensile_kubelet_api_inflight_requests",
    "Kubelet API requests being answered, by path (exec, attach and portForward for the "
    "life of their streams).",
    ["path"],
)


class _ApiProvider(LogsProvider, ExecProvider, PortForwardProvider, MetricsProvider, Protocol):
    """What the API needs of a provider."""


@dataclass(frozen=True, kw_only=True)
class ApiContext:
    """What the handlers need: the node's pods, the provider, and the auth checks."""

    node_name: str
    pod: Callable[[str, str], Obj | None]
    """Upper pod bound to this node, by (namespace, name), or None."""
    pods: Callable[[], list[Obj]]
    """All upper pods bound to this node."""
    provider: _ApiProvider
    authenticator: auth.Authenticator | None
    """None: no authentication (--no-verify-clients, development only)."""
    authorizer: auth.Authorizer | None
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds a streaming connection may move no frame before it is closed (0: never)."""
    stream_creation_timeout: float = STREAM_CREATION_TIMEOUT
    """Seconds a SPDY client has to open the streams of a session or a port-forward pair."""


CONTEXT_KEY: Final = web.AppKey("kubelet_api_context", ApiContext)

_ERRORS: Final[Mapping[int, type[web.HTTPError]]] = {
    error.status_code: error
    for error in (
        web.HTTPBadRequest,
        web.HTTPForbidden,
        web.HTTPNotFound,
        web.HTTPUnprocessableEntity,
        web.HTTPInternalServerError,
        web.HTTPServiceUnavailable,
    )
}
"""The answers the API's own error types carry a status for (`logs.LogOptionsError`,
`run.RunError`, `remotecommand.RequestError`)."""


def make_app(context: ApiContext) -> web.Application:
    """Return the aiohttp application of the kubelet API, serving `context`."""
    app = web.Application(middlewares=[_metrics_middleware, _auth_middleware])
    app[CONTEXT_KEY] = context
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/pods", _pods)
    for path in ("/runningpods/", "/runningpods"):
        app.router.add_get(path, _running_pods)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/metrics/resource", _resource_metrics)
    app.router.add_get("/stats/summary", _summary)
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", _container_logs)
    for prefix in ("/exec", "/attach"):
        for path in ("{namespace}/{pod}/{container}", "{namespace}/{pod}/{uid}/{container}"):
            app.router.add_route("GET", f"{prefix}/{path}", _remote_command)
            app.router.add_route("POST", f"{prefix}/{path}", _remote_command)
    for path in ("{namespace}/{pod}/{container}", "{namespace}/{pod}/{uid}/{container}"):
        app.router.add_post(f"/run/{path}", _run)
    for path in ("/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"):
        app.router.add_route("GET", path, _port_forward)
        app.router.add_route("POST", path, _port_forward)
    return app


@web.middleware
async def _metrics_middleware(
    request: web.Request, handler: typedefs.Handler
) -> web.StreamResponse:
    """Count every answer (`REQUESTS`), refusals included, and the requests in flight."""
    path = _path_label(request)
    code = 500  # what aiohttp answers for an exception that is not an HTTP error
    in_flight = IN_FLIGHT.labels(path=path)
    in_flight.inc()
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as exc:
        code = exc.status
        raise
    except asyncio.CancelledError:
        code = 0  # the caller left before an answer (the clients' metric says 0 too)
        raise
    finally:
        in_flight.dec()
        REQUESTS.labels(path=path, code=str(code)).inc()


def _path_label(request: web.Request) -> str:
    """The first segment of the route that serves `request` ("other" when none does): a
    label of bounded values, never the pod's names."""
    resource = request.match_info.route.resource
    if resource is None:
        return "other"
    return resource.canonical.strip("/").split("/", 1)[0] or "other"


@web.middleware
async def _auth_middleware(request: web.Request, handler: typedefs.Handler) -> web.StreamResponse:
    context = request.app[CONTEXT_KEY]
    if context.authenticator is None or context.authorizer is None:
        return await handler(request)
    attributes = auth.attributes(
        node_name=context.node_name, method=request.method, path=_authorized_path(request)
    )
    subs = " ".join(a.subresource for a in attributes)
    await delegated.check(
        request,
        reviews=delegated.Reviews(
            authenticator=context.authenticator, authorizer=context.authorizer
        ),
        attributes=attributes,
        label="kubelet API",
        forbidden=f"verb={attributes[0].verb}, resource=nodes, subresource(s)=[{subs}]",
    )
    return await handler(request)


def _authorized_path(request: web.Request) -> str:
    """Return the path to authorize `request` as: the route that will serve it, so what is
    checked is what runs, however the path was spelled (`/stats/../exec/...`, `%2F`,
    `//`); the path itself only when no route matches (the answer is then 404 anyway)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _pods(request: web.Request) -> web.Response:
    context = request.app[CONTEXT_KEY]
    body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": context.pods()}
    return web.json_response(body)


async def _running_pods(request: web.Request) -> web.Response:
    return web.json_response(stats.running_pods(request.app[CONTEXT_KEY].pods()))


async def _metrics(_request: web.Request) -> web.Response:
    """The node's own metrics (tensile_*, the process's), as the kubelet's /metrics: only
    for callers allowed `get` on nodes/metrics."""
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _resource_metrics(request: web.Request) -> web.Response:
    usage = await request.app[CONTEXT_KEY].provider.resource_usage()
    return web.Response(
        text=stats.resource_metrics(usage), headers={"Content-Type": stats.CONTENT_TYPE}
    )


async def _summary(request: web.Request) -> web.Response:
    # `only_cpu_and_memory=true` (older metrics-server) changes nothing: CPU and memory is
    # all there is.
    context = request.app[CONTEXT_KEY]
    usage = await context.provider.resource_usage()
    return web.json_response(stats.summary(usage, node_name=context.node_name))


async def _run(request: web.Request) -> web.Response:
    context = request.app[CONTEXT_KEY]
    pod, container = _pod_and_container(context, request)
    try:
        options = run.command(request.query)
        # The lower side may accept the connection and never answer the upgrade.
        async with asyncio.timeout(context.stream_creation_timeout):
            session = await context.provider.open_exec(
                pod, container=container, options=options, attach=False
            )
        output = await run.collect(session, options=options)
    except TimeoutError:
        raise web.HTTPGatewayTimeout(
            text=f"the lower cluster did not open the command's session in "
            f"{context.stream_creation_timeout:g}s"
        ) from None
    except run.RunError as exc:
        _refuse(exc.status, str(exc))
    except provider_errors.ProviderError as exc:
        _provider_failure(exc)
    # The kubelet labels the raw output JSON (writeJSONResponse); clients rely on status.
    return web.Response(body=output, content_type="application/json")


async def _container_logs(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT_KEY]
    pod, container = _pod_and_container(context, request)
    try:
        options = logs.parse(request.query)
    except logs.LogOptionsError as exc:
        _refuse(exc.status, str(exc))
    stream = context.provider.container_logs(pod, container=container, options=options.query())
    async with contextlib.aclosing(stream):
        try:
            first = await anext(stream, b"")
        except provider_errors.ProviderError as exc:
            _provider_failure(exc)
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        if first:
            await response.write(first)
        # write() waits for the client to take the bytes (backpressure); a client that
        # goes away cancels this handler, which closes the lower request.
        async for chunk in stream:
            await response.write(chunk)
        await response.write_eof()
        return response


async def _remote_command(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT_KEY]
    attach = request.path.startswith("/attach/")
    pod, container = _pod_and_container(context, request)
    upgrade = _upgrade(request)
    try:
        options = remotecommand.parse(
            request.query, request.query.getall("command", []), exec_=not attach
        )
        transport = _exec_transport(request, upgrade=upgrade, options=options)
    except remotecommand.RequestError as exc:
        _refuse(exc.status, str(exc), headers=exc.headers)

    async def open_session() -> RemoteSession:
        # Only called once the client's streams exist: a provider error is reported on
        # the error stream, as a kubelet reports a runtime's.
        return await context.provider.open_exec(
            pod, container=container, options=options, attach=attach
        )

    return await remotecommand.serve(
        request,
        transport=transport,
        open_session=open_session,
        attach=attach,
        idle_timeout=context.idle_timeout,
        creation_timeout=context.stream_creation_timeout,
    )


async def _port_forward(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT_KEY]
    pod = _bound_pod(context, request)
    upgrade = _upgrade(request)
    try:
        transport = _port_forward_transport(request, upgrade=upgrade)
    except remotecommand.RequestError as exc:
        _refuse(exc.status, str(exc), headers=exc.headers)

    async def connect(port: int) -> PortSession:
        return await context.provider.open_port_forward(pod, port=port)

    return await portforward.serve(
        request,
        transport=transport,
        connect=connect,
        idle_timeout=context.idle_timeout,
        creation_timeout=context.stream_creation_timeout,
    )


# -- transports: what SPDY and WebSocket differ in before the upgrade --------------------


def _upgrade(request: web.Request) -> str:
    """Return "spdy" or "websocket" after the request's `Upgrade` header; raises
    HTTPBadRequest for anything else."""
    upgrade = request.headers.get("Upgrade", "").strip().lower()
    transport = {"spdy/3.1": "spdy", "websocket": "websocket"}.get(upgrade)
    if transport is None:
        raise web.HTTPBadRequest(text="this endpoint needs Upgrade: SPDY/3.1 or Upgrade: websocket")
    return transport


def _exec_transport(
    request: web.Request, *, upgrade: str, options: RemoteCommand
) -> streaming.Transport:
    """Return the transport of an exec/attach: the sub-protocol negotiated, and the streams
    its session has there. Raises remotecommand.RequestError (400, 403)."""
    if upgrade == "websocket":
        protocol = _websocket_protocol(request, channels.EXEC_PROTOCOLS)
        layout = channels.exec_layout(remotecommand.stream_kinds(options))
        return WebSocketTransport(protocol=protocol, layout=layout)
    protocol = remotecommand.negotiate(request.headers.getall("X-Stream-Protocol-Version", []))
    kinds = remotecommand.stream_kinds(
        options, resize=protocol not in remotecommand.SPDY_WITHOUT_RESIZE
    )
    return SpdyTransport(protocol=protocol, kinds=kinds)


def _port_forward_transport(request: web.Request, *, upgrade: str) -> streaming.Transport:
    """Return the transport of a port-forward. Raises remotecommand.RequestError (400 for
    the ports of a WebSocket, 403 for no common sub-protocol)."""
    if upgrade == "websocket":
        try:
            # The kubelet's parameter is `port`; `ports` (what clients send the apiserver)
            # is taken too, for clients that call the node directly.
            ports = channels.parse_ports(
                request.query.getall("port", []) + request.query.getall("ports", [])
            )
        except ValueError as exc:
            raise remotecommand.RequestError(str(exc)) from None
        protocol = _websocket_protocol(request, channels.PORT_FORWARD_PROTOCOLS)
        return WebSocketTransport(protocol=protocol, layout=channels.port_forward_layout(ports))
    if portforward.negotiate(request.headers.getall("X-Stream-Protocol-Version", [])) is None:
        raise remotecommand.RequestError(
            "the client does not offer portforward.k8s.io",
            status=403,
            headers={"X-Accepted-Stream-Protocol-Versions": portforward.PROTOCOL},
        )
    return SpdyTransport(protocol=portforward.PROTOCOL, kinds=portforward.KINDS)


def _websocket_protocol(request: web.Request, supported: tuple[str, ...]) -> str:
    """Negotiate the channel sub-protocol; no common one is 403, as a kubelet answers."""
    try:
        # Only the first header counts, as for the kubelet (Go's Header.Get) and for
        # aiohttp's handshake, which must answer the protocol we chose.
        return channels.negotiate(
            request.headers.getall("Sec-WebSocket-Protocol", [])[:1], supported=supported
        )
    except channels.NoCommonProtocol as exc:
        raise remotecommand.RequestError(str(exc), status=403) from exc


# -- answers ------------------------------------------------------------------------------


def _bound_pod(context: ApiContext, request: web.Request) -> Obj:
    """Return the upper pod the path names, if bound to this node (and of the path's UID);
    raises HTTPNotFound otherwise."""
    namespace, name = request.match_info["namespace"], request.match_info["pod"]
    pod = context.pod(namespace, name)
    uid = request.match_info.get("uid")
    if pod is None or (uid and uid != uid_of(pod)):
        raise web.HTTPNotFound(text=f"pod {namespace}/{name} not found on this node")
    return pod


def _pod_and_container(context: ApiContext, request: web.Request) -> tuple[Obj, str]:
    """Return the bound pod and the container the path names; raises HTTPNotFound when
    either is not there."""
    pod = _bound_pod(context, request)
    namespace, name = request.match_info["namespace"], request.match_info["pod"]
    container = request.match_info["container"]
    names = {
        c.get("name")
        for group in ("containers", "initContainers", "ephemeralContainers")
        for c in (pod.get("spec") or {}).get(group) or []
    }
    if container not in names:
        raise web.HTTPNotFound(text=f"container {container!r} not found in pod {namespace}/{name}")
    return pod, container


def _refuse(status: int, text: str, *, headers: Mapping[str, str] | None = None) -> NoReturn:
    """Raise the aiohttp error of `status` (one of `_ERRORS`) saying `text`."""
    raise _ERRORS[status](text=text, headers=headers)


def _provider_failure(exc: provider_errors.ProviderError) -> NoReturn:
    """Raise the kubelet's answer to a provider error: 404 missing, 503 backend down, else
    400."""
    if isinstance(exc, provider_errors.PodNotFound):
        raise web.HTTPNotFound(text=str(exc))
    if isinstance(exc, provider_errors.BackendUnavailable):
        raise web.HTTPServiceUnavailable(text=str(exc))
    raise web.HTTPBadRequest(text=str(exc))
