"""Upper ServiceAccount tokens for lower pods (--enable-serviceaccount with --upper-api-address),
as pure decisions: what to ask the upper TokenRequest API for, the Secret below that holds
the answers, the lower pod's volume and env that use it, whose Secret and lower pod may
have them, and when to ask again.

tensile-kube copied an upper ServiceAccount's token Secret below so that pods there (Spark
drivers, MPI launchers, operators) could call the upper API; Kubernetes >= 1.24 makes no such
Secrets, and a copied long-lived credential outlives its pod. Here the lower pod gets what
the upper kubelet would have given it: for each `serviceAccountToken` source of the volume
the upper ServiceAccount admission injected (`kube-api-access-*`), a token of the pod's
upper ServiceAccount bound to the upper pod (TokenRequest with `boundObjectRef`; audience
and expiry as the source asks, never the 3607 s kube-apiserver extends to a year: see
`asks`), refreshed at `refresh_fraction` (80 %, the kubelet's rule,
pkg/kubelet/token/token_manager.go) of the life the token itself states, kept in the Secret
`secret_name(pod, upper UID)` below, owned by the lower pod (so the lower garbage collector
removes it with the pod). The lower pod mounts it where the injected volume was mounted,
with the upper cluster's CA (`ca.crt`) and namespace beside it, and its containers get
KUBERNETES_SERVICE_HOST/PORT of the upper apiserver as the lower pods reach it
(--upper-api-address). A token bound to the upper pod stops working once that pod is gone.

Only the sources the admission injects are rewritten (`injected_source`); any other source
of such a volume is an ordinary reference, copied from upstairs like any other
(`translate.references`). Secret names starting with `SECRET_PREFIX` are the node's own:
a pod that names one is refused (`reserved_secret`), and none is ever copied from upstairs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import (
    annotations_of,
    as_list,
    as_mapping,
    dicts_in,
    labels_of,
    meta_of,
)

DEFAULT_EXPIRATION = 3607
"""Seconds a token lives when the projected source names no expiry (the ServiceAccount
admission's default for kube-api-access volumes)."""
EXTENDED_EXPIRATION = 3607
"""The life (seconds) kube-apiserver extends: a pod-bound TokenRequest for exactly this
long, for the apiserver's own audiences, is given a token valid for a year while
--service-account-extend-token-expiration is on, its default (kube-apiserver
pkg/registry/core/serviceaccount/storage/token.go, `WarnOnlyBoundTokenExpirationSeconds`;
the answer's expirationTimestamp still says 3607 s). Kubelets ask for it so that old
clients that never re-read their token keep working; the node asks for `ASKED_INSTEAD`."""
ASKED_INSTEAD = 3600
"""Seconds asked for in place of `EXTENDED_EXPIRATION`: an hour, which is not extended."""
MIN_EXPIRATION = 600
"""The TokenRequest API refuses shorter lives (seconds)."""
RENEWAL_FLOOR = 60.0
"""Seconds a token is kept at least before it is asked for again, whatever its life and the
refresh fraction say (a token that states a life of nothing is not asked for in a loop)."""
RENEWAL_CEILING = 24 * 3600.0
"""Seconds after which a token is asked for again at the latest (the kubelet's rule)."""
SECRET_PREFIX = "tensile-token-"  # noqa: S105 - a name prefix, not a credential
SECRET_TYPE = "tensile.io/serviceaccount-token"  # noqa: S105
"""The lower Secret's type: not kubernetes.io/service-account-token, which the lower token
controller would claim."""
CA_KEY = "ca.crt"
NAMESPACE_KEY = "namespace"
EXPIRES_ANNOTATION = "tensile.io/token-expires"
"""On the lower Secret: the earliest expiry of its tokens (their `exp` claim), RFC 3339."""
ROOT_CA = "kube-root-ca.crt"
"""The ConfigMap the ServiceAccount admission projects `ca.crt` from."""
_TOKEN_VOLUME_PREFIX = "kube-api-access-"  # noqa: S105
_NAME_MAX = 253
_DIGEST = 16
"""Hex digits of the upper pod's UID digest in the Secret's name."""


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


def secret_name(pod_name: str, upper_uid: str) -> str:
    """The lower Secret holding the tokens of lower pod `pod_name`, made for the upper pod
    of UID `upper_uid`: `tensile-token-<pod>-<digest of both>` (a valid Secret name; a long
    pod name is cut). The UID in it makes the name unknown until the upper pod exists, so
    nobody below can take it before the node (see `UpperTokens.prepare`), and a later pod of
    the same name never meets the Secret of an earlier one."""
    digest = hashlib.sha256(f"{pod_name}/{upper_uid}".encode()).hexdigest()[:_DIGEST]
    room = _NAME_MAX - len(SECRET_PREFIX) - _DIGEST - 1
    # A cut name may end in "." or "-", which may not precede "-" in a DNS subdomain.
    return f"{SECRET_PREFIX}{pod_name[:room].rstrip('.-')}-{digest}"


def reserved_secret(names: Iterable[str]) -> str | None:
    """Return why a pod referencing the Secrets `names` is refused, or None: a name starting
    with `SECRET_PREFIX` would resolve, below, to the token Secret of another pod (or be
    copied over one)."""
    for name in sorted(names):
        if name.startswith(SECRET_PREFIX):
            return (
                f"the pod references Secret {name}: names starting with {SECRET_PREFIX} are "
                "the virtual nodes' ServiceAccount token Secrets below, never copied from "
                "upstairs nor mounted for another pod"
            )
    return None


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
    its injected volumes, in order: the life the source asks for, raised to the API's
    minimum, and `ASKED_INSTEAD` for `EXTENDED_EXPIRATION` (the default), which the upper
    apiserver would turn into a year."""
    found: list[TokenAsk] = []
    for volume in token_volumes(pod):
        for source in _sources(volume):
            token = as_mapping(source.get("serviceAccountToken"))
            if not token:
                continue
            path = str(token.get("path") or "token")
            expiration = token.get("expirationSeconds")
            seconds = expiration if isinstance(expiration, int) else DEFAULT_EXPIRATION
            if seconds == EXTENDED_EXPIRATION:
                seconds = ASKED_INSTEAD
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


def injected_source(source: Mapping[str, Any]) -> bool:
    """Tell whether `source`, one source of a `kube-api-access-*` volume, is one the upper
    ServiceAccount admission injects (plugin/pkg/admission/serviceaccount): the
    `serviceAccountToken`, `ca.crt` of ConfigMap kube-root-ca.crt, or the downward API's
    `metadata.namespace`. Only these are rewritten below; any other source (a Secret, a
    ConfigMap, other downward API fields) is the pod's own, resolved as anywhere else."""
    if "serviceAccountToken" in source:
        return True
    config_map = as_mapping(source.get("configMap"))
    if config_map:
        items = dicts_in(config_map.get("items"))
        return (
            len(source) == 1
            and config_map.get("name") == ROOT_CA
            and bool(items)
            and all(i.get("key") == CA_KEY for i in items)
        )
    downward = as_mapping(source.get("downwardAPI"))
    if downward:
        items = dicts_in(downward.get("items"))
        return (
            len(source) == 1
            and bool(items)
            and all(
                as_mapping(i.get("fieldRef")).get("fieldPath") == "metadata.namespace"
                and set(i) <= {"path", "fieldRef", "mode"}
                for i in items
            )
        )
    return False


def lower_volume(volume: Mapping[str, Any], *, secret: str, upper_ca: bool) -> dict[str, Any]:
    """The lower pod's replacement for an injected token volume: the same name, mode and
    files, the injected sources (`injected_source`) read from the lower Secret `secret`:
    its tokens, `ca.crt` (the upper CA) when `upper_ca` (else the lower namespace's
    kube-root-ca.crt as before) and the upper namespace (below, the downward API would say
    the lower one). Every other source is kept as it is: `translate.lower_pod` then treats
    it as any reference (copied from upstairs, or left out when optional and absent)."""
    projected = as_mapping(volume.get("projected"))
    sources: list[dict[str, Any]] = []
    for source in _sources(volume):
        token = as_mapping(source.get("serviceAccountToken"))
        if not injected_source(source):
            sources.append(dict(source))
        elif token:
            path = str(token.get("path") or "token")
            key = _key(f"{volume.get('name')}.{path}")
            sources.append({"secret": {"name": secret, "items": [{"key": key, "path": path}]}})
        elif "configMap" in source and upper_ca:
            items = dicts_in(as_mapping(source.get("configMap")).get("items"))
            paths = [{"key": CA_KEY, "path": str(i.get("path"))} for i in items]
            sources.append({"secret": {"name": secret, "items": paths}})
        elif "downwardAPI" in source:
            items = dicts_in(as_mapping(source.get("downwardAPI")).get("items"))
            paths = [{"key": NAMESPACE_KEY, "path": str(i.get("path")), **_mode(i)} for i in items]
            sources.append({"secret": {"name": secret, "items": paths}})
        else:
            sources.append(dict(source))
    result: dict[str, Any] = {"name": volume.get("name"), "projected": {"sources": sources}}
    if "defaultMode" in projected:
        result["projected"]["defaultMode"] = projected["defaultMode"]
    return result


def _mode(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"mode": item["mode"]} if "mode" in item else {}


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
    upper_uid: str,
    upper_namespace: str,
    owner: ownership.NodeIdentity,
    tokens: Mapping[str, str],
    expires: str | None,
    ca: str | None,
    lower_pod: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The lower token Secret of the upper pod of UID `upper_uid`: `tokens` (key -> token),
    `ca` when given, the upper namespace; `expires` (RFC 3339) their earliest expiry; the
    owner's annotations (not its labels, which the copies' mirrors select on: this Secret
    is no copy of an upper one), the upper pod's UID; owned by lower pod `lower_pod` (its
    metadata: name, uid) when given. Without tokens and owner, the placeholder made before
    the lower pod (`UpperTokens.prepare`)."""
    data = {**tokens, NAMESPACE_KEY: upper_namespace}
    if ca is not None:
        data[CA_KEY] = ca
    _, marks = ownership.owner_marks(owner)
    annotations = {
        **marks,
        ownership.UPPER_NAMESPACE_ANNOTATION: upper_namespace,
        ownership.UPPER_UID_ANNOTATION: upper_uid,
    }
    if expires is not None:
        annotations[EXPIRES_ANNOTATION] = expires
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations}
    if lower_pod is not None:
        meta["ownerReferences"] = [pod_owner(lower_pod)]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE,
        "metadata": meta,
        "stringData": data,
    }


def pod_owner(lower_pod: Mapping[str, Any]) -> dict[str, Any]:
    """The owner reference naming `lower_pod` (its metadata's name and uid)."""
    meta = meta_of(lower_pod)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": False,
        "blockOwnerDeletion": False,
    }


