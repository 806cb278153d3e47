"""Where a forwarded pod may run in the lower cluster: its nodeSelector, node affinity, tolerations.

The upper scheduler already evaluated the pod's own nodeSelector and required node affinity
against the virtual node: what the virtual node satisfied is spent and dropped, what it did
not satisfy is kept, and the tensile-kube webhook's `clusterSelector` annotation (the
constraints it moved off the upper pod) is merged on top. Unlike tensile-kube's TrimPod, which
replaced nodeSelector, tolerations and required node affinity with the annotation's (or wiped
them when it was absent), nothing the pod keeps is ever lost. Pure functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tensile.contracts import clusterselector, selectors
from tensile.contracts.labels import DEFAULT_TAINT_KEY
from tensile.contracts.objects import as_list, as_mapping
from tensile.contracts.scheduling import PREFERRED, REQUIRED, selector_matches
from tensile.kube import codec

TERM_RULES: Final[clusterselector.TermRules] = {
    "max_terms": clusterselector.MAX_TERMS,
    "overflow": "loosen",
    "drop_empty": True,
    "dedupe": False,
}
"""How the virtual node ANDs the pod's kept required terms (left) with the clusterSelector's
(right): see `clusterselector.and_terms`, which says why these differ from the webhook's."""

_POD_AFFINITIES = ("podAffinity", "podAntiAffinity")


def lower_placement(
    spec: Mapping[str, Any],
    *,
    cluster_selector: Mapping[str, Any] | None,
    node_name: str,
    node_labels: Mapping[str, str],
    taint_key: str = DEFAULT_TAINT_KEY,
    pool: selectors.Selector = selectors.EVERYTHING,
) -> dict[str, Any]:
    """Return a copy of the pod spec `spec` with its placement rewritten for the lower cluster.

    In: the upper pod's spec, the parsed `clusterSelector` (or None: the pod did not go
    through the webhook), the virtual node's name, labels and taint key, and its pool (the
    lower nodes it stands for, --lower-node-selector; everything by default). Out: a new
    spec where
    - nodeSelector = the upper entries the virtual node does not satisfy, updated with the
      clusterSelector's;
    - required node affinity = dropped if the virtual node satisfies it, then ANDed with the
      clusterSelector's (`clusterselector.and_terms` with `TERM_RULES`), then ANDed the
      same way with the pool's term (`pool_term`), on the right: should the AND pass
      `clusterselector.MAX_TERMS`, the pool is the part kept, so a lower pod never leaves
      its virtual node's pool;
    - preferred node affinity, podAffinity and podAntiAffinity = the pod's, plus whatever
      the clusterSelector's affinity adds to them;
    - tolerations = the pod's plus the clusterSelector's not already present; with a
      clusterSelector, the tolerations the webhook added upstairs (the virtual node's
      taint, its not-ready/unreachable NoExecute ones: `clusterselector.is_added_toleration`)
      are left there: below, the originals the webhook copied into the annotation apply,
      and a pod on a dead lower node is evicted and replaced;
    - empty nodeSelector / affinity parts removed, so the lower API server accepts the pod.
    The result shares nothing with `spec` or `cluster_selector` (neither is changed); the
    requirements of its ANDed node-affinity terms may be shared between those terms.
    """
    # The one copy, at the boundary: what follows rearranges parts of these two copies,
    # which are this call's own, and copies nothing again.
    placed = codec.deep_copy(dict(spec))
    chosen = codec.deep_copy(dict(cluster_selector)) if cluster_selector is not None else {}
    selector = {
        key: value
        for key, value in as_mapping(placed.get("nodeSelector")).items()
        if node_labels.get(key) != value  # the upper scheduler already matched this entry
    }
    selector.update(as_mapping(chosen.get("nodeSelector")))
    affinity = _lower_affinity(
        placed.get("affinity"),
        extra=as_mapping(chosen.get("affinity")),
        node_name=node_name,
        node_labels=node_labels,
        pool=pool_term(pool),
    )
    tolerations = _tolerations(
        as_list(placed.get("tolerations")),
        cluster_selector=chosen if cluster_selector is not None else None,
        taint_key=taint_key,
    )
    _put(placed, "nodeSelector", selector)
    _put(placed, "affinity", affinity)
    _put(placed, "tolerations", tolerations)
    return placed


