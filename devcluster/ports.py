"""Loopback TCP ports for the local control plane.

A port is chosen by binding it, so it was free a moment ago; a component that still
loses the race fails to bind and the harness restarts it on another port
(see `processes.Component.start`).
"""

from __future__ import annotations

import logging
import socket

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def is_free(port: int, *, host: str = LOOPBACK) -> bool:
    """Tell whether `port` can be bound on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def is_listening(port: int, *, host: str = LOOPBACK, timeout: float = 0.2) -> bool:
    """Tell whether something accepts TCP connections on `host:port` (`timeout` in seconds)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pick(preferred: int = 0, *, host: str = LOOPBACK, taken: set[int] | None = None) -> int:
    """Return a free port: `preferred` if it is free, otherwise one the kernel hands out.

    `taken` holds ports already promised to other components of the same start-up, which
    are not bound yet and so look free; they are never returned, and the result is added.
    """
    taken = taken if taken is not None else set()
    if preferred and preferred not in taken and is_free(preferred, host=host):
        taken.add(preferred)
        return preferred
    if preferred:
        logger.warning("port %d on %s is in use; choosing another", preferred, host)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port
    raise OSError(f"no free TCP port on {host}")
