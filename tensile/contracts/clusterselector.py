"""The `clusterSelector` annotation: placement meant for the lower cluster, written on the
upper pod by the webhook and restored on the lower pod by the virtual node.

The format is tensile-kube's (research/tensile-kube.md section 6.2), so pods move between
the two systems: compact JSON of `{"nodeSelector": {...}, "affinity": {"nodeAffinity":
{"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [...]}}},
"tolerations": [...]}`, in that key order, each key omitted when empty, Kubernetes' own
field names inside.

The webhook also adds tolerations to the upper pod (`added_tolerations`): the virtual
node's taint, and node.kubernetes.io/not-ready and /unreachable (NoExecute) with its
configured tolerationSeconds in place of the pod's own, which went into the annotation.
Those belong upstairs only; `is_added_toleration` is how the virtual node recognises them
to leave them there. Pure: no I/O, inputs never mutated.

Both sides AND two lists of required nodeSelectorTerms (`and_terms`): the webhook when it
moves requirements into an annotation that has terms already, the virtual node when it puts
the annotation's terms on the lower pod beside the pod's own. One function does both; each
side states its rules (`TermRules`) where it calls it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from tensile.contracts.labels import DEFAULT_TAINT_KEY
from tensile.contracts.objects import as_list
from tensile.contracts.scheduling import PREFERRED, REQUIRED

ANNOTATION = "clusterSelector"
"""On upper pods: the placement meant for the lower cluster (compact JSON, the format above).
The webhook writes it; the virtual node puts it on the lower pod."""
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
"""The node lifecycle controller's NoExecute taint on a node that is not Ready; the webhook
replaces a pod's toleration of it with its own (`--default-not-ready-toleration-seconds`)."""
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
"""The node lifecycle controller's NoExecute taint on a node that stopped reporting; the webhook
replaces a pod's toleration of it with its own (`--default-unreachable-toleration-seconds`)."""
NODE_PROBLEM_TAINTS = (NOT_READY_TAINT, UNREACHABLE_TAINT)
"""The NoExecute taints the node lifecycle controller puts on a node that stops reporting
(Kubernetes "Taints and Tolerations": taint-based evictions)."""
DEFAULT_TOLERATION_SECONDS = 300
"""Default tolerationSeconds of the webhook's not-ready/unreachable tolerations: the value
kube-apiserver's DefaultTolerationSeconds admission gives every pod
(--default-not-ready-toleration-seconds), so a pod on a virtual node that died is treated
as one on a real node that died. README "The webhook" explains the trade-off."""
MAX_TERMS = 64
"""Most nodeSelectorTerms an AND of two term lists may produce (`and_terms`: the product of
the lists' lengths). Our own bound, not the apiserver's: it validates at least one term and
no most, but a cross product grows fast, and a pod with thousands of terms is unreadable
and slow for every scheduler that filters nodes by it."""
_POD_AFFINITIES = ("podAffinity", "podAntiAffinity")
_REQUIREMENT_FIELDS = ("matchExpressions", "matchFields")
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=repr)


