"""Loopback TCP ports for the local control plane.

A port is chosen by binding it, so it was free a moment ago; a component that still
loses the race fails to bind and the harness restarts it on another port
(see `processes.Component.start`). Programs whose port is fixed before they start (a
chart's values) cannot be restarted elsewhere, so ports are chosen outside the kernel's
ephemeral range (`net.ipv4.ip_local_port_range`): a port from inside it can be taken, between
the choice and the bind, as the local port of any outgoing connection, which then makes the
program's bind fail with EADDRINUSE.
"""

from __future__ import annotations

import functools
import logging
import random
import socket
from pathlib import Path

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
CHOSEN = range(20000, 30000)
"""Where `pick` chooses: below the kernel's default ephemeral range (32768-60999) and
below kube-apiserver's default NodePort range (30000-32767)."""
NODE_PORTS = range(30000, 32768)
"""kube-apiserver's default --service-node-port-range."""
KUBE_PORTS = range(10000, 11000)
"""Where Kubernetes programs listen by default (kubelet 10250, 10255; schedulers 10259;
tensile's programs near them): left to them."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Unseeded by tests (a plugin that seeds `random` alike in every worker would have them all
# try the same ports in the same order).
_RANDOM = random.SystemRandom()
_next: int | None = None
"""Where this process's next choice starts among the candidates: a random place at first,
then just past the last port chosen, so a process hands a port out again only after going
round the whole range (a port chosen but not bound yet looks free; choosing at random every
time would hand one out twice within a few dozen choices), and processes starting at
different places seldom meet."""


@functools.cache  # one list per ephemeral range, not 10,000 ports built per choice
def _candidates(ephemeral: range) -> tuple[int, ...]:
    """The ports `pick` chooses among: `CHOSEN` outside `ephemeral`, or, where `ephemeral`
    covers it all, any unprivileged port outside `ephemeral` and the NodePort range."""
    chosen = tuple(port for port in CHOSEN if port not in ephemeral)
    if chosen:
        return chosen
    return tuple(
        port
        for port in range(1024, 65536)
        if port not in ephemeral and port not in NODE_PORTS and port not in KUBE_PORTS
    )


def _ephemeral() -> range:
    """The kernel's ephemeral port range (the default when it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(low, high + 1)


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
    """Return a free port: `preferred` if it is free, otherwise the next free one of
    `_candidates` (`CHOSEN` outside the kernel's ephemeral range, see the module docstring)
    after this process's last choice, or, when there is none, one the kernel hands out.
    Raises OSError when no port is free.

    `taken` holds ports already promised to other components of the same start-up, which
    are not bound yet and so look free; they are never returned, and the result is added.
    """
    taken = taken if taken is not None else set()
    if preferred and preferred not in taken and is_free(preferred, host=host):
        taken.add(preferred)
        return preferred
    if preferred:
        logger.warning("port %d on %s is in use; choosing another", preferred, host)
    global _next  # noqa: PLW0603 - one cursor per process, as the kernel keeps one
    candidates = _candidates(_ephemeral())
    if candidates:
        if _next is None:
            _next = _RANDOM.randrange(len(candidates))
        for step in range(min(len(candidates), 1000)):
            port = candidates[(_next + step) % len(candidates)]
            if port not in taken and is_free(port, host=host):
                _next = (_next + step + 1) % len(candidates)
                taken.add(port)
                return port
    logger.warning(
        "no free port on %s outside the ephemeral range (%s); taking one the kernel "
        "hands out, which an outgoing connection may take first",
        host,
        EPHEMERAL_RANGE,
    )
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port
    raise OSError(f"no free TCP port on {host}")
