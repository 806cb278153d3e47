"""A bound on how long a synchronous call may run, for tests of pure code on large input.

pytest-timeout's own signal leaves a traceback pytest cannot format when it lands inside a
long C-level comparison (an INTERNALERROR that ends the whole run); this bound fails just
the test, with a one-line message. A bound here is a ceiling orders of magnitude above
the expected time (it catches quadratic blow-ups, not slowness on a loaded machine).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

import pytest


class _Late(Exception):
    pass


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Fail the test when the block runs longer than `seconds` (main thread, Unix only)."""

    def late(_signal: int, _frame: FrameType | None) -> None:
        raise _Late

    previous = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Late:
        pytest.fail(f"{what}: not done within {seconds:g} s", pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