def token_secret_problem(
    found: Mapping[str, Any],
    *,
    owner: ownership.NodeIdentity,
    upper_uid: str,
    pod_name: str,
) -> str | None:
    """Return why the lower Secret `found` (of the name `secret_name` wants) is not this
    node's token Secret of the upper pod of UID `upper_uid`, or None when it is: of this
    type, with this node's annotations and not its labels (a copy of an upper Secret has
    them: a tenant can write an upper Secret of any type and annotations), made for that
    upper pod, and owned by nothing or by lower pods of name `pod_name` only (the pod the
    node made, or an earlier one of the node's for the same upper pod, which the lower
    garbage collector would otherwise take the Secret with). Only such a Secret is written
    or mounted."""
    annotations = annotations_of(found)
    labels = labels_of(found)
    owners = [as_mapping(o) for o in as_list(meta_of(found).get("ownerReferences"))]
    if found.get("type") != SECRET_TYPE:
        return f"it is of type {found.get('type') or 'Opaque'}, not {SECRET_TYPE}"
    if (
        annotations.get(ownership.NODE_ANNOTATION) != owner.node_name
        or annotations.get(ownership.CLUSTER_ANNOTATION) != owner.cluster_id
    ):
        return ownership.owner_of(found)
    if any(key in labels for key in ownership.OWNERSHIP_LABELS):
        return "it is a copy of an upper Secret"
    if annotations.get(ownership.UPPER_UID_ANNOTATION) != upper_uid:
        return "it was made for another upper pod"
    if any(o.get("kind") != "Pod" or o.get("name") != pod_name for o in owners):
        return "it is owned by another object"
    return None


