"""Who may call a tensile program's HTTPS port, decided the way a kubelet, and
kube-apiserver's delegated authentication and authorization (k8s.io/apiserver
pkg/server/options/authentication.go, authorization.go), decide it: the upper cluster says.

Authentication: a client certificate, verified by TLS against the client CA when one is
presented (user = CN, groups = O; kube-apiserver's kubelet client certificate); otherwise a
bearer token, checked with a TokenReview; otherwise `system:anonymous` when the program
allows anonymous callers, else 401. Authorization: a SubjectAccessReview of `Attributes`
(the kubelet API: `nodes/<node>/<subresource>`, vnode.api.auth; the other programs: the
non-resource URL `/metrics`). Answers are cached; the kubelet's lifetimes are the defaults:
tokens 2 min, allow 5 min, deny 30 s.

Reviews the upper cluster must answer are bounded, so hostile callers cannot tie the node
up: at most `REVIEWS_IN_FLIGHT` at a time and `REVIEWS_WAITING` waiting (more: answer 429),
each given `REVIEW_TIMEOUT` seconds; a caller that hung up while waiting costs no review.
The kubelet answers an authentication or authorization it could not complete with 401 /
500; here an upper cluster that fails or does not answer in time gives 503 (the caller
may retry), and one that refuses the review itself gives 401 / 403.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache
from cryptography import x509
from cryptography.x509.oid import NameOID

from tensile.kube import errors
from tensile.kube.client import ApiClient

_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


@dataclass(frozen=True, kw_only=True)
class User:
    """An authenticated caller."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = User(name="system:anonymous", groups=("system:unauthenticated",))
"""Who a request without credentials is under --anonymous-auth (the apiserver's names)."""


class Unauthenticated(Exception):
    """No acceptable credentials (answer 401)."""


class AuthError(Exception):
    """The upper cluster refused a TokenReview or SubjectAccessReview (a 4xx: the node may
    lack the RBAC to ask); answer 401 for authentication, 403 for authorization."""


class AuthUnavailable(AuthError):
    """The upper cluster failed a review (5xx, throttled, unreachable) or did not answer in
    `REVIEW_TIMEOUT` seconds; answer 503."""


class Busy(Exception):
    """`REVIEWS_WAITING` callers already wait for a review slot; answer 429."""


class Abandoned(Exception):
    """The caller hung up before its review could start; nobody reads the answer."""


REVIEWS_IN_FLIGHT = 8
"""TokenReviews + SubjectAccessReviews of one server in flight at once."""
REVIEWS_WAITING = 256
"""Callers that may wait for a review slot before more are answered 429."""
REVIEW_TIMEOUT = 10.0
"""Seconds the upper cluster has to answer one review."""


class ReviewGate:
    """Bounds the reviews of one server (shared by its Authenticator and Authorizer)."""

    def __init__(
        self, *, in_flight: int = REVIEWS_IN_FLIGHT, waiting: int = REVIEWS_WAITING
    ) -> None:
        self._slots = asyncio.Semaphore(in_flight)
        self._admitted = 0
        """Reviews in flight or waiting for a slot."""
        self._most = in_flight + waiting

    async def review(
        self, upper: ApiClient, path: str, body: Mapping[str, Any], *, alive: Callable[[], bool]
    ) -> dict[str, Any]:
        """POST the review `body` to `path` once a slot is free and return the answer.

        `alive()` tells whether the caller still waits for it. Raises Busy, Abandoned,
        AuthError (a 4xx) or AuthUnavailable (anything else that is not an answer).
        """
        if self._admitted >= self._most:
            raise Busy(f"{self._admitted} reviews already in flight or waiting")
        self._admitted += 1
        try:
            async with self._slots:
                return await self._review(upper, path, body, alive=alive)
        finally:
            self._admitted -= 1

    async def _review(
        self, upper: ApiClient, path: str, body: Mapping[str, Any], *, alive: Callable[[], bool]
    ) -> dict[str, Any]:
        try:
            if not alive():
                raise Abandoned
            async with asyncio.timeout(REVIEW_TIMEOUT):
                return await upper.request("POST", path, body=body, timeout=REVIEW_TIMEOUT)
        except TimeoutError:
            raise AuthUnavailable(
                f"no answer from the upper cluster in {REVIEW_TIMEOUT:g}s"
            ) from None
        except (errors.ServerError, errors.TooManyRequests, errors.ApiUnavailable) as exc:
            raise AuthUnavailable(str(exc)) from exc
        except errors.ApiError as exc:
            raise AuthError(str(exc)) from exc


def _always_alive() -> bool:
    return True


def verb(method: str) -> str:
    """Return the authorization verb of an HTTP method (pure)."""
    return _VERBS.get(method.upper(), method.lower())


def user_from_certificate(der: bytes) -> User:
    """Return the user a verified client certificate names (CN = user, O = groups)."""
    cert = x509.load_der_x509_certificate(der)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    groups = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    return User(name=str(cns[0].value) if cns else "", groups=tuple(str(g.value) for g in groups))