def parse(value: object) -> dict[str, Any] | None:
    """Parse a `clusterSelector` annotation value.

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


def render(
    *,
    node_selector: Mapping[str, str],
    affinity: Mapping[str, Any] | None,
    tolerations: Sequence[Mapping[str, Any]],
) -> str:
    """Return the annotation value for lower-cluster placement: `node_selector` (label map),
    `affinity` (an Affinity; the webhook writes only required node affinity, see
    `with_required_terms`) and `tolerations`, as compact JSON in tensile-kube's key order,
    each key left out when empty ("{}" when all are)."""
    shaped: dict[str, Any] = {}
    if node_selector:
        shaped["nodeSelector"] = dict(node_selector)
    if affinity:
        shaped["affinity"] = affinity
    if tolerations:
        shaped["tolerations"] = list(tolerations)
    return json.dumps(shaped, separators=(",", ":"), ensure_ascii=False)


def union(first: Sequence[Any], second: Sequence[Any]) -> list[Any]:
    """Return `first`, then each item of `second` not equal to one before it: how both sides
    merge lists of the contract's JSON objects (tolerations, node-selector requirements,
    affinity terms), the webhook into the annotation, the virtual node back onto the pod.

    In: lists of JSON values. Out: a new list holding the same item objects (not copies).
    Items are compared through a hashable stand-in (a flat object's items, else its
    canonical JSON text), so the time is linear in the lists' size: a pod may carry a
    hundred thousand tolerations (objects are up to 3 MiB and the apiserver does not bound
    their count), and comparing every pair would take many minutes."""
    seen = {_identity(item) for item in first}
    merged = list(first)
    for item in second:
        identity = _identity(item)
        if identity not in seen:
            seen.add(identity)
            merged.append(item)
    return merged


def required_terms(affinity: object) -> list[dict[str, Any]]:
    """Return the required node-affinity terms of an Affinity (of a pod, or of a parsed
    clusterSelector's `affinity`): a new list of shallow copies of the terms (a term's
    keys may be replaced; its requirements are shared); [] when it has none or is not a
    mapping. Items that are not objects are left out."""
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node.get(REQUIRED) if isinstance(node, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list):
        return []
    return [dict(term) for term in terms if isinstance(term, dict)]


def with_required_terms(
    affinity: Mapping[str, Any] | None, terms: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Return the Affinity `affinity` with its required node affinity replaced by `terms`
    (removed when `terms` is empty); preferred node affinity and pod (anti-)affinity are
    kept; parts left empty are removed, so `{}` means no affinity at all; a `nodeAffinity`
    that is not an object is replaced. The result is a new object on the changed path and
    shares the rest with the arguments."""
    result = dict(affinity or {})
    node_affinity = result.get("nodeAffinity")
    # Anything but an object there is no node affinity at all: it is replaced.
    node = dict(node_affinity) if isinstance(node_affinity, Mapping) else {}
    if terms:
        node[REQUIRED] = {"nodeSelectorTerms": [dict(t) for t in terms]}
    else:
        node.pop(REQUIRED, None)
    if node:
        result["nodeAffinity"] = node
    else:
        result.pop("nodeAffinity", None)
    return {key: value for key, value in result.items() if value}


Overflow = Literal["loosen", "refuse"]
"""What `and_terms` does when the AND would pass its limit: keep the right-hand terms alone
(a looser selection), or raise `TooManyTerms`."""


class TooManyTerms(ValueError):
    """An AND of `left` and `right` terms would pass `limit` terms (`and_terms`, refuse)."""

    def __init__(self, *, left: int, right: int, limit: int) -> None:
        super().__init__(f"{left} x {right} node-affinity terms is over {limit}")
        self.left = left
        self.right = right
        self.limit = limit


class TermRules(TypedDict):
    """How one side ANDs term lists: the keyword arguments of `and_terms`."""

    max_terms: int
    overflow: Overflow
    drop_empty: bool
    dedupe: bool


def and_terms(
    left: Sequence[object],
    right: Sequence[object],
    *,
    max_terms: int,
    overflow: Overflow,
    drop_empty: bool,
    dedupe: bool,
) -> list[dict[str, Any]]:
    """Return nodeSelectorTerms equal to (OR of `left`) AND (OR of `right`).

    Kubernetes semantics (core/v1 NodeSelector; kube-scheduler's NodeAffinity plugin through
    component-helpers' nodeaffinity): the terms of a selector are ORed, the requirements of
    one term (matchExpressions and matchFields) ANDed, and a term without any requirement
    selects no node. So the AND is the cross product: one term per (left, right) pair,
    carrying both terms' requirements.

    In: two lists of terms (items that are not objects are left out); the rules, which each
    side passes as its `TermRules`:
    - `max_terms`: when len(left) * len(right), counted as given, is over it, `overflow`
      decides: "refuse" raises `TooManyTerms`; "loosen" returns the right-hand terms alone
      (shallow copies), a selection looser than the AND: the caller puts on the right the
      terms it must keep.
    - `drop_empty`: leave out terms without requirements before the product (they select
      nothing, so this keeps the meaning, except that a side of only such terms then
      counts as no constraint); else they join the product, where an empty term joined
      with a right-hand one adds that one alone, a looser selection than Kubernetes'.
    - `dedupe`: a requirement both terms of a pair carry appears once (`union`); else the
      two lists are concatenated (the same selection, with repeats).
    When one side has no term (left), the other side's terms are returned as they are
    rather than an empty, invalid list.

    Out: a new list of new term objects holding new requirement lists; the requirements
    themselves are the inputs' (callers that hand the result on copy it deeply).
    Raises `TooManyTerms` (refuse only).

    The sides differ where they must: the webhook (writer) refuses, since a pod it cannot
    convert without dropping a constraint is better left as it is, with a warning, than
    placed wrongly; and dedupes, so converting a converted pod changes nothing. The virtual
    node (reader) cannot refuse a pod the upper scheduler already bound, so it loosens: the
    clusterSelector's terms (on the right) are the webhook's statement of where below the
    pod belongs, the pod's kept terms are ones the virtual node itself did not satisfy. It
    drops empty terms; the webhook keeps them (the only ones it can meet come from an
    annotation written by hand), which is today's behaviour of each.
    """
    if len(left) * len(right) > max_terms:
        if overflow == "refuse":
            raise TooManyTerms(left=len(left), right=len(right), limit=max_terms)
        return [dict(term) for term in right if isinstance(term, Mapping)]
    lefts = _usable_terms(left, drop_empty=drop_empty)
    rights = _usable_terms(right, drop_empty=drop_empty)
    if not lefts or not rights:
        return [dict(term) for term in (rights or lefts)]
    return [_joined_term(a, b, dedupe=dedupe) for a in lefts for b in rights]


