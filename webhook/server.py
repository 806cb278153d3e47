"""The webhook's HTTPS application (aiohttp): `POST /mutate`, and the serving layer's
`/healthz`, `/readyz` and `/metrics`; `/metrics` only for callers the upper cluster allows
`get` on the non-resource URL `/metrics` (a token or client certificate, TokenReview and
SubjectAccessReview: `tensile.serving.delegated`).

`/mutate` answers every AdmissionReview it can read with `allowed: true` (the webhook
changes pods, it never refuses them) and, for a pod it converts, a JSON patch. What is not
an AdmissionReview gets a 4xx with a message, never a 500: 400 for a body that is not one
(not JSON, wrong apiVersion or kind, no request, uid or object, an operation no apiserver
sends, a Pod whose labels or annotations are not objects), 413 past
`max_request_bytes`, 415 for a Content-Type other than JSON, 408 when the body does not
arrive in time. The apiserver gives the call a deadline (the configuration's
`timeoutSeconds`, sent as `?timeout=`, at most 30 s): a decision that would need longer (the caches
have not listed yet) is answered before it, "allowed, no patch", with a warning for the
client and `result="timeout"` in the metrics, rather than after the apiserver gave up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from tensile.serving import delegated, endpoints
from tensile.serving.flags import parse_duration
from webhook import metrics, review
from webhook.mutation import Lookups, MutationSettings, mutate

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0
"""Seconds the apiserver gives a webhook call when it does not say (the API's default
`timeoutSeconds`)."""
MAX_TIMEOUT = 30.0
"""The longest deadline the apiserver gives a webhook call (`timeoutSeconds` is validated to
1-30 seconds): a longer `?timeout=` comes from some other caller and is cut to it."""
MAX_REQUEST_BYTES = 3 * 1024 * 1024
"""Default bound of a request body: an object of etcd's largest (1.5 MiB) in an
AdmissionReview, with room to spare."""
_NOT_READY_WARNING = (
    "tensile-webhook: its caches of the cluster are not ready; the pod was admitted "
    "unchanged, its placement constraints apply to the virtual node"
)
_ERROR_WARNING = "tensile-webhook: internal error; the pod was admitted unchanged"


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What `/mutate` decides with."""

    settings: MutationSettings
    lookups: Lookups
    ready: Callable[[], bool]
    """Whether the lookups can be trusted now (the informers have listed)."""
    wait_ready: Callable[[], Awaitable[None]]
    """Returns once they can (the handler bounds the wait)."""
    default_timeout: float = DEFAULT_TIMEOUT


ADMISSION_KEY: Final = web.AppKey("admission", Admission)


def make_app(
    admission: Admission,
    *,
    health: endpoints.Health,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    reviews: delegated.Reviews | None = None,
) -> web.Application:
    """Return the webhook's application (see the module docstring); `reviews` check the
    callers of `/metrics` (None: anyone may read it, for tests of the application alone)."""
    guards = [] if reviews is None else [delegated.metrics_guard(reviews, label="webhook")]
    app = web.Application(client_max_size=max_request_bytes, middlewares=guards)
    app[ADMISSION_KEY] = admission
    app.router.add_post("/mutate", _mutate)
    endpoints.add_routes(app, health=health)
    return app


@functools.lru_cache(maxsize=64)
def budget(timeout: str | None, *, default: float = DEFAULT_TIMEOUT) -> float:
    """Return the seconds a call may take: the apiserver's `?timeout=` (a Go duration; the
    default when absent or unreadable, at most MAX_TIMEOUT) less a margin for the answer's
    way back (a fifth, at least 0.2 s, leaving at least 0.1 s). Cached: the apiserver sends
    the same few values again and again."""
    seconds = default
    if timeout:
        try:
            seconds = parse_duration(timeout) or default
        except ValueError:
            pass
    seconds = min(seconds, MAX_TIMEOUT)
    return max(0.1, seconds - max(0.2, seconds / 5))


async def _mutate(request: web.Request) -> web.Response:
    started = time.monotonic()
    admission = request.app[ADMISSION_KEY]
    operation, result = "", "rejected"
    try:
        deadline = started + budget(request.query.get("timeout"), default=admission.default_timeout)
        if request.content_type != "application/json":
            raise web.HTTPUnsupportedMediaType(
                text=f"Content-Type {request.content_type} is not application/json"
            )
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                body = await request.read()
        except TimeoutError:
            raise web.HTTPRequestTimeout(text="the request body did not arrive in time") from None
        try:
            checked = review.parse(body)
        except review.BadReview as exc:
            raise web.HTTPBadRequest(text=f"not an AdmissionReview: {exc}") from None
        operation = checked.operation
        answer, result = await _decide(admission, checked, deadline=deadline)
        return web.json_response(answer)
    finally:
        metrics.ADMISSIONS.labels(operation, result).inc()
        metrics.LATENCY.labels(operation).observe(time.monotonic() - started)


async def _decide(
    admission: Admission, checked: review.Review, *, deadline: float
) -> tuple[dict[str, Any], str]:
    """Return (the answer to `checked`, the result label)."""
    api_version, uid = checked.api_version, checked.uid
    if checked.admission is None:
        return review.response(api_version=api_version, uid=uid), "skipped"
    if not admission.ready():
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                await admission.wait_ready()
        except TimeoutError:
            logger.warning("admission %s answered unchanged: the caches are not ready", uid)
            warnings = [_NOT_READY_WARNING]
            return review.response(api_version=api_version, uid=uid, warnings=warnings), "timeout"
    try:
        decision = mutate(checked.admission, settings=admission.settings, lookups=admission.lookups)
    except Exception:
        # A bug must not block pod creation (failurePolicy Fail would) nor crash the server.
        logger.exception("admission %s: the mutation failed; answered unchanged", uid)
        warnings = [_ERROR_WARNING]
        return review.response(api_version=api_version, uid=uid, warnings=warnings), "error"
    if decision.skipped is not None:
        result = "skipped"
    else:
        result = "mutated" if decision.patch else "unchanged"
    logger.debug("admission %s: %s %s", uid, result, decision.skipped or "")
    answer = review.response(
        api_version=api_version, uid=uid, patch=decision.patch, warnings=decision.warnings
    )
    return answer, result


def _loop_time(deadline: float) -> float:
    """The event loop's clock at the monotonic time `deadline` (they may differ)."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
