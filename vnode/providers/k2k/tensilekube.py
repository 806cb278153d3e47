"""What tensile-kube left in a lower cluster, and which of it a virtual node takes over (pure).

A virtual node started with --adopt-tensile-kube takes over the lower objects tensile-kube's
virtual node made for the same upper objects, instead of refusing them as someone else's
(`plan`). tensile-kube recorded no owner below (no node name, no cluster identity, no upper
UID), so its objects are recognised by the marks it did leave (tensile-kube
pkg/util/conversions.go TrimPod, pkg/controllers/utils.go SetObjectGlobal,
pkg/controllers/service_controller.go filterService):

- a pod: the name and namespace of its upper pod and the label `virtual-pod=true`;
- a ConfigMap, Secret or PersistentVolumeClaim copied for a pod: the name and namespace of
  the upper object and the annotation `global=true`;
- a Service: the same, with its selector moved into the annotation `labelSelector`; and
  beside it an Endpoints copy with `global=true` (tensile-kube mirrored Endpoints, tensile
  mirrors EndpointSlices).

Nothing written by tensile (an object carrying tensile's owner annotations) is a candidate,
and neither is one created at or after the operator's cut-off (--adopt-tensile-kube-before:
when tensile-kube's virtual node was stopped), so an object shaped like tensile-kube's by a
lower user later on is never taken for one. Those marks can be written by anyone who can
write the object, so a candidate is adopted only when it stands for an upper object of this
node in every respect tensile-kube copied: a pod bound to this node with the same
containers (by name and image, in order, init containers too); a copy that such a pod uses
(tensile-kube made copies only for its pods; a copy no pod of ours uses would be garbage
the moment it is ours) and that tensile's mirror would keep in place rather than replace;
a Service tensile's Service mirror covers, whose selector (kept by tensile-kube in the
`labelSelector` annotation) is the upper Service's and selects a pod adopted with it.
Adopting is a metadata patch adding tensile's owner marks (`ownership.owner_marks`, the
upper namespace and, for pods, Services and claims, the upper UID), guarded by the object's
UID: nothing is created, replaced or deleted. Everything else that looks like tensile-kube's
is listed (`Leftover`), never touched.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tensile.contracts import ownership
from tensile.contracts.labels import VIRTUAL_POD_LABEL, VIRTUAL_POD_VALUE
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    as_mapping,
    dicts_in,
    labels_of,
    meta_of,
    namespace_of,
)
from tensile.kube import timestamps
from vnode.providers.k2k import dependencies, services, translate

ADOPTED_KINDS = ("Pod", "ConfigMap", "Secret", "PersistentVolumeClaim", "Service")
"""The kinds a virtual node takes over from tensile-kube."""
LISTED_KINDS = (*ADOPTED_KINDS, "Endpoints")
"""The kinds of tensile-kube's lower objects the adoption looks at."""
LABEL_SELECTOR_ANNOTATION = "labelSelector"
"""Where tensile-kube kept an upper Service's (or claim's) selector on the lower copy."""
SKIPPED_NAMESPACE = "kube-system"
"""tensile-kube forwarded no pod and mirrored no Service of this namespace."""

CLOCK_SKEW = 60.0
"""Seconds a lower pod may seem to predate its upper pod (the two apiservers' clocks differ)
and still have been made for it."""
Outcome = Literal["unmatched", "after-cutoff", "mismatch", "unused", "superseded", "not-mirrored"]
"""Why a tensile-kube object is left as it is:
- unmatched: no upper object of this node has its name (another tensile-kube node's, or its
  upper object is gone);
- after-cutoff: created at or after --adopt-tensile-kube-before (tensile-kube was stopped
  by then: someone else made it);
- mismatch: the upper object of that name is not the one it was made for (a pod created
  before it, other containers or images, a Service of another selector or type), or
  tensile's mirror would have to replace it;
- unused: a copy no pod of this node uses, a Service that selects no adopted pod;
- superseded: a kind tensile does not mirror (Endpoints: tensile mirrors EndpointSlices);
- not-mirrored: a kind this node's --enable-controllers leave out."""


