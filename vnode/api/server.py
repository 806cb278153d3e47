"""The kubelet HTTPS API of a virtual node (aiohttp): routes, auth, logs, streaming.

Routes and status codes follow the kubelet's (pkg/kubelet/server): `/healthz`, `/pods`,
`/runningpods/`, `/containerLogs/{ns}/{pod}/{container}`, `/exec`, `/attach` and
`/portForward` over SPDY/3.1 or WebSocket (`Upgrade:` picks the transport), `/run`,
`/metrics/resource` and `/stats/summary`. Only pods bound to this node are reachable (404
otherwise). Every request is authenticated and authorized (see `auth`) unless
`verify_clients` is off; answers are bounded in what they wait for, and bad input gets a
4xx, never a 500 (`/run` reports a failed command with a 500, as a kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from aiohttp import web

from vnode import errors as provider_errors
from vnode.api import auth, channels, logs, portforward, remotecommand, run, stats
from vnode.api.streaming import DEFAULT_IDLE_TIMEOUT, STREAM_CREATION_TIMEOUT
from vnode.provider import (
    ExecProvider,
    LogsProvider,
    MetricsProvider,
    PortForwardProvider,
    PortSession,
    RemoteSession,
)

logger = logging.getLogger(__name__)
Obj = dict[str, Any]


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


def make_app(context: ApiContext) -> web.Application:
    """Return the aiohttp application of the kubelet API."""
    app = web.Application(middlewares=[_auth_middleware(context)])
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/pods", _pods(context))
    for path in ("/runningpods/", "/runningpods"):
        app.router.add_get(path, _running_pods(context))
    app.router.add_get("/metrics/resource", _resource_metrics(context))
    app.router.add_get("/stats/summary", _summary(context))
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", _container_logs(context))
    for prefix in ("/exec", "/attach"):
        for path in ("{namespace}/{pod}/{container}", "{namespace}/{pod}/{uid}/{container}"):
            app.router.add_route("GET", f"{prefix}/{path}", _remote_command(context))
            app.router.add_route("POST", f"{prefix}/{path}", _remote_command(context))
    for path in ("{namespace}/{pod}/{container}", "{namespace}/{pod}/{uid}/{container}"):
        app.router.add_post(f"/run/{path}", _run(context))
    for path in ("/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"):
        app.router.add_route("GET", path, _port_forward(context))
        app.router.add_route("POST", path, _port_forward(context))
    return app


def _auth_middleware(context: ApiContext) -> Any:
    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if context.authenticator is None or context.authorizer is None:
            return await handler(request)
        try:
            await _authenticate_and_authorize(context, request)
        except auth.Busy as exc:
            raise web.HTTPTooManyRequests(
                text=f"too many callers to check at once ({exc})", headers={"Retry-After": "1"}
            ) from None
        except auth.Abandoned:
            # Nobody reads this answer; the connection is gone.
            raise web.HTTPServiceUnavailable(text="the caller left") from None
        return await handler(request)

    return middleware


async def _authenticate_and_authorize(context: ApiContext, request: web.Request) -> None:
    """Raise the HTTP error that refuses `request`, or return when it may go on."""
    authenticator, authorizer = context.authenticator, context.authorizer
    assert authenticator is not None
    assert authorizer is not None
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport else None

    def alive() -> bool:
        current = request.transport
        return current is not None and not current.is_closing()

    try:
        user = await authenticator.authenticate(
            ssl_object=ssl_object,
            authorization=request.headers.get("Authorization"),
            alive=alive,
        )
    except auth.Unauthenticated:
        raise web.HTTPUnauthorized(text="Unauthorized") from None
    except auth.AuthError as exc:
        _review_failed(exc, refused=web.HTTPUnauthorized)
    the_verb = auth.verb(request.method)
    subs = auth.subresources(_authorized_path(request))
    try:
        for sub in subs:
            if await authorizer.allowed(user, verb=the_verb, subresource=sub, alive=alive):
                break
        else:
            raise web.HTTPForbidden(
                text=f"Forbidden (user={user.name}, verb={the_verb}, resource=nodes, "
                f"subresource(s)=[{' '.join(subs)}])"
            )
    except auth.AuthError as exc:
        _review_failed(exc, refused=web.HTTPForbidden)


def _authorized_path(request: web.Request) -> str:
    """Return the path to authorize `request` as: the route that will serve it, so what is
    checked is what runs, however the path was spelled (`/stats/../exec/...`, `%2F`,
    `//`); the path itself only when no route matches (the answer is then 404 anyway)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def _review_failed(exc: auth.AuthError, *, refused: type[web.HTTPError]) -> NoReturn:
    """Raise the answer to a review that did not complete (see `auth`)."""
    if isinstance(exc, auth.AuthUnavailable):
        logger.warning("kubelet API: %s", exc)
        raise web.HTTPServiceUnavailable(
            text=f"cannot check the caller now: {exc}", headers={"Retry-After": "1"}
        )
    logger.warning("kubelet API: %s (check the node's RBAC in the upper cluster)", exc)
    raise refused(text=f"cannot check the caller: {exc}")


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _pods(context: ApiContext) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_request: web.Request) -> web.Response:
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": context.pods()}
        return web.Response(text=json.dumps(body), content_type="application/json")

    return handler


