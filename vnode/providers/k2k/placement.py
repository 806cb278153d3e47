"""Where a forwarded pod may run in the lower cluster: its nodeSelector, node affinity, tolerations.

The upper scheduler already evaluated the pod's own nodeSelector and required node affinity
against the virtual node: what the virtual node satisfied is spent and dropped, what it did
not satisfy is kept, and the tensile-kube webhook's `clusterSelector` annotation (the
constraints it moved off the upper pod) is merged on top. Unlike tensile-kube's TrimPod, which
replaced nodeSelector, tolerations and required node affinity with the annotation's (or wiped
them when it was absent), nothing the pod keeps is ever lost. Pure functions only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vnode.contracts import clusterselector
from vnode.contracts.clusterselector import PREFERRED, REQUIRED
from vnode.contracts.labels import DEFAULT_TAINT_KEY
from vnode.contracts.scheduling import selector_matches
from vnode.kube import codec

MAX_MERGED_TERMS = 64
"""Most nodeSelectorTerms an AND of two term lists may produce (it is their cross product)."""

_POD_AFFINITIES = ("podAffinity", "podAntiAffinity")


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
    taint_key: str = DEFAULT_TAINT_KEY,
) -> dict[str, Any]:
    """Return a copy of the pod spec `spec` with its placement rewritten for the lower cluster.

    In: the upper pod's spec, the parsed `clusterSelector` (or None: the pod did not go
    through the webhook), the virtual node's name, labels and taint key. Out: a new spec
    where
    - nodeSelector = the upper entries the virtual node does not satisfy, updated with the
      clusterSelector's;
    - required node affinity = dropped if the virtual node satisfies it, then ANDed with the
      clusterSelector's (see `and_terms`);
    - preferred node affinity, podAffinity and podAntiAffinity = the pod's, plus whatever
      the clusterSelector's affinity adds to them;
    - tolerations = the pod's plus the clusterSelector's not already present; with a
      clusterSelector, the tolerations the webhook added upstairs (the virtual node's
      taint, its not-ready/unreachable NoExecute ones: `clusterselector.is_added_toleration`)
      are left there: below, the originals the webhook copied into the annotation apply,
      and a pod on a dead lower node is evicted and replaced;
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
    tolerations = lower_tolerations(spec, cluster_selector=cluster_selector, taint_key=taint_key)
    _put(placed, "nodeSelector", codec.deep_copy(selector))
    _put(placed, "affinity", affinity)
    _put(placed, "tolerations", tolerations)
    return placed


def lower_tolerations(
    spec: Mapping[str, Any],
    *,
    cluster_selector: Mapping[str, Any] | None,
    taint_key: str = DEFAULT_TAINT_KEY,
) -> list[Any]:
    """Return the tolerations `lower_placement` gives the lower pod (a new list; see there)."""
    own = _list(spec.get("tolerations"))
    if cluster_selector is not None:
        own = [t for t in own if not clusterselector.is_added_toleration(t, taint_key=taint_key)]
    return _union(own, _list((cluster_selector or {}).get("tolerations")))


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


def _union(first: list[Any], second: list[Any]) -> list[Any]:
    # Order-preserving, the webhook's rule (linear: a pod may carry very many tolerations).
    return codec.deep_copy(clusterselector.union(first, second))


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
