"""The slice controller: keeps each quota'd upper namespace's slices record
(`tensile.contracts.quotaslices`, on one of its ResourceQuotas) and answers the extender's
admission question from the same caches.

    upper ResourceQuotas (records)                -> store --+-> queue quota_slices (key: namespace)
    upper virtual nodes (type=virtual-kubelet)    -> store --+        |
    upper pods bound, not finished                -> store --+        v
                                                             decide.decide -> PATCH the
                                                             ResourceQuota's annotations + Events

A namespace is looked at when one of its quotas changes; a change of the virtual nodes or
of the pods bound to them has every quota'd namespace looked at again after `sync_delay`
(one pass for a burst). One worker, so namespaces are placed one after the other, each
seeing the slices the others hold (`_written` covers the moment between a write and its
watch event). Writes carry the resourceVersion they were decided on: a replica that decided
on an older state gets a Conflict and decides again, and since the decision is
deterministic, replicas agree without a Lease.

The record is read from the namespace's quotas, never from its Namespace object: a tenant
granted `patch` on its own Namespace must not grant itself slices (`tensile.placement.
slices.record_in_force` says what is read, and the virtual nodes read it the same way).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from scheduler.slices import metrics
from scheduler.slices.decide import decide
from scheduler.slices.placement import (
    Commitments,
    allocatable,
    commitments,
    headroom_base,
    kept_free,
    rooms,
    usable,
)
from scheduler.slices.pods import BoundPods, slim_pod
from scheduler.slices.settings import SliceSettings
from tensile.contracts import labels
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    as_mapping,
    meta_of,
    name_of,
    namespace_of,
    resource_version_of,
)
from tensile.contracts.quotaslices import SLICES_ANNOTATION, STATUS_ANNOTATION
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import NODES, PODS, RESOURCE_QUOTAS, object_key
from tensile.kube.workqueue import WorkQueue
from tensile.placement.requests import pod_requests
from tensile.placement.slices import (
    Holding,
    InForce,
    InForceReader,
    Units,
    admit,
    carriers,
    quota_of,
    record_in_force,
    units,
)

logger = logging.getLogger(__name__)

COMPONENT = "tensile-scheduler"
"""The source component of the Events."""
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""The pods that hold resources on a node (kube-scheduler's own selection of assigned,
unfinished pods)."""
_QUOTA_NAMESPACE = "quota-slices/namespace"


def _namespace_index(obj: Obj) -> list[str]:
    return [namespace_of(obj)]


