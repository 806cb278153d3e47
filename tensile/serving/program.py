"""One `main` for every program: a `Program` names what is the program's own (its name, its
parser, what it loads at start, its assembly, its own failures), and `main` does the rest
the same way for all of them (virtual-node, tensile-webhook, tensile-descheduler,
tensile-scheduler, kubectl-tensile), as aiohttp's `run_app` does for an application.

`main(program, argv)`, in order:

1. `program.parse(argv)`. A command line asking for the version (`version`, `--version`,
   `--version=true`: every form `tensile.serving.pflag` reads; not `--version=false`)
   prints the one version line (`tensile.serving.version.text`) and exits 0 before
   anything else is judged; `--help` prints the usage and exits 0; a usage error prints
   `<program>: error: <message naming the flag>` on stderr and exits 2.
2. A server configures logging (`--log-level`, `--log-format`) and logs its start-up notes
   (flags accepted but ignored, warnings about what was chosen).
3. `program.load(settings)`: the kubeconfigs (and other files) read once at start; one
   that cannot be loaded is a usage error: the same line, exit 2.
4. `program.run(settings, loaded, stopping)` on an event loop of its own. A server stops
   on SIGTERM or SIGINT: inside `stopping.calls(stop)` a signal calls `stop` (a graceful
   stop: in-flight work drains within the program's bound); before that block (the
   program is still connecting or assembling, nothing serves yet) a signal cancels the
   assembly. Either way the exit code is 0. A second Ctrl-C exits 130 at once.
5. A `StartupError`, or one of `program.failures` (the program's own "cannot start" and
   "lost its cluster" errors, declared once), exits 1 with one line: the ERROR log line
   `<program> stopped: <why>` of a server, `<program>: error: <why>` on stderr of a
   command.

A one-shot command (`Program.logging` None: kubectl-tensile) shares 1, 3 and 5: it logs
nothing and handles no signal (Ctrl-C ends it with exit code 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tensile.kube import config
from tensile.serving import flags, logs, shutdown, version
from tensile.serving.lifecycle import StartupError

logger = logging.getLogger(__name__)

S = TypeVar("S")
L = TypeVar("L")

EXIT_FAILED = 1
"""The program could not start, or stopped on a failure (`StartupError`, `failures`)."""
EXIT_USAGE = 2
"""A flag, an environment variable or a file named by one is invalid."""
EXIT_INTERRUPTED = 130
"""Ctrl-C ended the program (a command at once, a server the second time)."""

Note = tuple[int, str]
"""A start-up note: (logging level, message)."""


class Logged(Protocol):
    """What a server's settings say about its logging (`flags.add_logging_flags`)."""

    @property
    def log_level(self) -> str:
        """debug, info, warn or error."""

    @property
    def log_format(self) -> str:
        """text or json."""

    @property
    def notes(self) -> tuple[str, ...]:
        """One sentence per flag accepted but ignored (logged at start as warnings)."""


def logging_of(settings: Logged) -> flags.LoggingChoice:
    """Return the logging a server's `settings` ask for (`Program.logging` of a server)."""
    return flags.LoggingChoice(
        level=settings.log_level, format=settings.log_format, notes=settings.notes
    )


def _no_notes(_settings: object) -> Iterable[Note]:
    return ()


class Stopping:
    """How a server's assembly hears of SIGTERM and SIGINT (`main` installs the handlers):
    it runs its parts inside `calls(stop)`."""

    def __init__(self, task: asyncio.Task[None] | None = None) -> None:
        """`task` runs the assembly (a signal before `calls` cancels it); None: a command,
        which no signal reaches."""
        self._task = task
        self._stop: Callable[[], None] | None = None
        self._called = False
        self.cancelled = False
        """Whether a signal cancelled the assembly before it could stop gracefully."""

    @contextlib.contextmanager
    def calls(self, stop: Callable[[], None]) -> Iterator[None]:
        """While open, SIGTERM and SIGINT call `stop`, which must only ask for a graceful
        stop (set an event): it runs as an event-loop callback. Before the block a signal
        cancels the assembly (nothing is served yet); after it, a signal changes nothing
        (the program is stopping)."""
        self._stop, self._called = stop, True
        try:
            yield
        finally:
            self._stop = None

    def ask(self) -> None:
        """A stop signal arrived (called on the event loop)."""
        if self._stop is not None:
            self._stop()
        elif not self._called and self._task is not None and not self.cancelled:
            self.cancelled = True
            self._task.cancel()