@dataclass(frozen=True, kw_only=True)
class Adopt:
    """Patch `lower` (kind `kind`) with `patch` (a JSON merge patch of its metadata)."""

    kind: str
    lower: Obj
    patch: dict[str, Any]

    @property
    def key(self) -> str:
        """ "namespace/name" of the lower object."""
        return _key(self.lower)


@dataclass(frozen=True, kw_only=True)
class Leftover:
    """A lower object tensile-kube made that is left as it is, and why."""

    kind: str
    key: str
    outcome: Outcome
    reason: str


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What this virtual node mirrors, so that it adopts only what it will keep."""

    owner: ownership.NodeIdentity
    mirror_services: bool = True
    """ServiceControllers enabled."""
    mirror_claims: bool = True
    """PVControllers enabled."""
    service_selection: services.ServiceSelection = field(default_factory=services.ServiceSelection)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The outcome of `plan`: what to patch, and what to list."""

    adopt: tuple[Adopt, ...]
    leftovers: tuple[Leftover, ...]


def made_by_tensile(obj: Mapping[str, Any]) -> bool:
    """Tell whether a lower object carries tensile's owner annotations (any node's)."""
    annotations = annotations_of(obj)
    return ownership.NODE_ANNOTATION in annotations or ownership.CLUSTER_ANNOTATION in annotations


def is_tensile_kube_pod(lower: Mapping[str, Any]) -> bool:
    """Tell whether a lower pod looks like tensile-kube's: `virtual-pod=true`, no tensile
    owner marks."""
    labels = labels_of(lower)
    return labels.get(VIRTUAL_POD_LABEL) == VIRTUAL_POD_VALUE and not made_by_tensile(lower)


def is_tensile_kube_copy(lower: Mapping[str, Any]) -> bool:
    """Tell whether a lower ConfigMap, Secret, claim, Service or Endpoints looks like a
    tensile-kube copy: annotation `global=true`, no tensile owner marks."""
    annotations = annotations_of(lower)
    return annotations.get(ownership.GLOBAL_ANNOTATION) == "true" and not made_by_tensile(lower)


def plan(
    *,
    scope: Scope,
    upper_pods: Iterable[Mapping[str, Any]],
    lower: Mapping[str, Iterable[Obj]],
    upper: Mapping[str, Mapping[str, Obj]],
    created_before: dt.datetime,
) -> Plan:
    """Decide what to adopt and what to list.

    In: `upper_pods`, the upper pods bound to this node; `lower`, kind -> the lower objects
    of that kind (any; those not shaped as tensile-kube's are skipped), kinds from
    `LISTED_KINDS`; `upper`, kind -> {"namespace/name": upper object} for ConfigMap,
    Secret, PersistentVolumeClaim and Service; `created_before` (aware), the operator's
    cut-off: a lower object created at or after it (by its creationTimestamp, the lower
    apiserver's clock; one without a readable timestamp too) is not adopted. Out: a `Plan`,
    pods first, each list in key order. Without a namespace prefix only: tensile-kube kept
    namespace names.
    """
    adopt, leftovers, used, adopted_pods = _plan_pods(
        scope=scope, upper_pods=upper_pods, lower=lower, created_before=created_before
    )
    for kind in ("ConfigMap", "Secret", "PersistentVolumeClaim"):
        for candidate in _sorted(lower.get(kind, ()), is_tensile_kube_copy):
            found = _copy_outcome(
                kind,
                candidate,
                upper=upper.get(kind, {}),
                used=used[kind],
                created_before=created_before,
            )
            if isinstance(found, Leftover):
                leftovers.append(found)
            elif kind == "PersistentVolumeClaim" and not scope.mirror_claims:
                leftovers.append(_left(kind, _key(candidate), "not-mirrored", _NO_CLAIMS))
            else:
                uid = kind == "PersistentVolumeClaim"
                adopt.append(_adopt(kind, candidate, found, scope=scope, uid=uid))
    for candidate in _sorted(lower.get("Service", ()), is_tensile_kube_copy):
        found = _service_outcome(
            candidate,
            upper=upper.get("Service", {}),
            scope=scope,
            adopted_pods=adopted_pods,
            created_before=created_before,
        )
        if isinstance(found, Leftover):
            leftovers.append(found)
        else:
            adopt.append(_adopt("Service", candidate, found, scope=scope, uid=True))
    for candidate in _sorted(lower.get("Endpoints", ()), is_tensile_kube_copy):
        leftovers.append(_left("Endpoints", _key(candidate), "superseded", _SUPERSEDED))
    return Plan(adopt=tuple(adopt), leftovers=tuple(leftovers))