def pool_term(pool: selectors.Selector) -> dict[str, Any] | None:
    """Return the nodeSelectorTerm that selects the lower nodes of `pool` (a label selector
    over lower Nodes), or None for a selector of everything.

    Label-selector and node-selector requirements share their operators (In, NotIn,
    Exists, DoesNotExist, Gt, Lt; core/v1 NodeSelectorRequirement), so each requirement
    becomes one matchExpression as it is; Exists and DoesNotExist carry no values, as the
    API requires."""
    expressions: list[dict[str, Any]] = []
    for requirement in pool.requirements:
        expression: dict[str, Any] = {"key": requirement.key, "operator": requirement.operator}
        if requirement.operator not in ("Exists", "DoesNotExist"):
            expression["values"] = list(requirement.values)
        expressions.append(expression)
    return {"matchExpressions": expressions} if expressions else None


def lower_tolerations(
    spec: Mapping[str, Any],
    *,
    cluster_selector: Mapping[str, Any] | None,
    taint_key: str = DEFAULT_TAINT_KEY,
) -> list[Any]:
    """Return the tolerations `lower_placement` gives the lower pod (a new list of copies,
    sharing nothing with the inputs; see there)."""
    return codec.deep_copy(
        _tolerations(
            as_list(spec.get("tolerations")), cluster_selector=cluster_selector, taint_key=taint_key
        )
    )


def _tolerations(
    own: list[Any], *, cluster_selector: Mapping[str, Any] | None, taint_key: str
) -> list[Any]:
    # A new list holding the inputs' items (not copies).
    if cluster_selector is not None:
        own = [t for t in own if not clusterselector.is_added_toleration(t, taint_key=taint_key)]
    return clusterselector.union(own, as_list((cluster_selector or {}).get("tolerations")))


def _lower_affinity(
    affinity: object,
    *,
    extra: Mapping[str, Any],
    node_name: str,
    node_labels: Mapping[str, str],
    pool: dict[str, Any] | None,
) -> dict[str, Any]:
    # `affinity` and `extra` are parts of `lower_placement`'s copies: changed in place.
    merged: dict[str, Any] = affinity if isinstance(affinity, dict) else {}
    node = merged.get("nodeAffinity")
    node = node if isinstance(node, dict) else {}
    extra_node = as_mapping(extra.get("nodeAffinity"))
    required = node.get(REQUIRED)
    if not isinstance(required, Mapping) or selector_matches(
        required, node_name=node_name, node_labels=node_labels
    ):
        required = None  # spent: the upper scheduler placed the pod on the virtual node by it
    required = _and_selectors(required, as_mapping(extra_node.get(REQUIRED)) or None)
    # The pool on the right: `and_terms` keeps the right-hand terms if the AND is too large.
    required = _and_selectors(required, {"nodeSelectorTerms": [pool]} if pool else None)
    _put(node, REQUIRED, required)
    _put(node, PREFERRED, _union(as_list(node.get(PREFERRED)), as_list(extra_node.get(PREFERRED))))
    _put(merged, "nodeAffinity", node)
    for kind in _POD_AFFINITIES:
        terms = merged.get(kind)
        terms = terms if isinstance(terms, dict) else {}
        extra_terms = as_mapping(extra.get(kind))
        for field in (REQUIRED, PREFERRED):
            _put(terms, field, _union(as_list(terms.get(field)), as_list(extra_terms.get(field))))
        _put(merged, kind, terms)
    return merged


def _and_selectors(
    kept: Mapping[str, Any] | None, extra: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    if kept is None or extra is None:
        return kept if kept is not None else extra
    kept_terms = as_list(kept.get("nodeSelectorTerms"))
    extra_terms = as_list(extra.get("nodeSelectorTerms"))
    return {"nodeSelectorTerms": clusterselector.and_terms(kept_terms, extra_terms, **TERM_RULES)}


def _union(first: list[Any], second: list[Any]) -> list[Any]:
    # Order-preserving, the webhook's rule (linear: a pod may carry very many tolerations).
    return clusterselector.union(first, second)


def _put(target: dict[str, Any], key: str, value: object) -> None:
    # Empty containers are removed: `nodeSelector: {}` or `affinity: {}` only add noise, and an
    # empty nodeSelectorTerms list is invalid.
    if value:
        target[key] = value
    else:
        target.pop(key, None)
