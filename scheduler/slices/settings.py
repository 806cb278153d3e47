"""The slice controller's settings: frozen, built once from the command line
(`flags`)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

DEFAULT_SLICE_CPU = Fraction(1, 2)
"""Cores per slice unless --slice-cpu says otherwise (500 millicores)."""
DEFAULT_SLICE_MEMORY = 1 << 30
"""Bytes per slice unless --slice-memory says otherwise (1Gi)."""


@dataclass(frozen=True, kw_only=True)
class SliceSettings:
    """How namespace quotas are cut into slices and spread over the virtual nodes."""

    cpu: Fraction = DEFAULT_SLICE_CPU
    """Cores per slice (--slice-cpu, millicores or a quantity; default 500m)."""
    memory: int = DEFAULT_SLICE_MEMORY
    """Bytes per slice (--slice-memory, bytes or a quantity; default 1Gi)."""
    headroom: Fraction = Fraction(0)
    """Share of each virtual node's allocatable (0 <= headroom < 1) kept free of slices,
    for lower host failures (--headroom; default 0)."""
    sync_delay: float = 1.0
    """Seconds a change of nodes or bound pods waits before every quota'd namespace is
    looked at again, so a burst of bindings costs one pass (--slice-sync-delay)."""
