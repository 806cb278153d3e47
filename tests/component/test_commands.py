"""Every program's command line answers the same way (`tensile.serving.program`): `version`,
`--version` and `--version=true` print the one version line and exit 0, `--version=false`
prints none; `--help` prints the usage and exits 0; an unknown flag and a bad value print
one line `<program>: error: <message naming the flag>` on stderr and exit 2. Every row runs
the program's `main(argv)` in the test's process; the version and the unknown flag also run
the installed console script in a process of its own."""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tensile.serving import version


@dataclass(frozen=True)
class Command:
    """A program and what its command line needs around a row."""

    name: str
    module: str
    usage: str
    """How `--help` names it."""
    before: tuple[str, ...] = ()
    """Words every row starts with (kubectl-tensile's subcommand)."""
    bad_value: tuple[str, ...] = ("--log-format=xml",)
    bad_flag: str = "--log-format"


COMMANDS = [
    Command(name="virtual-node", module="vnode.__main__", usage="virtual-node"),
    Command(name="tensile-webhook", module="webhook.__main__", usage="tensile-webhook"),
    Command(name="tensile-descheduler", module="descheduler.__main__", usage="tensile-descheduler"),
    Command(name="tensile-scheduler", module="scheduler.__main__", usage="tensile-scheduler"),
    Command(
        name="kubectl-tensile",
        module="kubectl_tensile.__main__",
        usage="kubectl tensile",
        before=("status",),
        bad_value=("--output=xml",),
        bad_flag="-o/--output",
    ),
]
VERSION_FORMS = [["version"], ["--version"], ["--version=true"], ["--v=3", "version"]]


def _main(command: Command, argv: list[str]) -> int:
    code: int = importlib.import_module(command.module).main(argv)
    return code


def _usage_error(command: Command, err: str, *, flag: str) -> None:
    """`err` is one line: `<program>: error: <message>`, the message naming `flag`."""
    prefix = f"{command.name}: error: "
    assert err.startswith(prefix), err
    assert err.count("\n") == 1, err
    assert flag in err.removeprefix(prefix), err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
@pytest.mark.parametrize("argv", VERSION_FORMS, ids=" ".join)
def test_the_version_is_one_line_and_exit_0(
    command: Command, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing else is needed (no kubeconfig): the version is asked before anything is judged.
    assert _main(command, argv) == 0
    assert capsys.readouterr() == (version.text(command.name) + "\n", "")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_help_prints_the_usage_and_exits_0(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(command, ["--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: {command.usage} ")
    assert "--version" in out
    assert err == ""


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_an_unknown_flag_is_named_and_exits_2(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(command, [*command.before, "--no-such-flag"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _usage_error(command, err, flag="unrecognized arguments: --no-such-flag")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_a_bad_value_is_named_and_exits_2(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(command, [*command.before, *command.bad_value]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _usage_error(command, err, flag=f"argument {command.bad_flag}: invalid choice: 'xml'")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_version_false_prints_no_version(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command line is then judged as any other: here, an unknown flag.
    assert _main(command, [*command.before, "--version=false", "--no-such-flag"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _usage_error(command, err, flag="--no-such-flag")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_the_console_script_answers_alike(command: Command) -> None:
    script = Path(sys.executable).parent / command.name
    done = subprocess.run(
        [str(script), "version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        version.text(command.name) + "\n",
        "",
    )
    done = subprocess.run(
        [str(script), *command.before, "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    _usage_error(command, done.stderr, flag="unrecognized arguments: --no-such-flag")
