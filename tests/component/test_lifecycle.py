"""The one lifecycle of the programs (`tensile.serving.lifecycle`): a `Runner` starts
components in order, runs their informers (each once), runs the components once all have
synced, and on `stop()` shuts them down in reverse order and drains in-flight work within
its timeout. Fake components and informers record what happens to them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from tensile.serving import lifecycle
from tensile.serving.lifecycle import Runner, StartupError


class FakeInformer:
    def __init__(self, name: str, log: list[str], *, synced: bool = True) -> None:
        self.name = name
        self.log = log
        self.runs = 0
        self.last_sync_error = "connection refused"
        self._synced = asyncio.Event()
        if synced:
            self._synced.set()

    async def run(self) -> None:
        self.runs += 1
        self.log.append(f"informer {self.name}")
        await asyncio.Event().wait()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def has_synced(self) -> bool:
        return self._synced.is_set()


class FakeComponent:
    def __init__(
        self,
        name: str,
        log: list[str],
        *,
        informers: Sequence[FakeInformer] = (),
        start: asyncio.Event | None = None,
        fail_start: bool = False,
        fail_run: bool = False,
        done_at_once: bool = False,
        ignores_shut_down: bool = False,
    ) -> None:
        self.name = name
        self.log = log
        self._informers = list(informers)
        self._start = start
        self._fail_start = fail_start
        self._fail_run = fail_run
        self._done_at_once = done_at_once
        self._ignores_shut_down = ignores_shut_down
        self._shut = asyncio.Event()
        self.cancelled = False

    def informers(self) -> Sequence[FakeInformer]:
        return self._informers

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self._start is not None:
            await self._start.wait()
        if self._fail_start:
            raise StartupError(f"{self.name} cannot start")

    def ready(self) -> bool:
        return self._shut.is_set() is False

    async def run(self) -> None:
        self.log.append(f"run {self.name}")
        if self._fail_run:
            raise ValueError(f"{self.name} broke")
        if self._done_at_once:
            return
        try:
            await self._shut.wait()
            if self._ignores_shut_down:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def shut_down(self) -> None:
        self.log.append(f"shut down {self.name}")
        self._shut.set()


def runner(
    *, startup_timeout: float = 5.0, shutdown_timeout: float = 5.0, stop_when_done: bool = False
) -> Runner:
    return Runner(
        startup_timeout=startup_timeout,
        shutdown_timeout=shutdown_timeout,
        stop_when_done=stop_when_done,
    )


async def until(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(5):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def test_start_in_order_run_once_synced_shut_down_in_reverse_on_stop() -> None:
    log: list[str] = []
    shared = FakeInformer("pods", log)
    first = FakeComponent("first", log, informers=[shared])
    second = FakeComponent("second", log, informers=[shared, FakeInformer("nodes", log)])
    run = runner()
    task = asyncio.create_task(run.run([first, second]))
    await until(lambda: "run second" in log, "both run")
    assert log[:2] == ["start first", "start second"]
    assert sorted(log[2:4]) == ["informer nodes", "informer pods"]
    assert sorted(log[4:]) == ["run first", "run second"]
    assert shared.runs == 1, "an informer two components share runs once"
    run.stop()
    async with asyncio.timeout(5):
        await task
    assert log[-2:] == ["shut down second", "shut down first"]


async def test_a_stop_during_a_start_starts_nothing_more_and_runs_nothing() -> None:
    log: list[str] = []
    gate = asyncio.Event()
    first = FakeComponent("first", log)
    slow = FakeComponent("slow", log, start=gate)
    never = FakeComponent("never", log)
    run = runner()
    task = asyncio.create_task(run.run([first, slow, never]))
    await until(lambda: "start slow" in log, "the slow start")
    run.stop()
    gate.set()  # the start in progress finishes: it is not cut off
    async with asyncio.timeout(5):
        await task
    assert log == ["start first", "start slow", "shut down slow", "shut down first"]


async def test_a_failed_start_shuts_down_what_started_and_raises_it() -> None:
    log: list[str] = []
    components = [FakeComponent("first", log), FakeComponent("broken", log, fail_start=True)]
    with pytest.raises(StartupError, match="broken cannot start"):
        await runner().run(components)
    assert log == ["start first", "start broken", "shut down first"]


async def test_caches_that_do_not_sync_in_time_stop_the_start_naming_them() -> None:
    log: list[str] = []
    stuck = FakeInformer("pods", log, synced=False)
    component = FakeComponent("first", log, informers=[stuck, FakeInformer("nodes", log)])
    with pytest.raises(StartupError) as failed:
        await runner(startup_timeout=0.2).run([component])
    assert str(failed.value) == "caches not synced after 0.2s: pods (connection refused)"
    assert "run first" not in log
    assert log[-1] == "shut down first"


async def test_without_a_startup_timeout_a_stop_ends_the_wait_for_the_caches() -> None:
    log: list[str] = []
    component = FakeComponent("first", log, informers=[FakeInformer("pods", log, synced=False)])
    run = runner(startup_timeout=0)
    task = asyncio.create_task(run.run([component]))
    await until(lambda: "informer pods" in log, "the informer runs")
    await asyncio.sleep(0.2)
    assert not task.done()
    run.stop()
    async with asyncio.timeout(5):
        await task
    assert log == ["start first", "informer pods", "shut down first"]


async def test_work_still_in_flight_after_the_shutdown_timeout_is_cancelled() -> None:
    log: list[str] = []
    stubborn = FakeComponent("stubborn", log, ignores_shut_down=True)
    polite = FakeComponent("polite", log)
    run = runner(shutdown_timeout=0.2)
    task = asyncio.create_task(run.run([polite, stubborn]))
    await until(lambda: "run stubborn" in log, "both run")
    run.stop()
    async with asyncio.timeout(5):
        await task
    assert stubborn.cancelled
    assert not polite.cancelled


async def test_a_failed_run_ends_the_run_with_its_own_error_and_shuts_everything_down() -> None:
    log: list[str] = []
    healthy = FakeComponent("healthy", log)
    broken = FakeComponent("broken", log, fail_run=True)
    with pytest.raises(ValueError, match="broken broke"):  # the error, not a group
        async with asyncio.timeout(5):
            await runner().run([healthy, broken])
    assert healthy.cancelled
    assert sorted(log[-2:]) == ["shut down broken", "shut down healthy"]


async def test_of_two_failed_runs_the_first_is_raised_and_the_other_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    first = FakeComponent("first", log, fail_run=True)
    second = FakeComponent("second", log, fail_run=True)
    with pytest.raises(ValueError, match="first broke"):
        async with asyncio.timeout(5):
            await runner().run([first, second])
    assert any("second broke" in r.getMessage() for r in caplog.records), caplog.text


async def test_without_informers_no_caches_are_said_to_have_synced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tensile.serving.lifecycle")
    one = FakeComponent("once", [], done_at_once=True)
    async with asyncio.timeout(5):
        await runner(stop_when_done=True).run([one])
    assert "caches synced" not in caplog.text


async def test_work_that_is_done_ends_the_run_only_when_asked() -> None:
    log: list[str] = []
    once = FakeComponent("once", log, done_at_once=True)
    async with asyncio.timeout(5):
        await runner(stop_when_done=True).run([once])
    assert log == ["start once", "run once", "shut down once"]

    log.clear()
    run = runner()
    task = asyncio.create_task(run.run([FakeComponent("once", log, done_at_once=True)]))
    await until(lambda: "run once" in log, "the run")
    await asyncio.sleep(0.2)
    assert not task.done(), "without stop_when_done only stop() ends the run"
    run.stop()
    async with asyncio.timeout(5):
        await task


async def test_a_stop_before_the_run_starts_nothing() -> None:
    log: list[str] = []
    run = runner()
    run.stop()
    await run.run([FakeComponent("first", log)])
    assert log == []


def test_health_has_one_check_per_component_and_informers_are_listed_once() -> None:
    log: list[str] = []
    shared = FakeInformer("pods", log)
    ready = FakeComponent("ready", log, informers=[shared])
    components = [ready, FakeComponent("other", log, informers=[shared])]
    assert lifecycle.informers_of(components) == [shared]
    health = lifecycle.health_of(components)
    assert health.results() == [("ready", None), ("other", None)]
    ready._shut.set()
    assert health.results() == [("ready", "not ready"), ("other", None)]
