"""Steps retried until done (tensile.kube.retry): which failures, which delays, and no warning
from building the backoff."""

from __future__ import annotations

import pytest

from tensile.kube import errors, retry


async def test_listed_failures_are_retried_with_doubling_jittered_delays(
    slept: list[float],
) -> None:
    failures = [errors.ApiUnavailable("connection refused")] * 7

    async def step() -> str:
        if failures:
            raise failures.pop()
        return "done"

    assert await retry.until_done("a step", step, initial=0.5, cap=8.0) == "done"
    lows = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert len(slept) == len(lows)
    for delay, low in zip(slept, lows, strict=True):
        assert low <= delay <= low + 1.0, slept


async def test_other_failures_propagate_at_once(slept: list[float]) -> None:
    async def step() -> None:
        raise errors.Forbidden(code=403, status={"message": "no"})

    with pytest.raises(errors.Forbidden):
        await retry.until_done("a step", step, retried=(errors.ApiUnavailable,))
    assert slept == []


async def test_a_step_is_retried_after_an_api_error_until_it_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Run under the project's warnings-as-errors: building the backoff must not warn (a
    DeprecationWarning here stopped every in-process caller, tenacity 9.2's)."""
    answers: list[Exception | str] = [errors.ApiUnavailable("refused"), "done"]

    async def step() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert await retry.until_done("the step", step, initial=0.01, cap=0.02) == "done"
    [line] = [r.getMessage() for r in caplog.records if "failed (attempt 1)" in r.getMessage()]
    assert line.startswith("the step failed (attempt 1): refused; retrying in ")
    delay = float(line.rpartition(" ")[2].removesuffix("s"))
    assert 0.0 <= delay <= 0.02 + retry.JITTER


async def test_other_errors_are_not_retried() -> None:
    async def step() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await retry.until_done("the step", step, initial=0.01)
