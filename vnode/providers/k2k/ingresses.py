"""Upper Ingresses, as they are mirrored below with --enable-ingress (pure).

An Ingress below routes the lower cluster's traffic to the Services its backends name, by
name, in its own namespace (networking.k8s.io/v1 IngressBackend). Whatever Service holds
that name below receives it. So an Ingress is copied only when every backend (each rule
path's and the `defaultBackend`) names a Service whose lower copy is this upper cluster's
copy of that very upper Service: the ownership marks of this node or a sibling made for the
same upper key, and the upper Service's UID (`endpointslices.copy_serves`, the rule the
EndpointSlices follow). A backend naming anything else (a Service that is not copied, the
lower cluster's own Service of that name, a `resource` backend) is never referenced below:
the Ingress is not copied, a copy already below is deleted, and the upper Ingress gets a
Warning Event naming the backend (`judge`, `Verdict.reason`).

The class is the lower administrator's choice (which controller serves a tenant's Ingress
below, and so which addresses it gets): `spec.ingressClassName` is mapped by
--ingress-class-map UPPER=LOWER; an Ingress of a class the map does not name, or of none,
is not copied and says so in an Event (the `kubernetes.io/ingress.class` annotation is not
read: it is deprecated, and the class below is the map's).

TLS Secrets (`spec.tls[].secretName`) are dependencies like a pod's: copied by the node's
Secret mirror (`dependencies.DependencySync`) while an Ingress that is otherwise copied
needs them, under the same ownership rules (a lower Secret of that name that is not this
tenant's is never used or overwritten; a ServiceAccount token Secret is never copied). The
Ingress crosses once each of its Secrets' copy is below, so it never names a Secret
below that is not the tenant's.

Annotations configure the lower controller (rewrites, snippets, auth, whitelists), some of
them dangerous in a shared cluster (ingress-nginx's configuration snippets,
CVE-2021-25742): none travels unless --lower-ingress-annotations names it
(`podpolicy.annotation_allowed`, as --lower-service-annotations). The copied keys are
recorded on the copy (`services.COPIED_ANNOTATIONS`) so they go again when no longer
allowed, and the digest of the map and the allow-list (`services.POLICY_ANNOTATION`) lets a
sibling node under other settings leave the copy to its maker.

`status.loadBalancer` of the copy (written below by its controller) comes back up: each
node records its lower copy's addresses on the upper Ingress (`status_annotation`), and
the upper status is the union of what the nodes recorded, so the virtual nodes of several
lower clusters copying one Ingress do not write its status in turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import ownership, podpolicy
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    deletion_timestamp_of,
    meta_of,
    namespace_of,
)
from tensile.kube.mirror.spec import Change, KindSpec, Patch
from tensile.kube.resources import INGRESSES
from vnode.providers.k2k import dependencies, endpointslices, naming, services

STATUS_ANNOTATION_PREFIX = "ingress-status.tensile.io/"
"""+ `ownership.label_value(<virtual node>)`: on an upper Ingress, the JSON list of the
`status.loadBalancer.ingress` entries of that node's lower copy."""
REASON = "IngressNotCopied"
"""Reason of the Warning Event on an upper Ingress that is not copied below."""
JSON_PATCH = "application/json-patch+json"
_UNCOPIED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


@dataclass(frozen=True, kw_only=True)
class IngressPolicy:
    """--ingress-class-map and --lower-ingress-annotations."""

    classes: tuple[tuple[str, str], ...] = ()
    """UPPER=LOWER IngressClass names; an Ingress of another class is not copied."""
    annotations: tuple[str, ...] = ()
    """Annotation keys, or prefixes ending in `*` (`*`: all), copied below; none by default."""

    def lower_class(self, upper_class: str) -> str | None:
        """The lower class for `upper_class`, or None when the map does not name it."""
        return dict(self.classes).get(upper_class)

    @property
    def digest(self) -> str:
        """The digest of these settings (`podpolicy.digest`), recorded on every copy."""
        return podpolicy.digest(
            {"classes": frozenset(self.classes), "annotations": frozenset(self.annotations)}
        )


@dataclass(frozen=True, kw_only=True)
class Caches:
    """What `judge` reads besides the Ingress (read-only views, by key)."""

    upper_services: endpointslices.Lookup
    service_copies: endpointslices.Lookup
    """The lower Services of this upper cluster, by lower key."""
    upper_secrets: endpointslices.Lookup
    secret_copies: endpointslices.Lookup
    """The lower Secrets of this upper cluster, by lower key."""


