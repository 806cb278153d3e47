"""The slice controller: keeps each quota'd upper namespace's slices record
(`tensile.contracts.quotaslices`) and answers the extender's admission question from the
same caches.

    upper Namespaces                              -> store --+-> queue quota_slices (key: namespace)
    upper ResourceQuotas                          -> store --+        |
    upper virtual nodes (type=virtual-kubelet)    -> store --+        v
    upper pods bound, not finished                -> store --+   decide.decide -> PATCH
                                                                  Namespace annotations + Events

A namespace is looked at when it, or one of its quotas, changes; a change of the virtual
nodes or of the pods bound to them has every quota'd namespace looked at again after
`sync_delay` (one pass for a burst). One worker, so namespaces are placed one after the
other, each seeing the slices the others hold (`_written` covers the moment between a
write and its watch event). Writes carry the resourceVersion they were decided on: a
replica that decided on an older state gets a Conflict and decides again, and since the
decision is deterministic, replicas agree without a Lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from scheduler.slices import metrics
from scheduler.slices.admission import admit
from scheduler.slices.decide import decide
from scheduler.slices.placement import (
    Commitments,
    allocatable,
    commitments,
    headroom_base,
    kept_free,
    quota_of,
    rooms,
    usable,
)
from scheduler.slices.pods import BoundPods, slim_pod
from scheduler.slices.record import Holding, Units, record_of, units
from scheduler.slices.settings import SliceSettings
from tensile.contracts import labels
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    as_mapping,
    meta_of,
    name_of,
    namespace_of,
)
from tensile.contracts.quotaslices import SLICES_ANNOTATION
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import NAMESPACES, NODES, PODS, RESOURCE_QUOTAS, object_key
from tensile.kube.workqueue import WorkQueue
from tensile.placement.requests import pod_requests

logger = logging.getLogger(__name__)

COMPONENT = "tensile-scheduler"
"""The source component of the Events."""
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""The pods that hold resources on a node (kube-scheduler's own selection of assigned,
unfinished pods)."""
_QUOTA_NAMESPACE = "quota-slices/namespace"


def _namespace_index(obj: Obj) -> list[str]:
    return [namespace_of(obj)]


