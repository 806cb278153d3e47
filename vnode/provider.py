"""Protocols the node runtime calls, with their contracts: one per role.

A provider stands behind a virtual node (virtual-kubelet's PodLifecycleHandler,
PodNotifier and NodeProvider, reshaped for asyncio). All objects are Kubernetes dicts and
are read-only for both sides: never mutate what you are given or what you returned.

Everything the node runs (its informers' users, controllers, mirrors, the kubelet API
server, the provider itself) is a `tensile.serving.lifecycle.Component`: `vnode.node.VirtualNode`
composes a list of them and a `lifecycle.Runner` owns their life (start, sync, run, stop).
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    Callable,
    Container,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tensile.contracts.objects import Obj
from tensile.serving.lifecycle import Component


@dataclass(frozen=True, kw_only=True)
class PodEvent:
    """An Event the node records about a pod on a provider's behalf (core/v1 Event fields)."""

    type: str
    """"Normal" or "Warning"."""
    reason: str
    """UpperCamelCase, e.g. OptionalConfigMapNotFound."""
    message: str


class PodLifecycleHandler(Protocol):
    """Runs upper pods on the backend.

    Contracts: calls for one pod never overlap (the pod controller's queue guarantees it);
    `create_pod` and `delete_pod` are idempotent; errors are `vnode.provider_errors.ProviderError`s
    (others are treated as transient and retried).
    """

    async def create_pod(self, pod: Obj) -> Sequence[PodEvent]:
        """Start the upper pod `pod` on the backend, with everything it needs.

        Returns the events the node should record about the pod (e.g. an optional ConfigMap
        it starts without); raises `MissingDependency` while something mandatory is missing
        (the node shows it on the pod and retries), `tensile.kube.workqueue.Requeue` to have
        the pod handed back after a delay without a failure (the backend is not ready for
        it yet, e.g. its namespace is being deleted there).
        """

    async def update_pod(self, pod: Obj) -> None:
        """Apply the mutable parts of `pod` (images, labels, ...) to the running pod."""

    async def delete_pod(self, pod: Obj, *, grace_period: int | None) -> bool:
        """Stop the pod gracefully (`grace_period` seconds, None = backend default).

        Returns True when the backend no longer has the pod, False while it is terminating.
        """

    def backend_pod(self, pod: Obj) -> Obj | None:
        """Return the backend's pod for the upper pod (same UID), or None (non-blocking)."""

    def pod_status(self, pod: Obj) -> dict[str, Any] | None:
        """Return the status the upper pod should show, or None if the backend has no pod."""

    def vanished(self, pod: Obj) -> bool:
        """Tell whether the backend's pod disappeared without this node deleting it."""


class PodNotifier(Protocol):
    """Pushes changes of backend pods, so status flows up without polling."""

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        """Register `callback(upper "namespace/name")`, called (non-blocking) on each change."""


@runtime_checkable
class BackendPodLister(Protocol):
    """A provider that can name its own backend pods and its writes in flight (optional):
    the patrol then finds backend pods whose upper pod is gone, and leaves a pod whose
    create or delete is on its way alone."""

    def owned_backend_pods(
        self, *, besides: Container[str] = frozenset()
    ) -> Iterator[tuple[str, str]]:
        """Yield (upper "namespace/name", upper UID) of every backend pod of this node that
        is not being deleted, but those whose own key ("namespace/name" of the object
        `backend_pod` returns) is in `besides`: the patrol passes the backend pods it just
        found with their upper pods, which it need not look at again."""

    def backend_writing(self, upper_uid: str) -> bool:
        """Tell whether a create or delete of the backend pod of `upper_uid` is in flight
        (sent, and not shown by the backend's cache yet): its pod may be missing or left
        over only for a moment."""


@runtime_checkable
class BackendStatusOf(Protocol):
    """A provider that can tell an upper pod's status from a backend pod already in hand
    (optional): the patrol, which has just read the backend pod, then does not look it up
    (and, in a provider whose cache is encoded, decode it) a second time."""

    def status_of(self, pod: Obj, *, backend: Obj) -> dict[str, Any]:
        """Return what `pod_status(pod)` returns while `backend_pod(pod)` is `backend`."""


@runtime_checkable
class BackendStamp(Protocol):
    """A provider that can say, without reading the backend pod, whether what it answers for
    an upper pod may have changed (optional): the patrol then passes over the pods it found
    clean last time and whose upper and backend pods have not moved since, instead of
    decoding both and translating the status again."""

    def backend_stamp(self, pod_key: str, *, upper_uid: str) -> Hashable:
        """Return a value that stays equal while `backend_pod` and `status_of` answer the
        same for the upper pod `pod_key` ("namespace/name") of UID `upper_uid` at one
        resourceVersion: built of what they read (the backend pod's resourceVersion, what
        the provider recorded of it, its own inputs), none of it decoded. Equal stamps for
        the same upper resourceVersion must mean equal answers; a stamp that changes when
        nothing did only costs a look."""


class PodProvider(PodLifecycleHandler, PodNotifier, Protocol):
    """What the pod controller needs of a provider."""

    async def cleanup_dangling(self, upper_pods: Iterable[Obj]) -> None:
        """Delete backend pods whose upper pod is not in `upper_pods` (run at start;
        `upper_pods` is walked once: every upper pod of the node)."""

    async def delete_dangling(self, key: str) -> None:
        """Delete the backend's pod for upper pod `key` ("namespace/name"), which the node
        does not have (its upper pod was deleted and finalized, e.g. while a create of it
        was in doubt); nothing when there is none. Raises `BackendUnavailable` while the
        backend cannot take the delete."""


