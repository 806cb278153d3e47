"""The extender's HTTPS application (aiohttp): `POST /filter` and `POST /prioritize`
(kube-scheduler's filterVerb and prioritizeVerb), and the serving layer's `/healthz`,
`/readyz` and `/metrics`.

Who may call (`Callers`): with `client_certificates`, every route but `/healthz`,
`/readyz` and `/metrics` needs a client certificate verified at the TLS handshake (the
server context asks for one and verifies what is presented: CERT_OPTIONAL, so that kubelet
probes, which present none, still connect). A caller without one gets 401 before anything
is read or judged; on `/readyz` it gets "ok" or "not ready" and no check's reason.
kube-scheduler presents the certificate of its extender `tlsConfig.certFile`/`keyFile`. At
most `max_in_flight` filter and prioritize calls are answered at once; one more gets 429 at
once, without its body being read (kube-scheduler then goes on without the extender for
that pod: `ignorable`).
`/metrics` is for callers the upper cluster allows `get` on the non-resource URL `/metrics`
(a token, or a client certificate, then a TokenReview and a SubjectAccessReview:
`tensile.serving.delegated`), as kube-scheduler serves its own.

A body that is not an ExtenderArgs gets a 400 naming what is wrong (not JSON, no pod, no
node names), 413 past `max_request_bytes`, 415 for a Content-Type other than JSON; never a
500. A bug in a decision answers as if the extender were not there (every node passes,
scores 0) and is logged and counted: the scheduler goes on either way (`ignorable: true`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import typedefs, web

from scheduler import extender, metrics
from scheduler.slices.filter import Refusals, within_slices
from scheduler.summaries import Summaries
from tensile.kube import codec
from tensile.serving import delegated, endpoints

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
"""Default bound of a body: a Pod of etcd's largest (1.5 MiB) and the names of 5,000 nodes,
with room to spare (a NodeList of full Nodes can be larger: use nodeCacheCapable)."""
MAX_IN_FLIGHT: Final = 32
"""Default bound of the filter and prioritize calls answered at once (--max-requests-inflight):
kube-scheduler makes one call at a time per scheduling profile, so this leaves room for
several schedulers and profiles, and bounds what 8 MiB bodies can take."""
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})
"""What a caller without a client certificate may ask (kubelet probes present none)."""
VERBS: Final = frozenset({"/filter", "/prioritize"})
"""The extender calls, bounded by `Callers.max_in_flight`."""


@dataclass(frozen=True, kw_only=True)
class Callers:
    """Who may call, and how many calls at once."""

    client_certificates: bool = True
    """Every route but `OPEN_PATHS` needs a client certificate the TLS handshake verified
    (the server's context verifies any presented against --client-ca-file); False: any
    caller (a server without a client CA: tests and benchmarks on loopback)."""
    max_in_flight: int = MAX_IN_FLIGHT
    """Filter and prioritize calls answered at once; more get 429."""


@dataclass(frozen=True, kw_only=True)
class Judge:
    """What the handlers decide with."""

    summaries: Summaries
    policy: extender.Policy
    recent: extender.Recent = field(default_factory=extender.Recent)
    """Verdicts of filter kept for the prioritize call of the same pod."""
    slices: Refusals | None = None
    """The quota slices' check (`SliceController.refusals`); None: not enforced."""


JUDGE_KEY: Final = web.AppKey("judge", Judge)


class _Gate:
    """The application's admission of callers (`Callers`) and its count of calls in
    flight."""

    def __init__(self, callers: Callers) -> None:
        self.callers = callers
        self.in_flight = 0


GATE_KEY: Final = web.AppKey("gate", _Gate)
REVIEWED_KEY: Final = web.AppKey("reviewed", bool)
"""Whether `/metrics` is checked by the upper cluster's reviews (then no client certificate
is asked for it: a token will do)."""


def make_app(
    judge: Judge,
    *,
    health: endpoints.Health,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    callers: Callers | None = None,
    reviews: delegated.Reviews | None = None,
) -> web.Application:
    """Return the extender's application (see the module docstring); `callers` default:
    client certificates required, `MAX_IN_FLIGHT`; `reviews` check the callers of
    `/metrics` (None: `callers` alone decide, for tests of the application alone)."""
    guards: list[typedefs.Middleware] = [_guard]
    if reviews is not None:
        guards.append(delegated.metrics_guard(reviews, label="extender"))
    app = web.Application(client_max_size=max_request_bytes, middlewares=guards)
    app[REVIEWED_KEY] = reviews is not None
    app[JUDGE_KEY] = judge
    app[GATE_KEY] = _Gate(callers or Callers())
    app.router.add_post("/filter", _handler("filter", _filter))
    app.router.add_post("/prioritize", _handler("prioritize", _prioritize))
    endpoints.add_routes(app, health=health)
    return app


Decide = Callable[[Judge, extender.Call], Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _certified(request: web.Request) -> bool:
    """Whether the caller presented a client certificate the TLS handshake verified
    (`getpeercert()` is None without one; a presented one that fails verification ends
    the handshake, so there is no request at all)."""
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    return bool(peer)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Admit a call (see the module docstring): 401 without a client certificate outside
    `OPEN_PATHS`, 429 beyond the calls in flight."""
    gate = request.app[GATE_KEY]
    reviewed = request.app[REVIEWED_KEY] and request.path in delegated.METRICS_PATHS
    if gate.callers.client_certificates and not _certified(request) and not reviewed:
        if request.path not in OPEN_PATHS:
            metrics.REFUSED.labels("unauthenticated").inc()
            raise web.HTTPUnauthorized(
                text="a client certificate is required (the extender's --client-ca-file signs "
                "those it accepts; kube-scheduler presents its tlsConfig certFile)\n"
            )
        answer = await handler(request)
        if request.path == "/readyz":  # whether, not why
            ready = answer.status == 200
            return web.Response(status=answer.status, text="ok" if ready else "not ready")
        return answer
    if request.path not in VERBS:
        return await handler(request)
    if gate.in_flight >= gate.callers.max_in_flight:
        metrics.REFUSED.labels("too_many_requests").inc()
        raise web.HTTPTooManyRequests(
            headers={"Retry-After": "1"},
            text=f"more than {gate.callers.max_in_flight} calls in flight "
            "(--max-requests-inflight)\n",
        )
    gate.in_flight += 1
    try:
        return await handler(request)
    finally:
        gate.in_flight -= 1


def _filter(judge: Judge, call: extender.Call) -> dict[str, Any]:
    verdicts = extender.judge(
        call, summaries=judge.summaries, policy=judge.policy, recent=judge.recent
    )
    counted = collections.Counter(
        "passed" if not v.virtual else ("fit" if v.fits else "unfit") for v in verdicts
    )
    for label, count in counted.items():  # one labelled child per verdict, not per node
        metrics.NODES.labels(label).inc(count)
    result = extender.filter_result(call, verdicts)
    if judge.slices is not None:  # a quota'd namespace's pods only within its slices
        fitting = [v.name for v in verdicts if v.virtual and v.fits]
        result = within_slices(result, pod=call.pod, candidates=fitting, refusals=judge.slices)
    return result


def _prioritize(judge: Judge, call: extender.Call) -> list[dict[str, Any]]:
    verdicts = extender.judge(
        call, summaries=judge.summaries, policy=judge.policy, recent=judge.recent, explain=False
    )
    return extender.priorities(verdicts)


def _fallback(verb: str, call: extender.Call) -> Any:
    """The answer of an extender that judges nothing: every node passes, all score 0."""
    if verb == "prioritize":
        return [{"Host": name, "Score": 0} for name in call.names]
    return extender.filter_result(
        call, [extender.Verdict(name=n, virtual=False) for n in call.names]
    )


def _handler(verb: str, decide: Decide) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        started, cpu = time.perf_counter(), time.thread_time()
        result = "bad_request"
        try:
            if request.content_type != "application/json":
                raise web.HTTPUnsupportedMediaType(
                    text=f"Content-Type {request.content_type} is not application/json"
                )
            body = await request.read()
            try:
                decoded = codec.loads(body)
            except ValueError as exc:
                raise web.HTTPBadRequest(text=f"not JSON: {exc}") from None
            try:
                call = extender.read_extender_args(decoded)
            except extender.BadArgs as exc:
                raise web.HTTPBadRequest(text=f"not an ExtenderArgs: {exc}") from None
            try:
                answer = decide(request.app[JUDGE_KEY], call)
                result = "ok"
            except Exception:
                logger.exception("%s: the decision failed; every node passes", verb)
                answer, result = _fallback(verb, call), "error"
            return web.Response(body=codec.dumps(answer), content_type="application/json")
        finally:
            metrics.CALLS.labels(verb, result).inc()
            metrics.LATENCY.labels(verb).observe(time.perf_counter() - started)
            metrics.CPU.labels(verb).observe(time.thread_time() - cpu)

    return handle
