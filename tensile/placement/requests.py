"""What a pod requests of its node, counted the way kube-scheduler counts it (pure).

Amounts are exact `Fraction`s in each resource's unit (cores, bytes, counts); resource
lists are plain dicts of resource name -> amount.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

from tensile.kube.quantity import parse_quantity

HUGEPAGES_PREFIX: Final = "hugepages-"
"""Name prefix of the huge page resources (hugepages-2Mi, hugepages-1Gi)."""
# What PodLevelResources lets spec.resources set (component-helpers IsSupportedPodLevelResource).
_POD_LEVEL_RESOURCES: Final = frozenset({"cpu", "memory"})
_ZERO: Final = Fraction(0)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """Return what `pod` occupies on its node, per resource name, as kube-scheduler counts it.

    Mirrors `PodRequests` in k8s.io/component-helpers/resource with the sidecar-aware
    (non-deprecated) formula and spec (not status) resources, which the scheduler's
    NodeResourcesFit (pkg/scheduler/framework/plugins/noderesources/fit.go,
    `computePodResourceRequest`) uses:

    - app containers and restartable init containers (sidecars: `restartPolicy: Always`)
      all run together, so their requests add up;
    - each other init container runs alone but alongside the sidecars declared before it,
      so the pod needs at least its request plus theirs; the larger of the two wins;
    - pod-level `spec.resources.requests` (PodLevelResources) replace the container
      figure for cpu, memory and hugepages-*;
    - `spec.overhead` (RuntimeClass) is added on top;
    - "pods" is always 1: the pod takes one of its node's pod slots.

    A container with a limit but no request for a resource requests its limit, as API
    defaulting would have made it; objects read from the apiserver already are defaulted.

    Raises:
        ValueError: a quantity in the pod is malformed.
    """
    spec = pod.get("spec") or {}
    running: dict[str, Fraction] = {}
    for container in spec.get("containers") or ():
        running = plus(running, _container_requests(container))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            # A sidecar keeps running next to the app containers. While it starts, only
            # the sidecars before it run, which is never more than `running` ends up with.
            sidecars = plus(sidecars, requests)
            running = plus(running, requests)
        else:
            init_peak = larger(init_peak, plus(requests, sidecars))
    result = larger(running, init_peak)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name, quantity in pod_level.items():
        if name in _POD_LEVEL_RESOURCES or name.startswith(HUGEPAGES_PREFIX):
            result[name] = parse_quantity(quantity)
    result = plus(result, resource_list(spec.get("overhead")))
    result["pods"] = Fraction(1)
    return result


def resource_list(raw: Mapping[str, Any] | None) -> dict[str, Fraction]:
    """Parse a ResourceList (resource name -> quantity string). Raises ValueError for a
    malformed quantity."""
    return {name: parse_quantity(quantity) for name, quantity in (raw or {}).items()}


def plus(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> dict[str, Fraction]:
    """Add two resource lists name by name; a missing name counts as 0."""
    result = dict(left)
    for name, amount in right.items():
        result[name] = result.get(name, _ZERO) + amount
    return result


def larger(left: Mapping[str, Fraction], right: Mapping[str, Fraction]) -> dict[str, Fraction]:
    """Take the larger amount name by name; a name in only one of the lists keeps its amount."""
    result = dict(left)
    for name, amount in right.items():
        result[name] = max(result[name], amount) if name in result else amount
    return result


def _container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """A container's requests, with the limit standing in for any request left out."""
    resources = container.get("resources") or {}
    # Same as API defaulting (SetDefaults_Pod copies such limits into requests).
    return {**resource_list(resources.get("limits")), **resource_list(resources.get("requests"))}