@dataclass(frozen=True, kw_only=True)
class Program(Generic[S, L]):
    """What is a program's own; `main` does the rest (see the module docstring). `S` are
    its settings, `L` what it loads at start."""

    name: str
    """The command's name, as its version line and error lines say it ("virtual-node")."""
    parse: Callable[[Sequence[str]], S]
    """The settings of a command line. Raises flags.UsageError naming the flag,
    flags.VersionRequested (argparse exits for --help)."""
    load: Callable[[S], L]
    """Reads what the settings name, once, at start: the kubeconfigs (and files such as a
    token). Raises config.ConfigError or flags.UsageError (exit 2)."""
    run: Callable[[S, L, Stopping], Awaitable[None]]
    """The assembly: builds the program's collaborators and runs them until they stop
    (a server: inside `stopping.calls(stop)`). Raises StartupError or one of `failures`
    (exit 1)."""
    logging: Callable[[S], flags.LoggingChoice] | None = None
    """How a server logs (`logging_of`); None: a one-shot command (see the module
    docstring)."""
    notes: Callable[[S], Iterable[Note]] = _no_notes
    """Start-up notes of a server besides its ignored flags: warnings about what its
    settings chose, each at its level."""
    failures: tuple[type[Exception], ...] = ()
    """The program's own errors that mean it cannot start or lost its cluster: exit 1,
    as StartupError."""


def main(program: Program[S, L], argv: Sequence[str] | None = None) -> int:
    """Run `program` with `argv` (default: the process's arguments); return the exit code:
    0 done, stopped by a signal, or the version or help printed; 1 a StartupError or one of
    `program.failures`; 2 a usage error; 130 interrupted (see the module docstring)."""
    try:
        return _main(program, sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _main(program: Program[S, L], argv: list[str]) -> int:
    try:
        settings = program.parse(argv)
    except flags.VersionRequested:
        print(version.text(program.name))
        return 0
    except flags.UsageError as exc:
        print(f"{program.name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse after --help: the usage is printed
        return exc.code if isinstance(exc.code, int) else 0
    if program.logging is not None:
        choice = program.logging(settings)
        logs.configure(level=choice.level, fmt=choice.format)
        for note in choice.notes:
            logger.warning("%s", note)
        for level, message in program.notes(settings):
            logger.log(level, "%s", message)
    try:
        loaded = program.load(settings)
    except (config.ConfigError, flags.UsageError) as exc:
        print(f"{program.name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    failures: tuple[type[Exception], ...] = (StartupError, *program.failures)
    try:
        asyncio.run(run(program, settings, loaded))
    except failures as exc:
        if program.logging is None:
            print(f"{program.name}: error: {exc}", file=sys.stderr)
        else:
            logger.error("%s stopped: %s", program.name, exc)
        return EXIT_FAILED
    return 0


async def run(program: Program[S, L], settings: S, loaded: L) -> None:
    """Run `program`'s assembly as `main` does, on the running event loop: a server with
    its signal handlers (see the module docstring). Raises what the assembly raises."""
    if program.logging is None:
        await program.run(settings, loaded, Stopping())
        return
    task = asyncio.current_task()
    assert task is not None  # run on an event loop
    stopping = Stopping(task)
    with shutdown.stop_on_signals(stopping.ask, interrupt_again_exits=True):
        try:
            await program.run(settings, loaded, stopping)
        except asyncio.CancelledError:
            if not stopping.cancelled:
                raise
            task.uncancel()  # ours: a stop before anything was served
            logger.info("%s stopped before it started", program.name)
