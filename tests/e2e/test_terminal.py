"""`kubectl attach` and `kubectl exec -t` (a terminal, resized) through the upper cluster.

kwok simulates the lower containers: an attached container's output is what is appended to
the fleet's attach file, and `exec -t` runs the command on a real pseudo-terminal whose size
follows the resize stream. kubectl only sends sizes when its own stdin is a terminal, so it
runs on a pty of ours here. Each test runs with kubectl's WebSocket default and with SPDY end
to end, as in test_exec.py.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from devcluster import kwok
from devcluster.cluster import kubectl_binary
from devcluster.fleet import Fleet

MODES = pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket", "spdy"])


def _kubectl_env(fleet: Fleet, websockets: str) -> dict[str, str]:
    return {
        **os.environ,
        "KUBECONFIG": str(fleet.upper.kubeconfig),
        "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets,
        "TERM": "dumb",
    }


def _set_size(fd: int, *, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _Terminal:
    """kubectl running on a pseudo-terminal whose other end the test reads and writes."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str], rows: int, cols: int) -> None:
        self.master, slave = os.openpty()
        _set_size(slave, rows=rows, cols=cols)
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.output = b""

    def expect(self, pattern: str, *, timeout: float = 30.0) -> re.Match[bytes]:
        """Read until `pattern` (a regex) shows in the output; fail with what came if not."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern.encode(), self.output)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"{pattern!r} not seen in {timeout}s; got {self.output!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:  # EIO: kubectl is gone and the pty closed
                    pytest.fail(f"{pattern!r} not seen before kubectl ended; got {self.output!r}")
        return found

    def until(self, pattern: str, *, typing: str, timeout: float = 30.0) -> None:
        """Type `typing` every half second until `pattern` shows in the output."""
        deadline = time.monotonic() + timeout
        while True:
            self.type(typing)
            try:
                self.expect(pattern, timeout=0.5)
                return
            except pytest.fail.Exception:
                if time.monotonic() > deadline:
                    raise

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def resize(self, *, rows: int, cols: int) -> None:
        # kubectl reads the new size from its terminal when told so by SIGWINCH.
        _set_size(self.master, rows=rows, cols=cols)
        self.process.send_signal(signal.SIGWINCH)

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    break
        return self.process.wait(timeout=max(deadline - time.monotonic(), 1))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.master)


@contextmanager
def _terminal(
    argv: Sequence[str], *, env: dict[str, str], rows: int, cols: int
) -> Iterator[_Terminal]:
    terminal = _Terminal(argv, env=env, rows=rows, cols=cols)
    try:
        yield terminal
    finally:
        terminal.close()


@MODES
def test_exec_with_a_terminal_follows_resizes_and_returns_the_exit_code(
    fleet: Fleet, namespace: str, running_pod: str, websockets: str
) -> None:
    # Each line typed prints the terminal's size. Sizes travel on their own stream, so the
    # test keeps asking until the size it set shows, rather than guessing when it arrived.
    script = "while read line; do stty size; done; exit 4"
    argv = [kubectl_binary(), "exec", "-it", "-n", namespace, running_pod, "--", "sh", "-c", script]
    env = _kubectl_env(fleet, websockets)
    with _terminal(argv, env=env, rows=33, cols=101) as terminal:
        terminal.until(r"33 101", typing="\r")
        terminal.resize(rows=47, cols=132)
        terminal.until(r"47 132", typing="\r")
        terminal.type("\x04")  # end of input at the terminal: the loop ends, then the shell
        assert terminal.wait() == 4


@MODES
def test_attach_shows_the_containers_output_as_it_comes(
    fleet: Fleet, namespace: str, running_pod: str, websockets: str
) -> None:
    marker = f"attached-{namespace}"
    process = subprocess.Popen(
        [kubectl_binary(), "attach", "-n", namespace, running_pod, "-c", "main"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_kubectl_env(fleet, websockets),
    )
    try:
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        seen = b""
        deadline = time.monotonic() + 30
        # Attaching shows only what comes after it: keep writing until a line arrives.
        while marker.encode() not in seen:
            assert time.monotonic() < deadline, f"no attached output in 30s: {seen!r}"
            assert process.poll() is None, f"kubectl attach ended: {seen!r}"
            with fleet.attach_file.open("a") as log:
                log.write(kwok.cri_log_lines([marker], start=dt.datetime.now(dt.UTC)))
            time.sleep(0.5)
            seen += process.stdout.read() or b""
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def test_attach_to_a_missing_container_is_an_error(
    fleet: Fleet, namespace: str, running_pod: str
) -> None:
    result = fleet.upper.kubectl(
        "attach", "-n", namespace, running_pod, "-c", "nope", check=False, timeout=60
    )
    assert result.returncode != 0
    assert "nope" in result.stderr
