"""Which nodes the Kubernetes scheduler lets a pod onto, as far as tensile's programs must
agree with it (pure): node-affinity terms.

The virtual node uses the term semantics to tell which of a pod's requirements its own
labels satisfied (`vnode.providers.k2k.placement`); the avoidance merge is checked against
them (tests). The rules mirror kube-scheduler's NodeAffinity filter plugin
(k8s.io/component-helpers/scheduling/corev1/nodeaffinity).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

METADATA_NAME = "metadata.name"
# Go's strconv.ParseInt(s, 10, 64), which Gt/Lt use: optional sign, decimal digits, int64 range.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
    if not isinstance(requirement, Mapping) or requirement.get("key") != METADATA_NAME:
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


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
