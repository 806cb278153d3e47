"""The slice controller's flags (`add_slice_flags`) and their reading into `SliceSettings`
(`slice_settings`), for the `tensile-scheduler` command line."""

from __future__ import annotations

import argparse
import math
import re
from fractions import Fraction

from scheduler.slices.settings import DEFAULT_SLICE_CPU, DEFAULT_SLICE_MEMORY, SliceSettings
from tensile.kube.quantity import format_quantity, parse_quantity
from tensile.serving import flags
from tensile.serving.flags import UsageError

_INTEGER = re.compile(r"[0-9]+", re.ASCII)
MAX_SLICE_MEMORY = 1 << 50
"""Largest --slice-memory (1Pi): beyond any node."""
MAX_SLICE_CPU = Fraction(1 << 20)
"""Largest --slice-cpu (cores): beyond any node."""


def add_slice_flags(parser: argparse.ArgumentParser, *, headroom: bool = True) -> None:
    """Add --slice-cpu, --slice-memory, --slice-sync-delay and (with `headroom`) --headroom
    to `parser`. `headroom=False`: the command has a --headroom of its own (the extender's,
    the same share of each lower cluster kept free), which `slice_settings` then reads."""
    a = parser.add_argument
    a(
        "--slice-cpu",
        default=f"{DEFAULT_SLICE_CPU * 1000}",
        help="cpu of one quota slice: millicores, or a Kubernetes quantity with a unit or a "
        f"decimal point (500m, 0.5, 2.0) (default {format_quantity(DEFAULT_SLICE_CPU)})",
    )
    a(
        "--slice-memory",
        default=str(DEFAULT_SLICE_MEMORY),
        help="memory of one quota slice: bytes, or a Kubernetes quantity (512Mi, 1Gi) "
        f"(default {format_quantity(DEFAULT_SLICE_MEMORY, binary=True)})",
    )
    if headroom:
        a(
            "--headroom",
            default="0",
            help="share of each virtual node's allocatable kept free of slices, for lower "
            "host failures: 0 <= x < 1, or a percentage (0.1, 10%%) (default 0)",
        )
    a(
        "--slice-sync-delay",
        type=flags.duration,
        default=1.0,
        help="how long a change of virtual nodes or bound pods waits before the quota'd "
        "namespaces are looked at again (default 1s)",
    )


def slice_settings(args: argparse.Namespace) -> SliceSettings:
    """Read the flags of `add_slice_flags` from parsed `args`. Raises UsageError naming the
    flag: not a quantity, not above 0, too large, a headroom outside [0, 1)."""
    cpu = _amount(args.slice_cpu, "--slice-cpu", bare=Fraction(1, 1000))
    if cpu > MAX_SLICE_CPU or cpu * 1000 != math.floor(cpu * 1000):
        raise UsageError(
            f"--slice-cpu must be a whole number of millicores up to "
            f"{format_quantity(MAX_SLICE_CPU)}, got {args.slice_cpu}"
        )
    memory = _amount(args.slice_memory, "--slice-memory", bare=Fraction(1))
    if memory > MAX_SLICE_MEMORY or memory.denominator != 1:
        raise UsageError(
            f"--slice-memory must be a whole number of bytes up to 1Pi, got {args.slice_memory}"
        )
    text = str(getattr(args, "headroom", "0")).strip()
    try:
        headroom = Fraction(text[:-1]) / 100 if text.endswith("%") else Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise UsageError(
            f"--headroom must be a number (0.1) or a percentage (10%), got {args.headroom}"
        ) from None
    if not 0 <= headroom < 1:
        raise UsageError(f"--headroom must be at least 0 and below 1 (100%), got {args.headroom}")
    if args.slice_sync_delay < 0:
        raise UsageError("--slice-sync-delay must be >= 0")
    return SliceSettings(
        cpu=cpu, memory=int(memory), headroom=headroom, sync_delay=args.slice_sync_delay
    )


def _amount(text: str, flag: str, *, bare: Fraction) -> Fraction:
    """A bare integer in the flag's unit (`bare` of the quantity's), else a quantity."""
    text = str(text).strip()
    try:
        value = int(text) * bare if _INTEGER.fullmatch(text) else parse_quantity(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if value <= 0:
        raise UsageError(f"{flag} must be greater than 0, got {text}")
    return value
