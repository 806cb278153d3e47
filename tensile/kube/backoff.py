"""Backoff and rate-limit arithmetic (pure: time comes in as an argument, nothing sleeps).

Mirrors client-go's `workqueue` rate limiters: per-item exponential backoff combined with an
overall token bucket, and `wait.Backoff`-style jittered delays for reconnects.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ExponentialBackoff:
    """Delay after the n-th consecutive failure: base * 2**n, at most `cap` (seconds)."""

    base: float
    cap: float

    def delay(self, failures: int) -> float:
        """Return the delay in seconds after `failures` consecutive failures (0 -> base)."""
        if failures < 0:
            raise ValueError("failures must be >= 0")
        # Avoid float overflow for very large counts: past 64 doublings we are at the cap.
        return min(self.cap, self.base * math.ldexp(1.0, min(failures, 64)))


def jittered(delay: float, *, factor: float = 0.2, rng: random.Random | None = None) -> float:
    """Return `delay` stretched by a random fraction up to `factor` (spreads reconnect storms)."""
    r = (rng or random).random()
    return delay * (1.0 + factor * r)


class TokenBucket:
    """A token bucket: `rate` tokens per second, at most `burst` saved up.

    `reserve(now)` takes one token and returns how long the caller must wait before using
    it (0 when one is available), like golang.org/x/time/rate's Reserve. Not thread-safe;
    one event loop uses it.
    """

    def __init__(self, *, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"need rate > 0 and burst >= 1, got rate={rate} burst={burst}")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._last: float | None = None

    def reserve(self, now: float) -> float:
        """Take a token at time `now` (seconds, monotonic); return the wait in seconds."""
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate

    def give_back(self) -> None:
        """Return the token of a reservation that will not be used (its caller was
        cancelled while waiting), so an abandoned request does not cost a later one its
        slot (x/time/rate's Reservation.Cancel, without its bookkeeping of later ones)."""
        self._tokens = min(float(self.burst), self._tokens + 1.0)