def _running_pods(context: ApiContext) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_request: web.Request) -> web.Response:
        body = stats.running_pods(context.pods())
        return web.Response(text=json.dumps(body), content_type="application/json")

    return handler


def _resource_metrics(context: ApiContext) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_request: web.Request) -> web.Response:
        usage = await context.provider.resource_usage()
        return web.Response(
            text=stats.resource_metrics(usage), headers={"Content-Type": stats.CONTENT_TYPE}
        )

    return handler


def _summary(context: ApiContext) -> Callable[[web.Request], Awaitable[web.Response]]:
    # `only_cpu_and_memory=true` (older metrics-server) changes nothing: CPU and memory is
    # all there is.
    async def handler(_request: web.Request) -> web.Response:
        usage = await context.provider.resource_usage()
        body = stats.summary(usage, node_name=context.node_name)
        return web.Response(text=json.dumps(body), content_type="application/json")

    return handler


def _run(context: ApiContext) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        found = _pod_and_container(context, request)
        if isinstance(found, web.Response):
            return found
        pod, container = found
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
            return web.Response(status=exc.status, text=str(exc))
        except provider_errors.ProviderError as exc:
            return _provider_error(exc)
        # The kubelet labels the raw output JSON (writeJSONResponse); clients rely on status.
        return web.Response(body=output, content_type="application/json")

    return handler


def _container_logs(context: ApiContext) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        found = _pod_and_container(context, request)
        if isinstance(found, web.Response):
            return found
        pod, container = found
        try:
            options = logs.parse(request.query)
        except logs.LogOptionsError as exc:
            return web.Response(status=exc.status, text=str(exc))
        stream = context.provider.container_logs(pod, container=container, options=options.query())
        async with contextlib.aclosing(stream):
            try:
                first = await anext(stream, b"")
            except provider_errors.ProviderError as exc:
                return _provider_error(exc)
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

    return handler


def _remote_command(context: ApiContext) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        attach = request.path.startswith("/attach/")
        found = _pod_and_container(context, request)
        if isinstance(found, web.Response):
            return found
        pod, container = found
        transport = _transport(request)
        if transport is None:
            return _needs_upgrade()
        try:
            options = remotecommand.parse(
                request.query, request.query.getall("command", []), exec_=not attach
            )
            if transport == "websocket":
                protocol = _websocket_protocol(request, channels.EXEC_PROTOCOLS)
            else:
                protocol = remotecommand.negotiate(
                    request.headers.getall("X-Stream-Protocol-Version", [])
                )
        except remotecommand.RequestError as exc:
            return web.Response(status=exc.status, text=str(exc), headers=exc.headers)

        async def open_session() -> RemoteSession:
            # Only called once the client's streams exist: a provider error is reported on
            # the error stream, as a kubelet reports a runtime's.
            return await context.provider.open_exec(
                pod, container=container, options=options, attach=attach
            )

        if transport == "websocket":
            return await remotecommand.serve_websocket(
                request,
                protocol=protocol,
                options=options,
                open_session=open_session,
                attach=attach,
                idle_timeout=context.idle_timeout,
            )
        return await remotecommand.serve_spdy(
            request,
            protocol=protocol,
            options=options,
            open_session=open_session,
            attach=attach,
            idle_timeout=context.idle_timeout,
            creation_timeout=context.stream_creation_timeout,
        )

    return handler