class SliceController:
    """The caches, the queue and the decisions: a `tensile.serving.lifecycle.Component`."""

    name = "quota-slices"

    def __init__(
        self,
        *,
        client: ApiClient,
        events: ApiClient,
        settings: SliceSettings,
        identity: str,
        factory: InformerFactory | None = None,
        may_act: Callable[[], bool] = lambda: True,
        node_selector: str = labels.VIRTUAL_NODE_SELECTOR,
    ) -> None:
        """`client` reads and writes Namespaces; `events` records Events (a budget of its
        own); `identity` names this replica (the Events' source host); `factory` shares
        the informers with the extender when given; `may_act` says whether this replica
        writes (default: always; the writes are safe from several replicas, see the module
        docstring); `node_selector` is the label selector of the virtual nodes that take
        slices (default: every virtual node)."""
        self._client = client
        self._settings = settings
        self._may_act = may_act
        self._recorder = EventRecorder(events, component=COMPONENT, host=identity)
        factory = factory or InformerFactory()
        self.namespaces = factory.informer(client, NAMESPACES, name="upper-namespaces")
        self.quotas = factory.informer(client, RESOURCE_QUOTAS, name="upper-resourcequotas")
        self.quotas.store.add_indexer(_QUOTA_NAMESPACE, _namespace_index)
        self.nodes = factory.informer(
            client,
            NODES,
            name="upper-slice-virtual-nodes",
            label_selector=node_selector,
        )
        self.pods = factory.informer(
            client,
            PODS,
            name="upper-bound-pods",
            field_selector=BOUND_PODS,
            transform=slim_pod,
        )
        self.queue = WorkQueue(name="quota_slices")
        self._bound = BoundPods()
        self._parsed: dict[str, dict[str, Holding] | None] = {}
        """Record annotation value -> its reading (records change seldom, calls often)."""
        self._written: dict[str, tuple[str | None, str | None]] = {}
        """Namespace -> (resourceVersion before our last write, the record we wrote), until
        the namespace informer shows a newer version."""
        self._unconstrained = metrics.ADMISSIONS.labels("unconstrained")
        self._admitted = metrics.ADMISSIONS.labels("admitted")
        self._refused = metrics.ADMISSIONS.labels("refused")
        self._generation = 0
        """Bumped by every change the commitments depend on (bound pods, virtual nodes,
        namespaces' records), so they are worked out once for all namespaces decided
        while nothing changes."""
        self._state: (
            tuple[int, dict[str, Units], dict[str, str], dict[str, Units], Commitments] | None
        ) = None
        self._held: dict[str, set[str]] = {}
        """Namespace -> nodes with a slices gauge set (to remove them when gone)."""
        enqueue = self._enqueue_object
        self.namespaces.add_handlers(Handlers(on_add=enqueue, on_modify=enqueue, on_delete=enqueue))
        quota = self._enqueue_namespace_of
        self.quotas.add_handlers(Handlers(on_add=quota, on_modify=quota, on_delete=quota))
        self.nodes.add_handlers(
            Handlers(
                on_add=self._resync_soon,
                on_update=self._node_changed,
                on_delete=self._resync_soon,
            )
        )
        self.pods.add_handlers(
            Handlers(on_add=self._pod_added, on_modify=self._pod_added, on_delete=self._pod_gone)
        )

    # Component

    def informers(self) -> Sequence[Informer]:
        """The caches the decisions and the admission read."""
        return [self.namespaces, self.quotas, self.nodes, self.pods]

    def ready(self) -> bool:
        """Whether every cache has its first list."""
        return all(i.has_synced() for i in self.informers())

    async def start(self) -> None:
        """Nothing to prepare."""

    async def run(self) -> None:
        """Decide namespaces one at a time until `shut_down()`."""
        await self.queue.run(workers=1, handler=self.reconcile)

    async def shut_down(self) -> None:
        """Stop taking namespaces (the one in hand is finished)."""
        await self.queue.shut_down()

    # The extender's question

    def refusals(self, pod: Mapping[str, Any], nodes: Iterable[str]) -> dict[str, str]:
        """Which of the virtual `nodes` `pod` may not go to within its namespace's slices,
        and why (`admission.admit`); {} for a namespace without a record. The
        pod's requests are read once for all nodes (the extender's hot path)."""
        namespace = namespace_of(pod)
        found = self.namespaces.store.get(namespace)
        record = self._record(annotations_of(found)) if found is not None else None
        if record is None:
            self._unconstrained.inc()
            return {}
        try:
            requests = units(pod_requests(pod))
        except (ValueError, TypeError):
            requests = {}
        refused = {}
        asked = 0
        for node in nodes:
            asked += 1
            used = self._bound.usage.get((namespace, node))
            reason = admit(
                record=record, node=node, requests=requests, placed=[used] if used else []
            )
            if reason is not None:
                refused[node] = reason
        self._admitted.inc(asked - len(refused))
        self._refused.inc(len(refused))
        return refused

    # Handlers: only look and enqueue.

    def _enqueue_object(self, obj: Obj) -> None:
        self._generation += 1
        self.queue.add(object_key(obj))

    def _enqueue_namespace_of(self, obj: Obj) -> None:
        self.queue.add(namespace_of(obj))

    def _resync_soon(self, _obj: Obj | None = None) -> None:
        """Look at every namespace with a quota or a record again, after `sync_delay`."""
        self._generation += 1
        names = {key.partition("/")[0] for key in self.quotas.store.keys()}
        names.update(self._held)
        for name in names:
            self.queue.add_after(name, self._settings.sync_delay)

    def _node_changed(self, old: Obj, new: Obj) -> None:
        if (
            allocatable(old) != allocatable(new)
            or usable(old) != usable(new)
            or (self._settings.headroom and headroom_base(old) != headroom_base(new))
        ):
            self._resync_soon()

    def _pod_added(self, pod: Obj) -> None:
        if self._bound.put(pod):
            self._resync_soon()

    def _pod_gone(self, pod: Obj) -> None:
        if self._bound.remove(pod):
            self._resync_soon()

    # The worker

    async def reconcile(self, namespace: str) -> None:
        """Decide for one namespace and write what changed. Raises the API errors of the
        write (the queue retries it with backoff)."""
        obj = self.namespaces.store.get(namespace)
        meta = meta_of(obj) if obj is not None else {}
        if obj is None or meta.get("deletionTimestamp"):
            self._written.pop(namespace, None)
            self._set_gauges(namespace, None, 0)
            return
        annotations = dict(as_mapping(meta.get("annotations")))
        version = str(meta.get("resourceVersion") or "")
        written = self._written.get(namespace)
        if written is not None:
            if written[0] == version:  # our write is not in the cache yet
                self._apply(annotations, written[1])
            else:
                del self._written[namespace]
        nodes, unusable, kept, committed = self._commitments()
        quota = quota_of(self.quotas.store.by_index(_QUOTA_NAMESPACE, namespace))
        decision = decide(
            annotations=annotations,
            quota=quota,
            cpu=self._settings.cpu,
            memory=self._settings.memory,
            headroom=self._settings.headroom,
            rooms=rooms(
                namespace=namespace,
                nodes=nodes,
                committed=committed,
                kept=kept,
            ),
            unusable=unusable,
        )
        if decision.patch is not None and self._may_act():
            body = {"metadata": {"resourceVersion": version, "annotations": decision.patch}}
            try:
                await self._client.request(
                    "PATCH",
                    NAMESPACES.path(name=namespace),
                    body=body,
                    content_type=MERGE_PATCH,
                )
            except errors.NotFound:
                return
            self._written[namespace] = (version, decision.patch.get(SLICES_ANNOTATION))
            self._generation += 1
            if decision.outcome is not None:
                metrics.DECISIONS.labels(decision.outcome).inc()
            for event in decision.events:
                logger.info("namespace %s: %s: %s", namespace, event.reason, event.message)
                await self._recorder.record(
                    obj,
                    type=event.type,
                    reason=event.reason,
                    message=event.message,
                    kind="Namespace",
                    api_version="v1",
                )
        self._set_gauges(namespace, decision.held, decision.unplaced)

    def _record(self, annotations: Mapping[str, Any]) -> dict[str, Holding] | None:
        """`record.record_of`, each distinct value read once."""
        value = annotations.get(SLICES_ANNOTATION)
        if not isinstance(value, str):
            return None
        if value not in self._parsed:
            if len(self._parsed) >= 4096:
                self._parsed.clear()
            self._parsed[value] = record_of(annotations)
        return self._parsed[value]

    @staticmethod
    def _apply(annotations: dict[str, Any], value: str | None) -> None:
        if value is None:
            annotations.pop(SLICES_ANNOTATION, None)
        else:
            annotations[SLICES_ANNOTATION] = value

    def _commitments(
        self,
    ) -> tuple[dict[str, Units], dict[str, str], dict[str, Units], Commitments]:
        """The usable virtual nodes' allocatable, the unusable ones (why), what headroom
        keeps free on each, and the commitments on them: worked out again only after a
        change."""
        if self._state is None or self._state[0] != self._generation:
            nodes, unusable, kept = self._virtual_nodes()
            committed = commitments(nodes=nodes, usage=self._bound.usage, records=self._records())
            self._state = (self._generation, nodes, unusable, kept, committed)
        return self._state[1], self._state[2], self._state[3], self._state[4]

    def _virtual_nodes(self) -> tuple[dict[str, Units], dict[str, str], dict[str, Units]]:
        """(usable virtual node -> allocatable, unusable virtual node -> why, usable
        virtual node -> what headroom keeps free there)."""
        nodes: dict[str, Units] = {}
        unusable: dict[str, str] = {}
        kept: dict[str, Units] = {}
        for node in self.nodes.store:
            name = name_of(node)
            why = usable(node)
            if why is None:
                nodes[name] = allocatable(node)
                if self._settings.headroom:
                    kept[name] = kept_free(headroom_base(node), self._settings.headroom)
            else:
                unusable[name] = why
        return nodes, unusable, kept

    def _records(self) -> dict[str, Mapping[str, Holding]]:
        """Every namespace's record in force (the cache, with our writes not yet in it)."""
        out: dict[str, Mapping[str, Holding]] = {}
        for obj in self.namespaces.store:
            meta = meta_of(obj)
            name = str(meta.get("name") or "")
            annotations = dict(as_mapping(meta.get("annotations")))
            written = self._written.get(name)
            if written is not None and written[0] == str(meta.get("resourceVersion") or ""):
                self._apply(annotations, written[1])
            record = self._record(annotations)
            if record:
                out[name] = record
        return out

    def _set_gauges(
        self, namespace: str, held: Mapping[str, Holding] | None, unplaced: int
    ) -> None:
        now = {node: h.count for node, h in (held or {}).items()}
        for node in self._held.get(namespace, set()) - set(now):
            metrics.SLICES_HELD.remove(namespace, node)
        for node, count in now.items():
            metrics.SLICES_HELD.labels(namespace, node).set(count)
        if now or unplaced:
            self._held[namespace] = set(now)
            metrics.SLICES_UNPLACED.labels(namespace).set(unplaced)
        elif namespace in self._held:
            del self._held[namespace]
            metrics.SLICES_UNPLACED.remove(namespace)
