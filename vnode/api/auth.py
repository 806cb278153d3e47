"""Who may call the kubelet API, decided as a kubelet decides (kubelet authn/authz docs).

Authentication: a client certificate, verified by TLS against the upper cluster's CA when
one is presented (user = CN, groups = O; kube-apiserver's kubelet client certificate);
otherwise a bearer token, checked with a TokenReview; otherwise `system:anonymous` with
--anonymous-auth, else 401. Authorization: a
SubjectAccessReview on `nodes/<node>` with the verb of the HTTP method and the subresources
of the path (see `subresources`). Answers are cached: tokens 2 min, allow 5 min,
deny 30 s.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache
from cryptography import x509
from cryptography.x509.oid import NameOID

from vnode.kube import errors
from vnode.kube.client import ApiClient

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
    """The upper cluster could not answer a TokenReview or SubjectAccessReview (answer 500)."""


_FINE_GRAINED = (
    ("/pods", "pods"),
    ("/runningpods", "pods"),
    ("/healthz", "healthz"),
    ("/configz", "configz"),
    ("/statusz", "statusz"),
)


def subresources(path: str) -> tuple[str, ...]:
    """Return the `nodes` subresources a kubelet path is authorized as, in order (pure).

    One of them allowed is enough. Fine-grained kubelet authorization (KEP-2862, GA in
    Kubernetes 1.36) checks `nodes/pods` for /pods and /runningpods/, `nodes/healthz`,
    `nodes/configz` and `nodes/statusz` first, then falls back to `nodes/proxy`; stats,
    metrics, logs and checkpoint have their own; everything else (exec, attach,
    port-forward, container logs, run) is `nodes/proxy` only.
    """
    for prefix, name in (
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/checkpoint", "checkpoint"),
    ):
        if _under(path, prefix):
            return (name,)
    for prefix, name in _FINE_GRAINED:
        if _under(path, prefix):
            return (name, "proxy")
    return ("proxy",)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


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

    def __init__(self, upper: ApiClient, *, anonymous: bool = False) -> None:
        """`anonymous`: a request without credentials is ANONYMOUS instead of 401 (the
        kubelet's --anonymous-auth)."""
        self._upper = upper
        self._anonymous = anonymous
        self._tokens: TTLCache[str, User | None] = TTLCache(maxsize=4096, ttl=120)

    async def authenticate(
        self, *, ssl_object: ssl.SSLObject | None, authorization: str | None
    ) -> User:
        """Return the caller. Raises Unauthenticated (401) or AuthError (500)."""
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
            user = await self._review(token)
            self._tokens[token] = user
            if user is None:
                raise Unauthenticated("invalid bearer token")
            return user
        if self._anonymous and not authorization:
            return ANONYMOUS
        raise Unauthenticated("no client certificate or bearer token")

    async def _review(self, token: str) -> User | None:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            review = await self._upper.request(
                "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body
            )
        except errors.ApiError as exc:
            if exc.code in (400, 404, 422):
                return None  # the apiserver refused the token itself (malformed)
            raise AuthError(f"TokenReview failed: {exc}") from exc
        except Exception as exc:
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


class Authorizer:
    """Asks the upper cluster whether a user may do a verb on nodes/<node>/<subresource>."""

    def __init__(self, upper: ApiClient, *, node_name: str) -> None:
        self._upper = upper
        self._node = node_name
        self._allowed: TTLCache[tuple[Any, ...], bool] = TTLCache(maxsize=4096, ttl=300)
        self._denied: TTLCache[tuple[Any, ...], bool] = TTLCache(maxsize=4096, ttl=30)

    async def allowed(self, user: User, *, verb: str, subresource: str) -> bool:
        """Tell whether `user` may; raises AuthError if the upper cluster cannot say."""
        extra = tuple(sorted((k, tuple(v)) for k, v in user.extra.items()))
        key = (user.name, user.groups, user.uid, extra, verb, subresource)
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
                "resourceAttributes": {
                    "verb": verb,
                    "resource": "nodes",
                    "subresource": subresource,
                    "name": self._node,
                },
            },
        }
        try:
            review = await self._upper.request(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body
            )
        except Exception as exc:
            raise AuthError(f"SubjectAccessReview failed: {exc}") from exc
        allowed = bool((review.get("status") or {}).get("allowed"))
        (self._allowed if allowed else self._denied)[key] = True
        return allowed