def _port_forward(context: ApiContext) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        pod = _bound_pod(context, request)
        if isinstance(pod, web.Response):
            return pod
        transport = _transport(request)
        if transport is None:
            return _needs_upgrade()
        found = pod

        async def connect(port: int) -> PortSession:
            return await context.provider.open_port_forward(found, port=port)

        if transport == "websocket":
            return await _port_forward_websocket(context, request, connect=connect)
        if portforward.negotiate(request.headers.getall("X-Stream-Protocol-Version", [])) is None:
            return web.Response(
                status=403,
                text="the client does not offer portforward.k8s.io",
                headers={"X-Accepted-Stream-Protocol-Versions": portforward.PROTOCOL},
            )
        return await portforward.serve_spdy(
            request,
            connect=connect,
            idle_timeout=context.idle_timeout,
            creation_timeout=context.stream_creation_timeout,
        )

    return handler


async def _port_forward_websocket(
    context: ApiContext, request: web.Request, *, connect: portforward.Connect
) -> web.StreamResponse:
    try:
        # The kubelet's parameter is `port`; `ports` (what clients send the apiserver) is
        # taken too, for clients that call the node directly.
        ports = channels.parse_ports(
            request.query.getall("port", []) + request.query.getall("ports", [])
        )
    except ValueError as exc:
        return web.Response(status=400, text=str(exc))
    try:
        protocol = _websocket_protocol(request, channels.PORT_FORWARD_PROTOCOLS)
    except remotecommand.RequestError as exc:
        return web.Response(status=exc.status, text=str(exc))
    return await portforward.serve_websocket(
        request, protocol=protocol, ports=ports, connect=connect, idle_timeout=context.idle_timeout
    )


def _transport(request: web.Request) -> str | None:
    """Return "spdy" or "websocket" after the request's `Upgrade` header, or None."""
    upgrade = request.headers.get("Upgrade", "").strip().lower()
    return {"spdy/3.1": "spdy", "websocket": "websocket"}.get(upgrade)


def _needs_upgrade() -> web.Response:
    return web.Response(
        status=400, text="this endpoint needs Upgrade: SPDY/3.1 or Upgrade: websocket"
    )


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


def _bound_pod(context: ApiContext, request: web.Request) -> Obj | web.Response:
    """The upper pod the path names, if bound to this node (and of the path's UID), else 404."""
    namespace, name = request.match_info["namespace"], request.match_info["pod"]
    pod = context.pod(namespace, name)
    uid = request.match_info.get("uid")
    if pod is None or (uid and uid != pod["metadata"].get("uid")):
        return web.Response(status=404, text=f"pod {namespace}/{name} not found on this node")
    return pod


def _pod_and_container(context: ApiContext, request: web.Request) -> tuple[Obj, str] | web.Response:
    pod = _bound_pod(context, request)
    if isinstance(pod, web.Response):
        return pod
    namespace, name = request.match_info["namespace"], request.match_info["pod"]
    container = request.match_info["container"]
    names = {
        c.get("name")
        for group in ("containers", "initContainers", "ephemeralContainers")
        for c in (pod.get("spec") or {}).get(group) or []
    }
    if container not in names:
        return web.Response(
            status=404, text=f"container {container!r} not found in pod {namespace}/{name}"
        )
    return pod, container


def _provider_error(exc: provider_errors.ProviderError) -> web.Response:
    """Map a provider error to the kubelet's answer: 404 missing, 503 backend down, else 400."""
    if isinstance(exc, provider_errors.NotFound):
        return web.Response(status=404, text=str(exc))
    if isinstance(exc, provider_errors.BackendUnavailable):
        return web.Response(status=503, text=str(exc))
    return web.Response(status=400, text=str(exc))