def target_quota(quotas: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ResourceQuota of a namespace whose annotations hold its record: the first (by
    name) that carries one, else the first carrying the controller's status (a record
    cleared by hand), else the first unscoped one bounding requests.cpu or requests.memory
    (where a new record is written); None when there is none of these."""
    ordered = sorted(quotas, key=name_of)
    for key in (SLICES_ANNOTATION, STATUS_ANNOTATION):
        for quota in ordered:
            if isinstance(annotations_of(quota).get(key), str):
                return quota
    for quota in ordered:
        if quota_of([quota]):
            return quota
    return None


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
        """`client` reads and writes ResourceQuotas; `events` records Events (a budget of
        its own); `identity` names this replica (the Events' source host); `factory` shares
        the informers with the extender when given; `may_act` says whether this replica
        writes (default: always; the writes are safe from several replicas, see the module
        docstring); `node_selector` is the label selector of the virtual nodes that take
        slices (default: every virtual node)."""
        self._client = client
        self._settings = settings
        self._may_act = may_act
        self._recorder = EventRecorder(events, component=COMPONENT, host=identity)
        factory = factory or InformerFactory()
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
            # As JSON text: only the handlers read these pods (what they request is summed
            # in `BoundPods` at each event), and bytes are no work for the garbage
            # collector, which walked every slim pod's dicts in each full collection, with
            # the extender's calls waiting.
            encoded=True,
        )
        self.queue = WorkQueue(name="quota_slices")
        self._bound = BoundPods()
        self._reader = InForceReader()
        """The records in force as the cache shows them (the extender's question)."""
        self._written: dict[str, tuple[str, str | None]] = {}
        """ResourceQuota key -> (its resourceVersion before our last write, the record we
        wrote), until the quota informer shows a newer version."""
        self._unconstrained = metrics.ADMISSIONS.labels("unconstrained")
        self._admitted = metrics.ADMISSIONS.labels("admitted")
        self._refused = metrics.ADMISSIONS.labels("refused")
        self._generation = 0
        """Bumped by every change the commitments depend on (bound pods, virtual nodes,
        quotas and their records), so they are worked out once for all namespaces decided
        while nothing changes."""
        self._state: (
            tuple[int, dict[str, Units], dict[str, str], dict[str, Units], Commitments] | None
        ) = None
        self._held: dict[str, set[str]] = {}
        """Namespace -> nodes with a slices gauge set (to remove them when gone)."""
        quota = self._quota_changed
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
        return [self.quotas, self.nodes, self.pods]

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

    def in_force(self, namespace: str) -> InForce:
        """What holds `namespace`'s pods, as the quota cache shows it."""
        return self._reader.read(namespace, self.quotas.store.by_index(_QUOTA_NAMESPACE, namespace))

    def refusals(self, pod: Mapping[str, Any], nodes: Iterable[str]) -> dict[str, str]:
        """Which of the virtual `nodes` `pod` may not go to within its namespace's slices,
        and why (`tensile.placement.slices.admit`: every node when its record cannot be
        read); {} for an unconstrained namespace. The pod's requests are read once for all
        nodes (the extender's hot path)."""
        namespace = namespace_of(pod)
        in_force = self.in_force(namespace)
        if not in_force.constrained:
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
                in_force=in_force, node=node, requests=requests, placed=[used] if used else []
            )
            if reason is not None:
                refused[node] = reason
        self._admitted.inc(asked - len(refused))
        self._refused.inc(len(refused))
        return refused

    # Handlers: only look and enqueue.

    def _quota_changed(self, obj: Obj) -> None:
        self._generation += 1
        self.queue.add(namespace_of(obj))

    def _resync_soon(self, _obj: Obj | None = None) -> None:
        """Look at every namespace with a quota or slices held again, after `sync_delay`."""
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
        """Decide for one namespace and write what changed on its ResourceQuota. Raises the
        API errors of the write (the queue retries it with backoff)."""
        quotas = self._quotas(namespace)
        target = target_quota(quotas)
        if target is None:
            self._set_gauges(namespace, None, 0)
            return
        found = carriers(quotas)
        conflict = None
        if len({value for _, value in found}) > 1:
            names = ", ".join(name for name, _ in found)
            conflict = f"the ResourceQuotas {names} carry different records (keep one)"
        nodes, unusable, kept, committed = self._commitments()
        decision = decide(
            annotations=annotations_of(target),
            quota=quota_of(quotas),
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
            conflict=conflict,
        )
        if decision.patch is not None and self._may_act():
            name = name_of(target)
            version = resource_version_of(target)
            body = {"metadata": {"resourceVersion": version, "annotations": decision.patch}}
            try:
                await self._client.request(
                    "PATCH",
                    RESOURCE_QUOTAS.path(namespace=namespace, name=name),
                    body=body,
                    content_type=MERGE_PATCH,
                )
            except errors.NotFound:
                return
            self._written[f"{namespace}/{name}"] = (
                version,
                decision.patch.get(
                    SLICES_ANNOTATION, annotations_of(target).get(SLICES_ANNOTATION)
                ),
            )
            self._generation += 1
            if decision.outcome is not None:
                metrics.DECISIONS.labels(decision.outcome).inc()
            for event in decision.events:
                logger.info("namespace %s: %s: %s", namespace, event.reason, event.message)
                await self._recorder.record(
                    target,
                    type=event.type,
                    reason=event.reason,
                    message=event.message,
                    kind="ResourceQuota",
                    api_version="v1",
                )
        self._set_gauges(namespace, decision.held, decision.unplaced)

    def _quotas(self, namespace: str) -> list[Obj]:
        """The namespace's ResourceQuotas as the cache shows them, with the records we
        wrote and the cache does not show yet."""
        out = []
        for quota in self.quotas.store.by_index(_QUOTA_NAMESPACE, namespace):
            key = object_key(quota)
            written = self._written.get(key)
            if written is not None and written[0] == resource_version_of(quota):
                out.append(_with_record(quota, written[1]))  # not in the cache yet
                continue
            self._written.pop(key, None)
            out.append(quota)
        return out

    def _commitments(
        self,
    ) -> tuple[dict[str, Units], dict[str, str], dict[str, Units], Commitments]:
        """The usable virtual nodes' allocatable, the unusable ones (why), what headroom
        keeps free on each, and the commitments on them: worked out again only after a
        change."""
        if self._state is None or self._state[0] != self._generation:
            nodes, unusable, kept = self._virtual_nodes()
            committed = commitments(nodes=nodes, usage=self._bound.usage, budgets=self._budgets())
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

    def _budgets(self) -> dict[str, dict[str, Units]]:
        """Every namespace's slice budgets in force, capped at its quota (the cache, with
        our writes not yet in it)."""
        pending = {key.partition("/")[0] for key in self._written}
        out: dict[str, dict[str, Units]] = {}
        for namespace in {key.partition("/")[0] for key in self.quotas.store.keys()}:
            if namespace in pending:
                in_force = record_in_force(self._quotas(namespace))
            else:
                in_force = self.in_force(namespace)
            budgets = in_force.budgets()
            if budgets:
                out[namespace] = budgets
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


def _with_record(quota: Obj, value: str | None) -> Obj:
    """A copy of `quota` whose record annotation is `value` (None: none)."""
    meta = dict(meta_of(quota))
    annotations = dict(as_mapping(meta.get("annotations")))
    if value is None:
        annotations.pop(SLICES_ANNOTATION, None)
    else:
        annotations[SLICES_ANNOTATION] = value
    meta["annotations"] = annotations
    return {**quota, "metadata": meta}
