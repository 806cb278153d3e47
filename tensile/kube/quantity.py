"""Kubernetes resource quantities (`resource.Quantity`) as exact fractions.

This module only converts between the strings the API uses for amounts of cpu, memory,
storage, hugepages and extended resources and `fractions.Fraction` values, so that the
arithmetic done on them elsewhere (sums, differences, maxima) is exact. It mirrors
`k8s.io/apimachinery/pkg/api/resource`. Pure functions only.

Grammar accepted by `parse_quantity` (the apiserver's, minus its degenerate corners)::

    quantity  = [sign] number [suffix]
    sign      = "+" | "-"
    number    = digits | digits "." [digits] | "." digits
    suffix    = binary | decimal | exponent
    binary    = "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"              (powers of 1024)
    decimal   = "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"  (powers of 1000)
    exponent  = ("e" | "E") [sign] digits                            (powers of 10)

"E" alone is exa (10**18), as in Kubernetes; "E" followed by digits is an exponent.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import Final

_DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
"""Decimal SI suffix -> power of ten."""

_BINARY_SUFFIXES: Final[dict[str, int]] = {
    "Ki": 10,
    "Mi": 20,
    "Gi": 30,
    "Ti": 40,
    "Pi": 50,
    "Ei": 60,
}
"""Binary SI suffix -> power of two."""

# Largest first, so formatting picks the biggest suffix that divides exactly.
_BINARY_BY_SIZE: Final[tuple[tuple[str, int], ...]] = tuple(
    sorted(((suffix, 1 << bits) for suffix, bits in _BINARY_SUFFIXES.items()), key=lambda s: -s[1])
)

# Bounds the apiserver does not have. No real resource amount comes near them, and without
# them a short string such as "1e999999999" would make us build an integer of a billion
# digits (and Python refuses to parse integers of more than 4300 digits anyway).
MAX_EXPONENT: Final = 1000
"""Largest accepted magnitude of a decimal exponent (`1e1000`, `1e-1000`)."""
MAX_LENGTH: Final = 1000
"""Longest accepted quantity string, in characters."""

# [0-9] rather than \d: \d also matches non-ASCII digits, which Kubernetes rejects.
_QUANTITY: Final = re.compile(
    r"""
    (?P<sign>[+-]?)
    (?P<whole>[0-9]*)
    (?:\.(?P<fraction>[0-9]*))?
    (?:
        [eE](?P<exponent>[+-]?[0-9]+)
      | (?P<suffix>[KMGTPE]i|[numkMGTPE])
    )?
    """,
    re.VERBOSE | re.ASCII,
)
_LEADING_NUMBER: Final = re.compile(r"[+-]?[0-9]*(?:\.[0-9]*)?", re.ASCII)

_SYNTAX_HINT: Final = (
    "expected [+|-]digits[.digits][suffix] with suffix one of "
    "n u m k M G T P E Ki Mi Gi Ti Pi Ei or e<exponent>, e.g. 500m, 1.5, 2Gi, 1e3"
)


def parse_quantity(text: str | int) -> Fraction:
    """Return the exact value of a Kubernetes quantity such as "500m", "1.5Gi" or "1e3".

    Units are those of the resource (cores for cpu, bytes for memory, counts for the rest);
    the suffix only scales the number. Mirrors `resource.ParseQuantity`, with these
    deliberate differences:

    - A quantity with no digits ("", "-", ".", "Ki", "m") is refused, where the apiserver
      reads the last four as zero; it never sends them (it serialises canonical forms),
      so in a manifest they are typos.
    - Surrounding whitespace is refused rather than trimmed.
    - Strings longer than `MAX_LENGTH` and exponents beyond `MAX_EXPONENT` are refused.

    An `int` (as a hand-written manifest may hold) is taken as that many units.

    Raises:
        ValueError: `text` is not a valid quantity; the message says why.
        TypeError: `text` is neither `str` nor `int`. `float` and `bool` are refused
            because a float is not exact and a bool is never meant as a number.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise TypeError(f"quantity must be a str or an int, not {type(text).__name__}")
    if isinstance(text, int):
        return Fraction(text)
    return _parse_text(text)


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    # Cached: a cluster's pods repeat a few dozen quantities ("100m", "128Mi"), and every
    # watch event of a lower pod sums its requests again (the capacity ledger). A Fraction
    # is immutable; a refusal raises, and is not cached.
    match = _QUANTITY.fullmatch(text) if len(text) <= MAX_LENGTH else None
    if match is None or not (match["whole"] or match["fraction"]):
        raise ValueError(_explain(text))
    digits = match["whole"] + (match["fraction"] or "")
    value = Fraction(int(digits), 10 ** len(match["fraction"] or ""))
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(
                f"invalid quantity {text!r}: exponent {exponent} is beyond ±{MAX_EXPONENT}"
            )
        value *= Fraction(10) ** exponent
    elif match["suffix"] in _BINARY_SUFFIXES:
        value *= 1 << _BINARY_SUFFIXES[match["suffix"]]
    else:
        value *= Fraction(10) ** _DECIMAL_SUFFIXES[match["suffix"] or ""]
    return -value if match["sign"] == "-" else value


