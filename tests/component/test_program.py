"""The one `main` of every program (`tensile.serving.program`) around a stand-in assembly:
what a start failure, a declared failure and a usage error exit with and say, and what
SIGTERM and Ctrl-C do before, during and after a graceful stop (real signals, sent to this
process)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tensile.kube import config
from tensile.serving import flags, program
from tensile.serving.lifecycle import StartupError


class Lost(Exception):
    """The stand-in's own "lost its cluster" error."""


def _parse(argv: Sequence[str]) -> flags.LoggingChoice:
    if "--bad" in argv:
        raise flags.UsageError("--bad: not a good flag")
    return flags.LoggingChoice(level="info", format="text", notes=("--log-dir is ignored",))


def _stand_in(
    run: Callable[[flags.LoggingChoice, str, program.Stopping], Any],
    *,
    load: Callable[[flags.LoggingChoice], str] = lambda _settings: "loaded",
    server: bool = True,
) -> program.Program[flags.LoggingChoice, str]:
    return program.Program(
        name="stand-in",
        parse=_parse,
        load=load,
        run=run,
        logging=(lambda settings: settings) if server else None,
        notes=lambda _settings: [(logging.ERROR, "INSECURE: a note at its level")],
        failures=(Lost,),
    )


async def _fails(error: Exception) -> None:
    raise error


def test_a_start_failure_exits_1_with_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    stand_in = _stand_in(lambda *_: _fails(StartupError("cannot listen on :1 (--port)")))
    assert program.main(stand_in, []) == 1
    out, err = capsys.readouterr()
    assert out == ""
    # The notes at start, then the one line of the failure (logs go to stderr).
    assert [line.split(" ", 2)[2] for line in err.splitlines()] == [
        "WARNING tensile.serving.program: --log-dir is ignored",
        "ERROR   tensile.serving.program: INSECURE: a note at its level",
        "ERROR   tensile.serving.program: stand-in stopped: cannot listen on :1 (--port)",
    ]


def test_a_declared_failure_exits_1_and_others_are_not_hidden() -> None:
    assert program.main(_stand_in(lambda *_: _fails(Lost("lease lost"))), []) == 1
    with pytest.raises(ValueError, match="a bug"):
        program.main(_stand_in(lambda *_: _fails(ValueError("a bug"))), [])


def test_a_command_prints_its_failure_as_a_usage_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stand_in = _stand_in(lambda *_: _fails(Lost("no such pod")), server=False)
    assert program.main(stand_in, []) == 1
    assert capsys.readouterr() == ("", "stand-in: error: no such pod\n")


def test_usage_errors_and_files_that_cannot_be_loaded_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    never = _stand_in(lambda *_: _fails(AssertionError("must not run")))
    assert program.main(never, ["--bad"]) == 2
    assert capsys.readouterr().err == "stand-in: error: --bad: not a good flag\n"

    def load(_settings: flags.LoggingChoice) -> str:
        raise config.ConfigError("kubeconfig /k does not exist")

    assert program.main(_stand_in(never.run, load=load), []) == 2
    # After the start-up notes (logged on stderr), the one line.
    assert capsys.readouterr().err.endswith("\nstand-in: error: kubeconfig /k does not exist\n")


def test_sigterm_while_running_stops_it_gracefully() -> None:
    seen: list[str] = []

    async def run(_settings: Any, loaded: str, stopping: program.Stopping) -> None:
        stopped = asyncio.Event()
        seen.append(loaded)
        with stopping.calls(stopped.set):
            os.kill(os.getpid(), signal.SIGTERM)
            await stopped.wait()
            seen.append("drained")

    assert program.main(_stand_in(run), []) == 0
    assert seen == ["loaded", "drained"]


def test_a_signal_while_it_assembles_cancels_it_and_exits_0() -> None:
    cleaned: list[str] = []

    async def run(_settings: Any, _loaded: str, stopping: program.Stopping) -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.Event().wait()  # connecting to a cluster that does not answer
        finally:
            cleaned.append("clients closed")
        with stopping.calls(lambda: None):  # pragma: no cover - never reached
            pass

    assert program.main(_stand_in(run), []) == 0
    assert cleaned == ["clients closed"]


def test_a_second_ctrl_c_exits_130() -> None:
    async def run(_settings: Any, _loaded: str, stopping: program.Stopping) -> None:
        with stopping.calls(lambda: None):  # a graceful stop that never ends
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.1)
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.Event().wait()

    assert program.main(_stand_in(run), []) == 130
    # The handlers are gone with the loop: Python's defaults are back.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
