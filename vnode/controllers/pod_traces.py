"""Each pod's forwarding as one trace (--trace-exporter): from the upper event to the first
status written back upstairs.

A pod's path crosses two queues and three event sources, so its trace cannot be one
`with` block: the root span is begun at the upper event and kept, with the times that
cross the asynchronous boundaries, until the status is back. The spans, each the child of
the root unless said otherwise:

    pod.forward           the root: the upper ADDED event -> the first status written back
      pod.upper_event     the informer handler queueing the pod
      pod.queue_wait      queued (or waiting for a retry) -> a worker took it
      pod.sync            one worker's handling; the provider's steps are its children
                          (k2k: pod.dependencies, pod.translate, pod.lower_create)
      ...                 a retried pod: one queue_wait and one sync per attempt
      pod.status_up       the first change below once the create began (the new lower
                          pod's watch event may come before the POST's answer) -> the
                          status written upstairs; linked to the sync that created the pod

The root carries the pod's k8s.namespace.name, k8s.pod.name and k8s.pod.uid
(OpenTelemetry's semantic conventions) and the virtual node's name as k8s.node.name (the
Node the pod is bound to); the steps carry only what is their own (a wait's and a sync's
attempt), since every attribute is copied and encoded per span (a third of a span's cost).
The root ends with `tensile.outcome`: `status_written`, `nothing_to_create` (the pod was forwarded
already, e.g. by this node before a restart, or refused, or finished), `deleted`,
`replaced` (a new pod of the same name) or `stopped` (the node stopped first).

Only pods the upper cluster adds are traced (a pod's updates and deletion are not part of
its forwarding); a pod the sampler leaves out keeps no state. At most `MAX_OPEN` traces are
open at once: pods beyond are not traced (said once in the log).

`PodTraces` itself is the no-op the controller holds when tracing is off (`NO_POD_TRACES`):
every hook is an empty method, and nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensile.contracts.objects import Obj, name_of, namespace_of, uid_of
from tensile.kube.resources import object_key
from tensile.kube.workqueue import Requeue
from tensile.serving.tracing import Attributes, ContextManager, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from tensile.serving.otel import OtelTracing

logger = logging.getLogger(__name__)

FORWARD = "pod.forward"
UPPER_EVENT = "pod.upper_event"
QUEUE_WAIT = "pod.queue_wait"
SYNC = "pod.sync"
STATUS_UP = "pod.status_up"
OUTCOME = "tensile.outcome"
"""Attribute of the root: how the pod's forwarding ended (see the module docstring)."""
ATTEMPT = "tensile.attempt"
"""Attribute of a queue wait and a sync: the worker's attempt at the pod, from 1."""
MAX_OPEN = 10_000
"""Open traces at most (one per pod between its upper event and its status back)."""


class PodTraces:
    """The pod controller's tracing hooks; this class does nothing (see the module
    docstring). `pod_traces` returns the one that traces."""

    def event(self, pod: Obj) -> ContextManager:
        """The block queueing upper pod `pod`, just added: it begins the pod's trace."""
        del pod
        return contextlib.nullcontext()

    def queued(self, key: str) -> None:
        """Pod `key` was queued again (an update): its next wait begins now."""

    def sync(self, key: str) -> ContextManager:
        """The block of a worker handling pod `key`: the spans the provider makes inside
        are its children."""
        del key
        return contextlib.nullcontext()

    def created(self, key: str) -> None:
        """The provider created pod `key` below, in the sync running now."""

    def noticed(self, key: str) -> None:
        """The provider told of a change of pod `key` below."""

    def status(self, key: str) -> ContextManager:
        """The block writing the status of pod `key` upstairs."""
        del key
        return contextlib.nullcontext()

    def gone(self, key: str) -> None:
        """Upper pod `key` was deleted."""

    def close(self) -> None:
        """The node stops: end every open trace."""


NO_POD_TRACES = PodTraces()


def pod_traces(tracing: Tracing, *, node_name: str) -> PodTraces:
    """Return the hooks that trace with `tracing` for the pods of node `node_name`, or
    `NO_POD_TRACES` when `tracing` is the no-op."""
    if not tracing.enabled:
        return NO_POD_TRACES
    from tensile.serving.otel import OtelTracing  # noqa: PLC0415 - loaded once tracing is on

    assert isinstance(tracing, OtelTracing)
    return TracedPods(tracing=tracing, node_name=node_name)


@dataclass(kw_only=True, eq=False)
class _Trace:
    """One pod's open trace; times in ns since the epoch."""

    uid: str
    root: Span
    waiting_since: int | None
    """When the pod was queued (or began to wait for a retry); None: not waiting."""
    attempts: int = 0
    syncing: Span | None = None
    """The sync running now."""
    creator: Span | None = None
    """The sync that created the pod below."""
    noticed_at: int | None = None
    """The first change below told once the pod's create began."""