def has_requirements(term: Mapping[str, Any]) -> bool:
    """Tell whether a nodeSelectorTerm has a requirement (one without selects no node)."""
    return any(as_list(term.get(field)) for field in _REQUIREMENT_FIELDS)


def virtual_node_toleration(*, taint_key: str = DEFAULT_TAINT_KEY) -> dict[str, Any]:
    """Return the toleration of the virtual nodes' taint (any value, any effect)."""
    return {"key": taint_key, "operator": "Exists"}


def node_problem_tolerations(
    *, not_ready_seconds: int | None, unreachable_seconds: int | None
) -> list[dict[str, Any]]:
    """Return the not-ready and unreachable NoExecute tolerations the webhook puts on upper
    pods, each bounded by its seconds (>= 0) or unlimited with None (tensile-kube's choice: a
    pod is then never evicted from a dead virtual node)."""
    tolerations: list[dict[str, Any]] = []
    for key, seconds in (
        (NOT_READY_TAINT, not_ready_seconds),
        (UNREACHABLE_TAINT, unreachable_seconds),
    ):
        toleration: dict[str, Any] = {"key": key, "operator": "Exists", "effect": "NoExecute"}
        if seconds is not None:
            toleration["tolerationSeconds"] = seconds
        tolerations.append(toleration)
    return tolerations


def added_tolerations(
    *,
    taint_key: str = DEFAULT_TAINT_KEY,
    not_ready_seconds: int | None,
    unreachable_seconds: int | None,
) -> list[dict[str, Any]]:
    """Return every toleration the webhook adds to an upper pod (see the module docstring)."""
    return [
        virtual_node_toleration(taint_key=taint_key),
        *node_problem_tolerations(
            not_ready_seconds=not_ready_seconds, unreachable_seconds=unreachable_seconds
        ),
    ]


def is_added_toleration(toleration: object, *, taint_key: str = DEFAULT_TAINT_KEY) -> bool:
    """Tell whether `toleration` has the form of one the webhook adds: the virtual nodes'
    taint toleration, or a not-ready/unreachable NoExecute Exists toleration with any
    tolerationSeconds (the reader cannot know the webhook's setting, and on a converted pod
    the originals of such tolerations are in the annotation anyway)."""
    if not isinstance(toleration, Mapping):
        return False
    if toleration == virtual_node_toleration(taint_key=taint_key):
        return True
    return (
        toleration.get("key") in NODE_PROBLEM_TAINTS
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") == "NoExecute"
        and not toleration.get("value")
    )


def _usable_terms(terms: Sequence[object], *, drop_empty: bool) -> list[Mapping[str, Any]]:
    return [
        term
        for term in terms
        if isinstance(term, Mapping) and (not drop_empty or has_requirements(term))
    ]


def _joined_term(
    left: Mapping[str, Any], right: Mapping[str, Any], *, dedupe: bool
) -> dict[str, Any]:
    term: dict[str, Any] = {}
    for field in _REQUIREMENT_FIELDS:
        first, second = as_list(left.get(field)), as_list(right.get(field))
        joined = union(first, second) if dedupe else first + second
        if joined:
            term[field] = joined
    return term


def _identity(item: object) -> object:
    """A hashable stand-in for a JSON value, equal for equal values: a flat object (most
    tolerations) by its items, anything else by its canonical JSON text."""
    if isinstance(item, dict):
        try:
            return frozenset(item.items())
        except TypeError:  # a nested list or object among the values
            pass
    return _CANONICAL.encode(item)


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
