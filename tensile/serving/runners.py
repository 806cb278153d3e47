"""The aiohttp runner every tensile server runs on (the kubelet API, the webhook, the
metrics and health endpoints): no access log, a handler cancelled when its client leaves,
and a bound on idle connections.

Idle connections: aiohttp closes a connection that brings no request for its keep-alive
timeout, counted from the TLS handshake until the first request and from each response to
the next one; a request whose headers trickle in never arrives, so a slow-header client is
closed on the same clock (a long request, an exec or a log stream, is never cut: the clock
only runs between requests). aiohttp's default is 3630 s. The callers of these servers are
Go HTTP clients whose transports drop idle connections after 90 s: the kube-apiserver
toward kubelets and webhooks, and metrics-server (client-go's transport cache fills in
http.DefaultTransport's IdleConnTimeout through apimachinery's SetTransportDefaults). We
wait a little longer, so the client closes an idle connection first (a server closing it
races a request the client sends at that moment), and a caller that opens connections and
says nothing holds each for `KEEPALIVE_TIMEOUT` instead of an hour. Before the handshake,
asyncio's own 60 s TLS handshake timeout applies.
"""

from __future__ import annotations

from aiohttp import web

KEEPALIVE_TIMEOUT = 95.0
"""Seconds a connection may wait for its next request: just above the 90 s after which the
kube-apiserver's and metrics-server's clients close theirs."""


def app_runner(app: web.Application, *, shutdown_timeout: float) -> web.AppRunner:
    """Return the runner for `app` (see the module docstring); `shutdown_timeout` is the
    seconds `cleanup()` waits for requests in flight before cancelling them."""
    return web.AppRunner(
        app,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
    )
