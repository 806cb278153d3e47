"""The real `Tracing`: the OpenTelemetry SDK, its spans batched to an OTLP/HTTP endpoint.

Imported only by `tensile.serving.tracing.start` when an exporter is chosen. Spans go to
a `BatchSpanProcessor`, which sends them from a thread of its own, so the event loop never
waits for the collector; a collector that is down costs dropped spans (the SDK logs a
warning), never a stalled program. The tracer is this program's own, not OpenTelemetry's
global one, so nothing else in the process is traced by accident.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tensile.serving import version
from tensile.serving.tracing import Attributes, ContextManager, TraceSettings, Tracing

logger = logging.getLogger(__name__)

INSTRUMENTATION = "tensile"
"""The instrumentation scope's name on every span."""
_UNNAMED = "unknown_service"
"""The SDK's service.name when neither the flag nor OTEL_SERVICE_NAME gives one."""
_FLUSH_MILLIS = 4000


class OtelTracing(Tracing):
    """Spans through one `TracerProvider` (see the module docstring)."""

    enabled = True

    def __init__(self, *, provider: TracerProvider) -> None:
        """Trace with `provider`, whose span processors are already attached."""
        self._provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION, version.version())
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def start(
        cls,
        settings: TraceSettings,
        *,
        service_name: str,
        exporter: SpanExporter | None = None,
    ) -> OtelTracing:
        """Return tracing as `settings` say: the resource is OTEL_RESOURCE_ATTRIBUTES and
        OTEL_SERVICE_NAME (the SDK's detector) under the --trace-tag pairs and
        --trace-service-name, named `service_name` when nothing names it; the sampler is
        ParentBased(TraceIdRatioBased(rate)) for a --trace-sample-rate, else the SDK's from
        OTEL_TRACES_SAMPLER. `exporter` (default: OTLP over HTTP, configured by the
        OTEL_EXPORTER_OTLP_* variables) receives the batches."""
        attributes: dict[str, str] = dict(settings.tags)
        if settings.service_name:
            attributes[SERVICE_NAME] = settings.service_name
        resource = Resource.create(attributes)
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith(_UNNAMED):
            resource = resource.merge(Resource({SERVICE_NAME: service_name}))
        sampler = (
            None
            if settings.sample_rate is None
            else ParentBased(TraceIdRatioBased(settings.sample_rate))
        )
        # No exit handler: the program flushes when it stops (`tracing.running`).
        provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter()))
        logger.info(
            "tracing: spans of %s go to %s over OTLP/HTTP, sampled %s",
            resource.attributes.get(SERVICE_NAME),
            _endpoint(os.environ) if exporter is None else type(exporter).__name__,
            "by OTEL_TRACES_SAMPLER (default: all)"
            if settings.sample_rate is None
            else f"at {settings.sample_rate * 100:g}%",
        )
        return cls(provider=provider)

    @staticmethod
    def now() -> int:
        """Nanoseconds since the epoch, the clock of span times."""
        return time.time_ns()

    def span(
        self,
        name: str,
        *,
        parent: Span | None,
        start: int | None = None,
        attributes: Attributes | None = None,
        links: Sequence[Span] = (),
    ) -> Span:
        """Start span `name`, child of `parent` (None: the root of a new trace, whatever
        span is current), at `start` (ns since the epoch; default now), linked to `links`.
        The caller ends it (`Span.end(end_time=ns)`). A root the sampler leaves out is a
        span that does not record (`is_recording()` False), and so are its children."""
        context = Context() if parent is None else trace.set_span_in_context(parent)
        return self._tracer.start_span(
            name,
            context=context,
            start_time=start,
            attributes=attributes,
            links=[Link(s.get_span_context()) for s in links],
        )

    @staticmethod
    def current(span: Span) -> ContextManager:
        """Make `span` the current span for the block (asyncio-safe: a context variable),
        without ending it or setting its status."""
        return trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    @contextlib.contextmanager
    def step(self, name: str, attributes: Attributes | None = None) -> Iterator[Span | None]:
        """A child of the current span for the block, when the current span records;
        otherwise no span (None). An exception marks the span as failed (its message) and
        goes on."""
        if not trace.get_current_span().is_recording():
            yield None
            return
        span = self._tracer.start_span(name, attributes=attributes)
        try:
            with trace.use_span(
                span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield span
        except BaseException as exc:
            self.failed(span, exc)
            raise
        finally:
            span.end()

    def traceparent(self, span: Span | None = None) -> str | None:
        """The W3C traceparent header of `span` (default: the current span), or None when
        it does not record."""
        span = span or trace.get_current_span()
        if not span.is_recording():
            return None
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent")

    @staticmethod
    def failed(span: Span, error: BaseException) -> None:
        """Mark `span` as failed with `error`'s type and message."""
        message = str(error)
        span.set_status(
            Status(StatusCode.ERROR, f"{type(error).__name__}: {message}" if message else None)
        )

    def close(self) -> None:
        """Send the spans still batched (bounded), then stop the exporter's thread."""
        self._provider.force_flush(timeout_millis=_FLUSH_MILLIS)
        self._provider.shutdown()


def _endpoint(env: Mapping[str, str]) -> str:
    """Where the OTLP/HTTP exporter sends spans, as it reads the environment (for the log)."""
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"
