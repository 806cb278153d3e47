"""What the virtual node offers: the resources still free in the lower cluster.

The virtual node's `status.capacity` and `status.allocatable` are the lower cluster's
schedulable room: the allocatable of its usable nodes minus what the pods bound to them
request, counted the way kube-scheduler counts them. The lower pods this virtual node
created are left out, because the upper scheduler already counts their upper twins
against the virtual node. Pure functions only; objects are plain dicts as the API returns
them in JSON, and amounts are exact `Fraction`s in each resource's unit (cores, bytes,
counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any, Final

from tensile.contracts.objects import name_of
from tensile.kube.quantity import format_quantity
from tensile.kube.resources import pod_is_terminal
from tensile.placement.requests import (
    HUGEPAGES_PREFIX,
    plus,
    pod_requests,
    resource_list,
)

STANDARD_RESOURCES: Final = ("cpu", "memory", "pods", "ephemeral-storage")
"""Resource names a node status always carries, in the order `node_resources` writes them."""

_BINARY_RESOURCES: Final = frozenset({"memory", "ephemeral-storage"})
_ZERO: Final = Fraction(0)


def node_is_usable(node: Mapping[str, Any]) -> bool:
    """Tell whether new pods can be scheduled to `node`: Ready is "True" and it is not cordoned.

    Mirrors the node lifecycle controller's view: only Ready "True" is ready; "False",
    "Unknown" and a missing condition (a kubelet that never reported) are not, and
    kube-scheduler keeps new pods off such nodes through their not-ready taints.
    """
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def capacity(
    *,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    is_own_pod: Callable[[Mapping[str, Any]], bool],
) -> dict[str, Fraction]:
    """Return the resources free in the lower cluster, per resource name, in its unit.

    That is the sum of `status.allocatable` over usable nodes (`node_is_usable`), minus
    `pod_requests` of every pod that is bound (`spec.nodeName`) to one of them, is not
    terminal and is not one of ours (`is_own_pod` false). A pod being deleted
    (`deletionTimestamp` set) still counts: it holds its resources until it is gone, as
    kube-scheduler assumes too.

    Every resource name in some usable node's allocatable is in the result, and so are
    the `STANDARD_RESOURCES`, possibly 0; names only pods request are not. Totals are
    clamped at 0, because a node status with a negative amount is refused by the
    apiserver ("Invalid value: -20Gi", as tensile-kube ran into) and a negative offer
    means nothing. The clamp is on the cluster-wide total, not per node, so a node
    holding more than its allocatable (static pods, shrunk allocatable) lowers the
    offer; erring that way is safer than offering room that is not there.

    `is_own_pod` is only called for pods that would otherwise count. The same figure,
    kept up to date pod by pod instead of recomputed from every pod, is `Ledger.free`.

    Raises:
        ValueError: a quantity in a node or pod is malformed.
    """
    ledger = Ledger()
    for i, pod in enumerate(pods):
        if counts(pod) and not is_own_pod(pod):
            ledger.put(str(i), pod)
    return ledger.free(nodes)


def counts(pod: Mapping[str, Any]) -> bool:
    """Tell whether `pod` holds resources on a lower node: bound and not terminal (whose
    it is aside)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and not pod_is_terminal(pod)


class Ledger:
    """What the pods that count against the lower cluster's room request, node by node,
    kept up to date one pod at a time: the capacity of a cluster of 10,000 pods is then
    computed from its nodes alone, not from every pod again (`capacity` recomputes it)."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, dict[str, Fraction]]] = {}
        """Pod key -> (node, requests) of the pods counted."""
        self._nodes: dict[str, dict[str, Fraction]] = {}
        """Node -> the sum of its counted pods' requests."""

    def __len__(self) -> int:
        return len(self._pods)

    def put(
        self, key: str, pod: Mapping[str, Any], *, requests: dict[str, Fraction] | None = None
    ) -> bool:
        """Count `pod` (stored under `key`, replacing what was counted for it) if it
        `counts`, else stop counting `key`. The caller leaves out pods of its own.
        `requests`: `pod_requests(pod)` when the caller has it already (two ledgers fed
        the same pod compute it once); kept, so not to be changed afterwards.

        Returns whether the figures changed. Raises ValueError for a malformed quantity
        (the figures are then unchanged).
        """
        if not counts(pod):
            return self.remove(key)
        node = str((pod.get("spec") or {}).get("nodeName"))
        if requests is None:
            requests = pod_requests(pod)
        if self._pods.get(key) == (node, requests):
            return False
        self.remove(key)
        self._pods[key] = (node, requests)
        self._nodes[node] = plus(self._nodes.get(node, {}), requests)
        return True

    def requested(self, node: str) -> dict[str, Fraction]:
        """Return the summed requests of the pods counted on `node` ("pods": their count;
        empty when none), a new dict."""
        return dict(self._nodes.get(node, {}))

    def remove(self, key: str) -> bool:
        """Stop counting `key`; returns whether it was counted."""
        counted = self._pods.pop(key, None)
        if counted is None:
            return False
        node, requests = counted
        left = {
            name: amount
            for name, amount in _minus(self._nodes[node], requests).items()
            if amount != 0
        }
        if left:
            self._nodes[node] = left
        else:
            del self._nodes[node]
        return True

    def free(self, nodes: Iterable[Mapping[str, Any]]) -> dict[str, Fraction]:
        """Return what `capacity` returns for `nodes` and the pods counted here."""
        total: dict[str, Fraction] = dict.fromkeys(STANDARD_RESOURCES, _ZERO)
        used: dict[str, Fraction] = {}
        for node in nodes:
            if node_is_usable(node):
                name = name_of(node)
                total = plus(total, resource_list((node.get("status") or {}).get("allocatable")))
                used = plus(used, self._nodes.get(name, {}))
        return {name: max(_ZERO, amount - used.get(name, _ZERO)) for name, amount in total.items()}


def node_resources(values: Mapping[str, Fraction]) -> dict[str, str]:
    """Write `values` (as `capacity` returns) as a node's `status.capacity`/`allocatable`.

    - cpu in cores, with millis when not whole ("1500m");
    - memory, ephemeral-storage and hugepages-* in bytes, with the largest binary suffix
      that divides exactly ("64Gi", "1536Mi");
    - pods and every other (extended) resource as a whole count ("110", "4").

    Every amount is rounded down to the unit it is written in (a milli-core, a byte, one
    unit), unlike `format_quantity`, which rounds up: an offer must never exceed what is
    free, and extended resources such as nvidia.com/gpu only come in whole units.
    Negative amounts are written as 0, for the reason given in `capacity`.

    The `STANDARD_RESOURCES` always come first (0 when missing), then the other names in
    sorted order.
    """
    names = list(STANDARD_RESOURCES) + sorted(set(values) - set(STANDARD_RESOURCES))
    result: dict[str, str] = {}
    for name in names:
        amount = max(_ZERO, Fraction(values.get(name, _ZERO)))
        if name == "cpu":
            result[name] = format_quantity(Fraction(math.floor(amount * 1000), 1000))
        elif name in _BINARY_RESOURCES or name.startswith(HUGEPAGES_PREFIX):
            result[name] = format_quantity(math.floor(amount), binary=True)
        else:
            result[name] = format_quantity(math.floor(amount))
    return result


def _minus(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> dict[str, Fraction]:
    """Subtract `right` from `left` name by name; a missing name counts as 0."""
    result = dict(left)
    for name, amount in right.items():
        result[name] = result.get(name, _ZERO) - amount
    return result