class Authenticator:
    """Turns a request's TLS peer certificate or bearer token into a User."""

    def __init__(
        self,
        upper: ApiClient,
        *,
        gate: ReviewGate,
        anonymous: bool = False,
        cache_ttl: float = 120.0,
    ) -> None:
        """`upper` answers TokenReviews, through `gate`; `anonymous`: a request without
        credentials is ANONYMOUS instead of 401 (the kubelet's --anonymous-auth);
        `cache_ttl`: seconds a review's answer is reused, 0 never (the kubelet's
        --authentication-token-webhook-cache-ttl)."""
        self._upper = upper
        self._gate = gate
        self._anonymous = anonymous
        self._tokens: TTLCache[str, User | None] = _cache(cache_ttl)

    async def authenticate(
        self,
        *,
        ssl_object: ssl.SSLObject | None,
        authorization: str | None,
        alive: Callable[[], bool] = _always_alive,
    ) -> User:
        """Return the caller. Raises Unauthenticated, and what `ReviewGate.review` raises
        (a 4xx answer to the TokenReview itself means an invalid token: Unauthenticated)."""
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            if der:  # only present when it verified against the client CA
                return user_from_certificate(der)
        if authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
            if not token:
                raise Unauthenticated("empty bearer token")
            if token in self._tokens:
                cached = self._tokens[token]
                if cached is None:
                    raise Unauthenticated("invalid bearer token")
                return cached
            user = await self._review(token, alive=alive)
            self._tokens[token] = user
            if user is None:
                raise Unauthenticated("invalid bearer token")
            return user
        if self._anonymous and not authorization:
            return ANONYMOUS
        raise Unauthenticated("no client certificate or bearer token")

    async def _review(self, token: str, *, alive: Callable[[], bool]) -> User | None:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            review = await self._gate.review(
                self._upper, "/apis/authentication.k8s.io/v1/tokenreviews", body, alive=alive
            )
        except AuthUnavailable as exc:
            raise AuthUnavailable(f"TokenReview failed: {exc}") from exc
        except AuthError as exc:
            cause = exc.__cause__
            if isinstance(cause, errors.ApiError) and cause.code in (400, 404, 422):
                return None  # the apiserver refused the token itself (malformed)
            raise AuthError(f"TokenReview failed: {exc}") from exc
        status: dict[str, Any] = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        info = status.get("user") or {}
        return User(
            name=str(info.get("username", "")),
            groups=tuple(info.get("groups") or ()),
            uid=str(info.get("uid", "")),
            extra={k: tuple(v) for k, v in (info.get("extra") or {}).items()},
        )


@dataclass(frozen=True, kw_only=True)
class Attributes:
    """What a request asks to do, as a SubjectAccessReview's spec says it
    (authorization.k8s.io/v1): a resource (`resource` set) or a non-resource URL (`path`)."""

    verb: str
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""
    """A non-resource URL ("/metrics"), when `resource` is empty."""

    def spec(self) -> dict[str, Any]:
        """The review's resourceAttributes or nonResourceAttributes."""
        if self.resource:
            return {
                "resourceAttributes": {
                    "verb": self.verb,
                    "resource": self.resource,
                    "subresource": self.subresource,
                    "name": self.name,
                }
            }
        return {"nonResourceAttributes": {"verb": self.verb, "path": self.path}}

    def __str__(self) -> str:
        if self.resource:
            sub = f"/{self.subresource}" if self.subresource else ""
            return f"verb={self.verb}, resource={self.resource}{sub}, name={self.name}"
        return f"verb={self.verb}, path={self.path}"


class Authorizer:
    """Asks the upper cluster whether a user may do what `Attributes` say."""

    def __init__(
        self,
        upper: ApiClient,
        *,
        gate: ReviewGate,
        allowed_ttl: float = 300.0,
        denied_ttl: float = 30.0,
    ) -> None:
        """`upper` answers SubjectAccessReviews, through `gate`; an allowing answer is
        reused `allowed_ttl` seconds, a denying one `denied_ttl` (0: never; the kubelet's
        --authorization-webhook-cache-authorized-ttl / -unauthorized-ttl)."""
        self._upper = upper
        self._gate = gate
        self._allowed: TTLCache[tuple[Any, ...], bool] = _cache(allowed_ttl)
        self._denied: TTLCache[tuple[Any, ...], bool] = _cache(denied_ttl)

    async def allowed(
        self,
        user: User,
        attributes: Attributes,
        *,
        alive: Callable[[], bool] = _always_alive,
    ) -> bool:
        """Tell whether `user` may; raises what `ReviewGate.review` raises when the upper
        cluster does not say."""
        extra = tuple(sorted((k, tuple(v)) for k, v in user.extra.items()))
        key = (user.name, user.groups, user.uid, extra, attributes)
        if key in self._allowed:
            return True
        if key in self._denied:
            return False
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "groups": list(user.groups),
                "uid": user.uid,
                "extra": {k: list(v) for k, v in user.extra.items()},
                **attributes.spec(),
            },
        }
        try:
            review = await self._gate.review(
                self._upper, "/apis/authorization.k8s.io/v1/subjectaccessreviews", body, alive=alive
            )
        except AuthUnavailable as exc:
            raise AuthUnavailable(f"SubjectAccessReview failed: {exc}") from exc
        except AuthError as exc:
            raise AuthError(f"SubjectAccessReview failed: {exc}") from exc
        allowed = bool((review.get("status") or {}).get("allowed"))
        (self._allowed if allowed else self._denied)[key] = True
        return allowed


_CACHE_SIZE = 4096
"""Answers kept per cache: hostile callers with ever new tokens evict, never grow it."""


class _Uncached(TTLCache[Any, Any]):
    """The cache of a lifetime 0 (the kubelet's flags: no caching): it keeps nothing."""

    def __setitem__(self, key: Any, value: Any, cache_setitem: Any = None) -> None:
        return


def _cache(ttl: float) -> TTLCache[Any, Any]:
    """Return a cache of answers kept `ttl` seconds (0: none kept)."""
    return TTLCache(maxsize=_CACHE_SIZE, ttl=ttl) if ttl > 0 else _Uncached(maxsize=1, ttl=1)
