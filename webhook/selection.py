"""Label selectors in Kubernetes' string form (`virtual-pod=true`, `tier in (a,b),!legacy`),
parsed once and evaluated against a pod's labels (pure).

The grammar is apimachinery's `labels.Parse` for what label selectors may say: requirements
joined by commas; `key`, `!key`, `key=value`, `key==value`, `key!=value`,
`key in (v1,v2)` and `key notin (v1,v2)`. An empty selector selects everything. As in
Kubernetes, `!=` and `notin` also select objects without the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Operator = Literal["exists", "not-exists", "in", "not-in"]
_KEY = re.compile(
    r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_SET = re.compile(r"(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)")
_EQUALITY = re.compile(r"(?P<key>[^!=\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)")


class SelectorError(ValueError):
    """The text is not a label selector; the message says which part and why."""


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """One requirement of a selector: `key` with `operator` over `values`."""

    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Tell whether `labels` satisfy this requirement."""
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "not-exists":
            return self.key not in labels
        inside = self.key in labels and labels[self.key] in self.values
        return inside if self.operator == "in" else not inside


@dataclass(frozen=True, kw_only=True)
class LabelSelector:
    """Requirements that must all hold (an empty selector selects everything)."""

    text: str
    """The selector as given, for messages and --help."""
    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse `text` (see the module docstring). Raises SelectorError naming the bad part."""
        return cls(text=text.strip(), requirements=tuple(_requirements(text)))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Tell whether `labels` satisfy every requirement."""
        return all(r.matches(labels) for r in self.requirements)


def _requirements(text: str) -> list[Requirement]:
    parts = _split(text)
    if parts == [""]:
        return []
    return [_requirement(part) for part in parts]


def _split(text: str) -> list[str]:
    """Split at the commas that separate requirements (not those inside a value set)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in label selector {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth:
        raise SelectorError(f"unbalanced '(' in label selector {text!r}")
    parts.append("".join(current).strip())
    return parts


def _requirement(part: str) -> Requirement:
    if match := _SET.fullmatch(part):
        values = [v.strip() for v in match["values"].split(",")]
        for value in values:
            _check_value(value, part)
        operator: Operator = "in" if match["op"] == "in" else "not-in"
        return Requirement(
            key=_check_key(match["key"], part), operator=operator, values=frozenset(values)
        )
    if match := _EQUALITY.fullmatch(part):
        operator = "not-in" if match["op"] == "!=" else "in"
        value = _check_value(match["value"], part)
        return Requirement(
            key=_check_key(match["key"], part), operator=operator, values=frozenset({value})
        )
    if part.startswith("!"):
        return Requirement(key=_check_key(part[1:].strip(), part), operator="not-exists")
    return Requirement(key=_check_key(part, part), operator="exists")


def _check_key(key: str, part: str) -> str:
    if not part:
        raise SelectorError("empty requirement in label selector (two commas in a row?)")
    name = key.rpartition("/")[2]
    if not _KEY.fullmatch(key) or len(name) > 63:
        raise SelectorError(f"{part!r}: {key!r} is not a label key")
    return key


def _check_value(value: str, part: str) -> str:
    if len(value) > 63 or not _VALUE.fullmatch(value):
        raise SelectorError(f"{part!r}: {value!r} is not a label value")
    return value
