"""The flag helpers every command shares (`tensile.serving.flags`)."""

from __future__ import annotations

import argparse

import pytest

from tensile.serving import flags


@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[(word, True) for word in ("1", "t", "T", "TRUE", "true", "True")],
        *[(word, False) for word in ("0", "f", "F", "FALSE", "false", "False")],
    ],
)
def test_booleans_read_like_go_flags(text: str, value: bool) -> None:
    assert flags.boolean(text) is value


@pytest.mark.parametrize("text", ["maybe", "yes", "y", "no", "n", "tRUE", "fALSE", " true", ""])
def test_a_word_go_refuses_is_refused_naming_the_value(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"not a boolean: {text!r}"):
        flags.boolean(text)


@pytest.mark.parametrize(
    ("text", "address"),
    [(":8080", "0.0.0.0:8080"), ("127.0.0.1:0", "127.0.0.1:0"), ("[::1]:9", "[::1]:9")],
)
def test_addresses(text: str, address: str) -> None:
    assert flags.address(text, "--metrics-addr") == address


@pytest.mark.parametrize("text", ["8080", "host:", "host:port", ":70000", ""])
def test_bad_addresses_name_the_flag(text: str) -> None:
    with pytest.raises(flags.UsageError, match="--metrics-addr must be host:port or :port"):
        flags.address(text, "--metrics-addr")


def test_parser_errors_are_usage_errors_naming_the_flag() -> None:
    parser = flags.Parser(prog="x")
    parser.add_argument("--timeout", type=flags.duration, default=1.0)
    flags.add_logging_flags(parser)
    args = parser.parse_args(["--timeout=1m30s", "--log-level=warning", "--log-format=json"])
    assert (args.timeout, flags.log_level(args.log_level), args.log_format) == (
        90.0,
        "warn",
        "json",
    )
    with pytest.raises(flags.UsageError, match="argument --timeout: not a duration: 'soon'"):
        parser.parse_args(["--timeout=soon"])
    with pytest.raises(flags.UsageError, match="argument --log-level: invalid choice"):
        parser.parse_args(["--log-level=loud"])
