"""OpenTelemetry tracing for a program: virtual-kubelet's flags (--trace-exporter,
--trace-sample-rate, --trace-service-name, --trace-tag), their settings, and the `Tracing`
a program hands to its parts.

Off by default, and then free: `start` returns `NO_TRACING`, whose methods do nothing, and
nothing of OpenTelemetry is imported (its SDK and exporter cost half a second of start-up
and memory no one asked for). With `--trace-exporter otlp`, `start` imports
`tensile.serving.otel`, which runs the OpenTelemetry SDK with its OTLP/HTTP exporter; the
SDK reads the standard environment variables itself (OTEL_EXPORTER_OTLP_ENDPOINT and
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _HEADERS, _TIMEOUT, _CERTIFICATE, _COMPRESSION,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and _ARG, OTEL_BSP_*,
OTEL_SDK_DISABLED), as the OpenTelemetry specification's "SDK environment variables" page
lists them.

virtual-kubelet's semantics (cmd/virtual-kubelet/internal/commands/root/tracing.go):
--trace-exporter names exporters (repeatable, comma-separated), --trace-sample-rate is
"always", "never" or a percentage from 0 to 100, --trace-service-name the service's name,
--trace-tag key=value pairs for every span (here: resource attributes). Its OpenCensus
exporters (jaeger, ocagent, zpages) are refused with a message: an OpenTelemetry Collector
receives OTLP and exports to those back ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from tensile.serving.flags import UsageError

logger = logging.getLogger(__name__)

EXPORTERS = ("otlp",)
"""What --trace-exporter may name."""
OPENCENSUS_EXPORTERS = ("jaeger", "ocagent", "zpages")
"""virtual-kubelet's exporters, which OpenCensus provided; refused with a message."""
OTLP_PROTOCOL = "http/protobuf"
"""The only OTLP transport shipped (OTEL_EXPORTER_OTLP_PROTOCOL's value for it): the HTTP
exporter needs protobuf and requests only; the gRPC one would bring grpcio's native library
into every install."""
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
RESERVED_TAGS = ("service.name",)
"""Resource attributes --trace-tag may not set (--trace-service-name sets the name)."""
FLUSH_TIMEOUT = 5.0
"""Seconds a stopping program waits for its last spans to be sent."""


@dataclass(frozen=True, kw_only=True)
class TraceSettings:
    """The tracing flags, checked. Off unless `exporter` is set."""

    exporter: str = ""
    """--trace-exporter: "otlp", or "" (no tracing)."""
    sample_rate: float | None = None
    """--trace-sample-rate as a probability from 0 to 1 that a trace is kept (decided once,
    at its root, for all its spans); None: the SDK's sampler from OTEL_TRACES_SAMPLER (by
    default every trace)."""
    service_name: str = ""
    """--trace-service-name ("": OTEL_SERVICE_NAME, else the program's name)."""
    tags: tuple[tuple[str, str], ...] = ()
    """--trace-tag pairs, resource attributes of every span (beside OTEL_RESOURCE_ATTRIBUTES,
    which they override)."""

    @property
    def enabled(self) -> bool:
        """Whether spans are made and exported."""
        return bool(self.exporter)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add virtual-kubelet's four tracing flags to `parser` (see the module docstring)."""
    a = parser.add_argument
    a(
        "--trace-exporter",
        action="append",
        default=[],
        help="send traces of each pod's path with this exporter (virtual-kubelet's flag; "
        "repeatable, comma-separated): otlp, OTLP over HTTP/protobuf to "
        "OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318) and the other standard "
        "OTEL_* variables (env OTEL_TRACES_EXPORTER; default none: no tracing, no cost)",
    )
    a(
        "--trace-sample-rate",
        default="",
        help="which pods' paths are traced: always, never, or a percentage from 0 to 100 "
        "(virtual-kubelet's values); default: OTEL_TRACES_SAMPLER, else every pod",
    )
    a(
        "--trace-service-name",
        default="",
        help="service.name of the spans (default: OTEL_SERVICE_NAME, else the program's name)",
    )
    a(
        "--trace-tag",
        action="append",
        default=[],
        help="key=value added to every span's resource (repeatable, comma-separated)",
    )


def settings_of(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[TraceSettings, tuple[str, ...]]:
    """Return the settings of `add_flags`'s flags (--trace-exporter defaults to
    OTEL_TRACES_EXPORTER from `env`) and one sentence per tracing flag given that does
    nothing without an exporter. Raises UsageError naming the flag or variable: an
    exporter that is not shipped, a sample rate that is none of virtual-kubelet's, a tag
    that is no key=value, an OTLP protocol other than http/protobuf."""
    given: Sequence[str] = args.trace_exporter
    source = "--trace-exporter"
    if not given and env.get("OTEL_TRACES_EXPORTER"):
        given, source = [env["OTEL_TRACES_EXPORTER"]], "OTEL_TRACES_EXPORTER"
    exporter = exporter_of(given, source=source)
    rate = sample_rate(args.trace_sample_rate)
    tags = tags_of(args.trace_tag)
    service = args.trace_service_name.strip()
    if args.trace_service_name and not service:
        raise UsageError("--trace-service-name must not be blank")
    notes: tuple[str, ...] = ()
    if exporter:
        check_protocol(env)
    else:
        idle = [
            flag
            for flag, value in (
                ("--trace-sample-rate", args.trace_sample_rate),
                ("--trace-service-name", args.trace_service_name),
                ("--trace-tag", args.trace_tag),
            )
            if value
        ]
        if idle:
            notes = (f"{', '.join(idle)} do nothing without --trace-exporter: no tracing",)
    settings = TraceSettings(exporter=exporter, sample_rate=rate, service_name=service, tags=tags)
    return settings, notes


def exporter_of(values: Sequence[str], *, source: str = "--trace-exporter") -> str:
    """Return the exporter `values` (occurrences of comma-separated names) choose: "otlp" or
    "" ("none", or nothing). Raises UsageError naming `source` for any other name."""
    names = list(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))
    if names == ["none"]:
        return ""
    for name in names:
        if name in OPENCENSUS_EXPORTERS:
            raise UsageError(
                f"{source}: {name} was one of virtual-kubelet's OpenCensus exporters, which "
                "tensile does not ship; use otlp and an OpenTelemetry Collector, which "
                f"exports to {name} and other back ends"
            )
        if name not in EXPORTERS:
            raise UsageError(
                f"{source}: unknown exporter {name!r} (available: {', '.join(EXPORTERS)})"
            )
    return names[0] if names else ""