def _explain(text: str) -> str:
    """Say why `text`, which failed to parse, is not a quantity."""
    if len(text) > MAX_LENGTH:
        return f"invalid quantity {text[:40]!r}...: longer than {MAX_LENGTH} characters"
    number = _LEADING_NUMBER.match(text)  # never None: the pattern matches ""
    head = number[0] if number else ""
    rest = text[len(head) :]
    if not text:
        reason = "it is empty; "
    elif any(ch.isspace() for ch in text):
        reason = "it contains whitespace; "
    elif text.count(".") > 1:
        reason = "more than one decimal point; "
    elif not any(ch in "0123456789" for ch in head):
        reason = "no digits before the suffix; "
    elif rest and not any(ch in ".+-" or ch.isdigit() for ch in rest):
        reason = f"unknown suffix {rest!r}; "
    else:
        reason = ""
    return f"invalid quantity {text!r}: {reason}{_SYNTAX_HINT}"


def format_quantity(value: Fraction | int, *, binary: bool = False) -> str:
    """Return a quantity string for `value` that the apiserver accepts and people can read.

    `value` is in the resource's units (cores, bytes, counts).

    - `binary=False` (cpu-like): whole numbers plainly ("4"), anything else in millis
      ("1500m", "250m"). Amounts finer than a milli are rounded up to the next milli, as
      Kubernetes does when it canonicalises a quantity to milli scale ("0.1m" -> "1m").
    - `binary=True` (memory-like): a whole number of bytes with the largest binary suffix
      that divides it exactly ("1536Mi", "1Gi"), else plain bytes ("1000"); fractional
      bytes are rounded up to the next byte.

    Rounding is always towards +infinity, so `parse_quantity(format_quantity(x)) >= x`
    for every `x`, with equality whenever `x` is a whole number of millis (cpu-like) or
    of bytes (memory-like). Negative values keep their "-". For negative amounts this is
    where we differ from Kubernetes, which rounds away from zero: we round a negative
    amount finer than the unit towards zero (so -0.0001 becomes "0"), keeping the
    guarantee above in one direction for all inputs.

    Raises:
        TypeError: `value` is not a `Fraction` or an `int` (floats and bools are refused).
    """
    if isinstance(value, bool) or not isinstance(value, (Fraction, int)):
        raise TypeError(f"quantity value must be a Fraction or an int, not {type(value).__name__}")
    if binary:
        return _format_bytes(math.ceil(value))
    if value.denominator == 1:
        return str(value.numerator)
    millis = math.ceil(value * 1000)
    # Rounding up can land on a whole number (0.9999 -> 1000m), which reads better plainly.
    if millis % 1000 == 0:
        return str(millis // 1000)
    return f"{millis}m"


def _format_bytes(count: int) -> str:
    """Write a whole number of bytes with the largest binary suffix dividing it exactly."""
    if count == 0:
        return "0"
    for suffix, size in _BINARY_BY_SIZE:
        if count % size == 0:
            return f"{count // size}{suffix}"
    return str(count)
