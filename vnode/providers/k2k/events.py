"""Mirror lower-cluster Events about forwarded pods and claims onto their upper objects.

So `kubectl describe pod` in the upper cluster shows why a pod waits or fails below
(FailedScheduling, Pulled, BackOff, ...), and `kubectl describe pvc` why a claim is not
bound below. Each lower Event becomes one upper Event of the same name in the upper
object's namespace; a repeat (count, lastTimestamp) updates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import Obj, annotations_of, meta_of, name_of, namespace_of, uid_of
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import EVENTS
from tensile.kube.workqueue import WorkQueue

_COPIED = (
    "reason",
    "message",
    "type",
    "count",
    "firstTimestamp",
    "lastTimestamp",
    "eventTime",
    "series",
    "action",
    "reportingComponent",
    "reportingInstance",
    "source",
)
_REPEAT_FIELDS = ("count", "lastTimestamp", "message", "series")
ROUTINE_REASONS = frozenset({"Scheduled"})
"""Normal lower events not mirrored: one per pod ("assigned to lower-node-3"), costing an
upper write each, while the upper pod's own Scheduled event already tells the story."""


_META_KEPT = ("name", "namespace", "resourceVersion")
_INVOLVED_KEPT = ("namespace", "name", "uid", "fieldPath")


def slim_event(event: Mapping[str, Any]) -> Obj:
    """Return what the cache keeps of a lower Event (a new object; pure): what `upper_event`
    and the mirror read. The lower cluster's Events about all its pods are cached, so the
    rest (managedFields, the lower UID and times of the Event object itself) is left out;
    routine Events, which are never mirrored, keep only what says they are routine."""
    meta = meta_of(event)
    involved = event.get("involvedObject") or {}
    slim: Obj = {
        "metadata": {k: meta[k] for k in _META_KEPT if k in meta},
        "involvedObject": {k: involved[k] for k in _INVOLVED_KEPT if k in involved},
    }
    fields = ("reason", "type") if _routine(event) else _COPIED
    slim.update({f: event[f] for f in fields if event.get(f) is not None})
    return slim


def _routine(event: Mapping[str, Any]) -> bool:
    return event.get("reason") in ROUTINE_REASONS and event.get("type") == "Normal"


def upper_event(
    lower_event: Mapping[str, Any], *, lower_pod: Mapping[str, Any], kind: str = "Pod"
) -> Obj | None:
    """Return the upper Event for a lower Event about an owned pod (or claim: `kind`), or
    None (pure).

    The involved object becomes the upper object (namespace, name, UID from the ownership
    annotations); everything the user reads (reason, message, type, counts, times,
    reporting component) is kept.
    """
    annotations = annotations_of(lower_pod)
    upper_uid = ownership.upper_uid_of(lower_pod)
    upper_ns = annotations.get(ownership.UPPER_NAMESPACE_ANNOTATION)
    if not upper_uid or not upper_ns:
        return None
    involved = lower_event.get("involvedObject") or {}
    event: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name_of(lower_event), "namespace": upper_ns},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": kind,
            "namespace": upper_ns,
            "name": involved.get("name"),
            "uid": upper_uid,
            **({"fieldPath": involved["fieldPath"]} if involved.get("fieldPath") else {}),
        },
    }
    for f in _COPIED:
        if lower_event.get(f) is not None:
            event[f] = lower_event[f]
    return event


class EventMirror:
    """Watches lower Events about one kind and copies those about owned objects upstairs."""

    def __init__(
        self,
        *,
        upper: ApiClient,
        lower: ApiClient,
        made: Callable[[Mapping[str, Any]], bool],
        lower_objects: Informer,
        informers: InformerFactory,
        kind: str = "Pod",
        name: str = "lower-events",
    ):
        """`lower_objects` caches the lower objects of `kind` (owned ones at least), of
        which `made` tells the ones this node made (for pods `LowerPodBook.made`: the marks
        and the lower UID the node recorded, so an impostor's Events never reach the upper
        pod its copied marks name); `name` names the Events informer and, with
        "_from_lower", its queue."""
        self._upper = upper
        self._made = made
        self._kind = kind
        self._lower_objects = lower_objects
        self.informer = informers.informer(
            lower,
            EVENTS,
            name=name,
            field_selector=f"involvedObject.kind={kind}",
            transform=slim_event,
            encoded=True,  # anyone's Events about the kind below; each read once or twice
        )
        self.queue = WorkQueue(name="events_from_lower" if kind == "Pod" else f"{name}_from_lower")
        self.informer.add_handlers(Handlers(on_add=self._changed, on_modify=self._changed))

    def _owned_object(self, event: Mapping[str, Any]) -> Obj | None:
        involved = event.get("involvedObject") or {}
        pod = self._lower_objects.store.get(f"{involved.get('namespace')}/{involved.get('name')}")
        if pod is None or not self._made(pod):
            return None
        if involved.get("uid") and involved["uid"] != uid_of(pod):
            return None  # about an earlier pod of the same name
        return pod

    def _changed(self, event: Obj) -> None:
        if _routine(event):
            return
        if self._owned_object(event) is not None:
            meta = meta_of(event)
            self.queue.add(f"{meta['namespace']}/{meta['name']}")

    async def sync(self, key: str) -> None:
        """Create or update the upper copy of the lower Event `key`."""
        lower_event = self.informer.store.get(key)
        if lower_event is None:
            return
        pod = self._owned_object(lower_event)
        if pod is None:
            return
        event = upper_event(lower_event, lower_pod=pod, kind=self._kind)
        if event is None:
            return
        ns = namespace_of(event)
        try:
            await self._upper.request("POST", EVENTS.path(namespace=ns), body=event)
        except errors.AlreadyExists:
            patch = {f: event.get(f) for f in _REPEAT_FIELDS if f in event}
            await self._upper.request(
                "PATCH",
                EVENTS.path(namespace=ns, name=name_of(event)),
                body=patch,
                content_type=MERGE_PATCH,
            )
        except errors.NotFound:
            pass  # the upper namespace is gone
