"""What every program's start-up shares: the error that stops a start with a message saying
what failed (a busy port, an unreadable file, caches that did not sync in time)."""

from __future__ import annotations


class StartupError(Exception):
    """A program could not start; the message says what failed and, where it can, how to
    fix it. Raised before anything is served, so nothing is half-started."""
