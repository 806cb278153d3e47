"""Replicas of one program, one leader: `Leadership` runs the components that write only
while this replica holds a leader-election Lease (`tensile.kube.leaderelection`).

Every replica starts every component and keeps every informer running and synced, so a
standby's caches are warm; but a standby's informers tell no handler (`hold_handlers`), so
its queues stay empty and it keeps no state but the caches, whatever the churn. On taking
the Lease, the leading components' `take_over()` run first (`lifecycle.TakesOver`: writes
to make once, e.g. an adoption, before anything else acts), then the handlers are told of
every cached object at once (`release_handlers`), as a fresh process's first list tells
them, and the leading components' `run()` begin: a takeover is a fresh start that lists
nothing. Components that only read and serve (the kubelet API) stay outside and run in
every replica.

The leading components write through clients fenced by the elector
(`ApiClient.fenced`): past the renew deadline their writes are refused before they are
sent, so a replica that lost the Lease writes nothing while its work is being cancelled.

Losing the Lease after leading ends the program (LeaseLost; the command exits 1), as
kube-controller-manager and kube-scheduler do: the leading components' memory (writes in
flight, retries, marks) was built while leading and may be wrong once another replica
wrote, so the process comes back as a fresh standby rather than leading again with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.kube.leaderelection import LeaderElector
from tensile.serving.lifecycle import Component, informers_of, take_over

logger = logging.getLogger(__name__)


class Leadership:
    """A `Component` holding the leading components (see the module docstring)."""

    name = "leadership"

    def __init__(
        self, *, elector: LeaderElector, leading: Sequence[Component], watch: ApiClient
    ) -> None:
        """`leading` run, in this order, only while `elector` holds the Lease; their
        `start()` runs in every replica (it must not write), their `take_over()` (if any)
        once the Lease is acquired, before anything else of theirs. `watch` carries the watch of
        the Lease (`LeaderElector.lease_informer`), so a standby sees renewals as they
        happen."""
        self._elector = elector
        self._lease = elector.lease_informer(watch)
        self._leading = list(leading)
        self._started: list[Component] = []
        self._stopped = asyncio.Event()
        self.leading = asyncio.Event()
        """Set once this replica leads (for the rest of its life: a lost Lease ends it)."""

    @property
    def members(self) -> Sequence[Component]:
        """The leading components."""
        return self._leading

    def informers(self) -> Sequence[Informer]:
        """The Lease's and every informer of the leading components: run and synced in
        every replica."""
        return [self._lease, *self._held()]

    def _held(self) -> list[Informer]:
        return informers_of(self._leading)

    async def start(self) -> None:
        """Hold the leading components' informers' handlers, then start each leading
        component (in order). Raises what a `start()` raised, after shutting down those
        already started."""
        for informer in self._held():
            informer.hold_handlers()
        try:
            for component in self._leading:
                await component.start()
                self._started.append(component)
        except BaseException:
            await self._shut_down_started()
            raise

    def ready(self) -> bool:
        """Leading: whether every leading component is ready; standing by: whether every
        cache has synced (a warm standby is ready to take over)."""
        if self.leading.is_set():
            return all(component.ready() for component in self._leading)
        return all(informer.has_synced() for informer in self.informers())

    async def run(self) -> None:
        """Compete for the Lease until `shut_down()`; lead once acquired. Raises LeaseLost
        when the Lease is not renewed in time after leading. On `shut_down()` a leader lets
        the leading components finish their in-flight work, then releases the Lease."""
        async with asyncio.TaskGroup() as group:
            election = group.create_task(
                self._elector.run(self._lead, compete_again=False), name="leader-election"
            )
            stop = group.create_task(self._stopped.wait(), name="leadership-stop")
            await asyncio.wait([election, stop], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not self.leading.is_set():
                election.cancel()  # standing by: nothing in flight

    async def shut_down(self) -> None:
        """Stop competing; a leader's components stop taking new work."""
        self._stopped.set()
        await self._shut_down_started()

    async def _shut_down_started(self) -> None:
        while self._started:
            await self._started.pop().shut_down()

    async def _lead(self) -> None:
        if self._stopped.is_set():
            return
        await take_over(self._leading)
        informers = self._held()
        cached = sum(len(informer.store) for informer in informers)
        logger.info(
            "leading: %d cached objects of %d informers handed to the handlers; starting %s",
            cached,
            len(informers),
            ", ".join(component.name for component in self._leading),
        )
        for informer in informers:
            informer.release_handlers()
        self.leading.set()
        async with asyncio.TaskGroup() as group:
            for component in self._leading:
                group.create_task(component.run(), name=component.name)
