"""Which ConfigMap and Secret references of a pod cannot be resolved, as a kubelet sees it.

A kubelet mounts volumes first (a missing mandatory ConfigMap or Secret keeps the pod in
ContainerCreating, with a FailedMount event), then builds each container's environment (a
missing mandatory object or key is CreateContainerConfigError on the container). Optional
references are skipped; virtual-kubelet records an event for each one it skips. Pure
functions: the caller passes a lookup into its cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vnode import provider_errors
from vnode.provider import PodEvent
from vnode.providers.k2k.translate import CONFIG_MAP, Reference, references

Lookup = Callable[[str, str], Mapping[str, Any] | None]
"""(kind, name) -> the object in the pod's namespace, or None."""


def unresolved(pod: Mapping[str, Any], *, lookup: Lookup) -> list[Reference]:
    """Return the references of `pod` that cannot be resolved, first met first.

    A reference whose object is missing comes back with `key` None (the object, not the key,
    is what is missing); one whose object exists but lacks the key keeps its key. Each
    (kind, name, key, volume) appears once; imagePullSecrets are left out (a kubelet pulls
    without a missing pull secret).
    """
    seen: set[tuple[str, str, str | None, str | None]] = set()
    result: list[Reference] = []
    for ref in references(pod):
        if ref.pull_secret:
            continue
        obj = lookup(ref.kind, ref.name)
        if obj is None:
            gap = Reference(kind=ref.kind, name=ref.name, optional=ref.optional, volume=ref.volume)
        elif ref.key is not None and not _has_key(obj, ref.key, kind=ref.kind):
            gap = ref
        else:
            continue
        ident = (gap.kind, gap.name, gap.key, gap.volume)
        if ident not in seen:
            seen.add(ident)
            result.append(gap)
    return result


def first_mandatory(
    gaps: list[Reference], *, namespace: str
) -> provider_errors.MissingDependency | None:
    """Return the error for the first mandatory gap in `gaps`, or None if all are optional.

    Messages are a kubelet's: `configmap "app" not found`, `couldn't find key k in Secret
    ns/s`; for a volume, the FailedMount wording `MountVolume.SetUp failed for volume "v" :
    configmap "app" not found`.
    """
    for gap in gaps:
        if gap.optional:
            continue
        if gap.key is not None:
            message = f"couldn't find key {gap.key} in {gap.kind} {namespace}/{gap.name}"
        else:
            message = f'{gap.kind.lower()} "{gap.name}" not found'
        if gap.volume is not None:
            message = f'MountVolume.SetUp failed for volume "{gap.volume}" : {message}'
        return provider_errors.MissingDependency(
            message,
            kind=gap.kind,
            namespace=namespace,
            name=gap.name,
            key=gap.key,
            volume=gap.volume,
        )
    return None


def skipped_events(gaps: list[Reference], *, namespace: str) -> list[PodEvent]:
    """Return the Warning events for optional env references the pod starts without.

    Reasons are virtual-kubelet's (`OptionalConfigMapNotFound`, `OptionalSecretKeyNotFound`,
    ...); optional volumes that are missing are mounted empty without an event, as by a kubelet.
    """
    events = []
    for gap in gaps:
        if not gap.optional or gap.volume is not None:
            continue
        if gap.key is not None:
            reason = f"Optional{gap.kind}KeyNotFound"
            what = f"key {gap.key} of {gap.kind} {namespace}/{gap.name}"
        else:
            reason = f"Optional{gap.kind}NotFound"
            what = f"{gap.kind} {namespace}/{gap.name}"
        events.append(
            PodEvent(
                type="Warning",
                reason=reason,
                message=f"optional {what} not found: starting the pod without it",
            )
        )
    return events


def _has_key(obj: Mapping[str, Any], key: str, *, kind: str) -> bool:
    # A Secret's stringData is write-only: the API server folds it into data.
    fields = ("data", "binaryData") if kind == CONFIG_MAP else ("data",)
    return any(key in (obj.get(f) or {}) for f in fields)
