"""The event loop every program runs on: uvloop where it is installed, the standard
library's asyncio loop by choice (`--event-loop=asyncio`) or where uvloop is not.

uvloop (libuv under asyncio's API) does the loop's own work (ready callbacks, timers, socket
reads and writes, TLS) in C, where the standard loop runs Python for each: the virtual node's
CPU per forwarded pod on either loop is in docs/benchmarks.md (bench/forwarding.py
--event-loop).
Nothing of tensile depends on which loop runs: both pass the same tests. The standard loop
stays one flag away for a platform uvloop does not build on, and to tell a loop's bug from
ours.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tensile.serving.flags import UsageError

T = TypeVar("T")

UVLOOP = "uvloop"
ASYNCIO = "asyncio"
EVENT_LOOPS = (UVLOOP, ASYNCIO)


def available(name: str) -> bool:
    """Tell whether the event loop `name` (one of EVENT_LOOPS) can run in this process."""
    return name == ASYNCIO or importlib.util.find_spec(name) is not None


def default() -> str:
    """Return the event loop a program runs on unless told: uvloop when it is installed,
    else asyncio."""
    return UVLOOP if available(UVLOOP) else ASYNCIO


def add_flag(parser: argparse.ArgumentParser) -> None:
    """Add `--event-loop` (uvloop or asyncio; default uvloop when installed): read it with
    `chosen`."""
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=None,
        help="the event loop: uvloop (libuv, in C) or asyncio (the standard library's); "
        "default uvloop when it is installed, else asyncio",
    )


def chosen(args: argparse.Namespace) -> str:
    """Return the event loop `--event-loop` asks for (its default when not given). Raises
    UsageError naming the flag for uvloop when it is not installed."""
    name: str = args.event_loop or default()
    if not available(name):
        raise UsageError(f"--event-loop={name}: {name} is not installed (pip install {name})")
    return name


def factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """Return what makes a new event loop of the kind `name` (one of EVENT_LOOPS). Raises
    ValueError for another name, ImportError when uvloop is asked for but not installed."""
    if name == ASYNCIO:
        return asyncio.new_event_loop
    if name == UVLOOP:
        import uvloop  # noqa: PLC0415 - optional: only the programs that choose it load it

        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return new_loop
    raise ValueError(f"unknown event loop {name!r} (one of {', '.join(EVENT_LOOPS)})")


def run(main: Coroutine[Any, Any, T], *, loop: str) -> T:
    """Run `main` to its end on a new event loop of the kind `loop`, as `asyncio.run` does
    (the loop is closed after its async generators and executor are shut down); return
    what it returns, raise what it raises. Raises ValueError / ImportError as `factory`."""
    with asyncio.Runner(loop_factory=factory(loop)) as runner:
        return runner.run(main)
