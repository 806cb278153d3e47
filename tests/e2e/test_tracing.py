"""A pod's path as a trace, end to end: a virtual node started with `--trace-exporter otlp`
and OTEL_EXPORTER_OTLP_ENDPOINT sends its spans over OTLP/HTTP (protobuf) to a receiver in
this test (devcluster.otlp, decoding with opentelemetry-proto's classes) while it forwards
a pod between the fleet's real clusters; the lower pod carries the trace's context."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.fleet import Fleet
from devcluster.otlp import OtlpReceiver, ReceivedSpan
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, phase, pod, pod_manifest, wait_for
from vnode.controllers import pod_traces
from vnode.providers.k2k import naming
from vnode.providers.k2k import provider as k2k


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on this machine's loopback, for the test."""
    otlp = OtlpReceiver()
    with otlp.in_thread():
        yield otlp


@pytest.fixture
def traced_node(
    fleet: Fleet, receiver: OtlpReceiver, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> VirtualNodeProcess:
    """A virtual node tracing every pod to `receiver` (batches sent every 200 ms)."""
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-trace-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=["--trace-exporter=otlp", "--trace-sample-rate=always", "--trace-tag=fleet=e2e"],
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"},
    )
    nodes.append(node)
    return node.start()


def _trace_of(spans: list[ReceivedSpan], uid: str) -> list[ReceivedSpan]:
    """The spans of the trace whose root is the pod of `uid` (none before the root came)."""
    roots = [
        s for s in spans if s.name == pod_traces.FORWARD and s.attributes.get("k8s.pod.uid") == uid
    ]
    if not roots:
        return []
    return [s for s in spans if s.trace_id == roots[0].trace_id]


def test_a_forwarded_pod_s_spans_reach_an_otlp_endpoint_in_order(
    fleet: Fleet, traced_node: VirtualNodeProcess, receiver: OtlpReceiver, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    made = create(upper, namespace, pod_manifest("web", node=traced_node.name))
    uid = made["metadata"]["uid"]
    wait_for("the pod Running upstairs", lambda: phase(upper, namespace, "web") == "Running")
    spans = receiver.wait_for(
        "the pod's trace, from its root to its status back",
        lambda got: any(s.name == pod_traces.STATUS_UP for s in _trace_of(got, uid)),
        timeout=60,
    )
    trace = _trace_of(spans, uid)
    by_name: dict[str, list[ReceivedSpan]] = {}
    for span in trace:
        by_name.setdefault(span.name, []).append(span)
    (root,) = by_name[pod_traces.FORWARD]
    (sync,) = by_name[pod_traces.SYNC]
    (status,) = by_name[pod_traces.STATUS_UP]
    (create_span,) = by_name[k2k.LOWER_CREATE_SPAN]
    # Parent and child as the path goes: the controller's steps under the root, the
    # provider's under the sync that created the lower pod, the status linked to that sync.
    assert root.parent_span_id == ""
    for name in (pod_traces.UPPER_EVENT, pod_traces.QUEUE_WAIT, pod_traces.SYNC):
        (span,) = by_name[name]
        assert span.parent_span_id == root.span_id, name
    for name in (k2k.DEPENDENCIES_SPAN, k2k.TRANSLATE_SPAN, k2k.LOWER_CREATE_SPAN):
        (span,) = by_name[name]
        assert span.parent_span_id == sync.span_id, name
    assert status.parent_span_id == root.span_id
    assert status.links == ((root.trace_id, sync.span_id),)
    # In time: event, wait, sync (its steps in turn), then the status back; the root holds all.
    (event,) = by_name[pod_traces.UPPER_EVENT]
    (wait,) = by_name[pod_traces.QUEUE_WAIT]
    (translated,) = by_name[k2k.TRANSLATE_SPAN]
    assert event.end_ns <= wait.start_ns <= wait.end_ns <= sync.start_ns
    assert translated.end_ns <= create_span.start_ns
    # The status span begins at the first change told below, the new lower pod's watch
    # event, which may come before the POST's answer: after the POST began, that is all.
    assert create_span.start_ns <= status.start_ns <= status.end_ns == root.end_ns
    assert root.start_ns == event.start_ns
    expected = {
        "k8s.namespace.name": namespace,
        "k8s.pod.name": "web",
        "k8s.pod.uid": uid,
        "k8s.node.name": traced_node.name,
    }
    assert dict(root.attributes) == {**expected, pod_traces.OUTCOME: "status_written"}
    assert sync.attributes == {pod_traces.ATTEMPT: 1}
    assert all(s.status_code != 2 for s in trace), [s.name for s in trace if s.status_code == 2]
    assert root.resource["service.name"] == "virtual-node"
    assert root.resource["fleet"] == "e2e"
    assert root.scope == "tensile"
    # The lower pod carries the context of the POST that made it.
    below = pod(lower, namespace, "web")
    assert below is not None
    traceparent = below["metadata"]["annotations"][naming.TRACEPARENT_ANNOTATION]
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert (version, trace_id, span_id) == ("00", root.trace_id, create_span.span_id)
