"""Command-line helpers shared by tensile's commands: argparse that raises instead of
exiting, Go-style booleans and durations (the flag syntax of tensile-kube's and
virtual-kubelet's pflag flags), addresses, and the logging flags.

Every parse error is a UsageError whose message names the flag; the commands print it on
one line and exit 2.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from vnode.kube import names

LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
LOG_FORMATS = ("text", "json")


class UsageError(Exception):
    """A flag or environment variable has an invalid value; the message says which and why."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UsageError (with argparse's message, which
    names the flag) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def boolean(text: str) -> bool:
    """Return the boolean of `text` as Go's strconv.ParseBool reads flags (1, t, true, yes,
    ... case-insensitively). Raises argparse.ArgumentTypeError otherwise."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "t", "yes", "y"):
        return True
    if lowered in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign
    "\u03bcs": 1e-6,  # Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)", re.ASCII)


def parse_duration(text: str) -> float:
    """Return the seconds of `text`: plain seconds ("90", "1.5") or a Go duration ("90s",
    "1m30s", "4h", "500ms"; units ns, us, ms, s, m, h; Go's time.ParseDuration). Raises
    ValueError for anything else, and for negative or non-finite values."""
    rest = text.strip()
    try:
        if not rest.isascii():
            raise ValueError(rest)  # float() would take other scripts' digits
        seconds = float(rest)
    except ValueError:
        if not rest or _DURATION_PART.sub("", rest):
            raise ValueError(f"not a duration: {text!r} (e.g. 30s, 1m30s, 4h)") from None
        seconds = sum(
            float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(rest)
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a duration: {text!r} (must be finite and >= 0)")
    return seconds


def duration(text: str) -> float:
    """argparse `type=` of a duration flag: seconds, see `parse_duration`. Raises
    argparse.ArgumentTypeError (the parser reports it with the flag's name)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def address(text: str, flag: str) -> str:
    """Return `host:port` for a listen address given as `host:port` or `:port` (all
    interfaces, "0.0.0.0"). Raises UsageError naming `flag`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"{flag} must be host:port or :port, got {text!r}")
    return f"{host or '0.0.0.0'}:{port}"  # noqa: S104 - the operator chose all interfaces


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--log-level` (debug, info, warn, error; default info) and `--log-format`
    (text or json; default text)."""
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS)


def log_level(value: str) -> str:
    """Return the level `serving.logs.configure` takes for a `--log-level` value ("warning"
    is "warn")."""
    return "warn" if value == "warning" else value


def namespaced(
    text: str,
    flag: str,
    *,
    valid: Callable[[str], bool] = names.is_dns1123_subdomain,
    what: str = "an object name (a DNS-1123 subdomain)",
) -> tuple[str, str]:
    """Return (namespace, name) of a NAMESPACE/NAME flag value, both as the apiserver accepts
    them (a DNS-1123 label; `valid` for the name). Raises UsageError naming `flag`."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise UsageError(f"{flag} must be namespace/name, got {text!r}")
    namespace_name(namespace, flag)
    object_name(name, flag, valid=valid, what=what)
    return namespace, name


def namespace_name(text: str, flag: str) -> str:
    """Return `text` if it is a namespace name (a DNS-1123 label). Raises UsageError."""
    if not names.is_dns1123_label(text):
        raise UsageError(f"{flag}: {text!r} is not a namespace name (a DNS-1123 label)")
    return text


def object_name(
    text: str,
    flag: str,
    *,
    valid: Callable[[str], bool] = names.is_dns1123_subdomain,
    what: str = "an object name (a DNS-1123 subdomain)",
) -> str:
    """Return `text` if `valid` accepts it (by default: a DNS-1123 subdomain, the names of
    ConfigMaps, Secrets, Leases). Raises UsageError saying it is not `what`."""
    if not valid(text):
        raise UsageError(f"{flag}: {text!r} is not {what}")
    return text
