"""Which nodes the Kubernetes scheduler lets a pod onto, as far as tensile's programs must
agree with it (pure): node-affinity terms, the nodeSelector, taints and tolerations.

The virtual node uses the term semantics to tell which of a pod's requirements its own
labels satisfied (`tensile.placement.lower`), and the avoidance merge is checked
against them (tests); the descheduler uses `unfit` to know whether a pod it would move has
anywhere else to go: a pod whose own placement admits no other virtual node must not be
moved, since its replacement (kept off the node it leaves) would be unschedulable for good.

The rules mirror kube-scheduler's NodeAffinity and TaintToleration filter plugins
(k8s.io/component-helpers/scheduling/corev1/nodeaffinity, k8s.io/api/core/v1
Toleration.ToleratesTaint). Resources, ports and pod (anti-)affinity are not judged here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tensile.contracts.objects import as_list, as_mapping, meta_of

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
"""The affinity field the scheduler must satisfy (node, pod and pod anti-affinity)."""
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
"""The affinity field the scheduler only scores by."""
METADATA_NAME = "metadata.name"
FILTERED_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects that keep a pod off a node unless tolerated (PreferNoSchedule only
steers)."""
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
    expressions = as_list(term.get("matchExpressions"))
    fields = as_list(term.get("matchFields"))
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
    terms = as_list(selector.get("nodeSelectorTerms"))
    return any(
        isinstance(term, Mapping)
        and term_matches(term, node_name=node_name, node_labels=node_labels)
        for term in terms
    )


def tolerates(tolerations: object, taint: Mapping[str, Any]) -> bool:
    """Tell whether one of `tolerations` (a pod's spec.tolerations) tolerates `taint`.

    Toleration.ToleratesTaint: the effect matches when the toleration names none or the
    taint's; the key when it names none or the taint's; operator Exists tolerates any value,
    Equal (or none) only the taint's value. An operator Kubernetes does not know tolerates
    nothing.
    """
    for item in as_list(tolerations):
        toleration = as_mapping(item)
        effect, key = toleration.get("effect") or "", toleration.get("key") or ""
        if effect and effect != taint.get("effect"):
            continue
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (
            operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def unfit(spec: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Return why the scheduler would not put a pod with `spec` (its spec) on `node` (a
    Node object) for its node selection -- its nodeSelector, its required node affinity, a
    NoSchedule/NoExecute taint it does not tolerate -- or None when nothing of that rules
    the node out. Raises nothing for any JSON-shaped input."""
    meta = meta_of(node)
    name = str(meta.get("name") or "")
    labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    selector = as_mapping(spec.get("nodeSelector"))
    for key, value in selector.items():
        if labels.get(str(key)) != value:
            return f"its nodeSelector {key}={value} does not match"
    required = as_mapping(
        as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(REQUIRED)
    )
    if required and not selector_matches(required, node_name=name, node_labels=labels):
        return "its required node affinity does not select it"
    tolerations = spec.get("tolerations")
    for item in as_list(as_mapping(node.get("spec")).get("taints")):
        taint = as_mapping(item)
        if taint.get("effect") in FILTERED_EFFECTS and not tolerates(tolerations, taint):
            value = f"={taint.get('value')}" if taint.get("value") else ""
            shown = f"{taint.get('key')}{value}:{taint.get('effect')}"
            return f"it does not tolerate the taint {shown}"
    return None


def _label_requirement_holds(requirement: object, labels: Mapping[str, str]) -> bool:
    requirement = as_mapping(requirement)
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