@dataclass(frozen=True)
class Verdict:
    """What becomes of one upper Ingress."""

    wants: bool
    """Class mapped, every backend this tenant's copy, every TLS Secret copyable: its TLS
    Secrets are needed below."""
    crosses: bool
    """`wants`, and every TLS Secret's copy is below: the Ingress is copied."""
    reason: str | None = None
    """Why it is not copied (None when it is, or when it is being deleted)."""


def backends(ingress: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Yield every backend of `ingress`: its `defaultBackend`, then each rule path's."""
    spec = ingress.get("spec") or {}
    if isinstance(spec.get("defaultBackend"), dict):
        yield spec["defaultBackend"]
    for rule in spec.get("rules") or ():
        http = rule.get("http") if isinstance(rule, dict) else None
        for path in (http or {}).get("paths") or ():
            if isinstance(path, dict) and isinstance(path.get("backend"), dict):
                yield path["backend"]


def service_names(ingress: Mapping[str, Any]) -> list[str]:
    """The names of the Services `ingress`'s backends name, sorted, each once."""
    names = set()
    for backend in backends(ingress):
        service = backend.get("service")
        if isinstance(service, dict) and service.get("name"):
            names.add(str(service["name"]))
    return sorted(names)


def tls_secrets(ingress: Mapping[str, Any]) -> list[str]:
    """The names of the TLS Secrets of `ingress` (`spec.tls[].secretName`), sorted."""
    spec = ingress.get("spec") or {}
    return sorted(
        {
            str(t["secretName"])
            for t in spec.get("tls") or ()
            if isinstance(t, dict) and t.get("secretName")
        }
    )


def judge(  # noqa: PLR0911 - one answer per check
    ingress: Mapping[str, Any],
    *,
    caches: Caches,
    tenancy: naming.NodeTenancy,
    policy: IngressPolicy,
) -> Verdict:
    """Return what becomes of the upper `ingress` (see the module docstring). Reads
    `caches`; raises nothing on a malformed object (what cannot be verified is not
    copied)."""
    if deletion_timestamp_of(ingress):
        return Verdict(wants=False, crosses=False)
    node = tenancy.owner.node_name
    spec = ingress.get("spec") or {}
    upper_class = spec.get("ingressClassName")
    if not upper_class:
        return _refused(f"it names no ingressClassName; {_map_hint(node, policy)}")
    if policy.lower_class(str(upper_class)) is None:
        return _refused(f"its class {upper_class} is not mapped; {_map_hint(node, policy)}")
    namespace = namespace_of(ingress)
    for backend in backends(ingress):
        problem = _backend_problem(backend, namespace=namespace, caches=caches, tenancy=tenancy)
        if problem is not None:
            return _refused(
                f"{problem}; an Ingress is copied below only when every backend is a Service "
                f"virtual node {node} copied there, so it never routes to another Service"
            )
    for secret in tls_secrets(ingress):
        upper = caches.upper_secrets.get(f"{namespace}/{secret}")
        if upper is None:
            return _refused(f"its TLS Secret {secret} does not exist")
        if not dependencies.copyable(upper, kind="Secret"):
            return _refused(f"its TLS Secret {secret} is not copied below (a token Secret)")
    for secret in tls_secrets(ingress):
        key = f"{namespace}/{secret}"
        copy = caches.secret_copies.get(tenancy.target_key(key))
        if copy is None or not tenancy.same_tenant(copy) or tenancy.source_key(copy) != key:
            return Verdict(
                wants=True,
                crosses=False,
                reason=f"its TLS Secret {secret} has no copy of this tenant below (a lower "
                "Secret of that name that is not this tenant's is never used or overwritten)",
            )
    return Verdict(wants=True, crosses=True)


def _refused(reason: str) -> Verdict:
    return Verdict(wants=False, crosses=False, reason=reason)


def _map_hint(node: str, policy: IngressPolicy) -> str:
    mapped = ",".join(f"{u}={lower}" for u, lower in policy.classes) or "(none)"
    return f"virtual node {node} copies only the classes --ingress-class-map maps ({mapped})"


def _backend_problem(
    backend: Mapping[str, Any],
    *,
    namespace: str,
    caches: Caches,
    tenancy: naming.NodeTenancy,
) -> str | None:
    """Why `backend` may not be referenced below, or None when it names a Service this
    tenant copied there."""
    service = backend.get("service")
    if not isinstance(service, dict) or not service.get("name"):
        resource = backend.get("resource") or {}
        what = f"{resource.get('kind')} {resource.get('name')}" if resource else "nothing"
        return f"its backend {what} is not a Service"
    name = str(service["name"])
    key = f"{namespace}/{name}"
    upper = caches.upper_services.get(key)
    if upper is None or deletion_timestamp_of(upper):
        return f"its backend Service {name} does not exist upstairs"
    copy = caches.service_copies.get(tenancy.target_key(key))
    if not endpointslices.copy_serves(copy, upper_service=upper, tenancy=tenancy):
        whose = "holds no Service" if copy is None else "holds a Service that is not its copy"
        return f"its backend Service {name} is not this tenant's copy below (that name {whose})"
    return None


def lower_ingress(
    upper: Mapping[str, Any],
    *,
    owner: ownership.NodeIdentity,
    prefix: str,
    policy: IngressPolicy,
) -> Obj:
    """Return the lower Ingress standing for `upper` (see the module docstring): its class
    mapped (an unmapped one is left out: such an Ingress is never selected), its rules,
    default backend and TLS as they are (copies keep their names), its labels, the allowed
    annotations and this node's marks."""
    meta = meta_of(upper)
    spec = upper.get("spec") or {}
    labels, annotations = ownership.owner_marks(owner)
    annotations[ownership.UPPER_NAMESPACE_ANNOTATION] = str(meta.get("namespace"))
    annotations[ownership.UPPER_UID_ANNOTATION] = str(meta.get("uid"))
    annotations[services.POLICY_ANNOTATION] = policy.digest
    copied = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k not in annotations
        and k not in _UNCOPIED_ANNOTATIONS
        and not k.startswith(STATUS_ANNOTATION_PREFIX)
        and k != services.COPIED_ANNOTATIONS
        and podpolicy.annotation_allowed(k, policy.annotations)
    }
    if copied:
        annotations = {
            **copied,
            **annotations,
            services.COPIED_ANNOTATIONS: ",".join(sorted(copied)),
        }
    lower_spec: dict[str, Any] = {}
    lower_class = policy.lower_class(str(spec.get("ingressClassName") or ""))
    if lower_class is not None:
        lower_spec["ingressClassName"] = lower_class
    for field in ("defaultBackend", "tls", "rules"):
        if spec.get(field):
            lower_spec[field] = spec[field]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": meta.get("name"),
            "namespace": naming.lower_namespace(str(meta.get("namespace")), prefix=prefix),
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": annotations,
        },
        "spec": lower_spec,
    }


