"""Upper ServiceAccount tokens for lower pods (--enable-serviceaccount with --upper-api-address),
as pure decisions: what to ask the upper TokenRequest API for, the Secret below that holds
the answers, the lower pod's volume and env that use it, and when to ask again.

tensile-kube copied an upper ServiceAccount's token Secret below so that pods there (Spark
drivers, MPI launchers, operators) could call the upper API; Kubernetes >= 1.24 makes no such
Secrets, and a copied long-lived credential outlives its pod. Here the lower pod gets what
the upper kubelet would have given it: for each `serviceAccountToken` source of the volume
the upper ServiceAccount admission injected (`kube-api-access-*`), a token of the pod's
upper ServiceAccount bound to the upper pod (TokenRequest with `boundObjectRef`; audience
and expiry as the source asks, expiry 3607 s when it names none), refreshed at
`refresh_fraction` (80 %, the kubelet's rule, pkg/kubelet/token/token_manager.go) of its life,
kept in the Secret `secret_name(pod)` below, owned by the lower pod (so the lower garbage
collector removes it with the pod). The lower pod mounts it where the injected volume was
mounted, with the upper cluster's CA (`ca.crt`) and namespace beside it, and its containers
get KUBERNETES_SERVICE_HOST/PORT of the upper apiserver as the lower pods reach it
(--upper-api-address). A token bound to the upper pod stops working once that pod is gone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import annotations_of, as_mapping, dicts_in, meta_of

DEFAULT_EXPIRATION = 3607
"""Seconds a token lives when the projected source names no expiry (the ServiceAccount
admission's default for kube-api-access volumes)."""
MIN_EXPIRATION = 600
"""The TokenRequest API refuses shorter lives (seconds)."""
SECRET_PREFIX = "tensile-token-"  # noqa: S105 - a name prefix, not a credential
SECRET_TYPE = "tensile.io/serviceaccount-token"  # noqa: S105
"""The lower Secret's type: not kubernetes.io/service-account-token, which the lower token
controller would claim."""
CA_KEY = "ca.crt"
NAMESPACE_KEY = "namespace"
EXPIRES_ANNOTATION = "tensile.io/token-expires"
"""On the lower Secret: the earliest expiry of its tokens, RFC 3339."""
_TOKEN_VOLUME_PREFIX = "kube-api-access-"  # noqa: S105
_NAME_MAX = 253


@dataclass(frozen=True, kw_only=True)
class TokenAsk:
    """One token a lower pod needs: the Secret key it is kept under, and what to ask for."""

    key: str
    """Key in the lower Secret (the projected source's path, made a valid key)."""
    path: str
    """Where it appears in the volume (the source's `path`)."""
    audience: str
    """"" for the upper apiserver's own audiences."""
    expiration: int
    """Seconds."""


def secret_name(pod_name: str) -> str:
    """The lower Secret holding the tokens of lower pod `pod_name` (a valid Secret name:
    long pod names are shortened with a digest)."""
    name = SECRET_PREFIX + pod_name
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:16]
    return f"{name[: _NAME_MAX - 17]}-{digest}"


