"""What the pods bound to virtual nodes request, per namespace and node, kept up to date pod
by pod from the watch (the slice controller's rooms and the extender's admission read it;
summing 10,000 pods per question would not do)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.slices.placement import PodUse
from tensile.contracts.objects import Obj, as_mapping, dicts_in, meta_of
from tensile.kube.resources import object_key
from tensile.placement.requests import pod_requests
from tensile.placement.slices import Units, units


def slim_pod(pod: Obj) -> Obj:
    """What the bound-pods informer keeps of a pod: its name and namespace, its node and
    what `pod_requests` reads (containers' and init containers' resources, sidecar
    restart policies, pod-level resources, overhead): a tenth of a pod, at 10,000 pods."""
    meta = meta_of(pod)
    spec = as_mapping(pod.get("spec"))
    kept_spec: Obj = {
        key: spec[key] for key in ("nodeName", "overhead", "resources") if key in spec
    }
    for key in ("containers", "initContainers"):
        if key in spec:
            kept_spec[key] = [
                {k: c[k] for k in ("name", "resources", "restartPolicy") if k in c}
                for c in dicts_in(spec[key])
            ]
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
        "spec": kept_spec,
    }


def pod_use(pod: Mapping[str, Any]) -> PodUse | None:
    """The namespace, node and cpu/memory requests (`Units`) of a bound pod; None when
    unbound or when a quantity in it cannot be read (the apiserver validates them: only a
    hand-made object)."""
    meta = meta_of(pod)
    node = as_mapping(pod.get("spec")).get("nodeName")
    if not node:
        return None
    try:
        requests = pod_requests(pod)
    except (ValueError, TypeError):
        return None
    return PodUse(
        namespace=str(meta.get("namespace") or ""),
        node=str(node),
        requests={"cpu": 0, "memory": 0, **units(requests)},
    )


class BoundPods:
    """The requests of bound pods, summed by (namespace, node)."""

    def __init__(self) -> None:
        self._uses: dict[str, PodUse] = {}
        """Pod key -> its use (requests read once, at the watch event)."""
        self.usage: dict[tuple[str, str], Units] = {}
        """(namespace, node) -> the summed requests of its bound pods."""

    def put(self, pod: Mapping[str, Any]) -> bool:
        """Count `pod` as it is now (a watch add or modify); True when the sums changed."""
        key = object_key(pod)
        use = pod_use(pod)
        if self._uses.get(key) == use:
            return False
        self.remove(pod)
        if use is not None:
            self._uses[key] = use
            used = self.usage.setdefault((use.namespace, use.node), {})
            for name, amount in use.requests.items():
                used[name] = used.get(name, 0) + amount
        return True

    def remove(self, pod: Mapping[str, Any]) -> bool:
        """Stop counting `pod` (a watch delete: gone, or finished); True when it counted."""
        use = self._uses.pop(object_key(pod), None)
        if use is None:
            return False
        place = (use.namespace, use.node)
        used = self.usage.get(place, {})
        for name, amount in use.requests.items():
            used[name] = used.get(name, 0) - amount
        if not any(used.values()):
            self.usage.pop(place, None)
        return True
