"""What the lower-pod cache keeps of each pod (pure): only the fields the provider reads.

A virtual node caches every lower pod (capacity counts pods that are not its own), so the
cache must be small: pods of others keep what capacity needs; our own keep, in addition,
their metadata, status, and the spec fields updates compare. The ConfigMaps, Secrets and
ServiceAccount a pod references are computed once here, for the dependency collector,
instead of keeping volumes and environments around.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vnode.kube.informer import compact
from vnode.providers.k2k import naming, translate

REFS = "tensile.io/refs"
"""Key of the precomputed references, a sorted list of [kind, name] (not a Kubernetes field)."""

_META_ALWAYS = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
_META_OWNED = ("labels", "annotations", "deletionGracePeriodSeconds", "creationTimestamp")
_SPEC_CAPACITY = ("nodeName", "overhead", "resources")
_SPEC_OWNED = ("tolerations", "activeDeadlineSeconds", "serviceAccountName", "readinessGates")
_CONTAINER_FIELDS = ("name", "image", "resources", "restartPolicy")


def slim_lower_pod(pod: Mapping[str, Any], *, owner: naming.Owner) -> dict[str, Any]:
    """Return the cached form of a lower pod (a new object; `pod` is not changed)."""
    owned = naming.is_owned(pod, owner=owner)
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    keep_meta = _META_ALWAYS + (_META_OWNED if owned else ())
    slim_spec: dict[str, Any] = {k: spec[k] for k in _SPEC_CAPACITY if k in spec}
    for group in ("containers", "initContainers"):
        if group in spec:
            slim_spec[group] = [
                {k: c[k] for k in _CONTAINER_FIELDS if k in c} for c in spec[group] or []
            ]
    if owned:
        slim_spec.update({k: spec[k] for k in _SPEC_OWNED if k in spec})
    deps = translate.dependencies(pod)
    refs = sorted(
        [["ConfigMap", n] for n in deps.config_maps]
        + [["Secret", n] for n in deps.secrets]
        + ([["ServiceAccount", deps.service_account]] if deps.service_account else [])
    )
    slim: dict[str, Any] = {
        "metadata": {k: meta[k] for k in keep_meta if k in meta},
        "spec": slim_spec,
        "status": dict(status) if owned else {"phase": status.get("phase")},
        REFS: refs,
    }
    return compact(slim)


@dataclass(frozen=True)
class SlimLowerPods:
    """`slim_lower_pod` for one owner, as an informer transform that compares by value (so
    every component asking for the lower pod informer gets the same shared one)."""

    owner: naming.Owner

    def __call__(self, pod: dict[str, Any]) -> dict[str, Any]:
        return slim_lower_pod(pod, owner=self.owner)
