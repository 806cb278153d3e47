"""Child processes of the local control plane: start, watch, stop, and report a death.

Each component runs in its own session (process group) with its output in a log file,
so stopping it takes its children too and a death can be explained by the log's tail.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_TAIL_LINES = 30


class ComponentDied(RuntimeError):
    """A control-plane component exited when it should be running.

    The message names the component, its exit code and the tail of its log.
    """

    def __init__(self, *, name: str, returncode: int | None, log: Path) -> None:
        self.name = name
        self.returncode = returncode
        self.log = log
        super().__init__(f"{name} exited with code {returncode}; last lines of {log}:\n{tail(log)}")


def tail(path: Path, *, lines: int = _TAIL_LINES) -> str:
    """Return the last `lines` lines of a text file, or a note if it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Process:
    """One running component: a child process in its own process group, logging to a file."""

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """Start `argv` now; stdout and stderr go to `log` (appended).

        With `die_with_parent`, the kernel kills the child if this process dies first, so
        a crashed test run leaves nothing behind; `tensile-devcluster up` turns it off
        because its components must outlive the command.

        Raises OSError if the executable cannot be started.
        """
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None,  # noqa: PLW1509
            )

    @property
    def pid(self) -> int:
        """The child's process id (also its process group id)."""
        return self._popen.pid

    def alive(self) -> bool:
        """Tell whether the child is still running."""
        return self._popen.poll() is None

    def check(self) -> None:
        """Raise ComponentDied if the child has exited."""
        if not self.alive():
            raise ComponentDied(name=self.name, returncode=self._popen.returncode, log=self.log)

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `timeout` seconds."""
        stop_group(self.pid, timeout=timeout)
        # SIGKILL was sent already if needed; this only reaps the child.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=1.0)


def stop_group(pgid: int, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group `pgid`, wait up to `timeout` seconds, then SIGKILL it."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Tell whether any process of group `pgid` is alive (zombies of our own are reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a recycled id owned by someone else
        return False
    return not _all_zombies(pgid)


def _all_zombies(pgid: int) -> bool:
    """Tell whether every process of group `pgid` is a zombie (dead, not yet reaped)."""
    found = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) != pgid:
            continue
        found = True
        if fields[0] != "Z":
            return False
    return found


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def children_of(pid: int) -> set[int]:
    """Return the ids of the live (non-zombie) direct children of process `pid` (Linux /proc)."""
    result: set[int] = set()
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return result
    for task in tasks:
        try:
            text = (task / "children").read_text()
        except OSError:
            continue
        for child in text.split():
            try:
                state = Path(f"/proc/{child}/stat").read_text()
            except OSError:
                continue
            if state[state.rfind(")") + 2 :].split()[0] != "Z":
                result.add(int(child))
    return result
