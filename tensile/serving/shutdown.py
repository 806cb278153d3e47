"""Signals and graceful shutdown: SIGTERM (what a kubelet sends a container first) and
SIGINT (Ctrl-C) ask the program to stop; it finishes in-flight work within a bound of its
own and exits 0. A signal arriving before the handlers are installed, or after they are
removed, has Python's default effect. How every program does it is `tensile.serving.program`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Sequence

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(
    stop: Callable[[], None],
    *,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
    interrupt_again_exits: bool = False,
) -> Iterator[None]:
    """Call `stop` (on the running event loop) whenever one of `signals` arrives, while the
    context is open. `stop` must only ask for a stop (set an event, cancel a task): it
    runs as a loop callback. Must be entered on the loop's thread (Unix only).

    With `interrupt_again_exits`, a SIGINT after a first signal raises KeyboardInterrupt
    out of the event loop instead (a second Ctrl-C ends a graceful stop that takes too
    long: the program exits 130)."""
    loop = asyncio.get_running_loop()
    asked = False

    def received(sig: signal.Signals) -> None:
        nonlocal asked
        if interrupt_again_exits and asked and sig == signal.SIGINT:
            logger.warning("%s received again: exiting now", sig.name)
            # The event loop lets KeyboardInterrupt out of a callback: asyncio.run ends.
            raise KeyboardInterrupt
        asked = True
        logger.info("%s received: stopping", sig.name)
        stop()

    for sig in signals:
        loop.add_signal_handler(sig, received, sig)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
