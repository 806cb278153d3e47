"""The virtual nodes as the extender knows them: each one's labels and its parsed placement
summary, kept from the upper Node informer's events (pure: no I/O, nothing mutated that is
passed in).

A summary is parsed once per new annotation value, not per call. A Node whose
LowerControlPlaneReachable condition is False is kept, marked (`lower_unreachable`): the
filter refuses it. A Node without the
annotation is not virtual (it passes the filter untouched); one whose summary cannot be
parsed is treated the same and counted (`unreadable`), because refusing pods for a
malformed summary would be a wrong "no".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import lowerhealth
from tensile.contracts.objects import as_mapping, meta_of
from tensile.placement import summary


@dataclass(frozen=True, kw_only=True)
class NodeSummary:
    """A virtual Node of the upper cluster and its lower cluster's summary."""

    name: str
    labels: Mapping[str, str]
    summary: summary.Summary
    text: str
    """The annotation value `summary` was parsed from."""
    generation: int = 0
    """Grows with every new summary `Summaries` takes in (a key for what was judged on it)."""
    lower_unreachable: bool = False
    """The Node says its lower control plane does not answer
    (`lowerhealth.lower_unreachable`): its summary is as last seen, and no pod is placed
    there until it answers again."""


class Summaries:
    """Node name -> `NodeSummary`, updated with `put`/`remove` from Node events."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeSummary] = {}
        self._generation = 0
        self.unreadable: dict[str, str] = {}
        """Node name -> why its summary could not be read (the latest error)."""

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, name: str) -> NodeSummary | None:
        """Return the virtual node `name`, or None when it is not one (or unknown)."""
        return self._nodes.get(name)

    def put(self, node: Mapping[str, Any]) -> None:
        """Take in a Node added or modified (a Node object as the API returns it)."""
        meta = meta_of(node)
        name = str(meta.get("name") or "")
        text = as_mapping(meta.get("annotations")).get(summary.ANNOTATION)
        labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
        unreachable = lowerhealth.lower_unreachable(node)
        if not isinstance(text, str):
            self.remove(name)
            return
        known = self._nodes.get(name)
        if known is not None and known.text == text:
            if known.labels != labels or known.lower_unreachable != unreachable:
                self._nodes[name] = NodeSummary(
                    name=name,
                    labels=labels,
                    summary=known.summary,
                    text=text,
                    generation=self._next(),
                    lower_unreachable=unreachable,
                )
            return
        try:
            parsed = summary.parse(text, previous=known.summary if known is not None else None)
        except summary.SummaryError as exc:
            self._nodes.pop(name, None)
            self.unreadable[name] = str(exc)
            return
        self.unreadable.pop(name, None)
        self._nodes[name] = NodeSummary(
            name=name,
            labels=labels,
            summary=parsed,
            text=text,
            generation=self._next(),
            lower_unreachable=unreachable,
        )

    def _next(self) -> int:
        self._generation += 1
        return self._generation

    def remove(self, name: str) -> None:
        """Forget Node `name` (deleted, or no longer carrying a summary)."""
        self._nodes.pop(name, None)
        self.unreadable.pop(name, None)