class NodeProvider(Protocol):
    """Describes the virtual node and says whether the backend is healthy."""

    async def ping(self) -> None:
        """Return if the backend answers; raise otherwise (keep it cheap: every 10 s)."""

    def capacity(self) -> Mapping[str, str]:
        """Return the node's capacity = allocatable (resource name -> quantity)."""

    def node_info(self) -> Mapping[str, str]:
        """Return `status.nodeInfo` fields (kubeletVersion, ...)."""

    def notify_node_changed(self, callback: Callable[[], None]) -> None:
        """Register `callback()`, called (non-blocking) when `capacity()` may have changed."""


@dataclass(frozen=True, kw_only=True)
class RemoteCommand:
    """A command to run in a container (exec) or to attach to, and its stdio."""

    command: tuple[str, ...]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


class RemoteSession(Protocol):
    """A running command in the backend, as channels (0 stdin ... 4 resize)."""

    async def send(self, channel: int, data: bytes) -> None:
        """Send bytes on a channel (stdin, resize)."""

    async def close_stdin(self) -> None:
        """Tell the command its stdin ended (if the backend can)."""

    async def receive(self) -> tuple[int, bytes] | None:
        """Return the next (channel, bytes) from the command, or None when it ended."""

    async def close(self) -> None:
        """End the session."""


class LogsProvider(Protocol):
    """Streams a container's log (the provider side of the kubelet's `/containerLogs`)."""

    def container_logs(
        self, pod: Obj, *, container: str, options: Mapping[str, str]
    ) -> AsyncGenerator[bytes, None]:
        """Yield the log's bytes as they come (`options` as pods/log query parameters).

        Raises vnode.provider_errors.PodNotFound or ProviderError before the first chunk.
        """


class ExecProvider(Protocol):
    """Runs commands in, or attaches to, a pod's containers (kubelet `/exec`, `/attach`)."""

    async def open_exec(
        self, pod: Obj, *, container: str, options: RemoteCommand, attach: bool
    ) -> RemoteSession:
        """Start the session. Raises vnode.provider_errors.PodNotFound or ProviderError."""


class PortSession(Protocol):
    """One forwarded TCP connection to a pod's port."""

    async def send(self, data: bytes) -> None:
        """Send bytes to the pod's port."""

    async def receive(self) -> bytes | None:
        """Return the next bytes from the pod's port, or None when the connection ended."""

    def error(self) -> str:
        """Return what the backend reported as the connection's error ("" if nothing)."""

    async def close(self) -> None:
        """End the connection."""


class PortForwardProvider(Protocol):
    """Connects to a pod's ports (kubelet `/portForward`)."""

    async def open_port_forward(self, pod: Obj, *, port: int) -> PortSession:
        """Connect to `port` of the pod. Raises vnode.provider_errors.PodNotFound or
        ProviderError."""


@dataclass(frozen=True, kw_only=True)
class Usage:
    """CPU and memory of a container, a pod or the node, measured at one moment."""

    time_ms: int
    """When it was measured: unix time in milliseconds (> 0)."""
    cpu_seconds: float
    """Cumulative CPU time used since the start, in core-seconds (a counter, > 0)."""
    memory_bytes: float
    """Current working set in bytes (> 0)."""
    cpu_nano_cores: float | None = None
    """Mean CPU use since the previous measurement, in nanocores; None if unknown."""


@dataclass(frozen=True, kw_only=True)
class ContainerUsage:
    """One container's usage."""

    name: str
    start_time: float
    """When the container started: unix seconds (stable while it runs)."""
    usage: Usage


@dataclass(frozen=True, kw_only=True)
class PodUsage:
    """One pod's usage, named as in the upper cluster."""

    namespace: str
    name: str
    uid: str
    """The upper pod's UID."""
    start_time: float | None
    """When the pod started (status.startTime): unix seconds, None if unknown."""
    containers: tuple[ContainerUsage, ...]
    """Never empty."""
    usage: Usage


@dataclass(frozen=True, kw_only=True)
class NodeUsage:
    """Usage of the virtual node's pods and of the node itself (= the sum of its pods)."""

    pods: tuple[PodUsage, ...]
    node: Usage | None
    """None when nothing could be measured (no pod, or none measured yet)."""
    complete: bool
    """False when part of the backend could not be measured (its pods are left out)."""


class MetricsProvider(Protocol):
    """Measures the node's pods (the provider side of `/metrics/resource`, `/stats/summary`).

    Contract, so that metrics-server (pkg/scraper/client/resource/decode.go) keeps every
    pod and node it is given: time, CPU and memory of every returned `Usage` and every
    container start time are > 0 (a container whose CPU or memory is zero or unknown drops
    its whole pod); start times and cumulative CPU
    never go backwards for a running container, and the node's cumulative CPU never goes
    backwards at all (pods that leave keep counting toward it). Every value is finite, and
    every time (start times, `Usage.time_ms`) is one an RFC 3339 timestamp can hold (no
    later than 9999-12-31T23:59:59Z), so the renderers never fail: implementations check
    what their backend says before returning it. Calls may be answered from a short cache;
    implementations bound their own waiting and report unreachable parts of the backend
    through `complete`, not by raising.
    """

    async def resource_usage(self) -> NodeUsage:
        """Return the current usage of the node's pods (upper names and UIDs)."""


class Provider(
    PodProvider,
    NodeProvider,
    LogsProvider,
    ExecProvider,
    PortForwardProvider,
    MetricsProvider,
    Component,
    Protocol,
):
    """A full provider: pods, node, logs, exec, port-forward and metrics; itself a
    component (its informers and workers), and the source of further ones."""

    def components(self) -> Sequence[Component]:
        """Further components the provider brings, run beside it and started after it in
        this order (e.g. the mirrors --enable-controllers chose)."""