def token_volumes(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The volumes of `pod` the upper ServiceAccount admission injected (kube-api-access-*
    with a serviceAccountToken source)."""
    return [
        v
        for v in dicts_in(as_mapping(pod.get("spec")).get("volumes"))
        if str(v.get("name") or "").startswith(_TOKEN_VOLUME_PREFIX)
        and any("serviceAccountToken" in s for s in _sources(v))
    ]


def asks(pod: Mapping[str, Any]) -> list[TokenAsk]:
    """The tokens the lower pod of upper `pod` needs, one per serviceAccountToken source of
    its injected volumes (expiry raised to the API's minimum), in order."""
    found: list[TokenAsk] = []
    for volume in token_volumes(pod):
        for source in _sources(volume):
            token = as_mapping(source.get("serviceAccountToken"))
            if not token:
                continue
            path = str(token.get("path") or "token")
            expiration = token.get("expirationSeconds")
            seconds = expiration if isinstance(expiration, int) else DEFAULT_EXPIRATION
            found.append(
                TokenAsk(
                    key=_key(f"{volume.get('name')}.{path}"),
                    path=path,
                    audience=str(token.get("audience") or ""),
                    expiration=max(MIN_EXPIRATION, seconds),
                )
            )
    return found


def token_request(ask: TokenAsk, *, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The TokenRequest body for `ask`, bound to upper `pod` (name and UID)."""
    meta = meta_of(pod)
    spec: dict[str, Any] = {
        "expirationSeconds": ask.expiration,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
    }
    if ask.audience:
        spec["audiences"] = [ask.audience]
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def service_account(pod: Mapping[str, Any]) -> str:
    """The upper pod's ServiceAccount (`default` when it names none, as Kubernetes)."""
    spec = as_mapping(pod.get("spec"))
    return str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")


def lower_volume(volume: Mapping[str, Any], *, secret: str, upper_ca: bool) -> dict[str, Any]:
    """The lower pod's replacement for an injected token volume: the same name, mode and
    files, its tokens read from the lower Secret `secret`; `ca.crt` from that Secret too
    (the upper CA) when `upper_ca`, else the lower namespace's kube-root-ca.crt as before;
    the downward API source (the namespace) kept."""
    projected = as_mapping(volume.get("projected"))
    sources: list[dict[str, Any]] = []
    for source in _sources(volume):
        token = as_mapping(source.get("serviceAccountToken"))
        if token:
            path = str(token.get("path") or "token")
            key = _key(f"{volume.get('name')}.{path}")
            sources.append({"secret": {"name": secret, "items": [{"key": key, "path": path}]}})
        elif upper_ca and as_mapping(source.get("configMap")).get("name") == "kube-root-ca.crt":
            items = as_mapping(source.get("configMap")).get("items") or [
                {"key": CA_KEY, "path": CA_KEY}
            ]
            paths = [{"key": CA_KEY, "path": str(i.get("path"))} for i in dicts_in(items)]
            sources.append({"secret": {"name": secret, "items": paths}})
        else:
            sources.append(dict(source))
    result: dict[str, Any] = {"name": volume.get("name"), "projected": {"sources": sources}}
    if "defaultMode" in projected:
        result["projected"]["defaultMode"] = projected["defaultMode"]
    return result


def service_env(address: str) -> list[dict[str, str]]:
    """KUBERNETES_SERVICE_HOST/PORT for `address` ("host:port", IPv6 in brackets)."""
    host, _, port = address.rpartition(":")
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": host.strip("[]")},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]


def secret(
    *,
    name: str,
    namespace: str,
    tokens: Mapping[str, str],
    expires: str,
    ca: str | None,
    upper_namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    owner: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The lower Secret: `tokens` (key -> token), `ca` when given, the upper namespace;
    `expires` (RFC 3339) their earliest expiry; owned by lower pod `owner` (its metadata:
    name, uid) when given."""
    data = {**tokens, NAMESPACE_KEY: upper_namespace}
    if ca is not None:
        data[CA_KEY] = ca
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "annotations": {**annotations, EXPIRES_ANNOTATION: expires},
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner.get("name"),
                "uid": owner.get("uid"),
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE,
        "metadata": meta,
        "stringData": data,
    }


def is_token_secret(secret: Mapping[str, Any], *, cluster_id: str) -> bool:
    """Tell whether lower `secret` is a token Secret written for a virtual node of upper
    cluster `cluster_id` (this type, that cluster's annotation): the only Secrets the token
    writer may take over when the name it wants is taken."""
    annotations = annotations_of(secret)
    return (
        secret.get("type") == SECRET_TYPE
        and annotations.get(ownership.CLUSTER_ANNOTATION) == cluster_id
    )


def renewal_ends(
    upper_pod: Mapping[str, Any], *, upper_uid: str, lower_pod_there: bool
) -> str | None:
    """Why the tokens of the lower pod made for the upper pod of UID `upper_uid` are asked
    for no more, given `upper_pod` (that name's pod now) and whether the lower pod is still
    there, or None to renew. They end with the pod, as the kubelet's do: once the upper pod
    is deleting or another pod of that name, once it has finished (Succeeded or Failed:
    nothing in it runs to use a token), and once the lower pod is gone."""
    meta = meta_of(upper_pod)
    if meta.get("deletionTimestamp"):
        return "the upper pod is going"
    if meta.get("uid") != upper_uid:
        return "the upper pod of that name is another one"
    phase = as_mapping(upper_pod.get("status")).get("phase")
    if phase in ("Succeeded", "Failed"):
        return f"the upper pod has finished ({phase})"
    if not lower_pod_there:
        return "the lower pod is gone"
    return None


def refresh_at(*, issued: float, expires: float, fraction: float) -> float:
    """When to ask again (seconds, same clock): at `fraction` of the token's life (the
    kubelet renews at 80 %, or after 24 h, whichever is first)."""
    life = max(0.0, expires - issued)
    return issued + min(life * fraction, 24 * 3600.0)


def _sources(volume: Mapping[str, Any]) -> list[dict[str, Any]]:
    return dicts_in(as_mapping(volume.get("projected")).get("sources"))


def _key(text: str) -> str:
    """A valid Secret data key ([-._a-zA-Z0-9]+) standing for `text`."""
    return "".join(c if c.isalnum() or c in "-._" else "-" for c in text)
