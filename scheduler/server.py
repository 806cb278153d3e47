"""The extender's HTTPS application (aiohttp): `POST /filter` and `POST /prioritize`
(kube-scheduler's filterVerb and prioritizeVerb), and the serving layer's `/healthz`,
`/readyz` and `/metrics`.

A body that is not an ExtenderArgs gets a 400 naming what is wrong (not JSON, no pod, no
node names), 413 past `max_request_bytes`, 415 for a Content-Type other than JSON; never a
500. A bug in a decision answers as if the extender were not there (every node passes,
scores 0) and is logged and counted: the scheduler goes on either way (`ignorable: true`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from scheduler import extender, metrics
from scheduler.slices.filter import Refusals, within_slices
from scheduler.summaries import Summaries
from tensile.kube import codec
from tensile.serving import endpoints

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
"""Default bound of a body: a Pod of etcd's largest (1.5 MiB) and the names of 5,000 nodes,
with room to spare (a NodeList of full Nodes can be larger: use nodeCacheCapable)."""


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


def make_app(
    judge: Judge, *, health: endpoints.Health, max_request_bytes: int = MAX_REQUEST_BYTES
) -> web.Application:
    """Return the extender's application (see the module docstring)."""
    app = web.Application(client_max_size=max_request_bytes)
    app[JUDGE_KEY] = judge
    app.router.add_post("/filter", _handler("filter", _filter))
    app.router.add_post("/prioritize", _handler("prioritize", _prioritize))
    endpoints.add_routes(app, health=health)
    return app


Decide = Callable[[Judge, extender.Call], Any]


def _filter(judge: Judge, call: extender.Call) -> dict[str, Any]:
    verdicts = extender.judge(
        call, summaries=judge.summaries, policy=judge.policy, recent=judge.recent
    )
    for verdict in verdicts:
        label = "passed" if not verdict.virtual else ("fit" if verdict.fits else "unfit")
        metrics.NODES.labels(label).inc()
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
        started = time.perf_counter()
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

    return handle
