"""Child processes of the local control plane: start, watch, stop, and report a death.

Each component runs in its own session (process group) with its output in a log file,
so stopping it takes its children too and a death can be explained by the log's tail.
A component is identified by its pid *and* its start time, so a stale state file never
makes us signal an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, kw_only=True)
class ProcessRef:
    """A process identified by pid and start time (clock ticks since boot, /proc/PID/stat)."""

    pid: int
    start: int

    def matches(self) -> bool:
        """Tell whether the process with this pid is still the one that was recorded."""
        return _start_ticks(self.pid) == self.start


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


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent: int, prctl: object) -> None:  # pragma: no cover - runs in the child
    # Runs between fork and exec: only async-signal-safe work (libc was loaded in the parent).
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # type: ignore[operator]
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


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
        """Start `argv` now; stdout and stderr go to `log`, which is started afresh.

        With `die_with_parent`, the kernel kills the child if the thread that started it
        ends, so a crashed test run leaves nothing behind (start pairs from the main thread
        or another long-lived one); `tensile-devcluster up` turns it off because its
        components must outlive the command.

        Raises OSError if the executable cannot be started.
        """
        self.name = name
        self.log = log
        self.argv = list(argv)
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._die_with_parent = die_with_parent
        self._spawn(mode="wb")

    def _spawn(self, *, mode: str) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        preexec = None
        if self._die_with_parent:
            preexec = functools.partial(_die_with_parent, os.getpid(), _libc().prctl)
        with self.log.open(mode) as out:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - see _die_with_parent
            )
        self.ref = ProcessRef(pid=self._popen.pid, start=_start_ticks(self._popen.pid) or 0)

    def restart(self) -> None:
        """Start the same command again after `stop` (its log is appended to)."""
        if self.alive():
            raise RuntimeError(f"{self.name} is still running")
        self._spawn(mode="ab")

    def pause(self) -> None:
        """Freeze the process group (SIGSTOP), as a hung component would be."""
        os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process group run again (SIGCONT)."""
        os.killpg(self.pid, signal.SIGCONT)

    @property
    def pid(self) -> int:
        """The child's process id (also its process group id)."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the child has exited (negative: killed by that signal)."""
        return self._popen.poll()

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


def stop_recorded(ref: ProcessRef, *, timeout: float = 10.0) -> None:
    """Stop the process group led by `ref`, unless its pid now belongs to another process."""
    if ref.matches():
        stop_group(ref.pid, timeout=timeout)


def stop_group(pgid: int, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group `pgid`, wait up to `timeout` seconds, then SIGKILL it.

    A pid that leads no group (a plain child) is signalled on its own.
    """
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
    """Tell whether any process of group `pgid` (or process `pgid`) is alive, not a zombie."""
    alive = any(state != "Z" for state in _members(pgid))
    # Reap it if it is our child, after looking: one that died meanwhile is reaped next time.
    # (An orphaned zombie is not reaped by every pid 1, e.g. in containers.)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    return alive


def recorded_alive(ref: ProcessRef) -> bool:
    """Tell whether the recorded process (or its group) is still running."""
    return ref.matches() and group_alive(ref.pid)


def _members(pgid: int) -> list[str]:
    """Return the states of the processes in group `pgid` or with pid `pgid` (Linux /proc)."""
    states = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and (int(fields[2]) == pgid or int(entry.name) == pgid):
            states.append(fields[0])
    return states


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        # Not a group leader (or gone): signal the process itself if it still exists.
        try:
            os.kill(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
    except PermissionError:  # a reused id that belongs to someone else
        return False
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Return /proc/PID/stat fields from the state onwards (index 0 = state), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ")".
    return stat[stat.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    # starttime is field 22 of /proc/PID/stat; index 0 here is field 3 (state).
    return int(fields[19]) if fields is not None else None


def children_of(pid: int) -> set[int]:
    """Return the ids of the live (non-zombie) direct children of process `pid` (Linux /proc)."""
    result: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return result
    for task in tasks:
        try:
            text = (task / "children").read_text()
        except OSError:
            continue
        for child in text.split():
            fields = _stat_fields(int(child))
            if fields is not None and fields[0] != "Z":
                result.add(int(child))
    return result
