"""The HTTP answers of `auth`'s checks, for every program's HTTPS port: who the caller is
(401 when nobody), whether the upper cluster lets it (403), and what a review that could not
be made answers (429 too many waiting, 503 the upper cluster failed or was slow), as
kube-apiserver's delegated authentication and authorization filters answer
(k8s.io/apiserver pkg/endpoints/filters/authentication.go, authorization.go).

`metrics_guard` puts `/metrics` of the webhook and the scheduler extender behind them, as
kube-controller-manager and kube-scheduler serve theirs on their secure port: a
SubjectAccessReview of the non-resource URL `/metrics`, verb `get` (the Prometheus
ClusterRole grants `nonResourceURLs: [/metrics]`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NoReturn

from aiohttp import typedefs, web

from tensile.kube.client import ApiClient
from tensile.serving import auth

logger = logging.getLogger(__name__)

METRICS_PATHS = frozenset({"/metrics"})
"""What `metrics_guard` checks."""


@dataclass(frozen=True, kw_only=True)
class Reviews:
    """Who a server asks about its callers: one `auth.ReviewGate` bounds both."""

    authenticator: auth.Authenticator
    authorizer: auth.Authorizer


def review_client(upper: ApiClient) -> ApiClient:
    """Return the client (not yet open) a server's TokenReviews and SubjectAccessReviews go
    through: a sibling of `upper` with no rate limit, `auth.REVIEW_TIMEOUT` seconds per
    request and `auth.REVIEWS_IN_FLIGHT` connections, so a caller's check never waits
    behind the server's own traffic (the kubelet's reviews are not throttled either)."""
    return upper.sibling(
        name="upper-reviews",
        qps=0,
        burst=1,
        timeout=auth.REVIEW_TIMEOUT,
        connections=auth.REVIEWS_IN_FLIGHT,
    )


def reviews(upper: ApiClient, *, anonymous: bool = False) -> Reviews:
    """Return the checks of a server whose callers `upper` reviews, with the kubelet's cache
    lifetimes (tokens 2 min, allowed 5 min, denied 30 s); `anonymous`: a caller without
    credentials is `auth.ANONYMOUS` (then authorized like anyone) instead of 401."""
    gate = auth.ReviewGate()
    return Reviews(
        authenticator=auth.Authenticator(upper, gate=gate, anonymous=anonymous),
        authorizer=auth.Authorizer(upper, gate=gate),
    )


async def check(
    request: web.Request,
    *,
    reviews: Reviews,
    attributes: Sequence[auth.Attributes],
    label: str,
    forbidden: str = "",
) -> auth.User:
    """Return the caller of `request` once one of `attributes` is allowed to it (tried in
    order); otherwise raise the aiohttp error that refuses it: 401 no credentials or a
    token the upper cluster does not know, 403 no attribute allowed (`forbidden` or the
    attributes in the text), 429 too many reviews waiting, 503 the upper cluster did not
    answer a review (Retry-After: 1). `label` prefixes the log lines ("kubelet API")."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport else None

    def alive() -> bool:
        current = request.transport
        return current is not None and not current.is_closing()

    try:
        try:
            user = await reviews.authenticator.authenticate(
                ssl_object=ssl_object,
                authorization=request.headers.get("Authorization"),
                alive=alive,
            )
        except auth.Unauthenticated:
            raise web.HTTPUnauthorized(text="Unauthorized") from None
        except auth.AuthError as exc:
            _review_failed(exc, refused=web.HTTPUnauthorized, label=label)
        try:
            for attribute in attributes:
                if await reviews.authorizer.allowed(user, attribute, alive=alive):
                    return user
        except auth.AuthError as exc:
            _review_failed(exc, refused=web.HTTPForbidden, label=label)
    except auth.Busy as exc:
        raise web.HTTPTooManyRequests(
            text=f"too many callers to check at once ({exc})", headers={"Retry-After": "1"}
        ) from None
    except auth.Abandoned:
        # Nobody reads this answer; the connection is gone.
        raise web.HTTPServiceUnavailable(text="the caller left") from None
    what = forbidden or "; ".join(str(a) for a in attributes)
    raise web.HTTPForbidden(text=f"Forbidden (user={user.name}, {what})")


def _review_failed(exc: auth.AuthError, *, refused: type[web.HTTPError], label: str) -> NoReturn:
    """Raise the answer to a review that did not complete (see `auth`)."""
    if isinstance(exc, auth.AuthUnavailable):
        logger.warning("%s: %s", label, exc)
        raise web.HTTPServiceUnavailable(
            text=f"cannot check the caller now: {exc}", headers={"Retry-After": "1"}
        )
    logger.warning("%s: %s (check the program's RBAC in the upper cluster)", label, exc)
    raise refused(text=f"cannot check the caller: {exc}")


def metrics_guard(
    reviews: Reviews, *, label: str, paths: Collection[str] = METRICS_PATHS
) -> typedefs.Middleware:
    """Return an aiohttp middleware that lets a request for one of `paths` through only
    once `check` allows its verb on it as a non-resource URL (GET: `get`); other requests
    pass untouched. `label` prefixes its log lines."""

    @web.middleware
    async def guard(request: web.Request, handler: typedefs.Handler) -> web.StreamResponse:
        if request.path not in paths:
            return await handler(request)
        attributes = [auth.Attributes(verb=auth.verb(request.method), path=request.path)]
        await check(request, reviews=reviews, attributes=attributes, label=label)
        return await handler(request)

    return guard
