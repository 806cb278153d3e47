"""Fixtures shared by the unit tests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff delays asked for (seconds); nothing actually waits."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def no_wait(seconds: float, *args: Any, **kwargs: Any) -> None:
        delays.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", no_wait)
    return delays