def _plan_pods(
    *,
    scope: Scope,
    upper_pods: Iterable[Mapping[str, Any]],
    lower: Mapping[str, Iterable[Obj]],
    created_before: dt.datetime,
) -> tuple[list[Adopt], list[Leftover], dict[str, set[str]], list[Mapping[str, Any]]]:
    """The pods of `plan`, what the adopted ones use ("namespace/name" by kind), and the
    upper pods whose lower pods are adopted."""
    pods = {_key(p): p for p in upper_pods if namespace_of(p) != SKIPPED_NAMESPACE}
    adopt: list[Adopt] = []
    leftovers: list[Leftover] = []
    adopted: list[Mapping[str, Any]] = []
    used: dict[str, set[str]] = {
        "ConfigMap": set(),
        "Secret": set(),
        "PersistentVolumeClaim": set(),
    }
    for candidate in _sorted(lower.get("Pod", ()), is_tensile_kube_pod):
        key = _key(candidate)
        upper_pod = pods.get(key)
        if upper_pod is None:
            leftovers.append(
                _left("Pod", key, "unmatched", "no upper pod of this node has its name")
            )
            continue
        if (late := _after_cutoff("Pod", candidate, created_before)) is not None:
            leftovers.append(late)
            continue
        if (why := _pod_mismatch(upper_pod, candidate)) is not None:
            leftovers.append(_left("Pod", key, "mismatch", why))
            continue
        adopt.append(_adopt("Pod", candidate, upper_pod, scope=scope, uid=True))
        adopted.append(upper_pod)
        for kind, names in _uses(upper_pod).items():
            used[kind] |= {f"{namespace_of(upper_pod)}/{n}" for n in names}
    return adopt, leftovers, used, adopted


def _after_cutoff(kind: str, candidate: Obj, created_before: dt.datetime) -> Leftover | None:
    """The Leftover of a candidate created at or after the cut-off (or of unknown age)."""
    created = timestamps.parse_rfc3339(meta_of(candidate).get("creationTimestamp"))
    if created is not None and created < created_before:
        return None
    when = f"created {created:%Y-%m-%dT%H:%M:%SZ}" if created else "of unknown creation time"
    return _left(
        kind,
        _key(candidate),
        "after-cutoff",
        f"{when}, not before --adopt-tensile-kube-before ({created_before:%Y-%m-%dT%H:%M:%SZ})",
    )


_NO_CLAIMS = "this node runs without PVControllers (--enable-controllers)"
_NO_SERVICES = "this node runs without ServiceControllers (--enable-controllers)"
_SUPERSEDED = (
    "tensile mirrors EndpointSlices, not Endpoints; this copy is no longer updated "
    "(delete it once the Service's EndpointSlices exist below)"
)


