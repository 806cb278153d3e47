"""The descheduler: informers on the upper cluster, and a round every interval while leading.

    upper Pending pods (fieldSelector status.phase=Pending) -> store --+
    upper virtual nodes (labelSelector type=virtual-kubelet) -> store --+-> round (policy.plan)
    upper PodDisruptionBudgets                               -> store --+      |
    the avoidance record ConfigMap                           -> store --+      v
                                                             mover: record, evict, re-create

Every replica keeps its caches warm; only the one holding the Lease runs rounds, so a
replica that takes over acts at its first round. A round first finishes bare-pod moves left
half done, then plans from the caches, reports pods that cannot move (blocked by a budget;
no virtual node left: marked so, never judged again), and moves the rest within the global
rate (a token bucket: at most `eviction_burst` at once, `eviction_rate` per second after
that). Nothing here ends the process on a failed list, an unreachable apiserver or too few
nodes (tensile-kube exited): the next round tries again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from descheduler import metrics
from descheduler.mover import Mover, NotLeading
from descheduler.policy import plan
from descheduler.record import AvoidanceRecord, RecordConflict
from descheduler.settings import Settings
from descheduler.waits import Waits
from tensile.contracts import descheduling, labels
from tensile.kube import errors
from tensile.kube.backoff import TokenBucket
from tensile.kube.client import ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Informer
from tensile.kube.leaderelection import LeaderElector
from tensile.kube.resources import (
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_DISRUPTION_BUDGETS,
    PODS,
)

logger = logging.getLogger(__name__)

COMPONENT = "tensile-descheduler"
"""The source component of its Events."""


class Descheduler:
    """Caches, the mover, and the rounds: a `tensile.serving.lifecycle.Component`, `run` until
    shut down (or one round, interval 0)."""

    name = "descheduler"

    def __init__(
        self,
        *,
        client: ApiClient,
        events: ApiClient,
        settings: Settings,
        identity: str,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`client` reads and moves, `events` records Events (a budget of its own);
        `identity` names this replica (the Events' source host, the Lease holder); `now`
        is the time pods and avoidances are judged at, `clock` the monotonic seconds the
        eviction rate and how long pods have been unplaceable are measured in."""
        self._settings = settings
        self._stop = asyncio.Event()
        self._now = now
        self._clock = clock
        self.pods = Informer(
            client, PODS, name="upper-pending-pods", field_selector="status.phase=Pending"
        )
        # Kept on every replica, so one that takes over has been counting too (waits.py).
        self.waits = Waits(clock=clock)
        self.pods.add_handlers(self.waits.handlers())
        self.nodes = Informer(
            client,
            NODES,
            name="upper-virtual-nodes",
            label_selector=labels.VIRTUAL_NODE_SELECTOR,
        )
        self.budgets = Informer(client, POD_DISRUPTION_BUDGETS, name="upper-pdbs")
        # A pod whose volume only its virtual node reaches must stay there (policy.pinned_volumes).
        self.claims = Informer(client, PERSISTENT_VOLUME_CLAIMS, name="upper-pvcs")
        self.volumes = Informer(client, PERSISTENT_VOLUMES, name="upper-pvs")
        self.record = AvoidanceRecord(
            client, namespace=settings.avoid_namespace, name=settings.avoid_name
        )
        self.elector = (
            LeaderElector(client, settings=settings.leader_election)
            if settings.leader_election is not None
            else None
        )
        self.mover = Mover(
            client=client,
            recorder=EventRecorder(events, component=COMPONENT, host=identity),
            record=self.record,
            settings=settings.moves,
            may_act=self.elector.is_leader if self.elector is not None else lambda: True,
        )
        rate = settings.eviction_rate
        self._bucket = TokenBucket(rate=rate, burst=settings.eviction_burst) if rate > 0 else None

    def informers(self) -> list[Informer]:
        """The caches a round reads."""
        return [
            self.pods,
            self.nodes,
            self.budgets,
            self.claims,
            self.volumes,
            self.record.informer,
        ]

    def not_synced(self) -> str | None:
        """A readiness check: None once every cache has its first list, else which not."""
        waiting = [i.name for i in self.informers() if not i.has_synced()]
        return f"caches not synced: {', '.join(waiting)}" if waiting else None

    def ready(self) -> bool:
        """Whether every cache has its first list (`Component`)."""
        return self.not_synced() is None

    async def start(self) -> None:
        """Nothing to prepare (`Component`): the command checked the apiserver answers."""

    async def run(self) -> None:
        """Lead rounds (competing for the Lease if configured) until `shut_down()`, which
        cancels a round in progress (a leader then releases the Lease); with interval 0,
        return after one round. Run by a `tensile.serving.lifecycle.Runner`, which fills the
        caches first."""
        async with asyncio.TaskGroup() as group:
            rounds = group.create_task(self._lead(), name="descheduler-rounds")
            asked = group.create_task(self._stop.wait(), name="descheduler-stop")
            await asyncio.wait([rounds, asked], return_when=asyncio.FIRST_COMPLETED)
            rounds.cancel()
            asked.cancel()

    async def shut_down(self) -> None:
        """Stop the rounds (`Component`)."""
        self._stop.set()

    async def _lead(self) -> None:
        if self.elector is not None:
            await self.elector.run(self._rounds)
        else:
            await self._rounds()

    async def _rounds(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.round()
            except NotLeading:
                logger.warning("the Lease was lost during a round; stopping it")
            except Exception:
                # A bug, not a cluster state: say it loudly, and let the next round run.
                logger.exception("a descheduling round failed")
            metrics.ROUND_DURATION.observe(time.monotonic() - started)
            if self._settings.interval <= 0:
                return
            await asyncio.sleep(self._settings.interval)

    async def round(self) -> None:
        """One round (see the module docstring). Raises NotLeading when the Lease is lost."""
        metrics.ROUNDS.inc()
        now = self._now()
        pods = list(self.pods.store)
        await self.mover.recover(p for p in pods if descheduling.is_gated(p))
        decided = plan(
            pods,
            nodes=list(self.nodes.store),
            record=self.record.data(),
            budgets=list(self.budgets.store),
            criteria=self._settings.criteria,
            now=now,
            waited=self.waits.waited().get,
            claims=self.claims.store,
            volumes=self.volumes.store,
        )
        metrics.PODS_CONSIDERED.inc(decided.considered)
        chosen = []
        limited = False
        for decision in decided.decisions:
            if decision.action in ("blocked", "exhausted"):
                await self.mover.report(decision, now=now)
            elif not self.mover.waiting(decision):
                if limited or not self._take_token():
                    limited = True
                    kind = "evict" if decision.owner is not None else "recreate"
                    metrics.MOVES.labels(kind, "rate_limited").inc()
                    continue
                chosen.append(decision)
        for decision in await self.mover.prepare(chosen, now=now):
            await self.mover.move(decision, now=now)
        if not self._settings.moves.dry_run:
            try:
                await self.record.prune(now=now)
            except (RecordConflict, errors.ApiError, errors.ApiUnavailable) as exc:
                logger.warning("could not prune the avoidance record: %s", exc)

    def _take_token(self) -> bool:
        """Take one move's token of the global rate; False (nothing taken) when none is
        left now."""
        if self._bucket is None:
            return True
        if self._bucket.reserve(self._clock()) > 0:
            # Not waited for: the pod is planned again next round. Its reservation is
            # handed back, or each limited round would put the bucket deeper in debt.
            self._bucket.give_back()
            return False
        return True
