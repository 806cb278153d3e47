"""Who may call the kubelet API, decided as a kubelet decides (kubelet authn/authz docs,
pkg/kubelet/server/auth.go): the callers are authenticated as `tensile.serving.auth` does
for every program (client certificate from APISERVER_CA_CERT_LOCATION, else a bearer token
through a TokenReview, else `system:anonymous` with --anonymous-auth, else 401), then a
SubjectAccessReview on `nodes/<node>` with the verb of the HTTP method and the subresources
of the path (`subresources`).
"""

from __future__ import annotations

from tensile.serving.auth import (
    ANONYMOUS,
    Abandoned,
    Attributes,
    Authenticator,
    AuthError,
    Authorizer,
    AuthUnavailable,
    Busy,
    ReviewGate,
    Unauthenticated,
    User,
    user_from_certificate,
    verb,
)

__all__ = [
    "ANONYMOUS",
    "Abandoned",
    "Attributes",
    "AuthError",
    "AuthUnavailable",
    "Authenticator",
    "Authorizer",
    "Busy",
    "ReviewGate",
    "Unauthenticated",
    "User",
    "attributes",
    "subresources",
    "user_from_certificate",
    "verb",
]

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
    metrics (/metrics and /metrics/resource), logs and checkpoint have their own;
    everything else (exec, attach, port-forward, container logs, run) is `nodes/proxy` only.
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


def attributes(*, node_name: str, method: str, path: str) -> list[Attributes]:
    """Return what a request of `method` on kubelet `path` of node `node_name` is
    authorized as, one `Attributes` per subresource, in order (pure)."""
    the_verb = verb(method)
    return [
        Attributes(verb=the_verb, resource="nodes", subresource=sub, name=node_name)
        for sub in subresources(path)
    ]