def renewal_ends(
    upper_pod: Mapping[str, Any],
    *,
    upper_uid: str,
    node_name: str,
    lower_pod_problem: str | None,
) -> str | None:
    """Why the tokens of the lower pod made for the upper pod of UID `upper_uid` are asked
    for no more, given `upper_pod` (that name's pod now) and what is wrong with the lower
    pod (`lower_pod_problem`, None: it is the one the node made), or None to renew. They
    end with the pod, as the kubelet's do: once the upper pod is deleting or another pod of
    that name, once it has finished (Succeeded or Failed: nothing in it runs to use a
    token), once it is not bound to this node `node_name` (the Node authorizer's rule: a
    node gets tokens of the pods bound to it only), and once the lower pod is not the
    node's."""
    meta = meta_of(upper_pod)
    if meta.get("deletionTimestamp"):
        return "the upper pod is going"
    if meta.get("uid") != upper_uid:
        return "the upper pod of that name is another one"
    bound = as_mapping(upper_pod.get("spec")).get("nodeName")
    if bound != node_name:
        return f"the upper pod is bound to {bound or 'no node'}, not to {node_name}"
    phase = as_mapping(upper_pod.get("status")).get("phase")
    if phase in ("Succeeded", "Failed"):
        return f"the upper pod has finished ({phase})"
    return lower_pod_problem