def _escape(key: str) -> str:
    """A JSON Pointer reference token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def compare_ingress(lower: Mapping[str, Any], desired: Mapping[str, Any]) -> Change:
    """Return how to bring a lower Ingress to `desired` (pure): a JSON patch (RFC 6902)
    setting its spec whole (a merge patch would merge a backend's old and new fields),
    exactly the desired labels, and the desired annotations, removing the copied ones no
    longer wanted (the lower cluster's own are left alone); None when equal."""
    ops: list[dict[str, Any]] = []
    if (lower.get("spec") or {}) != desired["spec"]:
        ops.append({"op": "add", "path": "/spec", "value": desired["spec"]})
    current_meta, desired_meta = meta_of(lower), meta_of(desired)
    if (current_meta.get("labels") or {}) != desired_meta["labels"]:
        ops.append({"op": "add", "path": "/metadata/labels", "value": desired_meta["labels"]})
    current = current_meta.get("annotations") or {}
    wanted = desired_meta["annotations"]
    if not current:
        if wanted:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": wanted})
    else:
        copied_before = str(current.get(services.COPIED_ANNOTATIONS) or "").split(",")
        stale = {k for k in (*copied_before, services.COPIED_ANNOTATIONS) if k in current}
        for key in sorted(stale - wanted.keys()):
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(key)}"})
        for key, value in sorted(wanted.items()):
            if current.get(key) != value:
                path = f"/metadata/annotations/{_escape(key)}"
                ops.append({"op": "add", "path": path, "value": value})
    return Patch(ops, content_type=JSON_PATCH) if ops else None


def status_annotation(node_name: str) -> str:
    """The annotation on upper Ingresses recording `node_name`'s lower addresses."""
    return STATUS_ANNOTATION_PREFIX + ownership.label_value(node_name)


def _entries(ingress: Mapping[str, Any]) -> list[Any]:
    status = ingress.get("status") or {}
    return list((status.get("loadBalancer") or {}).get("ingress") or [])


def report_addresses(node_name: str) -> Callable[[Obj, Obj], Obj | None]:
    """Return the `KindSpec.report` recording the lower copy's `status.loadBalancer.ingress`
    on the upper Ingress under `status_annotation(node_name)` (canonical JSON), or None when
    it is recorded already (or there is nothing to record and nothing was)."""
    key = status_annotation(node_name)

    def report(upper: Obj, lower: Obj) -> Obj | None:
        entries = _entries(lower)
        recorded = json.dumps(entries, sort_keys=True, separators=(",", ":"))
        before = annotations_of(upper).get(key)
        if before == recorded or (before is None and not entries):
            return None
        return {"metadata": {"annotations": {key: recorded}}}

    return report


def upper_status(upper: Obj, _lower: Obj) -> Obj | None:
    """`KindSpec.report_status`: the merge patch of the upper Ingress's status making
    `status.loadBalancer.ingress` the union of every node's recorded addresses (in the
    order of the nodes' annotations, each entry once), or None when it is that already.
    A recorded value that is not a JSON list is skipped (anyone may write annotations)."""
    union: list[Any] = []
    for key, value in sorted(annotations_of(upper).items()):
        if not key.startswith(STATUS_ANNOTATION_PREFIX):
            continue
        try:
            entries = json.loads(str(value))
        except ValueError:
            continue
        if isinstance(entries, list):
            union.extend(e for e in entries if isinstance(e, dict) and e not in union)
    if _entries(upper) == union:
        return None
    return {"status": {"loadBalancer": {"ingress": union}}}


def ingress_spec(
    *,
    tenancy: naming.NodeTenancy,
    selection: services.ServiceSelection,
    policy: IngressPolicy,
    caches: Caches,
    notice_settle: float = endpointslices.NOTICE_SETTLE,
) -> KindSpec:
    """Return the mirror of upper Ingresses into the lower cluster (see the module
    docstring): those `judge` lets cross, in namespaces `selection` covers; why one is not
    copied is told (`KindSpec.refusal`) once it has stayed so `notice_settle` seconds (a
    backend's copy or a TLS Secret's may be on its way). A sibling's copy is kept like our
    own unless written under another policy (then left to its maker)."""
    owner, prefix = tenancy.owner, tenancy.prefix

    def judged(upper: Obj) -> Verdict:
        return judge(upper, caches=caches, tenancy=tenancy, policy=policy)

    def covered(upper: Obj) -> bool:
        return selection.covers(namespace_of(upper), "")

    def refusal(upper: Obj) -> str | None:
        reason = judged(upper).reason if covered(upper) else None
        if reason is None:
            return None
        return f"not copied to the lower cluster of virtual node {owner.node_name}: {reason}"

    def conflict(lower: Obj, _upper: Obj) -> str | None:
        theirs = annotations_of(lower).get(services.POLICY_ANNOTATION)
        if theirs == policy.digest:
            return None
        return (
            f"written under another policy ({services.POLICY_ANNOTATION} {theirs or '(none)'}, "
            f"this node's {policy.digest}: --ingress-class-map, --lower-ingress-annotations); "
            "the virtual nodes of one upper cluster over one lower cluster need the same "
            "policy flags"
        )

    return KindSpec(
        name="ingresses_to_lower",
        kind="Ingress",
        source=INGRESSES,
        target=INGRESSES,
        selects=lambda upper: covered(upper) and judged(upper).crosses,
        translate=lambda upper: lower_ingress(upper, owner=owner, prefix=prefix, policy=policy),
        compare=compare_ingress,
        collectable=lambda _lower, upper: upper is None,
        keeps_siblings=lambda key, _lower: selection.covers(key.partition("/")[0], ""),
        sibling_conflict=conflict,
        report=report_addresses(owner.node_name),
        report_status=upper_status,
        refusal=refusal,
        notice_settle=notice_settle,
    )


# -- what the assembly needs to revisit Ingresses ---------------------------------------------


def services_of_ingress(ingress: Obj) -> list[str]:
    """Index function: the keys of the upper Services an upper Ingress's backends name."""
    namespace = namespace_of(ingress)
    return [f"{namespace}/{name}" for name in service_names(ingress)]


def secrets_of_ingress(ingress: Obj) -> list[str]:
    """Index function: the upper keys of the TLS Secrets of an upper Ingress."""
    namespace = namespace_of(ingress)
    return [f"{namespace}/{name}" for name in tls_secrets(ingress)]
