"""Where an extender call's time goes (`scheduler.latency`): the loop-lag probe records a
stall of the event loop it runs on, and the garbage collector's pauses are timed by
generation only while installed."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import REGISTRY

from scheduler.latency import YOUNG_THRESHOLD, GcPauses, LoopLag


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_the_probe_records_how_long_the_loop_was_stalled() -> None:
    probe = LoopLag(interval=0.01)
    before_sum = _value("tensile_scheduler_event_loop_lag_seconds_sum")
    before_slow = _value("tensile_scheduler_event_loop_lag_seconds_count") - _value(
        "tensile_scheduler_event_loop_lag_seconds_bucket", {"le": "0.05"}
    )
    task = asyncio.create_task(probe.run(), name="test-loop-lag")
    await asyncio.sleep(0.05)
    time.sleep(0.2)  # noqa: ASYNC251 - the stall measured: the timer runs 0.19 s late at least
    await asyncio.sleep(0.05)
    await probe.shut_down()
    await asyncio.wait_for(task, timeout=5)
    slow = _value("tensile_scheduler_event_loop_lag_seconds_count") - _value(
        "tensile_scheduler_event_loop_lag_seconds_bucket", {"le": "0.05"}
    )
    assert slow - before_slow >= 1
    assert _value("tensile_scheduler_event_loop_lag_seconds_sum") - before_sum >= 0.15


def test_gc_pauses_are_timed_by_generation_while_installed() -> None:
    pauses = GcPauses()
    name, full = "tensile_scheduler_gc_pause_seconds_count", {"generation": "2"}
    before = _value(name, full)
    pauses.install()
    pauses.install()  # once
    try:
        gc.collect()
    finally:
        pauses.uninstall()
    assert _value(name, full) == before + 1
    gc.collect()
    assert _value(name, full) == before + 1


async def test_once_the_caches_synced_what_is_there_is_frozen_out_of_full_collections() -> None:
    pauses = GcPauses()
    python = gc.get_threshold()
    await pauses.start()
    task = asyncio.create_task(pauses.run(), name="test-gc")
    try:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *python[1:])
    finally:
        await pauses.shut_down()
        await asyncio.wait_for(task, timeout=5)
        gc.unfreeze()
    assert gc.get_threshold() == python
