"""Start-up steps retried until they succeed, so one transient error is never a crash.

A kubelet keeps trying to register its Node until the apiserver answers; a virtual node
does the same for registration and the clean-up of orphaned lower pods: each failure is
logged with what failed and when the next attempt comes, with jittered exponential
backoff (0.5 s doubling to at most 30 s). Cancellation (shutdown) ends the retrying.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from vnode.errors import ProviderError
from vnode.kube import errors

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRIED = (errors.ApiError, errors.ApiUnavailable, ProviderError)
"""What a retried step may fail with: any API answer or outage, any provider failure."""


async def until_done(
    what: str,
    step: Callable[[], Awaitable[T]],
    *,
    initial: float = 0.5,
    cap: float = 30.0,
) -> T:
    """Run `step()` until it returns, retrying after `RETRIED` errors (delays in seconds:
    `initial` doubling up to `cap`, with jitter); return its result. Other exceptions,
    cancellation included, propagate at once. `what` names the step in the log."""

    def warn(state: RetryCallState) -> None:
        outcome = state.outcome
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.warning(
            "%s failed (attempt %d): %s; retrying in %.1fs",
            what,
            state.attempt_number,
            outcome.exception() if outcome else "?",
            delay,
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(RETRIED),
        wait=wait_exponential_jitter(initial=initial, max=cap),
        before_sleep=warn,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await step()
    raise AssertionError("unreachable")  # pragma: no cover - tenacity retries forever
