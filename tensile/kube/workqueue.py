"""A deduplicating keyed work queue with per-key backoff, as client-go's workqueue.

Guarantees (client-go's): a key is queued at most once however often it is added; a key is
never handed to two workers at once (an add while it is being processed is remembered and
handed out again when the worker is done); failed keys come back after a per-key
exponential delay combined with an overall token bucket, up to `max_retries` times.

Optionally the queue is *fair* (VirtualCluster's fair queue, research/virtualcluster.md
§1.7): keys are grouped (by namespace: a tenant), each group waits in a FIFO of its own,
and workers take keys from the groups in weighted round robin, so a namespace with
thousands of keys queued delays another's next key by at most one round, not by its whole
backlog. The guarantees above hold unchanged: fairness only decides which queued key is
handed out next.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from tensile.kube import metrics
from tensile.kube.backoff import ExponentialBackoff, TokenBucket

logger = logging.getLogger(__name__)


class Requeue(Exception):
    """Raised by a handler to have its key handled again after `after` seconds, not as a failure."""

    def __init__(self, after: float, reason: str = "") -> None:
        self.after = after
        super().__init__(reason or f"requeue after {after}s")


class Transient(Exception):
    """Raised by a handler whose key failed for a reason that passes by itself (its backend
    unreachable or overloaded): retried with the key's backoff like any failure, but never
    dropped after `max_retries`, since giving up would lose the work for good."""


def key_namespace(key: str) -> str:
    """Return the namespace of a "namespace/name" key ("" for a cluster-scoped "name")."""
    namespace, sep, _name = key.partition("/")
    return namespace if sep else ""


@dataclass(frozen=True, kw_only=True)
class FairQueuing:
    """How a fair queue groups its keys and weighs the groups (weighted round robin)."""

    group: Callable[[str], str] = key_namespace
    """Key -> the group (tenant) it is queued under; default: its namespace."""
    weights: Mapping[str, int] = field(default_factory=dict)
    """Keys a group may take in a row per round, by group; groups not named get
    `default_weight`. Every weight is >= 1."""
    default_weight: int = 1
    """Weight of groups not in `weights` (all equal by default: plain round robin)."""

    def __post_init__(self) -> None:
        bad = {g: w for g, w in self.weights.items() if w < 1}
        if self.default_weight < 1 or bad:
            raise ValueError(f"fair queuing weights must be >= 1, got {bad or self.default_weight}")

    def weight(self, group: str) -> int:
        """Return the weight of `group`."""
        return self.weights.get(group, self.default_weight)


@dataclass(frozen=True, kw_only=True)
class QueueSettings:
    """Retry policy and order of a queue; durations in seconds."""

    backoff: ExponentialBackoff = field(
        default_factory=lambda: ExponentialBackoff(base=0.005, cap=60.0)
    )
    """Per-key delay after consecutive failures."""
    max_retries: int = 15
    """Retries after a first failure before a key is dropped (until something adds it
    again): a key is handled at most 1 + max_retries times in a row, as in client-go."""
    rate: float = 50.0
    """Overall retries per second (token bucket)."""
    burst: int = 500
    """Token bucket size."""
    fairness: FairQueuing | None = None
    """Serve groups of keys in weighted round robin (see the module docstring); None: one
    FIFO for all keys, as client-go."""


class _FairBacklog:
    """Queued keys as one FIFO per group, handed out in weighted round robin.

    The ring holds the groups that have keys, in service order; the group at its head
    gives up to its weight of keys, then moves to the tail. A group whose FIFO empties
    leaves the ring (and is forgotten: no idle state to collect); when it gets a key again
    it joins at the tail, so it waits for at most one round. Every operation is O(1).
    """

    def __init__(self, fairness: FairQueuing) -> None:
        self._fairness = fairness
        self._groups: dict[str, collections.deque[str]] = {}
        self._ring: collections.deque[str] = collections.deque()
        self._served = 0
        """Keys the head group has taken in its current turn."""
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, key: str) -> None:
        group = self._fairness.group(key)
        keys = self._groups.get(group)
        if keys is None:
            keys = self._groups[group] = collections.deque()
            self._ring.append(group)
        keys.append(key)
        self._len += 1

    def popleft(self) -> str:
        """Return the next key. Raises IndexError when empty."""
        group = self._ring[0]
        keys = self._groups[group]
        key = keys.popleft()
        self._len -= 1
        self._served += 1
        if not keys:
            del self._groups[group]
            self._ring.popleft()
            self._served = 0
        elif self._served >= self._fairness.weight(group):
            self._ring.rotate(-1)
            self._served = 0
        return key


class WorkQueue:
    """Keys to process; see the module docstring for the guarantees."""

    def __init__(self, *, name: str, settings: QueueSettings | None = None) -> None:
        self.name = name
        self._settings = settings or QueueSettings()
        self._bucket = TokenBucket(rate=self._settings.rate, burst=self._settings.burst)
        fairness = self._settings.fairness
        self._queue: collections.deque[str] | _FairBacklog = (
            _FairBacklog(fairness) if fairness is not None else collections.deque()
        )
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._added_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        """Workers waiting for a key, first come first woken: one is woken per key queued
        (as asyncio.Queue does), not all of them to race for it."""
        self._shutting_down = False
        # The labelled children, looked up once: a lookup per add costs more than the add.
        self._depth = metrics.QUEUE_DEPTH.labels(name)
        self._adds = metrics.QUEUE_ADDS.labels(name)
        self._retries = metrics.QUEUE_RETRIES.labels(name)
        self._latency = metrics.QUEUE_LATENCY.labels(name)
        self._work = metrics.QUEUE_WORK.labels(name)
        self._depth.set(0)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: str) -> None:
        """Queue `key` unless it is queued already (or its worker will pick it up again)."""
        if self._shutting_down or key in self._dirty:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._dirty.add(key)
        self._adds.inc()
        if key in self._processing:
            return
        self._queue.append(key)
        self._added_at[key] = time.monotonic()
        self._depth.set(len(self._queue))
        self._notify()

    def add_after(self, key: str, delay: float) -> None:
        """Queue `key` in `delay` seconds (an earlier pending delay for it wins)."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def add_rate_limited(self, key: str) -> None:
        """Queue `key` again after its backoff (and the overall bucket) allows; counts a failure."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        self._retries.inc()
        delay = max(self._settings.backoff.delay(failures), self._bucket.reserve(time.monotonic()))
        self.add_after(key, delay)

    def forget(self, key: str) -> None:
        """Reset the failure count of `key` (after a success, or when giving up)."""
        self._failures.pop(key, None)

    def num_requeues(self, key: str) -> int:
        """Return how many times `key` failed since it was last forgotten."""
        return self._failures.get(key, 0)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _notify(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> str | None:
        """Wait for a key and mark it processing; None once the queue is shut down."""
        while not self._queue:
            if self._shutting_down:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # Woken and cancelled at once: the key it was woken for goes to another.
                if waiter.done() and not waiter.cancelled():
                    self._notify()
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        self._depth.set(len(self._queue))
        added = self._added_at.pop(key, None)
        if added is not None:
            self._latency.observe(time.monotonic() - added)
        return key

    def done(self, key: str) -> None:
        """Mark `key` processed; if it was added meanwhile, queue it again."""
        self._processing.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._queue.append(key)
            self._added_at[key] = time.monotonic()
            self._depth.set(len(self._queue))
            self._notify()

    async def shut_down(self) -> None:
        """Stop taking keys: adds and pending delays are dropped; keys already queued are still
        handed out (as client-go's ShuttingDown drains), then `get` returns None."""
        self._shutting_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def pending(self, key: str) -> bool:
        """Tell whether `key` is in hand: queued, being processed, or due after a delay."""
        return key in self._dirty or key in self._processing or key in self._timers

    def busy(self) -> bool:
        """Tell whether a worker is processing a key."""
        return bool(self._processing)

    async def run(self, *, workers: int, handler: Callable[[str], Awaitable[None]]) -> None:
        """Process keys with `workers` concurrent workers until the queue is shut down.

        A handler that returns forgets the key's failures; one that raises Requeue has it
        back after the given delay; one that raises Transient has it back with backoff for
        as long as that lasts; any other exception requeues it with backoff, up to
        `max_retries`, then drops it with an error log.
        """
        async with asyncio.TaskGroup() as group:
            for i in range(workers):
                group.create_task(self._worker(handler), name=f"{self.name}-worker-{i}")

    async def _worker(self, handler: Callable[[str], Awaitable[None]]) -> None:
        while True:
            key = await self.get()
            if key is None:
                return
            started = time.monotonic()
            try:
                await handler(key)
                self.forget(key)
            except Requeue as again:
                self.add_after(key, again.after)
            except Transient as exc:
                logger.info("queue %s: %s failed, will retry: %s", self.name, key, exc)
                self.add_rate_limited(key)
            except Exception as exc:  # noqa: BLE001 - any handler failure is retried
                if self.num_requeues(key) < self._settings.max_retries:
                    logger.info("queue %s: %s failed, will retry: %s", self.name, key, exc)
                    self.add_rate_limited(key)
                else:
                    logger.error(
                        "queue %s: dropping %s after %d failures: %s",
                        self.name,
                        key,
                        self.num_requeues(key) + 1,
                        exc,
                    )
                    self.forget(key)
            finally:
                self._work.observe(time.monotonic() - started)
                self.done(key)
