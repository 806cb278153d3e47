"""The pod controller: upper pods bound to the virtual node -> provider, and statuses back up.

Two queues, keyed by upper "namespace/name" (virtual-kubelet's design):
- `pods_from_upper`: create, update or delete the pod in the provider; finish an upper
  deletion once the provider's pod is gone (grace 0, UID precondition);
- `status_from_lower`: write the provider's status to the upper pod's status subresource,
  driven by the provider's notifications (no polling).
A key is never processed by two workers at once, so calls for one pod never overlap. Before
a pod is created below it passes the node's admission (`pod_admission`: its taint, its
namespace's quota slices), as a kubelet admits a pod before it runs it. Both
queues are fair (VirtualCluster's fair queuing): they serve namespaces in weighted round
robin, so one namespace creating thousands of pods does not delay another's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tensile.contracts.objects import (
    Obj,
    deletion_timestamp_of,
    meta_of,
    resource_version_of,
    uid_of,
)
from tensile.kube import errors, timestamps
from tensile.kube.backoff import ExponentialBackoff
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import PODS, object_key, pod_is_terminal, split_key
from tensile.kube.workqueue import FairQueuing, QueueSettings, Requeue, Transient, WorkQueue
from vnode import provider_errors
from vnode.controllers import pod_admission, pod_decisions
from vnode.controllers.pod_traces import NO_POD_TRACES, PodTraces
from vnode.controllers.retry import until_done
from vnode.provider import PodProvider

logger = logging.getLogger(__name__)

# Refused pods back off up to two minutes: no retry storm against a lower cluster that says no.
# A pod waiting for a ConfigMap or Secret is retried this often (seconds) as a backstop; it is
# retried at once when the provider announces that the object appeared.
_DEPENDENCY_RETRY = 20.0
# While the upper cluster cannot take a status write, the pod's status is retried this
# often (seconds), without limit; the current status is read again at each try.
_STATUS_RETRY = 2.0
_POD_BACKOFF = ExponentialBackoff(base=0.5, cap=120.0)
WRITE_SEEN_WITHIN = 30.0
"""Seconds a write of ours to an upper pod (a status, its final deletion) that the cache
does not show yet counts as on its way (`PodController.status_unseen`, `deletion_unseen`).
Under the fleet benchmark the patrol compared such pods up to 1.6 s after the writes'
answers; a write the cache does not show after this long is one the apiserver made
something else of, or another writer's came after it, and the cache is compared again."""


