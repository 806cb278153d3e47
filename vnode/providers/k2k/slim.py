"""What the lower-pod cache keeps of each pod (pure): only the fields the provider reads.

A virtual node caches every lower pod (capacity counts pods that are not its own), so the
cache must be small: pods of others keep what capacity needs; our own keep, in addition,
their metadata, status, and the spec fields updates compare. The ConfigMaps, Secrets and
ServiceAccount a pod references are computed once here, for the dependency collector,
instead of keeping volumes and environments around.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import meta_of
from tensile.kube.informer import compact
from vnode.providers.k2k import translate

REFS = "tensile.io/refs"
"""Key of the precomputed references, a sorted list of [kind, name] (not a Kubernetes field)."""

_META_ALWAYS = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
_META_OWNED = (
    "labels", "annotations", "deletionGracePeriodSeconds", "creationTimestamp",
    # With status.observedGeneration, whether the lower node observed the latest spec.
    "generation",
)  # fmt: skip
_SPEC_CAPACITY = ("nodeName", "overhead", "resources")
_SPEC_OWNED = ("tolerations", "activeDeadlineSeconds", "serviceAccountName", "readinessGates")
_CONTAINER_FIELDS = ("name", "image", "resources", "restartPolicy")


@dataclass(frozen=True)
class SlimLowerPods:
    """`slim_lower_pod` for one owner, as an informer transform: it compares by value (the
    owner), so every component asking for the lower pod informer gets the same shared one,
    and it remembers the references of recent pods: a pod's volumes and environment cannot
    change, so its references are worked out once, not at each of its watch events (a pod
    has several as it starts)."""

    owner: ownership.NodeIdentity
    remembered: int = 4096
    """How many pods' references are remembered (the oldest are forgotten first)."""
    _refs: dict[tuple[str, int], list[list[str]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __call__(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        meta = meta_of(pod)
        spec = pod.get("spec") or {}
        # Ephemeral containers are the one part that can be added later, with references.
        seen = (
            f"{meta.get('namespace')}/{meta.get('name')}/{meta.get('uid')}",
            len(spec.get("ephemeralContainers") or ()),
        )
        refs = self._refs.get(seen)
        if refs is None:
            refs = references_of(pod)
            if len(self._refs) >= self.remembered:
                del self._refs[next(iter(self._refs))]  # the oldest
            self._refs[seen] = refs
        return slim_lower_pod(pod, owner=self.owner, refs=refs)


def references_of(pod: Mapping[str, Any]) -> list[list[str]]:
    """Return what a pod references, as `REFS` keeps it: a sorted list of [kind, name]."""
    deps = translate.dependencies(pod)
    return sorted(
        [["ConfigMap", n] for n in deps.config_maps]
        + [["Secret", n] for n in deps.secrets]
        + ([["ServiceAccount", deps.service_account]] if deps.service_account else [])
    )


def slim_lower_pod(
    pod: Mapping[str, Any], *, owner: ownership.NodeIdentity, refs: list[list[str]] | None = None
) -> dict[str, Any]:
    """Return the cached form of a lower pod (a new object; `pod` is not changed).
    `refs`: its `references_of`, when already known."""
    owned = ownership.is_owned(pod, owner=owner)
    meta = meta_of(pod)
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    keep_meta = _META_ALWAYS + (_META_OWNED if owned else ())
    slim_spec: dict[str, Any] = {k: spec[k] for k in _SPEC_CAPACITY if k in spec}
    for group in ("containers", "initContainers"):
        if group in spec:
            slim_spec[group] = [_slim_container(c) for c in spec[group] or []]
    if owned:
        slim_spec.update({k: spec[k] for k in _SPEC_OWNED if k in spec})
    slim: dict[str, Any] = {
        "metadata": {k: meta[k] for k in keep_meta if k in meta},
        "spec": slim_spec,
        "status": dict(status) if owned else {"phase": status.get("phase")},
        REFS: references_of(pod) if refs is None else refs,
    }
    return compact(slim)


def _slim_container(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container fields kept, and of its ports only those with a hostPort (the lower
    node's taken host ports, for the placement summary)."""
    kept = {k: container[k] for k in _CONTAINER_FIELDS if k in container}
    held = [p for p in container.get("ports") or () if p.get("hostPort")]
    if held:
        kept["ports"] = held
    return kept