def lower_pod_problem(
    found: Mapping[str, Any] | None,
    *,
    owner: ownership.NodeIdentity,
    upper_uid: str,
    lower_uid: str | None,
    issued: bool,
) -> str | None:
    """Return why `found`, the lower pod at the key the upper pod of UID `upper_uid` maps to
    (None: no pod there), is not the one the node made for it, or None when it may be:
    with this node's marks and that upper UID, and of UID `lower_uid` (what the lower
    apiserver answered the node's create; after a restart, what the node first saw there;
    None: not known yet). A pod just created may not be cached yet: a missing pod ends the
    tokens only once they were `issued`."""
    if found is None:
        return "the lower pod is gone" if issued else None
    if not ownership.is_owned(found, owner=owner):
        return "the lower pod of that name is not this node's"
    if ownership.upper_uid_of(found) != upper_uid:
        return "the lower pod of that name stands for another upper pod"
    if lower_uid is not None and meta_of(found).get("uid") != lower_uid:
        return "the lower pod of that name is not the one this node made"
    return None


def token_times(token: str) -> tuple[float, float] | None:
    """Return the (`iat`, `exp`) claims of a JWT `token` (seconds since the epoch), or None
    when it is not a JWT with both as numbers. The signature is not checked: the token came
    from the upper apiserver over TLS, and only its own statement of its life is read
    (the TokenRequest's expirationTimestamp understates an extended one)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None
    if not isinstance(claims, dict):
        return None
    issued, expires = claims.get("iat"), claims.get("exp")
    numbers = (int, float)
    if (
        not isinstance(issued, numbers)
        or not isinstance(expires, numbers)
        or isinstance(issued, bool)
        or isinstance(expires, bool)
    ):
        return None
    return float(issued), float(expires)


def refresh_after(*, life: float, fraction: float) -> float:
    """Seconds after its issue to ask for a token of `life` seconds again: at `fraction`
    of its life (the kubelet renews at 80 %, or after 24 h, whichever is first), never
    sooner than `RENEWAL_FLOOR`."""
    return max(RENEWAL_FLOOR, min(max(0.0, life) * fraction, RENEWAL_CEILING))


def node_identity_problem(review: Mapping[str, Any], *, node_name: str) -> str | None:
    """Return why the SelfSubjectReview `review` of the --upper-token-kubeconfig's
    credentials shows no identity of node `node_name`, or None: the user must be
    `system:node:<node_name>` in group `system:nodes`, whom the Node authorizer and the
    NodeRestriction admission let ask only for tokens bound to pods bound to that node
    (kubernetes.io/docs "Using Node Authorization")."""
    user = as_mapping(as_mapping(review.get("status")).get("userInfo"))
    name, groups = user.get("username"), as_list(user.get("groups"))
    want = f"system:node:{node_name}"
    if name == want and "system:nodes" in groups:
        return None
    return (
        f"--upper-token-kubeconfig authenticates as {name!r} (groups {groups}); it must be "
        f"this node's identity {want} in group system:nodes"
    )


def _sources(volume: Mapping[str, Any]) -> list[dict[str, Any]]:
    return dicts_in(as_mapping(volume.get("projected")).get("sources"))


def _key(text: str) -> str:
    """A valid Secret data key ([-._a-zA-Z0-9]+) standing for `text`."""
    return "".join(c if c.isalnum() or c in "-._" else "-" for c in text)
