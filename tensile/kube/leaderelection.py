"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

Several replicas of a program run `LeaderElector.run(work)`; at any time at most one of them
runs `work`. It is client-go's `tools/leaderelection` with a `LeaseLock`:

- A replica acquires the Lease when it is absent, released (empty holderIdentity), or its
  holder has not renewed it for `leaseDurationSeconds` as *this replica observed it*: the
  time is measured with the local monotonic clock from the moment the record last changed,
  never from the renewTime written by another machine, so clocks need not agree.
- Every write is an update with the resourceVersion last read (optimistic concurrency):
  of two replicas racing for the Lease, exactly one wins.
- `leaseTransitions` counts changes of holder; `acquireTime` is when the holder got it.
- The leader renews every `retry_period`. When no renewal succeeded for `renew_deadline`
  (less than `lease_duration`, so before any other replica may take over), `work` is
  cancelled at once and the replica goes back to acquiring: it keeps trying for as long as
  it runs, across apiserver outages and restarts. The deadline counts from when the last
  successful write was *sent*: the apiserver may store it at once and other replicas count
  from then, however late its answer arrives (client-go counts from the answer).
- When `run` is cancelled (shutdown) a leader releases the Lease, as client-go's
  `ReleaseOnCancel` does: holder emptied, `leaseDurationSeconds` 1, so another replica takes
  over at its next retry instead of after a whole lease duration.
- Two additions, optional and timing only (the rules above stand): a waiting replica tries
  again right when the holder's Lease expires as it counts it, not at the retry after; and
  with `lease_informer` running, it sees each renewal as it happens rather than at its
  next read, so it takes over one lease duration after the holder's last renewal instead
  of up to two jittered retries later, and at once after a release.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tensile.kube import errors, metrics
from tensile.kube.backoff import jittered
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import LEASES
from tensile.kube.timestamps import rfc3339_micro

logger = logging.getLogger(__name__)

JITTER_FACTOR = 1.2
"""client-go's: a waiting replica retries after retry_period * (1 + up to 1.2)."""
MAX_LEASE_SECONDS = 2**31 - 1
"""The Lease's leaseDurationSeconds is an int32: a longer duration the apiserver refuses."""
_EXPIRY_MARGIN = 0.05
"""Seconds after the observed expiry at which a standby tries (its clock has moved past)."""


class ElectionConfigError(ValueError):
    """The election settings cannot work (client-go's NewLeaderElector checks)."""


class LeaseLost(Exception):
    """The Lease was not renewed within the renew deadline after this replica led: raised by
    `LeaderElector.run(..., compete_again=False)` once the work is cancelled."""


@dataclass(frozen=True, kw_only=True)
class LeaderElectionSettings:
    """Which Lease, who we are, and the timing (seconds; client-go's defaults)."""

    namespace: str
    """Namespace of the Lease."""
    name: str
    """Name of the Lease (one per program: its replicas compete for it)."""
    identity: str
    """This replica's holderIdentity; unique per process (e.g. hostname + "_" + a UUID)."""
    lease_duration: float = 15.0
    """How long a waiting replica waits after the last observed change of the Lease before
    it takes over (written as leaseDurationSeconds: whole seconds, rounded up)."""
    renew_deadline: float = 10.0
    """How long the leader keeps trying to renew before it stops acting."""
    retry_period: float = 2.0
    """Time between attempts to acquire or renew."""
    release_on_cancel: bool = True
    """Release the Lease when `run` is cancelled, so another replica takes over at once."""

    def __post_init__(self) -> None:
        if not self.identity:
            raise ElectionConfigError("leader election needs an identity")
        if not self.namespace or not self.name:
            raise ElectionConfigError("leader election needs the Lease's namespace and name")
        if self.retry_period <= 0:
            raise ElectionConfigError("retry period must be greater than zero")
        if self.lease_duration < 1:
            raise ElectionConfigError("lease duration must be at least 1s")
        if self.lease_duration > MAX_LEASE_SECONDS:
            # Refused here, not by the apiserver at every try of every replica.
            raise ElectionConfigError(f"lease duration must be at most {MAX_LEASE_SECONDS}s")
        if self.lease_duration <= self.renew_deadline:
            raise ElectionConfigError("lease duration must be greater than renew deadline")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ElectionConfigError(
                f"renew deadline must be greater than retry period * {JITTER_FACTOR}"
            )


