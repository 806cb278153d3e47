"""Start-up steps of the virtual node retried until they succeed (`tensile.kube.retry`):
registration and the clean-up of orphaned lower pods, after any API answer or outage and
any provider failure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tensile.kube import retry
from vnode.provider_errors import ProviderError

T = TypeVar("T")

RETRIED: tuple[type[Exception], ...] = (*retry.API_ERRORS, ProviderError)
"""What a retried step may fail with: any API answer or outage, any provider failure."""


async def until_done(
    what: str,
    step: Callable[[], Awaitable[T]],
    *,
    initial: float = 0.5,
    cap: float = 30.0,
) -> T:
    """Run `step()` until it returns, retrying after `RETRIED` errors (see
    `tensile.kube.retry.until_done`: delays in seconds, `initial` doubling up to `cap`, with
    jitter); return its result. Other exceptions, cancellation included, propagate."""
    return await retry.until_done(what, step, retried=RETRIED, initial=initial, cap=cap)
