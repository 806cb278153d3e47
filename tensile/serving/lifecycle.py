"""One life for every program's parts: the `Component` protocol, the `Runner` that runs a list
of them, and `StartupError`, which stops a start with a message saying what failed (a busy
port, an unreadable file, caches that did not sync in time).

The virtual node, the webhook and the descheduler are each a list of components run by a
`Runner` (virtual-kubelet's start order, Node.Run): `start()` of each in list order, then
`take_over()` of those that have one (`TakesOver`), then every informer of every component
runs (an informer shared by several components runs once), and once all have synced,
`run()` of each runs until `stop()`; then every started component is shut down (in
reverse order), in-flight work gets the shutdown timeout, and what is still running is
cancelled. Every task is named, owned by a TaskGroup and awaited.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from tensile.kube.informer import Informer
from tensile.serving import endpoints

logger = logging.getLogger(__name__)

_ShutDown = Callable[[Sequence["Component"]], Awaitable[None]]


class StartupError(Exception):
    """A program could not start; the message says what failed and, where it can, how to
    fix it. Raised before anything is served, so nothing is half-started."""


class Component(Protocol):
    """A part of a program with a life of its own, run by a `Runner` from a list.

    Life: `start()` once per component, in list order, before any informer runs; then every
    informer of every component runs, and once all have synced, `run()` of each runs until
    `shut_down()`; in-flight work then has the runner's shutdown timeout to finish before
    the run task is cancelled. `shut_down()` is called once for every component whose
    `start()` returned, also when the program stops before `run()` began.
    """

    name: str
    """Names its task and its log lines ("pod-controller", "services_to_lower")."""

    def informers(self) -> Sequence[Informer]:
        """The informers that must have synced before `run` (shared ones included)."""

    async def start(self) -> None:
        """Do what must work before anything runs (bind a port, read the backend's
        version); raise to stop the program's start (the message says what failed)."""

    def ready(self) -> bool:
        """Tell whether the component does its work now (started, its informers synced)."""

    async def run(self) -> None:
        """Work until `shut_down()`, then return once in-flight work is done."""

    async def shut_down(self) -> None:
        """Stop taking new work (queues stop handing out keys, servers stop listening)."""


@runtime_checkable
class TakesOver(Protocol):
    """A component with writes to make once before any component works: `take_over()` runs
    when this process may first write and before any `run()` (and any handler) begins. Run
    by a `Runner`, that is after every `start()` and before the informers run; under
    leader election (`tensile.serving.leadership`), when the Lease is acquired, after the
    caches synced and before their handlers are told of anything. Raising stops the
    program (as a failed `start()`)."""

    async def take_over(self) -> None:
        """Make the writes; raise to stop the program (the message says what failed)."""


async def take_over(components: Sequence[Component]) -> None:
    """Run `take_over()` of each of `components` that has one (`TakesOver`), in order."""
    for component in components:
        if isinstance(component, TakesOver):
            logger.info("%s: taking over", component.name)
            await component.take_over()


def informers_of(components: Sequence[Component]) -> list[Informer]:
    """Every informer of `components`, each once, in the components' order."""
    seen: dict[int, Informer] = {}
    for component in components:
        for informer in component.informers():
            seen.setdefault(id(informer), informer)
    return list(seen.values())


def health_of(components: Sequence[Component]) -> endpoints.Health:
    """Readiness checks for `/readyz`: one per component, named after it ("not ready" until
    its `ready()`), so a probe says which part is not ready."""
    health = endpoints.Health()
    for component in components:
        health.add_check(component.name, functools.partial(_readiness, component))
    return health


