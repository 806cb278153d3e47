"""Where a forwarded pod may run in the lower cluster: its nodeSelector, node affinity, tolerations.

The upper scheduler already evaluated the pod's own nodeSelector and required node affinity
against the virtual node: what the virtual node satisfied is spent and dropped, what it did
not satisfy is kept, and the tensile-kube webhook's `clusterSelector` annotation (the
constraints it moved off the upper pod) is merged on top. Unlike tensile-kube's TrimPod, which
replaced nodeSelector, tolerations and required node affinity with the annotation's (or wiped
them when it was absent), nothing the pod keeps is ever lost. Pure functions only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vnode.kube import codec

MAX_MERGED_TERMS = 64
"""Most nodeSelectorTerms an AND of two term lists may produce (it is their cross product)."""

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_POD_AFFINITIES = ("podAffinity", "podAntiAffinity")
_METADATA_NAME = "metadata.name"
# Go's strconv.ParseInt(s, 10, 64), which Gt/Lt use: optional sign, decimal digits, int64 range.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def parse_cluster_selector(value: object) -> dict[str, Any] | None:
    """Parse a tensile-kube `clusterSelector` annotation value.

    In: the annotation's value (any object; only a JSON string can be valid). Out: a dict with
    the keys `nodeSelector` (str->str map), `affinity` (Affinity) and `tolerations` (list),
    each only when present and non-null; or None when the value is not JSON or any of those
    keys has the wrong shape. Like tensile-kube, an unusable annotation counts as absent
    rather than failing the pod; unknown keys are ignored.
    """
    if not isinstance(value, str):
        return None
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None
    if not isinstance(parsed, dict):
        return None
    selector = parsed.get("nodeSelector")
    affinity = parsed.get("affinity")
    tolerations = parsed.get("tolerations")
    if (
        (selector is not None and not _is_string_map(selector))
        or (affinity is not None and not _is_affinity(affinity))
        or (tolerations is not None and not _is_list_of_maps(tolerations))
    ):
        return None
    shaped = {"nodeSelector": selector, "affinity": affinity, "tolerations": tolerations}
    return {key: value for key, value in shaped.items() if value is not None}


def term_matches(
    term: Mapping[str, Any], *, node_name: str, node_labels: Mapping[str, str]
) -> bool:
    """Tell whether one nodeSelectorTerm selects the node `node_name` with `node_labels`.

    Mirrors the Kubernetes scheduler: the term's matchExpressions (on labels: In, NotIn,
    Exists, DoesNotExist, Gt, Lt) and matchFields (`metadata.name` with In/NotIn) are ANDed; a
    term with no requirement, or with one Kubernetes cannot parse, selects no node.
    """
    expressions = _list(term.get("matchExpressions"))
    fields = _list(term.get("matchFields"))
    if not expressions and not fields:
        return False
    return all(_label_requirement_holds(e, node_labels) for e in expressions) and all(
        _field_requirement_holds(f, node_name) for f in fields
    )


def selector_matches(
    selector: Mapping[str, Any], *, node_name: str, node_labels: Mapping[str, str]
) -> bool:
    """Tell whether a NodeSelector (`{"nodeSelectorTerms": [...]}`) selects the node.

    Mirrors Kubernetes required node affinity: the terms are ORed (see `term_matches`).
    """
    terms = _list(selector.get("nodeSelectorTerms"))
    return any(
        isinstance(term, Mapping)
        and term_matches(term, node_name=node_name, node_labels=node_labels)
        for term in terms
    )


def and_terms(left: Sequence[Any], right: Sequence[Any]) -> list[dict[str, Any]]:
    """Return the nodeSelectorTerms equal to (OR of `left`) AND (OR of `right`).

    In: two term lists. Out: their cross product, each term carrying both sides'
    matchExpressions and matchFields (requirements in one term are ANDed). Terms without any
    requirement select no node, so they add nothing to an OR and are left out; when a side
    has no other term, the other side is returned as it is rather than an empty, invalid list.
    """
    lefts = [t for t in left if isinstance(t, Mapping) and _requirements(t)]
    rights = [t for t in right if isinstance(t, Mapping) and _requirements(t)]
    if not lefts or not rights:
        return codec.deep_copy([dict(t) for t in (rights or lefts)])
    return [_joined_term(a, b) for a in lefts for b in rights]


def lower_placement(
    spec: Mapping[str, Any],
    *,
    cluster_selector: Mapping[str, Any] | None,
    node_name: str,
    node_labels: Mapping[str, str],
) -> dict[str, Any]:
    """Return a copy of the pod spec `spec` with its placement rewritten for the lower cluster.

    In: the upper pod's spec, the parsed `clusterSelector` (or None), the virtual node's name
    and labels. Out: a new spec where
    - nodeSelector = the upper entries the virtual node does not satisfy, updated with the
      clusterSelector's;
    - required node affinity = dropped if the virtual node satisfies it, then ANDed with the
      clusterSelector's (see `and_terms`);
    - preferred node affinity, podAffinity and podAntiAffinity = the pod's, plus whatever
      the clusterSelector's affinity adds to them;
    - tolerations = the pod's plus the clusterSelector's not already present; when the
      clusterSelector carries tolerations, the pod's time-unlimited not-ready/unreachable
      tolerations (the form the webhook rewrites them to, so the upper pod is never evicted
      from a NotReady virtual node) are left upstairs: below, the original ones apply, and
      a pod on a dead lower node is evicted and replaced;
    - empty nodeSelector / affinity parts removed, so the lower API server accepts the pod.
    """
    placed = codec.deep_copy(dict(spec))
    chosen = cluster_selector or {}
    selector = {
        key: value
        for key, value in _mapping(spec.get("nodeSelector")).items()
        if node_labels.get(key) != value  # the upper scheduler already matched this entry
    }
    selector.update(_mapping(chosen.get("nodeSelector")))
    affinity = _lower_affinity(
        _mapping(spec.get("affinity")),
        extra=_mapping(chosen.get("affinity")),
        node_name=node_name,
        node_labels=node_labels,
    )
    own = _list(spec.get("tolerations"))
    if _list(chosen.get("tolerations")):
        own = [t for t in own if not _is_webhook_node_toleration(t)]
    tolerations = _union(own, _list(chosen.get("tolerations")))
    _put(placed, "nodeSelector", codec.deep_copy(selector))
    _put(placed, "affinity", affinity)
    _put(placed, "tolerations", tolerations)
    return placed


def _lower_affinity(
    affinity: Mapping[str, Any],
    *,
    extra: Mapping[str, Any],
    node_name: str,
    node_labels: Mapping[str, str],
) -> dict[str, Any]:
    merged = codec.deep_copy(dict(affinity))
    node = dict(_mapping(merged.get("nodeAffinity")))
    extra_node = _mapping(extra.get("nodeAffinity"))
    required = node.get(REQUIRED)
    if not isinstance(required, Mapping) or selector_matches(
        required, node_name=node_name, node_labels=node_labels
    ):
        required = None  # spent: the upper scheduler placed the pod on the virtual node by it
    _put(node, REQUIRED, _and_selectors(required, _mapping(extra_node.get(REQUIRED)) or None))
    _put(node, PREFERRED, _union(_list(node.get(PREFERRED)), _list(extra_node.get(PREFERRED))))
    _put(merged, "nodeAffinity", node)
    for kind in _POD_AFFINITIES:
        terms = dict(_mapping(merged.get(kind)))
        extra_terms = _mapping(extra.get(kind))
        for field in (REQUIRED, PREFERRED):
            _put(terms, field, _union(_list(terms.get(field)), _list(extra_terms.get(field))))
        _put(merged, kind, terms)
    return merged


def _and_selectors(
    kept: Mapping[str, Any] | None, extra: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    if kept is None or extra is None:
        chosen = kept if kept is not None else extra
        return codec.deep_copy(dict(chosen)) if chosen is not None else None
    kept_terms = _list(kept.get("nodeSelectorTerms"))
    extra_terms = _list(extra.get("nodeSelectorTerms"))
    if len(kept_terms) * len(extra_terms) > MAX_MERGED_TERMS:
        # A cross product this large is unreadable and slow to schedule. The clusterSelector is
        # the webhook's explicit statement of where in the lower cluster the pod belongs, while
        # the kept upper terms are ones the virtual node itself did not satisfy; so keep the
        # clusterSelector's terms and knowingly loosen the upper ones.
        return codec.deep_copy(dict(extra))
    return {"nodeSelectorTerms": and_terms(kept_terms, extra_terms)}


def _joined_term(left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
    term: dict[str, Any] = {}
    for field in ("matchExpressions", "matchFields"):
        joined = _list(left.get(field)) + _list(right.get(field))
        if joined:
            term[field] = codec.deep_copy(joined)
    return term


def _requirements(term: Mapping[str, Any]) -> bool:
    return bool(_list(term.get("matchExpressions")) or _list(term.get("matchFields")))


def _label_requirement_holds(requirement: object, labels: Mapping[str, str]) -> bool:
    requirement = _mapping(requirement)
    key, operator = requirement.get("key"), requirement.get("operator")
    values = requirement.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return False
    present = key in labels
    # Value-count rules are Kubernetes' own (labels.NewRequirement); breaking them makes the
    # whole term unparseable, which selects no node.
    if operator in ("In", "NotIn"):
        inside = present and labels[key] in values
        return bool(values) and (inside if operator == "In" else not inside)
    if operator in ("Exists", "DoesNotExist"):
        return not values and present == (operator == "Exists")
    if operator not in ("Gt", "Lt") or len(values) != 1 or not present:
        return False
    bound, actual = _int64(values[0]), _int64(labels[key])
    if bound is None or actual is None:
        return False
    return actual > bound if operator == "Gt" else actual < bound


def _field_requirement_holds(requirement: object, node_name: str) -> bool:
    # Kubernetes supports only metadata.name here, with In/NotIn and exactly one value.
    if not isinstance(requirement, Mapping) or requirement.get("key") != _METADATA_NAME:
        return False
    values = requirement.get("values")
    if not isinstance(values, list) or len(values) != 1:
        return False
    if requirement.get("operator") == "In":
        return bool(values[0] == node_name)
    if requirement.get("operator") == "NotIn":
        return bool(values[0] != node_name)
    return False


def _int64(value: object) -> int | None:
    if not isinstance(value, str) or not _INTEGER.fullmatch(value):
        return None
    number = int(value)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _is_string_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _is_list_of_maps(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _is_requirement(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    values = value.get("values")
    return (
        isinstance(value.get("key"), str)
        and isinstance(value.get("operator"), str)
        and (
            values is None or (isinstance(values, list) and all(isinstance(v, str) for v in values))
        )
    )


def _is_term(value: object) -> bool:
    return isinstance(value, dict) and all(
        value.get(field) is None
        or (isinstance(value[field], list) and all(_is_requirement(r) for r in value[field]))
        for field in ("matchExpressions", "matchFields")
    )


def _is_affinity(value: object) -> bool:
    return (
        isinstance(value, dict)
        and _is_node_affinity(value.get("nodeAffinity"))
        and all(_is_pod_affinity(value.get(kind)) for kind in _POD_AFFINITIES)
    )


def _is_node_affinity(value: object) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    required, preferred = value.get(REQUIRED), value.get(PREFERRED)
    if required is not None:
        terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
        # The API requires at least one term; an empty list would be rejected below.
        if not isinstance(terms, list) or not terms or not all(_is_term(t) for t in terms):
            return False
    return preferred is None or _is_list_of_maps(preferred)


def _is_pod_affinity(value: object) -> bool:
    if value is None:
        return True
    return isinstance(value, dict) and all(
        value.get(field) is None or _is_list_of_maps(value[field])
        for field in (REQUIRED, PREFERRED)
    )


def _union(first: list[Any], second: list[Any]) -> list[Any]:
    # Order-preserving; duplicates of the first list's items (full equality) are not repeated.
    merged = codec.deep_copy(first)
    for item in second:
        if item not in merged:
            merged.append(codec.deep_copy(item))
    return merged


def _put(target: dict[str, Any], key: str, value: object) -> None:
    # Empty containers are removed: `nodeSelector: {}` or `affinity: {}` only add noise, and an
    # empty nodeSelectorTerms list is invalid.
    if value:
        target[key] = value
    else:
        target.pop(key, None)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


_NODE_PROBLEM_KEYS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def _is_webhook_node_toleration(toleration: object) -> bool:
    """Tell whether a toleration is the webhook's unlimited not-ready/unreachable form."""
    return (
        isinstance(toleration, dict)
        and toleration.get("key") in _NODE_PROBLEM_KEYS
        and (
            toleration.get("operator") == "Exists"
            and toleration.get("effect") == "NoExecute"
            and toleration.get("tolerationSeconds") is None
        )
    )
