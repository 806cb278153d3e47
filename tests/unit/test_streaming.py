"""The bounds of a streaming connection's life: idle accounting and the connection runner."""

from __future__ import annotations

import asyncio

import pytest

from vnode.api.streaming import IdleWatch, idle_remaining, run_connection


def test_idle_remaining() -> None:
    assert idle_remaining(last_activity=100.0, now=130.0, timeout=60.0) == 30.0
    assert idle_remaining(last_activity=100.0, now=170.0, timeout=60.0) == -10.0
    assert idle_remaining(last_activity=100.0, now=1e9, timeout=0.0) is None  # no timeout


async def test_an_idle_watch_expires_after_the_timeout_and_touches_push_it_back() -> None:
    loop = asyncio.get_running_loop()
    watch = IdleWatch()
    start = loop.time()
    await asyncio.wait_for(watch.expired(0.05), timeout=2)
    assert loop.time() - start >= 0.05

    async def keep_busy() -> None:
        for _ in range(5):
            await asyncio.sleep(0.02)
            watch.touch()

    watch.touch()
    start = loop.time()
    busy = asyncio.create_task(keep_busy(), name="keep-busy")
    await asyncio.wait_for(watch.expired(0.05), timeout=2)
    await busy
    assert loop.time() - start >= 0.1 + 0.05


async def test_a_zero_timeout_never_expires() -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(IdleWatch().expired(0), timeout=0.05)


async def test_the_runner_reports_how_the_connection_ended() -> None:
    closed = asyncio.Event()

    async def quick() -> None:
        await asyncio.sleep(0)

    assert await run_connection(
        quick(), closed=closed, idle=IdleWatch(), idle_timeout=10, name="t"
    ) == "done"  # fmt: skip

    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    outcome = await run_connection(
        forever(), closed=closed, idle=IdleWatch(), idle_timeout=0.05, name="t"
    )
    assert (outcome, cancelled.is_set()) == ("idle", True)

    cancelled.clear()
    asyncio.get_running_loop().call_later(0.02, closed.set)
    outcome = await run_connection(
        forever(), closed=closed, idle=IdleWatch(), idle_timeout=0, name="t"
    )
    assert (outcome, cancelled.is_set()) == ("closed", True)


async def test_the_runner_lets_the_bridges_failure_through() -> None:
    async def broken() -> None:
        raise RuntimeError("bridge bug")

    with pytest.raises(RuntimeError, match="bridge bug"):
        await run_connection(
            broken(), closed=asyncio.Event(), idle=IdleWatch(), idle_timeout=10, name="t"
        )
