"""What the lower-pod cache keeps of each pod (pure): only the fields the provider reads.

A virtual node caches every lower pod (capacity counts pods that are not its own), so the
cache must be small: pods of others keep what capacity needs; our own keep, in addition,
their metadata, status, and the spec fields updates compare. The ConfigMaps, Secrets and
ServiceAccount a pod references are computed once here, for the dependency collector,
instead of keeping volumes and environments around.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vnode.kube.informer import compact
from vnode.providers.k2k import naming, translate

REFS = "tensile.io/refs"
"""Key of the precomputed references, a sorted list of [kind, name] (not a Kubernetes field)."""
REFS_INDEX = "refs"
"""Name of the lower-pod cache's index of references (`by_reference`)."""

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


def reference(namespace: str, kind: str, name: str) -> str:
    """Return the `REFS_INDEX` value of a reference to `kind` `name` in lower `namespace`."""
    return f"{namespace}/{kind}/{name}"


def by_reference(pod: Mapping[str, Any]) -> list[str]:
    """Index a cached lower pod by what it references (`reference` values), so "does any pod
    of this namespace still use this ConfigMap" is answered without reading every pod."""
    namespace = str((pod.get("metadata") or {}).get("namespace"))
    return [reference(namespace, str(kind), str(name)) for kind, name in pod.get(REFS) or ()]
