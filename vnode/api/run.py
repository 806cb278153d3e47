"""`/run/{namespace}/{pod}[/{uid}]/{container}?cmd=...`: run a command, answer its output.

Kubelet semantics (pkg/kubelet/server/server.go getRun, kuberuntime RunInContainer): the
`cmd` query parameter is split on single spaces (not a shell: no quoting); the answer is
the command's stdout followed by its stderr, with status 200 and the kubelet's
`Content-Type: application/json` (it writes the raw bytes under that type); a command that
exits non-zero, or cannot run, is a 500 whose body says why — for an exit code, as the CRI
client words it: "command '<cmd>' exited with <code>: <stderr>". Unlike the kubelet (no
timeout), the command is bounded in time and in output size.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from tensile.kube.channel_framing import ERROR, STDERR, STDOUT
from vnode.api.channels import STATUS_LIMIT
from vnode.provider import RemoteCommand, RemoteSession

TIMEOUT = 60.0
"""Seconds a command may run before the answer is a 500."""
OUTPUT_LIMIT = 4 * 1024 * 1024
"""Bytes of stdout + stderr kept at most; more is a 500 (a CRI runtime refuses 16 MiB)."""


class RunError(Exception):
    """The command did not succeed; `status` is the HTTP status (400 or 500), the message
    the body."""

    def __init__(self, message: str, *, status: int = 500) -> None:
        self.status = status
        super().__init__(message)


def command(query: Mapping[str, str]) -> RemoteCommand:
    """Return the exec options of a `/run` query: `cmd` split on " ", stdout and stderr.

    Raises RunError (400) when `cmd` is missing or empty.
    """
    text = query.get("cmd", "")
    if not text.strip():
        raise RunError("cmd is required", status=400)
    return RemoteCommand(
        command=tuple(text.split(" ")), stdin=False, stdout=True, stderr=True, tty=False
    )


async def collect(
    session: RemoteSession,
    *,
    options: RemoteCommand,
    timeout: float = TIMEOUT,
    limit: int = OUTPUT_LIMIT,
) -> bytes:
    """Read `session` to its end and return stdout + stderr; the session is closed after.

    `timeout` in seconds, `limit` in bytes (stdout + stderr; the error channel, which
    carries only the exec Status, is held to STATUS_LIMIT bytes). Raises RunError (500) on
    a failure status, a timeout, or output beyond either bound.
    """
    stdout, stderr, status = bytearray(), bytearray(), bytearray()
    shown = " ".join(options.command)
    try:
        async with asyncio.timeout(timeout):
            while (message := await session.receive()) is not None:
                channel, data = message
                if channel == STDOUT:
                    stdout += data
                elif channel == STDERR:
                    stderr += data
                elif channel == ERROR:
                    status += data
                    if len(status) > STATUS_LIMIT:
                        raise RunError(
                            f"command '{shown}': the lower cluster sent more than "
                            f"{STATUS_LIMIT} bytes of exec status"
                        )
                if len(stdout) + len(stderr) > limit:
                    raise RunError(f"command '{shown}' wrote more than {limit} bytes")
    except TimeoutError:
        raise RunError(f"command '{shown}' timed out after {timeout:g}s") from None
    finally:
        await session.close()
    failure = failure_message(bytes(status), command=shown, stderr=bytes(stderr))
    if failure is not None:
        raise RunError(failure)
    return bytes(stdout + stderr)


def failure_message(status: bytes, *, command: str, stderr: bytes) -> str | None:
    """Return why a command failed from its exec status (a v4/v5 channel-protocol Status on
    the error channel), or None if it succeeded. No status at all is a failure: the session
    ended without the backend saying how the command ended."""
    if not status.strip():
        return f"command '{command}' ended without a status from the lower cluster"
    try:
        decoded = json.loads(status)
    except ValueError:
        return status.decode("utf-8", errors="replace")  # pre-v4 protocols: the message
    if not isinstance(decoded, dict):
        return status.decode("utf-8", errors="replace")
    if decoded.get("status") == "Success":
        return None
    if decoded.get("reason") == "NonZeroExitCode":
        causes = (decoded.get("details") or {}).get("causes") or []
        code = next(
            (
                c.get("message")
                for c in causes
                if isinstance(c, dict) and c.get("reason") == "ExitCode"
            ),
            "?",
        )
        return f"command '{command}' exited with {code}: {stderr.decode('utf-8', errors='replace')}"
    return str(decoded.get("message") or "the command failed")
