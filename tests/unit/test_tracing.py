"""Tracing's flags and settings (tensile.serving.tracing), virtual-kubelet's values; the
OpenTelemetry side (tensile.serving.otel) with the SDK's in-memory exporter; and that a
node that does not trace loads nothing of OpenTelemetry."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tensile.serving import tracing
from tensile.serving.flags import UsageError
from tensile.serving.otel import OtelTracing
from tensile.serving.tracing import TraceSettings
from vnode import cli

LOWER = ["--client-kubeconfig=/dev/null"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], ""),
        (["none"], ""),
        (["otlp"], "otlp"),
        (["otlp,otlp"], "otlp"),
        (["otlp", " otlp "], "otlp"),
    ],
)
def test_exporters_virtual_kubelet_s_flag_takes(values: list[str], expected: str) -> None:
    assert tracing.exporter_of(values) == expected


@pytest.mark.parametrize("name", ["jaeger", "ocagent", "zpages"])
def test_virtual_kubelet_s_opencensus_exporters_are_refused_with_the_way_out(name: str) -> None:
    with pytest.raises(UsageError, match=f"--trace-exporter: {name} was one of") as raised:
        tracing.exporter_of([name])
    assert "use otlp and an OpenTelemetry Collector" in str(raised.value)


def test_an_unknown_exporter_names_what_is_available() -> None:
    with pytest.raises(UsageError, match=r"unknown exporter 'console' \(available: otlp\)"):
        tracing.exporter_of(["otlp,console"])


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("", None),
        ("always", 1.0),
        ("Always", 1.0),
        ("never", 0.0),
        ("100", 1.0),
        ("0", 0.0),
        ("25", 0.25),
        ("0.5", 0.005),
    ],
)
def test_sample_rates_are_virtual_kubelet_s_percentages(text: str, rate: float | None) -> None:
    assert tracing.sample_rate(text) == rate


@pytest.mark.parametrize("text", ["101", "-1", "half", "nan", "inf", "1e9", "50%"])
def test_a_sample_rate_outside_0_to_100_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--trace-sample-rate must be always, never or a perc"):
        tracing.sample_rate(text)


def test_tags_are_key_value_pairs_in_order() -> None:
    assert tracing.tags_of(["team=a,zone=b", "url=x=y"]) == (
        ("team", "a"),
        ("zone", "b"),
        ("url", "x=y"),
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["team"], "expected key=value, got 'team'"),
        (["=a"], "expected key=value"),
        (["a=1,a=2"], "a is given twice"),
        (["service.name=x"], "service.name is set by --trace-service-name"),
    ],
)
def test_a_bad_tag_is_refused(values: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        tracing.tags_of(values)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
        # The traces' own variable wins over the general one, as in the SDK.
        {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        },
    ],
)
def test_the_http_protobuf_transport_is_taken(env: dict[str, str]) -> None:
    tracing.check_protocol(env)


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
    ],
)
def test_another_otlp_transport_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(UsageError, match="only http/protobuf is shipped"):
        tracing.check_protocol(env)


def test_the_node_s_command_line_takes_the_flags() -> None:
    settings = cli.parse(
        [
            *LOWER,
            "--trace-exporter=otlp",
            "--trace-sample-rate=25",
            "--trace-service-name=edge-nodes",
            "--trace-tag=team=a",
        ],
        env={},
    )
    assert settings.tracing == TraceSettings(
        exporter="otlp", sample_rate=0.25, service_name="edge-nodes", tags=(("team", "a"),)
    )
    assert settings.tracing.enabled


def test_tracing_is_off_by_default() -> None:
    settings = cli.parse(LOWER, env={})
    assert settings.tracing == TraceSettings()
    assert not settings.tracing.enabled


def test_otel_traces_exporter_is_the_flag_s_default_and_the_flag_wins() -> None:
    env = {"OTEL_TRACES_EXPORTER": "otlp"}
    assert cli.parse(LOWER, env=env).tracing.exporter == "otlp"
    assert cli.parse([*LOWER, "--trace-exporter=none"], env=env).tracing.exporter == ""
    with pytest.raises(UsageError, match="OTEL_TRACES_EXPORTER: jaeger was one of"):
        cli.parse(LOWER, env={"OTEL_TRACES_EXPORTER": "jaeger"})


def test_a_grpc_protocol_is_refused_only_when_tracing() -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert not cli.parse(LOWER, env=env).tracing.enabled
    with pytest.raises(UsageError, match="OTEL_EXPORTER_OTLP_PROTOCOL=grpc"):
        cli.parse([*LOWER, "--trace-exporter=otlp"], env=env)


def test_tracing_flags_without_an_exporter_are_said_to_do_nothing() -> None:
    settings = cli.parse([*LOWER, "--trace-sample-rate=always", "--trace-tag=a=b"], env={})
    assert not settings.tracing.enabled
    assert (
        "--trace-sample-rate, --trace-tag do nothing without --trace-exporter: no tracing"
        in settings.notes
    )


def test_a_node_that_does_not_trace_loads_nothing_of_opentelemetry() -> None:
    # In a process of its own: this one has loaded OpenTelemetry for the tests above.
    script = """