def _copy_outcome(
    kind: str,
    candidate: Obj,
    *,
    upper: Mapping[str, Obj],
    used: set[str],
    created_before: dt.datetime,
) -> Obj | Leftover:
    """The upper object a tensile-kube copy is adopted for, or why it is left."""
    key = _key(candidate)
    source = upper.get(key)
    if source is None:
        return _left(kind, key, "unmatched", f"no upper {kind} has its name")
    if (late := _after_cutoff(kind, candidate, created_before)) is not None:
        return late
    if key not in used:
        return _left(kind, key, "unused", "no pod of this node uses it")
    if kind == "Secret" and not dependencies.copyable(source, kind=kind):
        return _left(kind, key, "mismatch", "a ServiceAccount token Secret is never copied")
    if kind in ("ConfigMap", "Secret"):
        desired: dict[str, Any] = {
            f: source[f] for f in ("data", "binaryData", "type") if f in source
        }
        if candidate.get("immutable") and dependencies.needs_update(candidate, desired, kind=kind):
            return _left(
                kind, key, "mismatch", "immutable and its content differs from the upper one"
            )
    return source


def _service_outcome(
    candidate: Obj,
    *,
    upper: Mapping[str, Obj],
    scope: Scope,
    adopted_pods: Iterable[Mapping[str, Any]],
    created_before: dt.datetime,
) -> Obj | Leftover:
    """The upper Service a tensile-kube Service copy is adopted for, or why it is left."""
    key = _key(candidate)
    if not scope.mirror_services:
        return _left("Service", key, "not-mirrored", _NO_SERVICES)
    source = upper.get(key)
    namespace, _, name = key.partition("/")
    if source is None or not scope.service_selection.covers(namespace, name):
        return _left("Service", key, "unmatched", "no upper Service this node mirrors has its name")
    if (late := _after_cutoff("Service", candidate, created_before)) is not None:
        return late
    if (why := _service_mismatch(candidate, source)) is not None:
        return _left("Service", key, "mismatch", why)
    selector = _upper_selector(source)
    if not any(_selects(selector, pod, namespace=namespace) for pod in adopted_pods):
        return _left("Service", key, "unused", "it selects no pod adopted with it")
    return source


def _service_mismatch(lower: Mapping[str, Any], upper: Mapping[str, Any]) -> str | None:
    """Why tensile-kube's Service copy `lower` was not made from `upper` as it is (another
    selector), or would be replaced by tensile's mirror (another kind of type); None when
    it was."""
    if as_mapping(lower.get("spec")).get("selector"):
        return "it has a selector (tensile-kube's copies have none)"
    selector, kept = _upper_selector(upper), _kept_selector(lower)
    if kept != selector:
        shown = "none" if kept is None else json.dumps(kept, sort_keys=True)
        return (
            f"its selector ({LABEL_SELECTOR_ANNOTATION} annotation: {shown}) is not the upper "
            f"Service's ({json.dumps(selector, sort_keys=True)})"
        )
    upper_type, lower_type = _service_type(upper), _service_type(lower)
    external = services.EXTERNAL_NAME
    if (upper_type == external) != (lower_type == external) or services.is_headless(
        upper
    ) != services.is_headless(lower):
        return f"type {lower_type} below, {upper_type} above: tensile's mirror would replace it"
    return None


def _upper_selector(service: Mapping[str, Any]) -> dict[str, str]:
    """The upper Service's `spec.selector` ({} when it has none)."""
    selector = as_mapping(as_mapping(service.get("spec")).get("selector"))
    return {str(k): str(v) for k, v in selector.items()}


def _kept_selector(lower: Mapping[str, Any]) -> dict[str, str] | None:
    """The selector tensile-kube kept on its Service copy (the `labelSelector` annotation,
    JSON of the upper `spec.selector`; {} when it wrote none, as for an upper Service
    without one); None when the annotation is not such a map."""
    text = annotations_of(lower).get(LABEL_SELECTOR_ANNOTATION)
    if text is None:
        return {}
    try:
        kept = json.loads(text)
    except ValueError:
        return None
    if not isinstance(kept, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in kept.items()
    ):
        return None
    return kept


