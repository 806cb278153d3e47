"""Listening sockets claimed before they serve."""

from __future__ import annotations

import socket


def bound_socket(host: str, port: int) -> socket.socket:
    """Return a TCP socket bound to `host`:`port` ("" for every address) but not listening.

    Binding first claims the port and reports a busy one (EADDRINUSE) at once; listening
    starts when the socket is served (aiohttp `web.SockSite`), so until then a client is
    refused at once instead of waiting in the accept queue for a TLS handshake that may
    come hours later (a certificate from a CSR may wait for a human). SO_REUSEADDR as
    asyncio sets it: a restart does not wait out the last run's TIME_WAIT connections.
    Raises OSError (EADDRINUSE, EADDRNOTAVAIL, EACCES...)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock
