"""Each pod's forwarding is one trace (vnode.controllers.pod_traces): the pod controller and
the k2k provider as the node builds them, on fake upper and lower APIs
(`vnode.testing.fakeapi.FakeApi`: controller logic in isolation; the informers do not run,
the test fills their stores as they would), the spans caught by the SDK's in-memory
exporter. The same path on the real fleet, its spans sent over OTLP, is
tests/e2e/test_tracing.py."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tensile.contracts.objects import Obj
from tensile.kube.events import EventRecorder
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import NAMESPACES, PODS
from tensile.kube.workqueue import Requeue
from tensile.serving.otel import OtelTracing
from tensile.serving.tracing import NO_TRACING, TraceSettings, Tracing
from vnode.controllers import pod_traces
from vnode.controllers.pod_traces import TracedPods
from vnode.controllers.pod_traces import pod_traces as traces_of
from vnode.controllers.pods import PodController
from vnode.providers.k2k import assembly, naming, slim, translate
from vnode.providers.k2k import provider as k2k
from vnode.testing.fakeapi import FakeApi

POLICY = translate.TranslationPolicy(node_name="vn-1", cluster_id="c-1", node_labels={})
KEY = "team/web"
POD_ATTRIBUTES = {
    "k8s.namespace.name": "team",
    "k8s.pod.name": "web",
    "k8s.pod.uid": "uid-web",
    "k8s.node.name": "vn-1",
}


def upper_pod(**spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "team", "name": "web", "uid": "uid-web", "resourceVersion": "1"},
        "spec": {"nodeName": "vn-1", "containers": [{"name": "c", "image": "nginx"}], **spec},
        "status": {"phase": "Pending"},
    }


class Node:
    """The pod controller and k2k provider of node vn-1, tracing into `spans`."""

    def __init__(self, *, sample_rate: float | None = None, traced: bool = True) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracing: Tracing = (
            OtelTracing.start(
                TraceSettings(exporter="otlp", sample_rate=sample_rate),
                service_name="virtual-node",
                exporter=self.exporter,
            )
            if traced
            else NO_TRACING
        )
        self.upper = FakeApi(name="upper")
        self.lower = FakeApi(name="lower")
        self.upper.put(NAMESPACES, {"metadata": {"name": "team"}, "status": {"phase": "Active"}})
        informers = InformerFactory()
        self.provider = assembly.build(
            upper=self.upper,
            lower=self.lower,
            informers=informers,
            policy=POLICY,
            node_ip="10.0.0.9",
            tracing=self.tracing,
        )
        self.traces = traces_of(self.tracing, node_name="vn-1")
        self.controller = PodController(
            upper=self.upper,
            informers=informers,
            provider=self.provider,
            node_name="vn-1",
            namespace=None,
            workers=1,
            recorder=EventRecorder(self.upper, component="vn-1/pod-controller", host="vn-1"),
            traces=self.traces,
        )

    def added(self, pod: Obj) -> None:
        """What the upper pods informer does with a new pod."""
        stored = self.upper.put(PODS, pod)
        self.controller.informer.store.update(stored)
        self.controller._added(stored)

    def deleted(self, pod: Obj) -> None:
        self.upper.remove(PODS, "web", namespace="team")
        self.controller.informer.store.delete(KEY)
        self.controller._deleted(pod)

    def running_below(self) -> Obj:
        """What the lower pods informer does when the lower pod runs."""
        lower = self.lower.get(PODS, "web", namespace="team")
        assert lower is not None
        lower["status"] = {"phase": "Running", "podIP": "10.1.0.5"}
        stored = self.lower.put(PODS, lower)
        self.provider.pods.store.update(slim.SlimLowerPods(POLICY.owner)(stored))
        self.provider.lower_pod_changed(stored)
        return stored

    def close(self) -> None:
        """Stop the tracer's export thread."""
        self.tracing.close()

    def spans(self) -> dict[str, list[ReadableSpan]]:
        """The spans sent so far, by name (the tracer flushed first)."""
        assert isinstance(self.tracing, OtelTracing)
        self.tracing._provider.force_flush()
        named: dict[str, list[ReadableSpan]] = {}
        for span in self.exporter.get_finished_spans():
            named.setdefault(span.name, []).append(span)
        return named


@pytest.fixture
def nodes() -> Iterator[Callable[..., Node]]:
    """Make nodes (`Node`'s keywords), closed after the test."""
    made: list[Node] = []

    def make(**kwargs: Any) -> Node:
        made.append(Node(**kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for node in made:
            node.close()


def parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def sid(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def test_an_untraced_node_gets_the_no_op_hooks() -> None:
    assert traces_of(NO_TRACING, node_name="vn-1") is pod_traces.NO_POD_TRACES


async def test_a_forwarded_pod_is_one_trace_from_its_upper_event_to_its_status_back(
    nodes: Callable[..., Node],
) -> None:
    node = nodes()
    node.added(upper_pod())
    await node.controller._sync_pod(KEY)
    node.running_below()
    await node.controller._sync_status(KEY)
    spans = node.spans()
    assert set(spans) == {
        pod_traces.FORWARD,
        pod_traces.UPPER_EVENT,
        pod_traces.QUEUE_WAIT,
        pod_traces.SYNC,
        k2k.DEPENDENCIES_SPAN,
        k2k.VOLUMES_SPAN,
        k2k.TRANSLATE_SPAN,
        k2k.LOWER_CREATE_SPAN,
        pod_traces.STATUS_UP,
    }
    assert all(len(found) == 1 for found in spans.values()), spans
    one = {name: found[0] for name, found in spans.items()}
    root, sync, create = one[pod_traces.FORWARD], one[pod_traces.SYNC], one[k2k.LOWER_CREATE_SPAN]
    assert len({s.context.trace_id for s in one.values() if s.context}) == 1, "one trace"
    assert root.parent is None
    for name in (pod_traces.UPPER_EVENT, pod_traces.QUEUE_WAIT, pod_traces.SYNC):
        assert parent(one[name]) == sid(root), name
    steps = [k2k.DEPENDENCIES_SPAN, k2k.VOLUMES_SPAN, k2k.TRANSLATE_SPAN, k2k.LOWER_CREATE_SPAN]
    for name in steps:
        assert parent(one[name]) == sid(sync), name
    for before, after in itertools.pairwise(steps):
        assert one[before].end_time <= one[after].start_time, (before, after)
    status = one[pod_traces.STATUS_UP]
    assert parent(status) == sid(root)
    assert [link.context.span_id for link in status.links] == [sid(sync)]
    # Each step in its turn, the root over all of them.
    order = [pod_traces.UPPER_EVENT, pod_traces.QUEUE_WAIT, pod_traces.SYNC]
    for before, after in itertools.pairwise(order):
        assert one[before].end_time <= one[after].start_time, (before, after)
    assert create.end_time <= status.start_time
    assert root.start_time == one[pod_traces.UPPER_EVENT].start_time
    assert root.end_time == status.end_time
    assert dict(root.attributes or {}) == {**POD_ATTRIBUTES, pod_traces.OUTCOME: "status_written"}
    assert (sync.attributes or {})[pod_traces.ATTEMPT] == 1
    # The lower pod carries the create's span context (W3C traceparent).
    (post,) = node.lower.requests_of("POST", "pods")
    traceparent = post.body["metadata"]["annotations"][naming.TRACEPARENT_ANNOTATION]
    assert create.context is not None
    assert traceparent.split("-")[1:3] == [
        f"{create.context.trace_id:032x}",
        f"{create.context.span_id:016x}",
    ]
    assert isinstance(node.traces, TracedPods)
    assert node.traces.open_keys() == frozenset()


async def test_a_pod_waiting_for_its_config_map_shows_each_attempt(
    nodes: Callable[..., Node],
) -> None:
    node = nodes()
    node.added(upper_pod(volumes=[{"name": "v", "configMap": {"name": "settings"}}]))
    with pytest.raises(Requeue):
        await node.controller._sync_pod(KEY)
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": "team", "name": "settings", "uid": "uid-cm"},
        "data": {"a": "1"},
    }
    node.provider.dependencies.mirrors["ConfigMap"].source.store.update(config)
    await node.controller._sync_pod(KEY)
    node.running_below()
    await node.controller._sync_status(KEY)
    spans = node.spans()
    assert [(s.attributes or {})[pod_traces.ATTEMPT] for s in spans[pod_traces.SYNC]] == [1, 2]
    assert [(s.attributes or {})[pod_traces.ATTEMPT] for s in spans[pod_traces.QUEUE_WAIT]] == [
        1,
        2,
    ]
    first, second = spans[pod_traces.SYNC]
    assert [event.name for event in first.events] == ["requeued"]
    assert first.status.status_code.name == "UNSET", "waiting is no failure"
    # The first attempt's dependencies step failed (the ConfigMap was missing).
    failed, copied = spans[k2k.DEPENDENCIES_SPAN]
    assert parent(failed) == sid(first)
    assert failed.status.status_code.name == "ERROR"
    assert "settings" in str(failed.status.description)
    assert parent(copied) == sid(second)
    (status,) = spans[pod_traces.STATUS_UP]
    assert [link.context.span_id for link in status.links] == [sid(second)]
    (root,) = spans[pod_traces.FORWARD]
    assert (root.attributes or {})[pod_traces.OUTCOME] == "status_written"


async def test_a_pod_deleted_before_its_status_came_back_ends_its_trace(
    nodes: Callable[..., Node],
) -> None:
    node = nodes()
    pod = upper_pod()
    node.added(pod)
    await node.controller._sync_pod(KEY)
    node.deleted(pod)
    (root,) = node.spans()[pod_traces.FORWARD]
    assert (root.attributes or {})[pod_traces.OUTCOME] == "deleted"
    assert pod_traces.STATUS_UP not in node.spans()


async def test_a_pod_forwarded_before_a_restart_has_nothing_to_create(
    nodes: Callable[..., Node],
) -> None:
    node = nodes()
    node.provider.pods.store.update(
        slim.SlimLowerPods(POLICY.owner)(
            node.lower.put(PODS, translate.lower_pod(upper_pod(), policy=POLICY))
        )
    )
    node.added(upper_pod())
    await node.controller._sync_pod(KEY)
    spans = node.spans()
    (root,) = spans[pod_traces.FORWARD]
    assert (root.attributes or {})[pod_traces.OUTCOME] == "nothing_to_create"
    assert k2k.LOWER_CREATE_SPAN not in spans
    assert node.lower.requests_of("POST", "pods") == []


async def test_open_traces_end_when_the_node_stops(nodes: Callable[..., Node]) -> None:
    node = nodes()
    node.added(upper_pod())
    await node.controller._sync_pod(KEY)
    node.traces.close()
    (root,) = node.spans()[pod_traces.FORWARD]
    assert (root.attributes or {})[pod_traces.OUTCOME] == "stopped"


@pytest.mark.parametrize("traced", [True, False], ids=["sampled-out", "tracing-off"])
async def test_an_untraced_pod_keeps_no_state_and_its_lower_pod_no_trace_context(
    traced: bool, nodes: Callable[..., Node]
) -> None:
    node = nodes(sample_rate=0.0, traced=traced)
    # An upper pod with a trace context of someone's choosing: it stays upstairs.
    pod = upper_pod()
    pod["metadata"]["annotations"] = {naming.TRACEPARENT_ANNOTATION: f"00-{'1' * 32}-{'2' * 16}-01"}
    node.added(pod)
    await node.controller._sync_pod(KEY)
    node.running_below()
    await node.controller._sync_status(KEY)
    if traced:
        assert node.spans() == {}
        assert isinstance(node.traces, TracedPods)
        assert node.traces.open_keys() == frozenset()
    (post,) = node.lower.requests_of("POST", "pods")
    assert naming.TRACEPARENT_ANNOTATION not in post.body["metadata"]["annotations"]


def test_an_upper_trace_context_never_reaches_the_lower_pod_by_an_update() -> None:
    upper = upper_pod()
    upper["metadata"]["annotations"] = {naming.TRACEPARENT_ANNOTATION: "00-forged"}
    lower = translate.lower_pod(upper_pod(), policy=POLICY)
    lower["metadata"]["annotations"][naming.TRACEPARENT_ANNOTATION] = "00-the-node-s"
    assert translate.spec_update(upper, lower, policy=POLICY) is None


async def test_a_new_pod_of_the_same_name_replaces_the_trace_of_the_old(
    nodes: Callable[..., Node],
) -> None:
    node = nodes()
    node.added(upper_pod())
    again = upper_pod()
    again["metadata"]["uid"] = "uid-web-2"
    node.controller._added(again)
    (root,) = node.spans()[pod_traces.FORWARD]
    assert (root.attributes or {})["k8s.pod.uid"] == "uid-web"
    assert (root.attributes or {})[pod_traces.OUTCOME] == "replaced"
    assert isinstance(node.traces, TracedPods)
    assert node.traces.open_keys() == {KEY}


async def test_pods_beyond_the_open_traces_bound_are_not_traced(
    nodes: Callable[..., Node], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pod_traces, "MAX_OPEN", 1)
    caplog.set_level(logging.INFO, logger=pod_traces.__name__)
    node = nodes()
    node.added(upper_pod())
    for name in ("second", "third"):
        other = upper_pod()
        other["metadata"].update(name=name, uid=f"uid-{name}")
        node.controller._added(other)
    assert isinstance(node.traces, TracedPods)
    assert node.traces.open_keys() == {KEY}
    assert caplog.text.count("pod traces open, later pods are not traced") == 1