def _selects(selector: Mapping[str, str], pod: Mapping[str, Any], *, namespace: str) -> bool:
    """Whether a Service of `namespace` with `selector` selects upper `pod` (equality of
    every pair; an empty selector selects nothing, as a Service's)."""
    labels = labels_of(pod)
    return (
        bool(selector)
        and namespace_of(pod) == namespace
        and all(labels.get(k) == v for k, v in selector.items())
    )


def _adopt(kind: str, lower: Obj, upper: Mapping[str, Any], *, scope: Scope, uid: bool) -> Adopt:
    """The merge patch giving `lower` tensile's owner marks for `upper` (its own UID kept as
    a precondition: the patch fails on another object of that name)."""
    labels, annotations = ownership.owner_marks(scope.owner)
    meta = meta_of(upper)
    annotations = {**annotations, ownership.UPPER_NAMESPACE_ANNOTATION: str(meta.get("namespace"))}
    if uid:
        annotations[ownership.UPPER_UID_ANNOTATION] = str(meta.get("uid"))
    lower_meta = meta_of(lower)
    patch = {
        "metadata": {"uid": lower_meta.get("uid"), "labels": labels, "annotations": annotations}
    }
    return Adopt(kind=kind, lower=lower, patch=patch)


def _pod_mismatch(upper: Mapping[str, Any], lower: Mapping[str, Any]) -> str | None:
    """Why `lower` was not made for `upper` (created before it: made for an earlier pod of
    that name, e.g. a StatefulSet's pod re-created while no virtual node ran; or other
    containers, by name or image), or None."""
    born_above = timestamps.parse_rfc3339(meta_of(upper).get("creationTimestamp"))
    born_below = timestamps.parse_rfc3339(meta_of(lower).get("creationTimestamp"))
    if born_above and born_below and (born_above - born_below).total_seconds() > CLOCK_SKEW:
        return (
            f"it was created {born_below:%Y-%m-%dT%H:%M:%SZ}, before the upper pod "
            f"({born_above:%Y-%m-%dT%H:%M:%SZ}): made for an earlier pod of that name"
        )
    for group in ("initContainers", "containers"):
        above = [c.get("name") for c in dicts_in(as_mapping(upper.get("spec")).get(group))]
        below = [c.get("name") for c in dicts_in(as_mapping(lower.get("spec")).get(group))]
        if above != below:
            return f"its {group} {below} are not the upper pod's {above}"
    for group in ("initContainers", "containers"):
        above = [c.get("image") for c in dicts_in(as_mapping(upper.get("spec")).get(group))]
        below = [c.get("image") for c in dicts_in(as_mapping(lower.get("spec")).get(group))]
        if above != below:
            return f"the images of its {group} {below} are not the upper pod's {above}"
    return None


def _uses(pod: Mapping[str, Any]) -> dict[str, set[str]]:
    """The ConfigMaps, Secrets and claims an upper pod uses, by kind."""
    deps = translate.dependencies(pod)
    claims = {
        str(v["persistentVolumeClaim"].get("claimName"))
        for v in dicts_in(as_mapping(pod.get("spec")).get("volumes"))
        if isinstance(v.get("persistentVolumeClaim"), dict)
    }
    return {
        "ConfigMap": set(deps.config_maps),
        "Secret": set(deps.secrets),
        "PersistentVolumeClaim": claims,
    }


def _service_type(service: Mapping[str, Any]) -> str:
    return str(as_mapping(service.get("spec")).get("type") or services.CLUSTER_IP)


def _left(kind: str, key: str, outcome: Outcome, reason: str) -> Leftover:
    return Leftover(kind=kind, key=key, outcome=outcome, reason=reason)


def _sorted(objects: Iterable[Obj], shaped: Any) -> list[Obj]:
    return sorted(
        (o for o in objects if shaped(o) and namespace_of(o) != SKIPPED_NAMESPACE), key=_key
    )


def _key(obj: Mapping[str, Any]) -> str:
    meta = meta_of(obj)
    return f"{meta.get('namespace')}/{meta.get('name')}"
