"""Signals and graceful shutdown: SIGTERM (what a kubelet sends a container first) and
SIGINT (Ctrl-C) ask the program to stop; it finishes in-flight work within a bound of its
own and exits 0. A signal arriving before the handlers are installed, or after they are
removed, has Python's default effect."""

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
    stop: Callable[[], None], *, signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> Iterator[None]:
    """Call `stop` (on the running event loop) whenever one of `signals` arrives, while the
    context is open. `stop` must only ask for a stop (set an event, cancel a task): it
    runs as a loop callback. Must be entered on the loop's thread (Unix only)."""
    loop = asyncio.get_running_loop()

    def received(sig: signal.Signals) -> None:
        logger.info("%s received: stopping", sig.name)
        stop()

    for sig in signals:
        loop.add_signal_handler(sig, received, sig)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