class Runner:
    """Runs a list of components (see the module docstring) until `stop()`."""

    def __init__(
        self,
        *,
        startup_timeout: float,
        shutdown_timeout: float | None,
        stop_when_done: bool = False,
    ) -> None:
        """`startup_timeout`: seconds the informers have to sync (0: no bound);
        `shutdown_timeout`: seconds in-flight work has after the components are shut down
        (None: as long as it takes);
        `stop_when_done`: also stop once every component's `run()` has returned (a program
        that does one thing and exits), not only on `stop()`."""
        self._startup_timeout = startup_timeout
        self._shutdown_timeout = shutdown_timeout
        self._stop_when_done = stop_when_done
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask `run` to stop gracefully (safe to call from a signal handler)."""
        self._stop.set()

    async def run(self, components: Sequence[Component]) -> None:
        """Run `components` until `stop()`. Raises StartupError if their informers do not
        sync in time, whatever a component's `start()` raised, and the first error a
        component's `run()` raised (the others are then cancelled)."""
        started: list[Component] = []
        shut: set[int] = set()

        async def shut_down(chosen: Sequence[Component]) -> None:
            for component in reversed(chosen):
                if id(component) not in shut:
                    shut.add(id(component))
                    await component.shut_down()

        try:
            for component in components:
                if self._stop.is_set():
                    return
                await component.start()
                started.append(component)
            if self._stop.is_set():
                return
            await take_over(components)
            try:
                await self._run_started(components, shut_down)
            except BaseExceptionGroup as group:
                first, *others = _leaves(group)
                for other in others:
                    # Only the first is raised; the rest would otherwise leave no trace.
                    logger.error("also failed while stopping: %r", other, exc_info=other)
                raise first from None
        finally:
            await shut_down(started)

    async def _run_started(self, components: Sequence[Component], shut_down: _ShutDown) -> None:
        informers = informers_of(components)
        async with asyncio.TaskGroup() as group:
            background = [group.create_task(i.run(), name=f"informer-{i.name}") for i in informers]
            stop = group.create_task(self._stop.wait(), name="stop-signal")
            await self._wait_synced(informers, stop)
            if stop.done():
                for task in background:
                    task.cancel()
                return
            if informers:
                logger.info("caches synced; starting workers")
            work = [group.create_task(c.run(), name=c.name) for c in components]
            if self._stop_when_done:
                background.append(group.create_task(self._stop_after(work), name="work-done"))
            await stop
            await self._drain(components, work, shut_down)
            for task in background + work:
                task.cancel()

    async def _stop_after(self, work: Sequence[asyncio.Task[None]]) -> None:
        await asyncio.wait(work)
        self.stop()

    async def _wait_synced(self, informers: Sequence[Informer], stop: asyncio.Task[bool]) -> None:
        timeout = self._startup_timeout or None

        async def all_synced() -> None:
            for informer in informers:
                await informer.wait_synced()

        synced = asyncio.create_task(all_synced(), name="wait-synced")
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait([synced, stop], return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            missing = [f"{i.name} ({i.last_sync_error})" for i in informers if not i.has_synced()]
            self.stop()
            raise StartupError(
                f"caches not synced after {timeout}s: {', '.join(missing)}"
            ) from None
        finally:
            synced.cancel()
            # gather returns the child's cancellation instead of raising it, while a
            # cancellation of this task itself still propagates (suppress would eat both).
            await asyncio.gather(synced, return_exceptions=True)

    async def _drain(
        self,
        components: Sequence[Component],
        work: list[asyncio.Task[None]],
        shut_down: _ShutDown,
    ) -> None:
        if self._shutdown_timeout is None:
            logger.info("stopping: finishing in-flight work")
        else:
            logger.info("stopping: finishing in-flight work (up to %.0fs)", self._shutdown_timeout)
        await shut_down(components)
        _done, pending = await asyncio.wait(work, timeout=self._shutdown_timeout)
        if pending:
            logger.warning(
                "stopping: abandoning work still in flight after %.0fs", self._shutdown_timeout
            )


def _readiness(component: Component) -> str | None:
    return None if component.ready() else "not ready"


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions of a task group's failure, nested groups flattened, in order: the
    first is the one that ended the run."""
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves
