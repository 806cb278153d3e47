"""The quota slices in the extender's filter (pure): nodes the pod's namespace's slices
refuse move from what passes to `FailedAndUnresolvableNodes`, with the reason the pod's
FailedScheduling event then shows.

Unresolvable, not merely failed: kube-scheduler's preemption looks for victims on failed
nodes, and evicting other pods there never gives a namespace slices it does not hold (nor
budget it has used): the victims would be evicted for nothing, as the filter would refuse
the node again."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tensile.contracts.objects import as_list, as_mapping, name_of

Refusals = Callable[[Mapping[str, Any], Iterable[str]], Mapping[str, str]]
"""(pod, virtual node names) -> the nodes refused and why (`SliceController.refusals`)."""


def within_slices(
    result: Mapping[str, Any],
    *,
    pod: Mapping[str, Any],
    candidates: Iterable[str],
    refusals: Refusals,
) -> dict[str, Any]:
    """Return a copy of the ExtenderFilterResult `result` in which each of `candidates`
    (the virtual nodes that passed the fit check) that `refusals` refuses for `pod` is
    moved from `NodeNames` (or `Nodes.items`) to `FailedAndUnresolvableNodes` (field
    names in either case). Nodes that are not
    virtual are never candidates: they pass untouched. Raises what `refusals` raises."""
    refused = refusals(pod, candidates)
    if not refused:
        return dict(result)
    # kube-scheduler reads the fields case-insensitively (Go's encoding/json): keep whichever
    # spelling the result uses ("FailedNodes" as Go writes it, "failedNodes" too).
    key = {k.lower(): k for k in result}
    failed, names, nodes = (
        key.get(k.lower(), k) for k in ("FailedAndUnresolvableNodes", "NodeNames", "Nodes")
    )
    out = dict(result)
    out[failed] = {**as_mapping(result.get(failed)), **refused}
    if names in result:
        out[names] = [n for n in as_list(result.get(names)) if n not in refused]
    if nodes in result:
        node_list = dict(as_mapping(result.get(nodes)))
        node_list["items"] = [
            item
            for item in as_list(node_list.get("items"))
            if name_of(as_mapping(item)) not in refused
        ]
        out[nodes] = node_list
    return out
