"""A private network for the local fleet: a network namespace of its own whose loopback
also carries the RFC 5737 documentation block 192.0.2.0/24 (TEST-NET-1, never routed).

Why: kube-apiserver refuses to proxy to a node, a pod or an aggregated API whose address is
loopback or link-local ("address not allowed"), so on 127.0.0.1 alone `kubectl top`,
`kubectl get --raw /api/v1/nodes/<node>/proxy/...` and metrics-server cannot work. Inside
the namespace, nodes publish 192.0.2.x addresses that are just as local as 127.0.0.1, and
the namespace has no other interface: nothing that runs in it can reach, or be reached
from, any other network.

Namespaces are a property of each thread (unshare(2), setns(2)), inherited by the threads
and processes it creates: a process enters the private network before it starts any
thread, and everything it starts afterwards is inside. Creating or joining one needs
CAP_SYS_ADMIN (root); without it the fleet runs on the host's loopback (`HOST`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
"""unshare(2) / setns(2) flag of network namespaces (linux/sched.h)."""
DOCUMENTATION_BLOCK = ipaddress.ip_network("192.0.2.0/24")
"""RFC 5737 TEST-NET-1: for documentation, never routed on any network."""
NODE_ADDRESS = "192.0.2.1"
"""The address every kwok node and local virtual node publishes in a private network."""
LOOPBACK = "127.0.0.1"


class NetworkError(RuntimeError):
    """The private network could not be created or joined; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Network:
    """Where the fleet's components listen and what addresses its nodes publish."""

    private: bool
    """True inside a private namespace with the documentation block on its loopback."""
    node_ip: str
    """The InternalIP kwok nodes and local virtual nodes publish (and listen on)."""

    def host_address(self, index: int) -> str:
        """Return an address of its own for the `index`-th upper cluster's host node (from
        0), where pods with hostNetwork (a deployed virtual node on port 10250) listen.
        On the host's loopback every index shares 127.0.0.1."""
        if not self.private:
            return LOOPBACK
        return str(DOCUMENTATION_BLOCK.network_address + 11 + index)


HOST = Network(private=False, node_ip=LOOPBACK)
PRIVATE = Network(private=True, node_ip=NODE_ADDRESS)

_current = HOST
_host_namespace: int | None = None
"""A descriptor of the network namespace the process started in (for builds that need the
Go module proxy), kept once the process moved to a private one."""


def current() -> Network:
    """Return the network this process is in (HOST until it entered or joined a private one)."""
    return _current


def unavailable_reason() -> str | None:
    """Return why this process cannot create a private network here, or None if it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces exist only on Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    return None


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise NetworkError(f"{what} failed: {os.strerror(errno)} (errno {errno})")


def _single_threaded(what: str) -> None:
    if threading.active_count() > 1:
        # Threads started before stay in the old namespace and so would their children.
        names = ", ".join(sorted(t.name for t in threading.enumerate()))
        raise NetworkError(
            f"{what} must happen before the process starts threads (running: {names})"
        )


def enter_private() -> Network:
    """Move this process into a new private network and return it (idempotent).

    The new namespace's loopback is brought up and given DOCUMENTATION_BLOCK, so every
    192.0.2.x address is local. Raises NetworkError when it is not possible (not root,
    not Linux, threads already running, or the kernel refused).
    """
    global _current, _host_namespace  # noqa: PLW0603 - one process-wide fact
    if _current.private:
        return _current
    reason = unavailable_reason()
    if reason is not None:
        raise NetworkError(reason)
    _single_threaded("entering a private network")
    host = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        _configure_loopback()
    except BaseException:
        with contextlib.suppress(OSError):
            _libc().setns(host, CLONE_NEWNET)
        os.close(host)
        raise
    _host_namespace = host
    _current = PRIVATE
    logger.info("entered a private network namespace; nodes publish %s", PRIVATE.node_ip)
    return _current


def join(pid: int, *, network: Network) -> Network:
    """Move this process into the network namespace of process `pid` (a running component
    of a fleet whose network is `network`) and return `network`.

    Nothing happens if this process is there already. Raises NetworkError if `pid` is gone,
    permission is lacking, or threads are running.
    """
    global _current  # noqa: PLW0603 - one process-wide fact
    if namespace_id(pid) == namespace_id(os.getpid()):
        _current = network
        return network
    _single_threaded("joining a fleet's network")
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetworkError(f"cannot open the network namespace of process {pid}: {exc}") from exc
    try:
        _check(_libc().setns(fd, CLONE_NEWNET), f"setns into the network of process {pid}")
    finally:
        os.close(fd)
    _current = network
    return network


def namespace_id(pid: int) -> int | None:
    """Return the inode number identifying the network namespace of `pid`, or None if gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def in_host_network() -> Callable[[], None] | None:
    """Return a `preexec_fn` that moves a child process back to the namespace this process
    started in (for a build that downloads from the Go module proxy), or None when this
    process never left it."""
    host = _host_namespace
    if host is None:
        return None
    setns = _libc().setns

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        if setns(host, CLONE_NEWNET) != 0:
            os._exit(1)

    return preexec


def _configure_loopback() -> None:
    """Bring `lo` up and add the documentation block to it (netlink, via pyroute2)."""
    try:
        from pyroute2 import IPRoute  # noqa: PLC0415 - Linux-only, needed only here
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise NetworkError(
            "pyroute2 is missing: install the test extra (pip install -e '.[test]')"
        ) from exc
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=index, state="up")
        ipr.addr(
            "add",
            index=index,
            address=str(DOCUMENTATION_BLOCK.network_address + 1),
            prefixlen=DOCUMENTATION_BLOCK.prefixlen,
        )


def describe(network: Network) -> str:
    """Return one line saying where the fleet's nodes are, for people."""
    if network.private:
        return (
            f"private network namespace: nodes publish {network.node_ip} "
            f"({DOCUMENTATION_BLOCK}, RFC 5737), nothing leaves the machine"
        )
    return "host loopback only: the apiservers' node proxy and metrics-server cannot work"
