"""Label selectors (pure): the string form of flags (`--pod-selector`, `--node-selector`,
`--virtual-node-selector`) and the LabelSelector object of a PodDisruptionBudget, with
Kubernetes' grammar and matching rules (k8s.io/apimachinery/pkg/labels `Parse` and
metav1.LabelSelectorAsSelector).

One parser for every program: the webhook converts the pods its `--pod-selector` selects,
and the descheduler moves a pod with a controller only when the same `--pod-selector`
selects it, so those two must accept and match the same selectors."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts.labels import is_label_value
from tensile.contracts.names import qualified_name_problem

_SET = re.compile(r"^\s*(!)?\s*([^\s!=<>(),]+)(?:\s+(in|notin)\s*\(([^()]*)\))?\s*$")
_BINARY = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|=|!=|<|>)\s*([^\s!=<>(),]*)\s*$")


class SelectorError(ValueError):
    """A label selector that Kubernetes would not accept; the message says which part."""


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """One requirement: `key` compared by `operator` (In, NotIn, Exists, DoesNotExist, Gt,
    Lt) with `values`."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:  # noqa: PLR0911 - a dispatch
        """Tell whether `labels` satisfy this requirement (labels.Requirement.Matches)."""
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        compare: Callable[[int, int], bool] = (
            (lambda a, b: a > b) if self.operator == "Gt" else (lambda a, b: a < b)
        )
        try:
            return compare(int(labels[self.key]), int(self.values[0]))
        except ValueError:
            return False


@dataclass(frozen=True, kw_only=True)
class Selector:
    """Requirements that must all hold; `everything` when there are none."""

    requirements: tuple[Requirement, ...] = ()
    text: str = ""
    """The selector as written (for messages); "" for one made from an object."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Tell whether `labels` satisfy every requirement."""
        return all(r.matches(labels) for r in self.requirements)


EVERYTHING = Selector()


def parse(text: str) -> Selector:
    """Parse a label selector string as kubectl and the API accept it: comma-separated
    `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a,b)`,
    `key notin (a,b)`, `key>N`, `key<N`; as in Kubernetes, an empty value may be listed
    (`key in (a,,b)`, and `key in ()` is the set of the empty value). "" selects everything.
    Raises SelectorError naming the bad part."""
    requirements: list[Requirement] = []
    for part in _split(text):
        requirements.append(_requirement(part))
    return Selector(requirements=tuple(requirements), text=text.strip())


def render(selector: Selector) -> str:
    """Return `selector` in the string form `parse` reads and the API server accepts as a
    `labelSelector` query (labels.Selector.String): requirements joined by commas, sets
    sorted as Kubernetes writes them. `parse(render(s))` has the requirements of `s`;
    "" for a selector of everything."""
    return ",".join(_rendered(r) for r in selector.requirements)


def _rendered(requirement: Requirement) -> str:
    key, values = requirement.key, requirement.values
    if requirement.operator == "Exists":
        return key
    if requirement.operator == "DoesNotExist":
        return f"!{key}"
    if requirement.operator in ("Gt", "Lt"):
        return f"{key}{'>' if requirement.operator == 'Gt' else '<'}{values[0]}"
    listed = ",".join(sorted(set(values)))
    return f"{key} {'in' if requirement.operator == 'In' else 'notin'} ({listed})"


def is_label_key(text: str) -> bool:
    """Tell whether `text` is a label key: an optional DNS-subdomain prefix and "/", then a
    name of at most 63 characters (validation.IsQualifiedName)."""
    return qualified_name_problem(text) is None


def from_object(selector: object) -> Selector | None:
    """Return the Selector of a metav1.LabelSelector object (`matchLabels`,
    `matchExpressions`): None when it selects nothing (a null selector, or one Kubernetes
    cannot convert, which the Eviction API treats as matching no pod); `{}` selects every
    pod."""
    if not isinstance(selector, Mapping):
        return None
    requirements: list[Requirement] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        return None
    for key, value in labels.items():
        if not isinstance(value, str):
            return None
        requirements.append(Requirement(key=str(key), operator="In", values=(value,)))
    for expression in selector.get("matchExpressions") or []:
        requirement = _expression(expression)
        if requirement is None:
            return None
        requirements.append(requirement)
    return Selector(requirements=tuple(requirements))


def _expression(expression: Any) -> Requirement | None:
    if not isinstance(expression, Mapping):
        return None
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return None
    if operator in ("In", "NotIn") and values:
        return Requirement(key=key, operator=operator, values=tuple(str(v) for v in values))
    if operator in ("Exists", "DoesNotExist") and not values:
        return Requirement(key=key, operator=operator)
    return None


def _split(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in selector {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise SelectorError(f"unbalanced '(' in selector {text!r}")
    parts.append(text[start:])
    if len(parts) == 1 and not parts[0].strip():
        return []
    for part in parts:
        if not part.strip():
            raise SelectorError(f"empty requirement in selector {text!r}")
    return parts


def _requirement(part: str) -> Requirement:
    binary = _BINARY.match(part)
    if binary:
        key, op, value = binary.groups()
        _check_key(key, part)
        if op in ("<", ">"):
            if not re.fullmatch(r"-?[0-9]+", value):
                raise SelectorError(f"{part.strip()!r}: {op} needs an integer")
            return Requirement(key=key, operator="Gt" if op == ">" else "Lt", values=(value,))
        _check_value(value, part)
        return Requirement(key=key, operator="NotIn" if op == "!=" else "In", values=(value,))
    found = _SET.match(part)
    if not found:
        raise SelectorError(
            f"{part.strip()!r}: not a requirement (key, !key, key=value, key in (...))"
        )
    negated, key, op, listed = found.groups()
    _check_key(key, part)
    if op is None:
        return Requirement(key=key, operator="DoesNotExist" if negated else "Exists")
    if negated:
        raise SelectorError(f"{part.strip()!r}: '!' only goes with a bare key")
    values = tuple(v.strip() for v in listed.split(","))
    for value in values:
        _check_value(value, part)
    return Requirement(key=key, operator="In" if op == "in" else "NotIn", values=values)


def _check_key(key: str, part: str) -> None:
    if not is_label_key(key):
        raise SelectorError(f"{part.strip()!r}: {key!r} is not a label key")


def _check_value(value: str, part: str) -> None:
    if not is_label_value(value):
        raise SelectorError(f"{part.strip()!r}: invalid label value {value!r}")
