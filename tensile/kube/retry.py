"""Steps retried until they succeed, so one transient error is never a crash.

A kubelet keeps trying to register its Node until the apiserver answers; tensile's programs
do the same for what they cannot start without (a Node's registration, a serving
certificate's Secret): each failure is logged with what failed and when the next attempt
comes, with jittered exponential backoff (0.5 s doubling to at most 30 s, client-go's
`wait.Backoff` shape). Cancellation (shutdown) ends the retrying.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential,
    wait_random,
)

from tensile.kube import errors

logger = logging.getLogger(__name__)

T = TypeVar("T")

API_ERRORS: tuple[type[Exception], ...] = (errors.ApiError, errors.ApiUnavailable)
"""Any answer or outage of an apiserver."""
JITTER = 1.0
"""Most seconds added at random to each delay."""


async def until_done(
    what: str,
    step: Callable[[], Awaitable[T]],
    *,
    retried: tuple[type[Exception], ...] = API_ERRORS,
    initial: float = 0.5,
    cap: float = 30.0,
) -> T:
    """Run `step()` until it returns, retrying after the exceptions in `retried` (delays in
    seconds: `initial` doubling up to `cap`, plus up to JITTER at random); return its result. Other
    exceptions, cancellation included, propagate at once. `what` names the step in the log
    ("<what> failed (attempt N): <error>; retrying in S s")."""

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
        retry=retry_if_exception_type(retried),
        # Not wait_exponential_jitter: its `initial` warns (DeprecationWarning) from
        # tenacity 9.2 on, and the `multiplier` replacing it does not exist in 9.1.
        wait=wait_exponential(multiplier=initial, max=cap) + wait_random(0, JITTER),
        before_sleep=warn,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await step()
    raise AssertionError("unreachable")  # pragma: no cover - tenacity retries forever