def sample_rate(text: str) -> float | None:
    """--trace-sample-rate -> a probability from 0 to 1, or None for "" (the SDK's sampler).
    "always" is 1, "never" 0, a number a percentage (virtual-kubelet's whole numbers, and
    fractions such as 0.5 for one pod in 200). Raises UsageError otherwise."""
    value = text.strip().lower()
    if not value:
        return None
    if value == "always":
        return 1.0
    if value == "never":
        return 0.0
    try:
        percent = float(value)
    except ValueError:
        percent = math.nan
    if not 0 <= percent <= 100:  # also refuses nan
        raise UsageError(
            f"--trace-sample-rate must be always, never or a percentage from 0 to 100, got {text!r}"
        )
    return percent / 100


def tags_of(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """--trace-tag occurrences ("key=value", comma-separated) -> pairs, in order. Raises
    UsageError for an item without "=" or with an empty key, a key given twice, or a
    reserved key (`RESERVED_TAGS`)."""
    tags: dict[str, str] = {}
    for item in (i.strip() for v in values for i in v.split(",")):
        if not item:
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise UsageError(f"--trace-tag: expected key=value, got {item!r}")
        if key in RESERVED_TAGS:
            raise UsageError(f"--trace-tag: {key} is set by --trace-service-name")
        if key in tags:
            raise UsageError(f"--trace-tag: {key} is given twice")
        tags[key] = value
    return tuple(tags.items())


def check_protocol(env: Mapping[str, str]) -> None:
    """Raise UsageError when OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or, without it,
    OTEL_EXPORTER_OTLP_PROTOCOL) asks for a transport other than http/protobuf."""
    for variable in _PROTOCOL_VARIABLES:
        value = env.get(variable, "").strip()
        if value:
            if value != OTLP_PROTOCOL:
                raise UsageError(
                    f"{variable}={value}: only {OTLP_PROTOCOL} is shipped (an OpenTelemetry "
                    "Collector takes it on port 4318 and forwards over gRPC)"
                )
            return


ContextManager = contextlib.AbstractContextManager[object]
Attributes = Mapping[str, str | int | bool]
"""Span attributes (OpenTelemetry's value types that tensile uses)."""


class Tracing:
    """What a program's parts trace with. This class is the no-op (`NO_TRACING`): no span,
    no context; `tensile.serving.otel.OtelTracing` is the real one."""

    enabled = False
    """Whether spans are made."""

    def step(self, name: str, attributes: Attributes | None = None) -> ContextManager:
        """A span `name` for the block, child of the current span, when there is a current
        span that records (a traced pod's path); otherwise nothing. The no-op: nothing."""
        del name, attributes
        return contextlib.nullcontext()

    def traceparent(self) -> str | None:
        """The W3C traceparent of the current span (that records), or None. The no-op: None."""
        return None

    def close(self) -> None:
        """Send what is left and stop (blocking: see `running`). The no-op: nothing."""


NO_TRACING = Tracing()


def start(settings: TraceSettings, *, service_name: str) -> Tracing:
    """Return `NO_TRACING` when `settings` choose no exporter; otherwise a running
    `OtelTracing` (spans batched to the OTLP endpoint on a thread of its own), named
    `service_name` unless the settings or OTEL_SERVICE_NAME name it."""
    if not settings.enabled:
        return NO_TRACING
    # Imported here only: a program that does not trace never loads OpenTelemetry.
    from tensile.serving.otel import OtelTracing  # noqa: PLC0415

    return OtelTracing.start(settings, service_name=service_name)


@contextlib.asynccontextmanager
async def running(
    settings: TraceSettings, *, service_name: str, flush_timeout: float = FLUSH_TIMEOUT
) -> AsyncIterator[Tracing]:
    """`start` for the block; at its end, the spans not yet sent are sent, waiting at most
    `flush_timeout` seconds (the exporter's HTTP calls block, so they run on a thread; one
    still running then is left to finish as a daemon thread, so an unreachable collector
    never holds a stopping program)."""
    tracing = start(settings, service_name=service_name)
    try:
        yield tracing
    finally:
        if tracing.enabled:
            await _closed(tracing, timeout=flush_timeout)


async def _closed(tracing: Tracing, *, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def close() -> None:
        try:
            tracing.close()
        except Exception:  # a failed flush loses spans, nothing else
            logger.exception("tracing: the last spans could not be sent")
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed after the timeout
                loop.call_soon_threadsafe(done.set)

    threading.Thread(target=close, name="trace-flush", daemon=True).start()
    try:
        async with asyncio.timeout(timeout):
            await done.wait()
    except TimeoutError:
        logger.warning("tracing: the last spans were not sent within %gs", timeout)