class LeaderElector:
    """Competes for one Lease; see the module docstring."""

    def __init__(
        self,
        client: ApiClient,
        *,
        settings: LeaderElectionSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` (seconds, monotonic) measures lease expiry and the renew deadline."""
        self._client = client
        self._settings = settings
        self._clock = clock
        self._path = LEASES.path(namespace=settings.namespace, name=settings.name)
        self._lease: dict[str, Any] | None = None
        """The Lease as last read or written (its resourceVersion is the next write's)."""
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        """When the write of our last acquisition or renewal was sent (clock); None while
        we do not hold the Lease."""
        self._last_renewal: float | None = None
        self._last_error = ""
        self._holder = ""
        self._gauge = metrics.LEADER.labels(f"{settings.namespace}/{settings.name}")
        self._gauge.set(0)
        self._released = asyncio.Event()
        """Set when a watch shows the Lease released: compete at once."""
        self._informer: Informer | None = None

    @property
    def identity(self) -> str:
        """This replica's holderIdentity."""
        return self._settings.identity

    @property
    def holder(self) -> str:
        """The holder of the Lease as last observed ("" when none or unknown)."""
        return self._holder

    @property
    def last_renewal(self) -> float | None:
        """When (clock seconds) the Lease was last acquired or renewed by us; None if never."""
        return self._last_renewal

    def is_leader(self) -> bool:
        """Tell whether we hold the Lease and renewed it less than renew_deadline ago: the
        check to make right before a write only the leader may do."""
        return (
            self._renewed_at is not None
            and self._clock() - self._renewed_at < self._settings.renew_deadline
        )

    def may_write(self) -> bool:
        """The fence of this election's writes (`tensile.kube.client.WriteGate`, given to
        `ApiClient.fenced`): `is_leader()`. It turns False at the renew deadline after the
        last successful renewal was sent, on the monotonic clock, which is before any other
        replica may take the Lease over (lease_duration counts from when it saw that
        renewal, later still); so a fenced write is never sent by this process while
        another holds the Lease, whatever its tasks still try (a stalled event loop, a task
        the cancellation has not reached yet). Left: a write sent in the last moments
        before the deadline, which has lease_duration - renew_deadline (5 s by default)
        to be stored before a successor may act."""
        return self.is_leader()

    def refusal(self) -> str:
        """Say why `may_write()` is False now (the message of a fenced write)."""
        lease = f"{self._settings.namespace}/{self._settings.name}"
        if self._renewed_at is None:
            return f"this process ({self.identity}) does not hold the lease {lease}"
        age = self._clock() - self._renewed_at
        return (
            f"the lease {lease} was last renewed {age:.1f}s ago, past the renew deadline "
            f"({self._settings.renew_deadline:g}s): another replica may lead"
        )

    async def run(self, work: Callable[[], Awaitable[None]], *, compete_again: bool = True) -> None:
        """Acquire the Lease, then run `work()` while renewing it; when renewal fails past the
        deadline, cancel `work` and compete again, or, with `compete_again=False`, raise
        LeaseLost (kube-controller-manager's and kube-scheduler's choice: a program whose
        in-memory state was built while leading starts again as a fresh standby). Returns
        when `work` returns (the Lease is then released); raises what `work` raises (after
        releasing). Runs until cancelled otherwise, releasing the Lease on the way out when
        `release_on_cancel`."""
        try:
            while True:
                await self._acquire()
                if await self._lead(work):
                    return
                if not compete_again:
                    raise LeaseLost(
                        f"lease {self._settings.namespace}/{self._settings.name} lost by "
                        f"{self.identity}: {self._last_error or 'taken over'}"
                    )
        finally:
            if self._renewed_at is not None and self._settings.release_on_cancel:
                await self._release()
            self._lost()

    async def _acquire(self) -> None:
        logger.info(
            "lease %s/%s: %s competes for it",
            self._settings.namespace,
            self._settings.name,
            self.identity,
        )
        while True:
            self._released.clear()
            if await self._attempt(timeout=self._settings.renew_deadline):
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_try()):
                    await self._released.wait()
        logger.info(
            "lease %s/%s acquired by %s",
            self._settings.namespace,
            self._settings.name,
            self.identity,
        )
        self._gauge.set(1)

    async def _lead(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run `work` while renewing. Returns True when `work` finished by itself, False
        when the Lease was lost (work cancelled)."""
        worker = asyncio.create_task(_call(work), name=f"leader-{self._settings.name}")
        renewer = asyncio.create_task(self._keep_renewing(), name=f"lease-{self._settings.name}")
        try:
            await asyncio.wait({worker, renewer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Whatever ended first (or our own cancellation), the other one stops now. Both
            # are awaited to the end, and a cancellation of ours arriving meanwhile (a
            # shutdown while the work cleans up after a lost Lease) is raised once they are
            # done, never swallowed with theirs.
            worker.cancel()
            renewer.cancel()
            await asyncio.gather(worker, renewer, return_exceptions=True)
        if worker.done() and not worker.cancelled():
            worker.result()  # re-raise the work's own failure
            return True
        renewer.result()
        return False

    async def _keep_renewing(self) -> None:
        """Renew every retry_period; return when renew_deadline passed without a renewal."""
        while True:
            await asyncio.sleep(self._settings.retry_period)
            while True:
                assert self._renewed_at is not None
                remaining = self._renewed_at + self._settings.renew_deadline - self._clock()
                if remaining > 0 and await self._attempt(timeout=remaining):
                    break
                remaining = self._renewed_at + self._settings.renew_deadline - self._clock()
                if remaining <= 0:
                    logger.error(
                        "lease %s/%s: not renewed for %.0fs (%s); %s stops leading",
                        self._settings.namespace,
                        self._settings.name,
                        self._settings.renew_deadline,
                        self._last_error or "taken over",
                        self.identity,
                    )
                    self._lost()
                    return
                await asyncio.sleep(min(self._settings.retry_period, remaining))

    def _next_try(self) -> float:
        """Seconds until the next attempt: the retry period, jittered as client-go's; but
        no later than the moment the observed holder's Lease expires as this replica
        counts it, so a takeover does not wait a further retry after the expiry."""
        delay = jittered(self._settings.retry_period, factor=JITTER_FACTOR)
        if self._observed and self._holder and self._holder != self.identity:
            duration = _seconds(self._observed.get("leaseDurationSeconds"))
            expires = self._observed_at + duration - self._clock()
            delay = min(delay, max(0.0, expires) + _EXPIRY_MARGIN)
        return delay

    def lease_informer(self, client: ApiClient) -> Informer:
        """Return an informer of this election's Lease on `client` (made once; a watch
        holds one of its connections), whose events this elector takes in as it takes in
        what it reads at each retry: run it (`Informer.run`) and a standby counts the
        lease duration from the moment of the holder's last renewal (to within the
        watch's delay) instead of from its own next read, and competes at once when the
        holder releases the Lease. Without it, the Lease is read at each retry only
        (client-go's way). Needs list and watch on the Lease."""
        if self._informer is None:
            self._informer = Informer(
                client,
                LEASES,
                name=f"lease-{self._settings.name}",
                namespace=self._settings.namespace,
                field_selector=f"metadata.name={self._settings.name}",
            )
            self._informer.add_handlers(Handlers(on_add=self._watched, on_modify=self._watched))
        return self._informer

    def _watched(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        self._observe(spec)
        if not spec.get("holderIdentity"):
            self._released.set()

    def _lost(self) -> None:
        self._renewed_at = None
        self._gauge.set(0)

    async def _attempt(self, *, timeout: float) -> bool:
        """One try to acquire or renew, bounded by `timeout` seconds; True on success."""
        try:
            async with asyncio.timeout(timeout):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            self._note_error(f"no answer within {timeout:.1f}s")
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            self._note_error(str(exc))
        return False

    def _note_error(self, message: str) -> None:
        # Said once per distinct failure: a follower retries every two seconds for as long
        # as an outage lasts.
        if message != self._last_error:
            logger.warning(
                "lease %s/%s: %s", self._settings.namespace, self._settings.name, message
            )
        self._last_error = message

    async def _try_acquire_or_renew(self) -> bool:
        now = dt.datetime.now(dt.UTC)
        # The apiserver may store a write the moment it arrives, however late its answer
        # reaches us; other replicas count the lease duration from then. So the renew
        # deadline counts from before the write was sent, never from its answer.
        sent = self._clock()
        if self.is_leader() and self._lease is not None:
            # client-go's fast path: the leader writes over what it wrote last; a conflict
            # (someone else wrote meanwhile) falls back to reading the Lease.
            try:
                return self._stored(await self._put(self._renewed(self._lease, now=now)), sent=sent)
            except errors.Conflict:
                pass
        try:
            lease = await self._client.request("GET", self._path)
        except errors.NotFound:
            return await self._create(now, sent=sent)
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = str(spec.get("holderIdentity") or "")
        duration = _seconds(spec.get("leaseDurationSeconds"))
        if holder and holder != self.identity and self._observed_at + duration > self._clock():
            self._last_error = ""
            return False
        try:
            return self._stored(await self._put(self._renewed(lease, now=now)), sent=sent)
        except errors.Conflict:
            return False  # another replica wrote first: it won this round

    async def _create(self, now: dt.datetime, *, sent: float) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._settings.name, "namespace": self._settings.namespace},
            "spec": self._record(now=now, acquired=now, transitions=0),
        }
        try:
            created = await self._client.request(
                "POST", LEASES.path(namespace=self._settings.namespace), body=body
            )
        except errors.AlreadyExists:
            return False
        return self._stored(created, sent=sent)

    async def _put(self, lease: dict[str, Any]) -> dict[str, Any]:
        return await self._client.request("PUT", self._path, body=lease)

    def _renewed(self, lease: dict[str, Any], *, now: dt.datetime) -> dict[str, Any]:
        spec = lease.get("spec") or {}
        transitions = int(spec.get("leaseTransitions") or 0)
        if spec.get("holderIdentity") == self.identity and spec.get("acquireTime"):
            record = self._record(now=now, acquired=None, transitions=transitions)
            record["acquireTime"] = spec["acquireTime"]
        else:
            record = self._record(now=now, acquired=now, transitions=transitions + 1)
        return {**lease, "spec": {**spec, **record}}

    def _record(
        self, *, now: dt.datetime, acquired: dt.datetime | None, transitions: int
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "holderIdentity": self.identity,
            # Rounded up: others must never be told they may take over sooner than this
            # replica stops acting (a renew deadline may be just under the duration).
            "leaseDurationSeconds": max(1, math.ceil(self._settings.lease_duration)),
            "renewTime": rfc3339_micro(now),
            "leaseTransitions": transitions,
        }
        if acquired is not None:
            record["acquireTime"] = rfc3339_micro(acquired)
        return record

    def _stored(self, lease: dict[str, Any], *, sent: float) -> bool:
        """Keep `lease` as written by us; `sent` (clock) is when its write was sent."""
        self._lease = lease
        self._observe(lease.get("spec") or {})
        self._renewed_at = self._last_renewal = sent
        self._last_error = ""
        return True

    def _observe(self, spec: dict[str, Any]) -> None:
        record = {k: spec.get(k) for k in _RECORD_FIELDS}
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
            holder = str(spec.get("holderIdentity") or "")
            if holder != self._holder:
                logger.info(
                    "lease %s/%s: holder is now %s",
                    self._settings.namespace,
                    self._settings.name,
                    holder or "nobody (released)",
                )
                self._holder = holder

    async def _release(self) -> None:
        """Give the Lease up (client-go's release): holder emptied, leaseDurationSeconds 1,
        transitions kept. Bounded by renew_deadline; a failure is logged (the Lease then
        expires by itself after lease_duration)."""
        if self._lease is None:
            return
        now = rfc3339_micro(dt.datetime.now(dt.UTC))
        spec = self._lease.get("spec") or {}
        released = {
            **self._lease,
            "spec": {
                **spec,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            },
        }
        try:
            async with asyncio.timeout(self._settings.renew_deadline):
                self._lease = await self._put(released)
            logger.info(
                "lease %s/%s released by %s",
                self._settings.namespace,
                self._settings.name,
                self.identity,
            )
        except (TimeoutError, errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning(
                "lease %s/%s: release failed (%s); it expires by itself",
                self._settings.namespace,
                self._settings.name,
                exc or "timed out",
            )


_RECORD_FIELDS = (
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "renewTime",
    "leaseTransitions",
)


def _seconds(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


async def _call(work: Callable[[], Awaitable[None]]) -> None:
    await work()
