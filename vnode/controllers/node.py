"""The node controller: the virtual Node in the upper cluster, its status and its Lease.

- The Node is created, or adopted (our labels and taint merged into an existing one), and
  re-created if someone deletes it.
- Its status (capacity, conditions, addresses, ...) is written when the provider reports a
  change that changes it, at most once per `status_min_interval`, and at least every
  `status_interval`.
- The provider is pinged every `lease_renew_interval`, and the Lease renewed after each
  ping as `lower_outage.stance` decides. While the lower cluster fails its health check,
  under --lower-outage-policy=keep (the default) the Lease and the status go on: the Node
  stays Ready with the condition LowerControlPlaneReachable False and the NoSchedule taint
  tensile.io/lower-unreachable (written at once), and turns Ready False once the outage
  outlasts --lower-outage-grace; under evict (tensile-kube's), renewals and status writes
  stop, so the upper node lifecycle controller marks the node Unknown, as it would a dead
  kubelet. On recovery the condition, the taint and the heartbeats are back at once
  (within one ping interval).

Registration, status and Lease go through a client of their own (`heartbeat`), so they
never queue behind pod traffic, Events or kubelet API reviews; the provider answers its
ping the same way (the Kubernetes provider through a lower client of its own).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Gauge

from tensile.contracts.objects import resource_version_of
from tensile.kube import errors, timestamps
from tensile.kube.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import LEASES, NODES
from vnode.controllers import lower_outage, node_objects
from vnode.controllers.retry import until_done
from vnode.provider import NodeProvider
from vnode.settings import NodeSettings

logger = logging.getLogger(__name__)

LOWER_REACHABLE = Gauge(
    "tensile_lower_apiserver_reachable",
    "1 while the lower apiserver answered the node's last ping (/readyz within 5 s), 0 while "
    "it did not (a lower outage: the Node's LowerControlPlaneReachable condition is False).",
)
LOWER_OUTAGE_SINCE = Gauge(
    "tensile_lower_outage_start_timestamp_seconds",
    "Unix time the lower outage in progress started (the first ping not answered); 0 while "
    "the lower apiserver answers.",
)


class NodeController:
    """Registers the virtual node and keeps its status and lease fresh."""

    name = "node-controller"

    def __init__(
        self,
        *,
        upper: ApiClient,
        informers: InformerFactory,
        heartbeat: ApiClient,
        provider: NodeProvider,
        settings: NodeSettings,
    ):
        """`upper` watches the Node; `heartbeat` writes it and its Lease."""
        self._upper = heartbeat
        self._provider = provider
        self._settings = settings
        self.informer = informers.informer(
            upper, NODES, name="upper-node", field_selector=f"metadata.name={settings.name}"
        )
        self.healthy: bool | None = None
        """Whether the last ping of the provider succeeded (None: not pinged yet)."""
        self.outage: lower_outage.Outage | None = None
        """The lower outage in progress (None while the provider's ping succeeds)."""
        self._stance = self.stance()
        self._taints_from: str | None = None
        """The Node's resourceVersion the last taint write was made from: a cache still
        showing it has not caught up with that write yet."""
        self.ready_event = asyncio.Event()
        """Set once the Node exists with a first status."""
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._lease: dict[str, Any] | None = None
        self._written: dict[str, Any] | None = None
        """The status last written, to tell news from what the cache may not show yet."""
        self._on_recovered: list[Callable[[], None]] = []
        self.informer.add_handlers(Handlers(on_delete=lambda _n: self._node_deleted()))
        provider.notify_node_changed(self._wake.set)

    def stance(self) -> lower_outage.Stance:
        """What the node does about its lower control plane now (`lower_outage.stance`)."""
        return lower_outage.stance(
            policy=self._settings.lower_outage_policy,
            grace=self._settings.lower_outage_grace,
            outage=self.outage,
            now=time.monotonic(),
        )

    def on_recovered(self, callback: Callable[[], None]) -> None:
        """Register `callback()`, called when the provider's ping succeeds after failing."""
        self._on_recovered.append(callback)

    def _node_deleted(self) -> None:
        logger.warning("node %s was deleted; registering it again", self._settings.name)
        self._lease = None
        self._written = None
        self._wake.set()

    def informers(self) -> Sequence[Informer]:
        """The node's own Node object upstairs."""
        return [self.informer]

    async def start(self) -> None:
        """Nothing to prepare: registration waits for `run` (after every other component
        synced, so the node is never advertised before pods can be served)."""

    def ready(self) -> bool:
        """Whether the Node is registered with a first status."""
        return self.ready_event.is_set()

    async def shut_down(self) -> None:
        """Stop heartbeats: `run` returns (the Lease then expires and the node lifecycle
        controller marks the node NotReady, as for a stopped kubelet)."""
        self._stopped.set()

    async def run(self) -> None:
        """Register the node, then keep status and lease fresh until cancelled."""
        await self.informer.wait_synced()
        await self._ping()
        await until_done(f"registering node {self._settings.name}", self._ensure_node)
        await self._guard("node status update", self._update_status())
        if self._stance.renew_lease and self._settings.enable_lease:
            await self._guard("lease renewal", self._renew_lease())
        self.ready_event.set()
        async with asyncio.TaskGroup() as group:
            loops = [
                group.create_task(self._status_loop(), name="node-status"),
                group.create_task(self._heartbeat_loop(), name="node-heartbeat"),
            ]
            await self._stopped.wait()
            for loop in loops:
                loop.cancel()

    async def _ping(self) -> bool:
        try:
            await self._provider.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
            if self.outage is None:
                self.outage = lower_outage.Outage(
                    started=time.monotonic(), since=timestamps.now_rfc3339()
                )
                LOWER_OUTAGE_SINCE.set(time.time())
                logger.warning("provider ping failed: %s; %s", exc, self._outage_plan())
            self.healthy = False
            LOWER_REACHABLE.set(0)
            self._take_stance()
            return False
        if self.healthy is not True:
            logger.info("provider healthy; node heartbeats running")
        self.healthy = True
        self.outage = None
        LOWER_REACHABLE.set(1)
        LOWER_OUTAGE_SINCE.set(0)
        self._take_stance()
        return True

    def _outage_plan(self) -> str:
        if self._settings.lower_outage_policy == "evict":
            return "pausing node heartbeats (--lower-outage-policy=evict)"
        return (
            "the node stays Ready, tainted tensile.io/lower-unreachable:NoSchedule, for "
            f"{self._settings.lower_outage_grace:g}s (--lower-outage-grace)"
        )

    def _take_stance(self) -> None:
        """Adopt the stance of now; a new one is written at once (not at the next
        status interval)."""
        stance = self.stance()
        if stance != self._stance:
            if stance.conditions[0]["status"] != self._stance.conditions[0]["status"]:
                logger.warning("node %s: %s", self._settings.name, stance.conditions[0]["message"])
            self._stance = stance
            self._wake.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.lease_renew_interval)
            await self.heartbeat()

    async def heartbeat(self) -> None:
        """Ping the provider, then renew the Lease if the stance says so (one beat of the
        heartbeat loop; a recovery calls the `on_recovered` callbacks first)."""
        was_healthy = self.healthy
        if await self._ping() and was_healthy is False:
            for callback in self._on_recovered:
                callback()
        if self._stance.renew_lease and self._settings.enable_lease:
            await self._guard("lease renewal", self._renew_lease())

    async def _status_loop(self) -> None:
        while True:
            due = False
            try:
                async with asyncio.timeout(self._settings.status_interval):
                    await self._wake.wait()
            except TimeoutError:
                due = True
            self._wake.clear()
            if self._stance.write_status:
                await self._guard("node taints update", self._update_taints())
                await self._guard("node status update", self._update_status(only_news=not due))
            await asyncio.sleep(self._settings.status_min_interval)

    async def _guard(self, what: str, work: Any) -> None:
        try:
            await work
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("%s failed: %s", what, exc)

    async def _ensure_node(self) -> dict[str, Any]:
        path = NODES.path(name=self._settings.name)
        try:
            current = await self._upper.request("GET", path)
        except errors.NotFound:
            try:
                created = await self._upper.request(
                    "POST", NODES.path(), body=node_objects.node_object(self._settings)
                )
                logger.info("registered node %s", self._settings.name)
                return created
            except errors.AlreadyExists:
                current = await self._upper.request("GET", path)
        # Adopt: merge our labels in, put our taint in place of an older one of ours.
        patch = {
            "metadata": {"labels": node_objects.node_labels(self._settings)},
            "spec": {
                "taints": node_objects.node_taints(
                    (current.get("spec") or {}).get("taints") or [], settings=self._settings
                )
            },
        }
        return await self._upper.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def _update_status(self, *, only_news: bool = False) -> None:
        """Write the node status; with `only_news`, only if it changed (see
        `node_objects.node_status_news`): a lower cluster whose nodes heartbeat every few seconds
        then costs no upper write while its room stays the same."""
        current = self.informer.store.get(self._settings.name)
        if current is None:
            current = await self._ensure_node()
        body = node_objects.node_status(
            current,
            settings=self._settings,
            capacity=self._provider.capacity(),
            node_info=self._provider.node_info(),
            now=timestamps.now_rfc3339(),
            health=self._stance.conditions,
        )
        if (
            only_news
            and self._written is not None
            # Both what we last wrote and what the cache shows (which may not show that
            # write yet, or show the node lifecycle controller's Unknown) must be current.
            and not node_objects.node_status_news({"status": self._written}, body)
            and not node_objects.node_status_news(current, body)
        ):
            return
        try:
            await self._upper.request(
                "PATCH",
                NODES.path(name=self._settings.name, subresource="status"),
                body=body,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except errors.NotFound:
            self._written = None
            await self._ensure_node()
            self._wake.set()
            return
        self._written = body["status"]

    async def _update_taints(self) -> None:
        """Put the tensile.io/lower-unreachable taint on the Node, or take it off, as the
        stance wants (`lower_outage.taints_to_write`). The write names the resourceVersion
        it was made from, as the node lifecycle controller's taint writes do, so a taint
        another writer added meanwhile is never lost: on a conflict the Node is read again
        and the write made once more."""
        current = self.informer.store.get(self._settings.name)
        if current is None or resource_version_of(current) == self._taints_from:
            return  # not registered yet, or the cache has not shown the last write yet
        path = NODES.path(name=self._settings.name)
        for _attempt in range(3):
            taints = lower_outage.taints_to_write(
                (current.get("spec") or {}).get("taints"), stance=self._stance
            )
            if taints is None:
                return
            version = resource_version_of(current)
            patch = {"metadata": {"resourceVersion": version}, "spec": {"taints": taints}}
            try:
                await self._upper.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
            except errors.Conflict:
                current = await self._upper.request("GET", path)
                continue
            self._taints_from = version
            return
        self._wake.set()  # taken over three times running: again after status_min_interval

    async def _renew_lease(self) -> None:
        name = self._settings.name
        path = LEASES.path(namespace="kube-node-lease", name=name)
        now = timestamps.now_micro()
        if self._lease is not None:
            lease = {**self._lease, "spec": {**self._lease["spec"], "renewTime": now}}
            try:
                self._lease = await self._upper.request("PUT", path, body=lease)
                return
            except (errors.Conflict, errors.NotFound):
                self._lease = None  # someone changed or removed it: start from the server's
        try:
            current = await self._upper.request("GET", path)
            current["spec"] = {
                **(current.get("spec") or {}),
                "holderIdentity": name,
                "leaseDurationSeconds": self._settings.lease_duration,
                "renewTime": now,
            }
            self._lease = await self._upper.request("PUT", path, body=current)
        except errors.NotFound:
            node = self.informer.store.get(name) or await self._ensure_node()
            body = node_objects.lease_object(
                settings=self._settings, node_uid=str(node["metadata"]["uid"]), now=now
            )
            self._lease = await self._upper.request(
                "POST", LEASES.path(namespace="kube-node-lease"), body=body
            )
