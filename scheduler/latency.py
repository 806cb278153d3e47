"""Where an extender call's time goes besides its own work, as metrics (issue: the fleet
benchmark's p99 was tens of milliseconds against 0.9 ms alone).

- `LoopLag`: a component whose task sleeps `LAG_INTERVAL` seconds over and over and records
  how much later than asked it woke (`tensile_scheduler_event_loop_lag_seconds`): the time
  a call that arrives then waits, for other work on the event loop (watch events decoded,
  handlers) or for a CPU (the process preempted on a busy machine).
- `GcPauses`: the garbage collector's pauses (`tensile_scheduler_gc_pause_seconds`, by
  generation), timed by `gc.callbacks` (https://docs.python.org/3/library/gc.html#gc.callbacks):
  a full collection stops everything meanwhile; and what lives as long as the process is
  frozen once the caches have synced, so that a full collection is short.

A call's own CPU time is in `tensile_scheduler_extender_cpu_seconds` (the server's
handler): its duration less that is time spent waiting.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence
from typing import Any, Final

from scheduler import metrics
from tensile.kube.informer import Informer

LAG_INTERVAL: Final = 0.1
"""Seconds between two wake-ups of the loop-lag probe: 10 a second cost nothing measurable
and catch a stall of a few milliseconds one time in ten or more."""


class LoopLag:
    """The event loop's lag probe, as a `tensile.serving.lifecycle.Component`."""

    name = "event-loop-lag"

    def __init__(self, *, interval: float = LAG_INTERVAL) -> None:
        self._interval = interval
        self._stop = asyncio.Event()

    def informers(self) -> Sequence[Informer]:
        """None."""
        return ()

    async def start(self) -> None:
        """Nothing to prepare."""

    def ready(self) -> bool:
        """Always."""
        return True

    async def run(self) -> None:
        """Sleep and record the lag until `shut_down()`."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            asked = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            metrics.LOOP_LAG.observe(max(0.0, loop.time() - asked))

    async def shut_down(self) -> None:
        """Stop after the current sleep."""
        self._stop.set()


YOUNG_THRESHOLD: Final = 10_000
"""Allocations (net of frees) between two collections of the youngest generation, in place
of Python's 700: a full collection is only considered every hundredth young one, so with
700 the extender, whose caches and verdicts churn through every call, walked its whole
unfrozen heap every few seconds (13 to 20 pauses over 5 ms in a two-minute fleet run); a
young collection of 10,000 objects stays well under a millisecond."""


class GcPauses:
    """The garbage collector, as a `tensile.serving.lifecycle.Component`: its pauses timed
    while it runs; once every cache has its first list (`run()` begins), what is there is
    collected and frozen (`gc.freeze`, https://docs.python.org/3/library/gc.html#gc.freeze):
    the modules, the program's assembly and the first lists live as long as the process, and
    a full collection no longer walks them (it took tens of milliseconds on a busy machine
    each time, inside whichever call's allocations set it off)."""

    name = "gc"

    def __init__(self) -> None:
        self._started = 0.0
        self._thresholds: tuple[int, int, int] | None = None
        """Python's collection thresholds while `run` has set its own."""
        self._stop = asyncio.Event()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            metrics.GC_PAUSES.labels(str(info.get("generation", ""))).observe(
                time.perf_counter() - self._started
            )

    def informers(self) -> Sequence[Informer]:
        """None."""
        return ()

    async def start(self) -> None:
        """Time the pauses from now on."""
        self.install()

    def ready(self) -> bool:
        """Always."""
        return True

    async def run(self) -> None:
        """Collect and freeze what is there (the caches have synced), collect the young
        generation less often (`YOUNG_THRESHOLD`), then wait for `shut_down()`."""
        gc.collect()
        gc.freeze()
        self._thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, *self._thresholds[1:])
        await self._stop.wait()

    async def shut_down(self) -> None:
        """Stop timing; collect as Python would again."""
        self.uninstall()
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        self._stop.set()

    def install(self) -> None:
        """Start timing (once)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop timing."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
