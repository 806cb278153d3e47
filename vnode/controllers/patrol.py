"""The patrol: a periodic full comparison of what the node's event path decides on with
the clusters, repairing what the event path missed (VirtualCluster's syncer patrol).

The event path reacts to watch events; an event it never got, or a key a queue dropped,
leaves drift nothing looks at again. Every `period` seconds the patrol
1. audits every informer of the node (`tensile.kube.cacheaudit`): its selection listed
   again, metadata only, in pages, through the patrol's own clients (their own rate
   budget, never the heartbeat's); a store that differs from its server (a missed event)
   is relisted by its reflector, so the handlers fire and the event path's queues get
   the keys;
2. runs its checks (`patrol_checks`) over the caches, now right: upper pods against
   backend pods (missing below, stale status upstairs, lost deletions, orphans below),
   and every mirror's copies against their sources; each mismatch's key is added to
   the queue of the event path that owns it, which repairs it with its own ownership
   checks.
Each mismatch is logged when first found, naming the object, and when it is no longer
found. Metrics (`tensile_patrol_*`): runs, run duration, mismatches found and repaired by
kind and reason, and those outstanding. A mismatch of (1) counts as repaired when the
store agrees after the relist; one of (2) when the next run no longer finds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter as CounterMetric
from prometheus_client import Gauge, Histogram

from tensile.kube import cacheaudit, errors
from tensile.kube.cacheaudit import AuditSettings
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from vnode.controllers.patrol_checks import Check
from vnode.controllers.patrol_decisions import Mismatch

logger = logging.getLogger(__name__)

RUNS = CounterMetric("tensile_patrol_runs", "Patrol runs completed.")
DURATION = Histogram(
    "tensile_patrol_duration_seconds",
    "Wall-clock time of one patrol run (lists, comparisons, relists).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
FOUND = CounterMetric(
    "tensile_patrol_mismatches_found",
    "Drift the patrol found (each piece counted once, when first found), by kind and reason.",
    ["kind", "reason"],
)
REPAIRED = CounterMetric(
    "tensile_patrol_mismatches_repaired",
    "Drift found by the patrol and no longer found after its repair, by kind and reason.",
    ["kind", "reason"],
)
OUTSTANDING = Gauge(
    "tensile_patrol_mismatches",
    "Drift found by the last patrol run and not repaired yet, by kind and reason.",
    ["kind", "reason"],
)
CPU = CounterMetric(
    "tensile_patrol_cpu_seconds",
    "Process CPU seconds used while patrol runs were in progress (an upper bound of the "
    "patrol's own: the node's other work goes on meanwhile).",
)
AUDIT_FAILURES = CounterMetric(
    "tensile_patrol_audit_failures",
    "Informer audits that could not list their server (the store was left alone).",
    ["informer"],
)


@dataclass(frozen=True, kw_only=True)
class Audit:
    """An informer to audit and the patrol's client of its cluster."""

    informer: Informer
    client: ApiClient


class Patrol:
    """Runs the patrol every `period` seconds (see the module docstring)."""

    name = "patrol"

    def __init__(
        self,
        *,
        period: float,
        audits: Sequence[Audit],
        checks: Sequence[Check],
        audit_settings: AuditSettings | None = None,
        relist_timeout: float = 120.0,
    ) -> None:
        """`period`: seconds between runs (0: never); `audits`: the informers to compare
        with their servers; `checks`: the comparisons of upper and lower state;
        `relist_timeout` (seconds) bounds the wait for a relist of a drifted store."""
        self._period = period
        self._audits = list(audits)
        self._checks = list(checks)
        self._audit_settings = audit_settings or AuditSettings()
        self._relist_timeout = relist_timeout
        self._stop = asyncio.Event()
        self._outstanding: dict[Mismatch, Check] = {}
        """Drift not repaired yet, with the check that found it (and knows its queue)."""

    # -- the Component contract --------------------------------------------------------------

    def informers(self) -> Sequence[Informer]:
        """None of its own: it reads the other components' informers."""
        return []

    async def start(self) -> None:
        """Nothing to prepare."""

    def ready(self) -> bool:
        """Always: the patrol serves nothing."""
        return True

    async def run(self) -> None:
        """Patrol every `period` seconds until `shut_down` (never when `period` is 0)."""
        if self._period <= 0:
            await self._stop.wait()
            return
        while not await self._stopped_within(self._period):
            await self.patrol()

    async def shut_down(self) -> None:
        """Stop after the run in progress."""
        self._stop.set()

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        except TimeoutError:
            return False
        return True

    # -- one run -------------------------------------------------------------------------------

    async def patrol(self) -> set[Mismatch]:
        """Run once: audit the caches, then compare and repair; return the drift found by
        the comparisons (the caches' drift is repaired by relists, and logged)."""
        started, cpu = time.monotonic(), time.process_time()
        for audit in self._audits:
            if self._stop.is_set():
                return set()
            await self._audit(audit)
        audited = time.process_time()
        found: dict[Mismatch, Check] = {}
        for check in self._checks:
            async for mismatch in check.mismatches():
                found[mismatch] = check
                check.repair(mismatch)
        # Drift not found again only because its key is still in its queue (a repair that
        # failed and waits for its retry, or not worked yet), or because a write of the
        # repair's is not in the cache yet, is not repaired: it stays.
        held = {
            mismatch: check
            for mismatch, check in self._outstanding.items()
            if mismatch not in found and check.in_hand(mismatch)
        }
        self._account({**held, **found})
        RUNS.inc()
        elapsed, used = time.monotonic() - started, time.process_time() - cpu
        DURATION.observe(elapsed)
        CPU.inc(used)
        logger.info(
            "patrol: run done in %.2fs (CPU %.2fs: audits %.2fs, comparisons %.2fs); %d mismatches",
            elapsed,
            used,
            audited - cpu,
            used - (audited - cpu),
            len(found),
        )
        return set(found)

    async def _audit(self, audit: Audit) -> None:
        informer = audit.informer
        kind = informer.selection.resource.plural
        try:
            drift = await cacheaudit.audit(
                informer,
                client=audit.client,
                settings=self._audit_settings,
                stopped=self._stop.is_set,  # a shut-down waits for no more looks
            )
        except (errors.ApiError, errors.ApiUnavailable, ValueError) as exc:
            # ValueError: an answer that is not JSON (a proxy's page), as the reflector
            # takes it; raised on, it would end the patrol's run() and with it the node.
            AUDIT_FAILURES.labels(informer.name).inc()
            logger.warning("patrol: cannot audit informer %s: %s", informer.name, exc)
            return
        if not drift:
            return
        for suspect in drift:
            FOUND.labels(kind, suspect.reason).inc()
            logger.warning(
                "patrol: informer %s missed an event: %s %s (%s); relisting",
                informer.name,
                kind,
                suspect.key,
                suspect.reason,
            )
        try:
            async with asyncio.timeout(self._relist_timeout):
                await informer.relist()
        except TimeoutError:
            logger.warning("patrol: relist of informer %s did not complete", informer.name)
            return
        for suspect in drift:
            if cacheaudit.repaired(suspect, cached_now=informer.store.version(suspect.key)):
                REPAIRED.labels(kind, suspect.reason).inc()
                logger.info(
                    "patrol: repaired informer %s: %s %s (%s)",
                    informer.name,
                    kind,
                    suspect.key,
                    suspect.reason,
                )

    def _account(self, found: dict[Mismatch, Check]) -> None:
        """Count what is new and what went since the last run; log each, naming it."""
        for mismatch in found.keys() - self._outstanding.keys():
            FOUND.labels(mismatch.kind, mismatch.reason).inc()
            logger.info(
                "patrol: %s %s: %s%s; queued for repair",
                mismatch.kind,
                mismatch.key,
                mismatch.reason,
                f" ({mismatch.detail})" if mismatch.detail else "",
            )
        for mismatch in self._outstanding.keys() - found.keys():
            REPAIRED.labels(mismatch.kind, mismatch.reason).inc()
            logger.info("patrol: repaired %s %s (%s)", mismatch.kind, mismatch.key, mismatch.reason)
        before = Counter((m.kind, m.reason) for m in self._outstanding)
        now = Counter((m.kind, m.reason) for m in found)
        for labels in before.keys() | now.keys():
            OUTSTANDING.labels(*labels).set(now.get(labels, 0))
        self._outstanding = found
