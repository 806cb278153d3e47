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
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tensile.contracts import names
from tensile.serving import pflag

LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
LOG_FORMATS = ("text", "json")


class UsageError(Exception):
    """A flag or environment variable has an invalid value; the message says which and why."""


class VersionRequested(Exception):
    """The command line asks for the version (`version` or `--version`): print it, exit 0."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UsageError (with argparse's message, which
    names the flag) instead of printing usage and exiting, and which reads pflag's forms
    (`tensile.serving.pflag`): every boolean flag, however it is declared
    (`action="store_true"`, or `type=boolean`), becomes pflag's optional boolean, and every
    command line is normalized before argparse sees it. It also has `--version`; parsing a
    command line that asks for the version raises VersionRequested. Abbreviations of long
    flags are refused, as pflag refuses them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        self._booleans: set[str] = set()
        self._valued: set[str] = set()
        super().__init__(*args, **kwargs)
        self.add_argument(
            "--version",
            action="store_true",
            help="print the version, commit and Kubernetes version, and exit (also: the "
            "`version` command)",
        )

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        """argparse's add_argument; a boolean flag is made pflag's (see the class). A
        command's own `--version` is the one every Parser has already (so it is not a
        conflict): the command line asking for it raises VersionRequested either way."""
        if "--version" in names and "--version" in self._option_string_actions:
            return self._option_string_actions["--version"]
        if kwargs.get("action") == "store_true" or kwargs.get("type") is boolean:
            kwargs.pop("action", None)
            kwargs.pop("nargs", None)
            kwargs.pop("const", None)
            kwargs.setdefault("default", False)
            kwargs.update(type=boolean, metavar="true|false")
        action = super().add_argument(*names, **kwargs)
        longs = [o for o in action.option_strings if o.startswith("--")]
        if action.type is boolean:
            self._booleans.update(longs)
        elif action.nargs is None and not isinstance(action, argparse._HelpAction):
            self._valued.update(longs)
        return action

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Normalize `args` (pflag's forms), then parse. Raises VersionRequested, UsageError."""
        if args is not None:
            args = pflag.normalize(args, valued=self._valued, booleans=self._booleans)
            if pflag.wants_version(args):
                raise VersionRequested()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def boolean(text: str) -> bool:
    """Return the boolean of `text` as Go's strconv.ParseBool reads flags
    (`pflag.parse_bool`: 1 t T TRUE true True, 0 f F FALSE false False, nothing else).
    Raises argparse.ArgumentTypeError otherwise (argparse names the flag in its message)."""
    try:
        return pflag.parse_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


DEBUG_VERBOSITY = 4
"""klog's --v from which tensile logs at debug (klog's convention: 4 is debug-level)."""
KLOG_IGNORED = (
    "vmodule",
    "log-dir",
    "log-file",
    "log-file-max-size",
    "stderrthreshold",
    "log-backtrace-at",
    "log-flush-frequency",
)
"""klog's valued flags (and component-base's --log-flush-frequency) tensile accepts and
ignores: it logs every level to stderr, unbuffered."""
KLOG_IGNORED_BOOLEANS = ("alsologtostderr", "skip-headers", "skip-log-headers", "add-dir-header")
"""klog's boolean flags tensile accepts and ignores; --logtostderr is honoured (it is what
tensile always does), --logtostderr=false refused."""


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--log-level` (debug, info, warn, error; default info, or debug with --v >= 4)
    and `--log-format` (text or json; default text), and klog's flags (`--v`,
    `--logtostderr`, ... also as `--klog.*`, as node-cli named them): see `logging_choice`."""
    a = parser.add_argument
    a("--log-level", default=None, choices=LOG_LEVELS, help="default info (debug with --v >= 4)")
    a("--log-format", default="text", choices=LOG_FORMATS)
    a(
        "--v",
        type=_verbosity,
        default=0,
        dest="klog_v",
        help=f"klog verbosity (also --klog.v): {DEBUG_VERBOSITY} or more logs at debug when "
        "--log-level is not given",
    )
    a(
        "--logtostderr",
        type=boolean,
        default=True,
        dest="klog_logtostderr",
        help="klog's: tensile always logs to stderr (false is refused)",
    )
    for name in KLOG_IGNORED:
        a(f"--{name}", default=None, dest=_klog_dest(name), help="klog's; accepted and ignored")
    for name in KLOG_IGNORED_BOOLEANS:
        a(f"--{name}", type=boolean, dest=_klog_dest(name), help="klog's; accepted and ignored")


def _klog_dest(name: str) -> str:
    return "klog_" + name.replace("-", "_")


def _verbosity(text: str) -> int:
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise argparse.ArgumentTypeError(
            f"klog verbosity must be a whole number >= 0, got {text!r}"
        )
    return int(text)


@dataclass(frozen=True)
class LoggingChoice:
    """What the logging flags ask for: `level` for `serving.logs.configure`, `format`, and
    `notes`: one sentence per klog flag given that tensile ignores (to be logged at start)."""

    level: str
    format: str
    notes: tuple[str, ...]


def logging_choice(args: argparse.Namespace) -> LoggingChoice:
    """Return the logging `add_logging_flags`' flags ask for: --log-level when given, else
    debug at --v >= 4, else info. Raises UsageError for --logtostderr=false (tensile writes
    no log files)."""
    if not args.klog_logtostderr:
        raise UsageError(
            "--logtostderr=false: tensile writes its log to stderr only (no log files); "
            "drop the flag and collect stderr"
        )
    if args.log_level is not None:
        level = log_level(args.log_level)
    else:
        level = "debug" if args.klog_v >= DEBUG_VERBOSITY else "info"
    notes = [
        f"--{name} is ignored: tensile logs every level to stderr ({level} and above)"
        for name in (*KLOG_IGNORED, *KLOG_IGNORED_BOOLEANS)
        if getattr(args, _klog_dest(name)) not in (None, False)
    ]
    return LoggingChoice(level=level, format=args.log_format, notes=tuple(notes))


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


def server_url(text: str, flag: str) -> str:
    """Return an apiserver URL given to replace a kubeconfig's (`MASTER_URI`, `--master`):
    "" stays "" (none), else `http(s)://host[:port][/path]` without a trailing slash.
    Raises UsageError naming `flag`."""
    value = text.strip()
    if not value:
        return ""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("https", "http") or not parsed.hostname:
        raise UsageError(f"{flag} must be an apiserver URL like https://host:6443, got {text!r}")
    try:
        parsed.port  # noqa: B018 - raises for a port that is no number
    except ValueError:
        raise UsageError(f"{flag}: the port of {text!r} is not a port number") from None
    if parsed.query or parsed.fragment:
        raise UsageError(f"{flag} must be an apiserver URL without ?query or #fragment")
    return value.rstrip("/")