class PodController:
    """Keeps the provider's pods equal to the upper pods bound to `node_name`."""

    name = "pod-controller"

    def __init__(
        self,
        *,
        upper: ApiClient,
        informers: InformerFactory,
        provider: PodProvider,
        node_name: str,
        namespace: str | None,
        workers: int,
        recorder: EventRecorder,
        fairness: FairQueuing | None = None,
        sync_timeout: float = 60.0,
        status_coalesce: float = 0.1,
        write_seen_within: float = WRITE_SEEN_WITHIN,
        traces: PodTraces = NO_POD_TRACES,
        taints: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """`fairness` weighs namespaces in both queues (default: all equal);
        `sync_timeout` (seconds) bounds one provider call, so a hung backend cannot pin a
        worker forever; `status_coalesce` (seconds) is how long a provider notification
        waits for more of the same pod before its status is written; `write_seen_within`
        (seconds) is how long a write of ours the cache does not show yet counts as on its
        way (`status_unseen`, `deletion_unseen`); `traces` makes each
        pod's forwarding a trace (`pod_traces`; default: none); `taints` are the node's own,
        which a pod must tolerate to be created below (`pod_admission`)."""
        fairness = fairness or FairQueuing()
        self._traces = traces
        self._coalesce = status_coalesce
        self._seen_within = write_seen_within
        self._upper = upper
        self._provider = provider
        self._workers = workers
        self._recorder = recorder
        self._sync_timeout = sync_timeout
        self._taints = tuple(taints)
        self._node_name = node_name
        self.informer = informers.informer(
            upper,
            PODS,
            name="upper-pods",
            namespace=namespace,
            field_selector=f"spec.nodeName={node_name}",
            encoded=True,  # every pod of the node, read a few times in its life
        )
        self.slices = pod_admission.SliceAdmission(
            client=upper, informers=informers, node_name=node_name, namespace=namespace
        )
        self.pods_from_upper = WorkQueue(
            name="pods_from_upper",
            settings=QueueSettings(backoff=_POD_BACKOFF, max_retries=20, fairness=fairness),
        )
        self.status_from_lower = WorkQueue(
            name="status_from_lower", settings=QueueSettings(fairness=fairness)
        )
        self._gone: dict[str, Obj] = {}
        """Last state of upper pods deleted from the API, until the provider said their
        backend pod is gone: a deletion is state until the backend confirms it."""
        self._moved: set[str] = set()
        """Pods whose backend pod changed since the status worker last looked at them."""
        self._written: dict[str, pod_decisions.StatusWrite] = {}
        """Upper key -> our last status write, until the cache shows it, or an event comes
        after `write_seen_within` (`pod_decisions.already_written`, `status_unseen`)."""
        self._deletes: dict[str, pod_decisions.FinalDelete] = {}
        """Upper key -> our final deletion of the pod, until the watch brings it
        (`deletion_unseen`)."""
        self.informer.add_handlers(
            Handlers(on_add=self._added, on_update=self._updated, on_delete=self._deleted)
        )
        provider.notify_pods(self._provider_changed)

    def _added(self, pod: Obj) -> None:
        key = object_key(pod)
        with self._traces.event(pod):
            self.pods_from_upper.add(key)
            self.status_from_lower.add(key)

    def _updated(self, old: Obj, new: Obj) -> None:
        key = object_key(new)
        if pod_is_terminal(new):
            self.slices.forget(key)  # it holds nothing of its slices any more
        written = self._written.get(key)
        if written is not None and (
            pod_decisions.shows_write(new, written)
            or uid_of(new) != written.uid
            or time.monotonic() - written.answered >= self._seen_within
        ):
            # Our last status write came back, or the pod is another, or the write is past
            # the time it may be on its way. (An event of another write, an earlier one of
            # ours under load included, leaves it on its way.)
            del self._written[key]
        if pod_decisions.spec_changed(old, new):
            self.pods_from_upper.add(key)
            self._traces.queued(key)

    def _deleted(self, pod: Obj) -> None:
        key = object_key(pod)
        self.slices.forget(key)
        self._written.pop(key, None)
        self._deletes.pop(key, None)
        self._gone[key] = pod
        self.pods_from_upper.add(key)
        self._traces.gone(key)

    def _provider_changed(self, key: str) -> None:
        # A pod's changes below come in bursts (bound, then started): a short wait lets one
        # status write carry them all, which spares the upper apiserver and its watchers.
        # The status worker then also looks at what the change means for the spec side
        # (reading the pod once per burst, not once per change).
        self._moved.add(key)
        self.status_from_lower.add_after(key, self._coalesce)
        self._traces.noticed(key)

    def resync(self) -> None:
        """Queue every pod of the node now (e.g. when the backend is reachable again, so pods
        waiting in a long backoff are created at once)."""
        for key in self.informer.store.keys():
            self.pods_from_upper.add(key)
            self.status_from_lower.add(key)
        for key in list(self._gone):  # deletions waiting for the backend
            self.pods_from_upper.add(key)

    def status_unseen(self, key: str) -> bool:
        """Tell whether our last status write to upper pod `key`, answered less than
        `write_seen_within` seconds ago, is not in the cache yet
        (`pod_decisions.status_unseen`): until the watch brings it, the cached status is
        older than the pod's, so the patrol holds its verdict on the status. Reads the
        cached pod only when such a write was made."""
        written = self._written.get(key)
        if written is None:
            return False
        return pod_decisions.status_unseen(
            self.informer.store.get(key), written, now=time.monotonic(), within=self._seen_within
        )

    def deletion_unseen(self, key: str) -> bool:
        """Tell whether our final deletion of upper pod `key`, answered less than
        `write_seen_within` seconds ago, is not in the cache yet
        (`pod_decisions.deletion_unseen`): until the watch brings it, the cache shows a pod
        being deleted with nothing below, so the patrol holds its verdict on the deletion.
        Reads the cached pod only when such a deletion was made."""
        deleted = self._deletes.get(key)
        if deleted is None:
            return False
        return pod_decisions.deletion_unseen(
            self.informer.store.get(key), deleted, now=time.monotonic(), within=self._seen_within
        )

    def deleting(self, key: str) -> bool:
        """Tell whether the deletion of upper pod `key`, gone from the API, still waits
        for its backend pod to go."""
        return key in self._gone

    def informers(self) -> Sequence[Informer]:
        """The upper pods bound to the node, and the ResourceQuotas their admission reads."""
        return [self.informer, *self.slices.informers()]

    async def start(self) -> None:
        """Nothing to prepare."""

    def ready(self) -> bool:
        """Whether the upper pod and quota caches have synced."""
        return all(i.has_synced() for i in self.informers())

    async def run(self) -> None:
        """Wait for the upper pod and quota caches, clean up dangling backend pods, then
        work the queues."""
        for informer in self.informers():
            await informer.wait_synced()
        try:
            await self._work()
        finally:
            self._traces.close()  # the traces of pods still on their way end here

    async def _work(self) -> None:
        async with asyncio.TaskGroup() as group:
            # Orphans are deleted in the background: a lower cluster that refuses a delete
            # for a while must not hold up the pods that are alive. Each attempt reads the
            # upper pods afresh, so a pod created meanwhile is never taken for an orphan.
            group.create_task(
                until_done(
                    "deleting lower pods of deleted upper pods",
                    lambda: self._provider.cleanup_dangling(iter(self.informer.store)),
                ),
                name="cleanup-dangling",
            )
            group.create_task(
                self.pods_from_upper.run(workers=self._workers, handler=self._sync_pod),
                name="pods-from-upper",
            )
            group.create_task(
                self.status_from_lower.run(workers=self._workers, handler=self._sync_status),
                name="status-from-lower",
            )

    async def shut_down(self) -> None:
        """Stop handing out keys."""
        await self.pods_from_upper.shut_down()
        await self.status_from_lower.shut_down()

    # -- upper -> provider ---------------------------------------------------------------

    async def _sync_pod(self, key: str) -> None:
        with self._traces.sync(key):
            async with asyncio.timeout(self._sync_timeout):
                await self._sync_pod_now(key)

    async def _sync_pod_now(self, key: str) -> None:
        pod = self.informer.store.get(key)
        if pod is None:
            await self._delete_gone(key)
            return
        self._gone.pop(key, None)
        refusal = pod_decisions.rejection(pod)
        if refusal is not None:
            if not pod_is_terminal(pod):
                await self._write_status(pod, pod_decisions.rejected_status(pod, message=refusal))
                await self._recorder.record(
                    pod, type="Warning", reason="UnsupportedPod", message=refusal
                )
            return
        meta = meta_of(pod)
        if meta.get("deletionTimestamp"):
            if await self._delete_below(pod):
                await self._final_delete(pod)
            return  # otherwise the provider's deletion event brings the key back
        if pod_is_terminal(pod):
            return
        if self._provider.backend_pod(pod) is None:
            if self._provider.vanished(pod):
                await self._write_status(
                    pod, pod_decisions.vanished_status(pod, now=timestamps.now_rfc3339())
                )
                return
            refused = self._admission(key, pod)
            if refused is not None:
                reason, message = refused
                status = pod_decisions.admission_rejected_status(
                    pod, reason=reason, message=message
                )
                await self._write_status(pod, status)
                await self._recorder.record(pod, type="Warning", reason=reason, message=message)
                return
            await self._create(pod)
        else:
            self.slices.count(key, pod)
            try:
                await self._provider.update_pod(pod)
            except provider_errors.ProviderError as exc:
                await self._recorder.record(
                    pod, type="Warning", reason="ProviderUpdateFailed", message=str(exc)
                )
                raise

    def _admission(self, key: str, pod: Obj) -> tuple[str, str] | None:
        """(reason, message) of a kubelet-like refusal of `pod`, not yet created below, or
        None when it may be (and then it counts against its namespace's slices). Both
        checks hold for every pod; a pod kube-scheduler bound already passed them there."""
        if pod_admission.untolerated(pod, self._taints):
            return pod_admission.TAINT_REASON, pod_admission.TAINT_MESSAGE
        why = self.slices.admit(key, pod, below=self._created_below)
        if why is not None:
            return pod_admission.SLICES_REASON, why
        return None

    def _created_below(self, namespace: str) -> Iterator[tuple[str, Obj]]:
        """The pods of `namespace` bound to the node, not finished, with a pod below (asked
        once per namespace after a start: the keys are read, not an index, which would
        decode every stored pod at each of its updates)."""
        prefix = f"{namespace}/"
        for key in self.informer.store.keys():
            if not key.startswith(prefix):
                continue
            pod = self.informer.store.get(key)
            placed = pod is not None and self._provider.backend_pod(pod) is not None
            if pod is not None and placed and not pod_is_terminal(pod):
                yield key, pod

    async def _delete_gone(self, key: str) -> None:
        """Delete below what stands for `key`, an upper pod the API no longer has. Its last
        state is kept until the provider says its pod is gone (a failed delete is retried,
        and `resync` queues it again); without one (a backend pod that showed up after the
        upper pod was forgotten, e.g. a create in doubt that landed), the provider deletes
        whatever of ours still stands for the key."""
        gone = self._gone.get(key)
        if gone is None:
            if await self._alive_upstairs(key, uid=None):
                return
            try:
                await self._provider.delete_dangling(key)
            except provider_errors.BackendUnavailable as exc:
                raise Transient(str(exc)) from exc
            return
        backend = self._provider.backend_pod(gone)
        if (
            backend is not None
            and not deletion_timestamp_of(backend)
            and await self._alive_upstairs(key, uid=uid_of(gone))
        ):
            if self._gone.get(key) is gone:
                del self._gone[key]
            return
        if await self._delete_below(gone) and self._gone.get(key) is gone:
            del self._gone[key]
        # Otherwise the provider's deletion event brings the key back.

    async def _alive_upstairs(self, key: str, *, uid: str | None) -> bool:
        """Tell whether the API has upper pod `key` bound to this node and not being
        deleted (of UID `uid`, unless None), although the cache no longer shows it: then
        nothing of it is deleted below (a cache that lost a pod, e.g. one that lags behind
        after a partition, never costs a running pod; the patrol's audit relists it).
        Raises Transient while the upper cluster does not answer."""
        namespace, name = split_key(key)
        try:
            found = await self._upper.request("GET", PODS.path(namespace=namespace, name=name))
        except errors.NotFound:
            return False
        except errors.TRANSIENT as exc:
            raise Transient(f"reading upper pod {key} before deleting below: {exc}") from exc
        if not pod_decisions.bound_here(found, node_name=self._node_name, uid=uid):
            return False
        logger.warning(
            "pod %s: the cache no longer has it, but the upper cluster does (bound to this "
            "node): its lower pod is kept",
            key,
        )
        return True

    async def _delete_below(self, pod: Obj) -> bool:
        """Have the provider delete `pod` (its grace period); True once it is gone below.
        Raises Transient while the backend is unavailable: a deletion is never given up."""
        grace = meta_of(pod).get("deletionGracePeriodSeconds")
        try:
            return await self._provider.delete_pod(pod, grace_period=grace)
        except provider_errors.BackendUnavailable as exc:
            raise Transient(str(exc)) from exc

    async def _create(self, pod: Obj) -> None:
        try:
            events = await self._provider.create_pod(pod)
        except provider_errors.MissingDependency as exc:
            # As a kubelet: the pod waits (Pending, the container saying why) and is retried;
            # the provider also announces the pod as soon as the object appears.
            mount = exc.volume is not None
            await self._recorder.record(
                pod, type="Warning", reason="FailedMount" if mount else exc.reason, message=str(exc)
            )
            status = pod_decisions.waiting_status(
                pod,
                reason="ContainerCreating" if mount else "CreateContainerConfigError",
                message=None if mount else str(exc),
                now=timestamps.now_rfc3339(),
            )
            await self._write_status(pod, status)
            raise Requeue(_DEPENDENCY_RETRY, str(exc)) from exc
        except provider_errors.ProviderError as exc:
            await self._recorder.record(
                pod, type="Warning", reason="ProviderCreateFailed", message=str(exc)
            )
            # An unreachable or overloaded backend fails nothing: the pod waits, retried with
            # backoff for as long as that lasts (its /readyz may well answer meanwhile: 429s
            # of a lower priority level, 500s of a failing admission webhook) and at once
            # when a failed ping recovers (`resync`).
            transient = isinstance(exc, provider_errors.BackendUnavailable)
            status = pod_decisions.provider_failed_status(
                pod, message=str(exc), now=timestamps.now_rfc3339(), transient=transient
            )
            await self._write_status(pod, status)
            if transient:
                raise Transient(str(exc)) from exc
            raise
        self._traces.created(object_key(pod))
        for event in events:
            await self._recorder.record(
                pod, type=event.type, reason=event.reason, message=event.message
            )

    async def _final_delete(self, pod: Obj) -> None:
        meta = meta_of(pod)
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        key = object_key(pod)
        try:
            await self._upper.request(
                "DELETE",
                PODS.path(namespace=meta["namespace"], name=meta["name"]),
                body=body,
                decode=False,
            )
        except errors.Conflict:
            return  # a new pod of the same name: not ours to delete
        except errors.NotFound:
            pass  # gone already: its deletion is on its way to the cache too
        # Until the watch brings the deletion (`_deleted` forgets it).
        cached = self.informer.store.get(key)
        if cached is not None and uid_of(cached) == meta["uid"]:
            self._deletes[key] = pod_decisions.FinalDelete(
                uid=str(meta["uid"]), answered=time.monotonic()
            )

    # -- provider -> upper status --------------------------------------------------------

    async def _sync_status(self, key: str) -> None:
        pod = self.informer.store.get(key)
        if key in self._moved:
            self._moved.discard(key)
            # Only a deletion below concerns the spec side (finishing an upper deletion, or
            # failing a pod whose backend pod vanished).
            if pod is None or deletion_timestamp_of(pod) or self._provider.backend_pod(pod) is None:
                self.pods_from_upper.add(key)
        if pod is None or pod_is_terminal(pod):
            return
        desired = self._provider.pod_status(pod)
        if desired is not None and not pod_decisions.nothing_to_tell(desired):
            try:
                with self._traces.status(key):
                    await self._write_status(pod, desired)
            except errors.TRANSIENT as exc:
                # The upper cluster is down or overloaded: a status must never be dropped
                # (a completed pod's exit code exists only below), so this key is retried
                # for as long as the outage lasts, outside the queue's retry budget.
                raise Requeue(_STATUS_RETRY, str(exc)) from exc

    async def _write_status(self, pod: Obj, desired: dict[str, Any]) -> None:
        key = object_key(pod)
        if pod_decisions.already_written(pod, desired, self._written.get(key)):
            return
        patch = pod_decisions.status_patch(pod.get("status") or {}, desired)
        if patch is None:
            return
        namespace, name = split_key(key)
        logger.debug("pod %s/%s: writing status %s", namespace, name, sorted(patch["status"]))
        try:
            await self._upper.request(
                "PATCH",
                PODS.path(namespace=namespace, name=name, subresource="status"),
                body=patch,
                content_type=MERGE_PATCH,
                decode=False,  # the watch brings the written pod; the answer is not read
            )
        except errors.NotFound:
            self._written.pop(key, None)
            return  # deleted meanwhile
        # Kept until the cache shows what it wrote (`_updated`), also when another event came
        # while it was on its way (under load, an earlier write's of ours): this one is still
        # to come. Not kept when its event came before its answer: none follows.
        write = pod_decisions.StatusWrite(
            uid=uid_of(pod),
            started=resource_version_of(pod),
            status=desired,
            removed=frozenset(k for k, v in patch["status"].items() if v is None),
            answered=time.monotonic(),
        )
        cached = self.informer.store.get(key)
        if (
            cached is not None
            and uid_of(cached) == write.uid
            and not pod_decisions.shows_write(cached, write)
        ):
            self._written[key] = write
        else:
            self._written.pop(key, None)