class TracedPods(PodTraces):
    """The hooks that trace (see the module docstring)."""

    def __init__(self, *, tracing: OtelTracing, node_name: str) -> None:
        self._tracing = tracing
        self._node_name = node_name
        self._open: dict[str, _Trace] = {}
        self._full_said = False

    def open_keys(self) -> frozenset[str]:
        """The pods whose trace is open."""
        return frozenset(self._open)

    @contextlib.contextmanager
    def event(self, pod: Obj) -> Iterator[None]:
        key, uid = object_key(pod), uid_of(pod)
        known = self._open.get(key)
        if known is not None and known.uid == uid:
            yield  # the same pod again (a cache refilled): its trace goes on
            return
        if known is not None:
            self._end(key, outcome="replaced")
        if len(self._open) >= MAX_OPEN:
            if not self._full_said:
                self._full_said = True
                logger.info("tracing: %d pod traces open, later pods are not traced", MAX_OPEN)
            yield
            return
        self._full_said = False
        attributes: Attributes = {
            "k8s.namespace.name": namespace_of(pod),
            "k8s.pod.name": name_of(pod),
            "k8s.pod.uid": uid,
            "k8s.node.name": self._node_name,
        }
        start = self._tracing.now()
        root = self._tracing.span(FORWARD, parent=None, start=start, attributes=attributes)
        if not root.is_recording():
            yield  # not sampled: nothing is kept
            return
        event = self._tracing.span(UPPER_EVENT, parent=root, start=start)
        try:
            yield
        finally:
            end = self._tracing.now()
            event.end(end_time=end)
            self._open[key] = _Trace(uid=uid, root=root, waiting_since=end)

    def queued(self, key: str) -> None:
        trace = self._open.get(key)
        if trace is not None and trace.waiting_since is None:
            trace.waiting_since = self._tracing.now()

    @contextlib.contextmanager
    def sync(self, key: str) -> Iterator[None]:
        trace = self._open.get(key)
        if trace is None:
            yield
            return
        tracing = self._tracing
        start = tracing.now()
        trace.attempts += 1
        attempt = {ATTEMPT: trace.attempts}
        if trace.waiting_since is not None:
            wait = tracing.span(
                QUEUE_WAIT, parent=trace.root, start=trace.waiting_since, attributes=attempt
            )
            wait.end(end_time=start)
            trace.waiting_since = None
        span = tracing.span(SYNC, parent=trace.root, start=start, attributes=attempt)
        trace.syncing = span
        try:
            with tracing.current(span):
                yield
        except Requeue as again:
            # Not a failure: the pod waits for something (a dependency, its namespace).
            span.add_event("requeued", {"reason": str(again), "after_seconds": again.after})
            trace.waiting_since = tracing.now()
            raise
        except BaseException as exc:
            tracing.failed(span, exc)
            trace.waiting_since = tracing.now()  # retried with backoff
            raise
        finally:
            trace.syncing = None
            span.end()
        if trace.creator is None and self._open.get(key) is trace:
            self._end(key, outcome="nothing_to_create")

    def created(self, key: str) -> None:
        trace = self._open.get(key)
        if trace is not None and trace.syncing is not None:
            trace.creator = trace.syncing

    def noticed(self, key: str) -> None:
        trace = self._open.get(key)
        if (
            trace is not None
            and trace.noticed_at is None
            and (trace.creator is not None or trace.syncing is not None)
        ):
            trace.noticed_at = self._tracing.now()

    @contextlib.contextmanager
    def status(self, key: str) -> Iterator[None]:
        trace = self._open.get(key)
        if trace is None or trace.creator is None:
            yield
            return
        span = self._tracing.span(
            STATUS_UP,
            parent=trace.root,
            start=trace.noticed_at,
            links=[trace.creator],
        )
        try:
            yield
        except BaseException as exc:
            self._tracing.failed(span, exc)
            span.end()
            raise
        end = self._tracing.now()
        span.end(end_time=end)
        if self._open.get(key) is trace:
            self._end(key, outcome="status_written", end=end)

    def gone(self, key: str) -> None:
        if key in self._open:
            self._end(key, outcome="deleted")

    def close(self) -> None:
        for key in list(self._open):
            self._end(key, outcome="stopped")

    def _end(self, key: str, *, outcome: str, end: int | None = None) -> None:
        trace = self._open.pop(key)
        trace.root.set_attribute(OUTCOME, outcome)
        trace.root.end(end_time=end)
