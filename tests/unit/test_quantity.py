"""Quantities parse exactly and format to strings that parse back to at least the same amount."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tensile.kube.quantity import MAX_EXPONENT, format_quantity, parse_quantity

KI = 1024
MI = KI**2
GI = KI**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # plain and signed numbers
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("007", Fraction(7)),
        ("+3", Fraction(3)),
        ("-3", Fraction(-3)),
        ("-0", Fraction(0)),
        ("123456789012345678901234567890", Fraction(123456789012345678901234567890)),
        # decimals, including the forms with nothing on one side of the point
        ("0.5", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("1.", Fraction(1)),
        ("-.25", Fraction(-1, 4)),
        ("+1.5", Fraction(3, 2)),
        ("0.1", Fraction(1, 10)),
        ("3.14159", Fraction(314159, 100000)),
        # decimal SI suffixes
        ("1n", Fraction(1, 10**9)),
        ("1u", Fraction(1, 10**6)),
        ("250m", Fraction(1, 4)),
        ("1500m", Fraction(3, 2)),
        ("0.5m", Fraction(1, 2000)),
        ("1k", Fraction(1000)),
        ("1M", Fraction(10**6)),
        ("129M", Fraction(129 * 10**6)),
        ("1G", Fraction(10**9)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),
        ("1.5G", Fraction(15 * 10**8)),
        ("1.G", Fraction(10**9)),
        ("-2k", Fraction(-2000)),
        # binary SI suffixes
        ("1Ki", Fraction(KI)),
        ("1Mi", Fraction(MI)),
        ("123Mi", Fraction(128974848)),
        ("1Gi", Fraction(GI)),
        ("1.5Gi", Fraction(1610612736)),
        ("1Ti", Fraction(KI**4)),
        ("1Pi", Fraction(KI**5)),
        ("1Ei", Fraction(KI**6)),
        (".5Ki", Fraction(512)),
        ("0.1Ki", Fraction(512, 5)),
        ("-20Gi", Fraction(-20 * GI)),
        # decimal exponents; "E" with digits is an exponent, without digits exa
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1e+3", Fraction(1000)),
        ("1e-3", Fraction(1, 1000)),
        ("1.5e-3", Fraction(3, 2000)),
        ("129e6", Fraction(129 * 10**6)),
        ("12E0", Fraction(12)),
        ("-1.5E2", Fraction(-150)),
        (".5e1", Fraction(5)),
        ("1e007", Fraction(10**7)),
        (f"1e{MAX_EXPONENT}", Fraction(10**MAX_EXPONENT)),
        (f"1e-{MAX_EXPONENT}", Fraction(1, 10**MAX_EXPONENT)),
    ],
)
def test_parses_valid_quantities_exactly(text: str, expected: Fraction) -> None:
    value = parse_quantity(text)
    assert isinstance(value, Fraction)
    assert value == expected


@pytest.mark.parametrize("spelling", ["129e6", "129M", "129000000", "129000k", "0.129G"])
def test_kubernetes_documented_spellings_of_the_same_amount_agree(spelling: str) -> None:
    assert parse_quantity(spelling) == 129_000_000


def test_accepts_ints_as_hand_written_manifests_hold_them() -> None:
    assert parse_quantity(4) == Fraction(4)
    assert parse_quantity(-2) == Fraction(-2)
    assert parse_quantity(0) == Fraction(0)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        (" ", "whitespace"),
        (" 1", "whitespace"),
        ("1 ", "whitespace"),
        ("1 Gi", "whitespace"),
        ("1\n", "whitespace"),
        ("1\t", "whitespace"),
        ("Ki", "no digits"),
        ("Mi", "no digits"),
        ("m", "no digits"),
        ("k", "no digits"),
        ("-", "no digits"),
        ("+", "no digits"),
        (".", "no digits"),
        ("-.", "no digits"),
        ("e3", "no digits"),
        ("-Ki", "no digits"),
        ("1.2.3", "more than one decimal point"),
        ("1..2", "more than one decimal point"),
        ("1.5.Gi", "more than one decimal point"),
        ("1Kb", "unknown suffix 'Kb'"),
        ("1K", "unknown suffix 'K'"),
        ("1ki", "unknown suffix 'ki'"),
        ("1KI", "unknown suffix 'KI'"),
        ("1mi", "unknown suffix 'mi'"),
        ("1gi", "unknown suffix 'gi'"),
        ("1g", "unknown suffix 'g'"),
        ("1B", "unknown suffix 'B'"),
        ("1e", "unknown suffix 'e'"),
        ("1Gib", "unknown suffix 'Gib'"),
        ("1mm", "unknown suffix 'mm'"),
        ("inf", "no digits"),
        ("nan", "no digits"),
        ("1e3.5", "invalid quantity"),
        ("1e1.5", "invalid quantity"),
        ("1e3Ki", "invalid quantity"),
        ("1Ki3", "invalid quantity"),
        ("1e-", "invalid quantity"),
        ("1e+", "invalid quantity"),
        ("--1", "no digits"),
        ("+-1", "no digits"),
        ("1-", "invalid quantity"),
        ("0x10", "invalid quantity"),
        ("1_000", "invalid quantity"),
        ("1,5", "invalid quantity"),
        ("1/2", "invalid quantity"),
        ("\u0661", "no digits"),  # ARABIC-INDIC DIGIT ONE: a digit to Python, not to Kubernetes
        ("1\u0662", "invalid quantity"),
        ("\uff11", "no digits"),  # FULLWIDTH DIGIT ONE
        ("1e1001", "exponent 1001 is beyond"),
        ("1e-99999999999", "exponent -99999999999 is beyond"),
        ("1" * 1001, "longer than 1000 characters"),
    ],
)
def test_rejects_invalid_quantities_with_a_clear_message(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_quantity(text)


def test_error_message_names_the_input_and_the_expected_form() -> None:
    with pytest.raises(ValueError, match=r"invalid quantity '12XB'.*expected .*Ki Mi Gi"):
        parse_quantity("12XB")


@pytest.mark.parametrize("value", [1.5, 0.0, True, False, None, b"1", Fraction(1), [1]])
def test_rejects_values_that_are_neither_str_nor_int(value: object) -> None:
    with pytest.raises(TypeError, match="must be a str or an int"):
        parse_quantity(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (4, "4"),
        (-4, "-4"),
        (Fraction(4), "4"),
        (10**12, "1000000000000"),
        (Fraction(3, 2), "1500m"),
        (Fraction(1, 4), "250m"),
        (Fraction(1, 1000), "1m"),
        (Fraction(-3, 2), "-1500m"),
        (Fraction(-1, 1000), "-1m"),
        (Fraction(4001, 1000), "4001m"),
        # finer than a milli: round up to the next milli
        (Fraction(1, 10_000), "1m"),
        (Fraction(1, 10**9), "1m"),
        (Fraction(1501, 1_000_000), "2m"),
        (Fraction(1, 3), "334m"),
        (Fraction(9_999, 10_000), "1"),
        # ... towards +infinity for negatives, so the result never falls below the input
        (Fraction(-1, 10_000), "0"),
        (Fraction(-15_001, 10_000), "-1500m"),
    ],
)
def test_formats_cpu_like_values(value: Fraction | int, expected: str) -> None:
    assert format_quantity(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (1, "1"),
        (1000, "1000"),
        (1023, "1023"),
        (1536, "1536"),
        (10**9, "1000000000"),
        (KI, "1Ki"),
        (3 * KI, "3Ki"),
        (1025 * KI, "1025Ki"),
        (MI, "1Mi"),
        (1536 * MI, "1536Mi"),
        (GI, "1Gi"),
        (20 * GI, "20Gi"),
        (KI**4, "1Ti"),
        (KI**5, "1Pi"),
        (KI**6, "1Ei"),
        (KI**7, "1024Ei"),
        (-KI, "-1Ki"),
        (-20 * GI, "-20Gi"),
        (-1000, "-1000"),
        (Fraction(GI), "1Gi"),
        # fractional bytes round up to the next byte
        (Fraction(1, 2), "1"),
        (Fraction(1, 10**9), "1"),
        (Fraction(2 * KI - 1, 2), "1Ki"),
        (Fraction(-1, 2), "0"),
        (Fraction(-3, 2), "-1"),
    ],
)
def test_formats_memory_like_values(value: Fraction | int, expected: str) -> None:
    assert format_quantity(value, binary=True) == expected


@pytest.mark.parametrize("value", [1.5, 0.5, True, "1", None])
def test_format_rejects_values_that_are_not_fractions_or_ints(value: object) -> None:
    with pytest.raises(TypeError, match="must be a Fraction or an int"):
        format_quantity(value)  # type: ignore[arg-type]


def test_format_does_not_change_its_input() -> None:
    value = Fraction(3, 2)
    format_quantity(value)
    format_quantity(value, binary=True)
    assert value == Fraction(3, 2)


# --- properties -------------------------------------------------------------------------

_CANONICAL_CPU = re.compile(r"-?(0|[1-9][0-9]*)|-?[1-9][0-9]*m")
_CANONICAL_BYTES = re.compile(r"-?(0|[1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei)?")

amounts = st.one_of(
    st.fractions(),
    st.fractions(max_denominator=1000),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: Fraction(n, 1000)),
    st.integers(min_value=-64, max_value=64).map(lambda n: Fraction(n) * KI**3),
)


@given(amounts)
@example(Fraction(1, 10_000))
@example(Fraction(-1, 10_000))
@example(Fraction(9_999, 10_000))
def test_cpu_format_round_trips_to_at_least_the_value(value: Fraction | int) -> None:
    text = format_quantity(value)
    assert _CANONICAL_CPU.fullmatch(text), text
    back = parse_quantity(text)
    assert value <= back < value + Fraction(1, 1000)
    if Fraction(value * 1000).denominator == 1:
        assert back == value


@given(amounts)
@example(Fraction(1, 2))
@example(Fraction(-1, 2))
def test_memory_format_round_trips_to_at_least_the_value(value: Fraction | int) -> None:
    text = format_quantity(value, binary=True)
    assert _CANONICAL_BYTES.fullmatch(text), text
    back = parse_quantity(text)
    assert value <= back < value + 1
    if Fraction(value).denominator == 1:
        assert back == value


@given(amounts, st.booleans())
def test_format_is_idempotent_through_parse(value: Fraction | int, binary: bool) -> None:
    text = format_quantity(value, binary=binary)
    assert format_quantity(parse_quantity(text), binary=binary) == text


@given(amounts)
def test_negative_values_keep_their_sign(value: Fraction | int) -> None:
    for binary in (False, True):
        back = parse_quantity(format_quantity(value, binary=binary))
        if back < 0:
            assert format_quantity(value, binary=binary).startswith("-")
        # Only amounts finer than the unit may lose their sign (they become zero).
        if value <= -1:
            assert back < 0


_SCALES: dict[str, Fraction] = {
    "n": Fraction(1, 1_000_000_000),
    "u": Fraction(1, 1_000_000),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(1000),
    "M": Fraction(1_000_000),
    "G": Fraction(1_000_000_000),
    "T": Fraction(1_000_000_000_000),
    "P": Fraction(1_000_000_000_000_000),
    "E": Fraction(1_000_000_000_000_000_000),
    "Ki": Fraction(1024),
    "Mi": Fraction(1024 * 1024),
    "Gi": Fraction(1024 * 1024 * 1024),
    "Ti": Fraction(1024 * 1024 * 1024 * 1024),
    "Pi": Fraction(1024 * 1024 * 1024 * 1024 * 1024),
    "Ei": Fraction(1024 * 1024 * 1024 * 1024 * 1024 * 1024),
}

_digits = st.text(alphabet="0123456789", max_size=12)


@st.composite
def mantissas(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(_digits)
    point = draw(st.booleans())
    fraction = draw(_digits) if point else ""
    if not (whole or fraction):
        whole = "0"
    return sign + whole + ("." + fraction if point else "")


@given(mantissas(), st.sampled_from(sorted(_SCALES)))
def test_parse_agrees_with_fraction_for_suffixed_numbers(mantissa: str, suffix: str) -> None:
    # Fraction's own string parser reads the number part; the table above scales it.
    assert parse_quantity(mantissa + suffix) == Fraction(mantissa) * _SCALES[suffix]


@given(
    mantissas(),
    st.sampled_from(["e", "E"]),
    st.sampled_from(["", "+", "-"]),
    st.integers(min_value=0, max_value=40),
)
def test_parse_agrees_with_fraction_for_exponents(
    mantissa: str, letter: str, sign: str, exponent: int
) -> None:
    text = f"{mantissa}{letter}{sign}{exponent}"
    assert parse_quantity(text) == Fraction(f"{mantissa}e{sign}{exponent}")


def _outcome(text: str) -> Fraction | str:
    """The parsed value, or the message of the ValueError raised (any other error escapes)."""
    try:
        return parse_quantity(text)
    except ValueError as error:
        return str(error)


@given(st.text(max_size=20))
@example("1e99999999999999999999")
def test_arbitrary_text_either_parses_or_raises_value_error(text: str) -> None:
    outcome = _outcome(text)
    assert isinstance(outcome, Fraction) or outcome.startswith("invalid quantity")


@given(st.text(alphabet="0123456789.+-eEinumkKMGTP", max_size=12))
def test_quantity_alphabet_either_parses_or_raises_value_error(text: str) -> None:
    outcome = _outcome(text)
    assert isinstance(outcome, Fraction) or outcome.startswith("invalid quantity")
