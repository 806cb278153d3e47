"""vnode.kube.retry: a step retried after the errors it names, with the delays it says."""

from __future__ import annotations

import pytest

from vnode.kube import errors, retry


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