import sys
from tensile.serving import tracing
from vnode import __main__, cli
from vnode.controllers.pod_traces import NO_POD_TRACES, pod_traces
from vnode.node import VirtualNode
from vnode.providers.k2k import assembly
settings = cli.parse(["--client-kubeconfig=/dev/null"], env={})
assert tracing.start(settings.tracing, service_name="virtual-node") is tracing.NO_TRACING
assert pod_traces(tracing.NO_TRACING, node_name="vn") is NO_POD_TRACES
with tracing.NO_TRACING.step("pod.translate"):
    assert tracing.NO_TRACING.traceparent() is None
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry", "google.protobuf")))
print(loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def _settings(**kwargs: object) -> TraceSettings:
    return TraceSettings(exporter="otlp", **kwargs)  # type: ignore[arg-type]


def _resource_of(exporter: InMemorySpanExporter, traced: OtelTracing) -> dict[str, object]:
    traced.span("probe", parent=None).end()
    traced.close()
    (span,) = exporter.get_finished_spans()
    return dict(span.resource.attributes)


def test_the_service_is_named_by_the_flag_then_the_environment_then_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=x")
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(
        _settings(tags=(("team", "y"),)), service_name="virtual-node", exporter=exporter
    )
    resource = _resource_of(exporter, traced)
    assert resource["service.name"] == "virtual-node"
    assert resource["deployment.environment"] == "test"
    assert resource["team"] == "y", "--trace-tag wins over OTEL_RESOURCE_ATTRIBUTES"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(_settings(), service_name="virtual-node", exporter=exporter)
    assert _resource_of(exporter, traced)["service.name"] == "from-env"
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(
        _settings(service_name="flag"), service_name="virtual-node", exporter=exporter
    )
    assert _resource_of(exporter, traced)["service.name"] == "flag"


@pytest.mark.parametrize(("rate", "recorded"), [(0.0, False), (1.0, True)])
def test_the_sample_rate_decides_for_a_new_trace(rate: float, recorded: bool) -> None:
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(_settings(sample_rate=rate), service_name="t", exporter=exporter)
    root = traced.span("root", parent=None)
    assert root.is_recording() is recorded
    with traced.current(root), traced.step("child") as child:
        assert (child is not None) is recorded
        assert (traced.traceparent() is not None) is recorded
    root.end()
    traced.close()
    assert len(exporter.get_finished_spans()) == (2 if recorded else 0)


def test_a_step_outside_a_trace_makes_no_span() -> None:
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(_settings(), service_name="t", exporter=exporter)
    with traced.step("orphan") as span:
        assert span is None
        assert traced.traceparent() is None
    traced.close()
    assert exporter.get_finished_spans() == ()


def test_a_failed_step_is_an_error_span_and_the_error_goes_on() -> None:
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(_settings(), service_name="t", exporter=exporter)
    root = traced.span("root", parent=None)
    with pytest.raises(KeyError), traced.current(root), traced.step("child"):
        raise KeyError("gone")
    root.end()
    traced.close()
    child = next(s for s in exporter.get_finished_spans() if s.name == "child")
    assert child.status.status_code.name == "ERROR"
    assert child.status.description == "KeyError: 'gone'"


def test_the_traceparent_is_w3c_s_header_of_the_span() -> None:
    exporter = InMemorySpanExporter()
    traced = OtelTracing.start(_settings(), service_name="t", exporter=exporter)
    root = traced.span("root", parent=None)
    version, trace_id, span_id, flags = str(traced.traceparent(root)).split("-")
    context = root.get_span_context()
    assert (version, trace_id, span_id) == (
        "00",
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert int(flags, 16) & 1, "sampled"
    root.end()
    traced.close()


class Stuck(SpanExporter):
    """An exporter whose collector never answers (until released)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.FAILURE


async def test_a_stopping_program_waits_for_a_stuck_collector_only_so_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stuck = Stuck()
    traced = OtelTracing.start(_settings(), service_name="t", exporter=stuck)
    traced.span("root", parent=None).end()
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            await tracing._closed(traced, timeout=0.3)
        assert time.monotonic() - began < 3
        assert "the last spans were not sent within 0.3s" in caplog.text
    finally:
        stuck.release.set()
        await asyncio.sleep(0)
