"""The mock provider (`--provider mock`): pods bound to the node become Running, with no
lower cluster and no containers behind them.

virtual-kubelet's `mock` provider, for the same uses: testing what an upper cluster does
with a node (scheduling, controllers, quotas, a cluster's own limits) without the cost of
running anything, and measuring the upper cluster alone (bench/forwarding.py's upper-only
baseline). Its capacity comes from `--provider-config`, a JSON file in virtual-kubelet's
mock format, `{"<node name>": {"cpu": "20", "memory": "100Gi", "pods": "20"}}` (those are
also the defaults, as virtual-kubelet's).

A pod is Running as soon as it is created: every container running since then, every init
container completed, Ready unless a readiness gate says otherwise, the node's InternalIP
as host and pod IP (no pod network exists). Logs are empty; exec, attach and port-forward
are refused (nothing runs); no resource usage is reported. State lives in memory: after a
restart, a pod the upper cluster already shows Running is taken back as it is, so a
restart writes nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensile.contracts.objects import Obj, uid_of
from tensile.kube.informer import Informer
from tensile.kube.quantity import parse_quantity
from tensile.kube.resources import object_key
from tensile.kube.timestamps import rfc3339
from tensile.serving.lifecycle import Component
from vnode import provider_errors
from vnode.provider import (
    NodeUsage,
    PodEvent,
    PortSession,
    RemoteCommand,
    RemoteSession,
)

DEFAULT_CAPACITY: Mapping[str, str] = {"cpu": "20", "memory": "100Gi", "pods": "20"}
"""virtual-kubelet's mock defaults."""
_NOTHING_RUNS = "the mock provider runs no containers"


@dataclass(frozen=True, kw_only=True)
class MockSettings:
    """What the mock node offers."""

    capacity: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CAPACITY))
    """The node's capacity = allocatable (resource name -> quantity)."""


def load_config(path: str, *, node_name: str) -> MockSettings:
    """Read virtual-kubelet's mock provider config: the entry of `node_name`, each resource
    optional (defaults: `DEFAULT_CAPACITY`). An empty `path` gives the defaults.

    Raises ValueError naming the file and what is wrong with it (unreadable, not JSON, no
    entry for the node, a quantity that does not parse).
    """
    if not path:
        return MockSettings()
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the mock provider config {path}: {exc}") from exc
    entry = config.get(node_name) if isinstance(config, dict) else None
    if not isinstance(entry, dict):
        raise ValueError(f"the mock provider config {path} has no object for node {node_name!r}")
    capacity = dict(DEFAULT_CAPACITY)
    for name, value in entry.items():
        if not isinstance(value, str):
            raise ValueError(f"{path}: {name} must be a quantity string, got {value!r}")
        try:
            parse_quantity(value)
        except ValueError as exc:
            raise ValueError(f"{path}: {name}: {exc}") from exc
        capacity[name] = value
    return MockSettings(capacity=capacity)


def running_status(pod: Mapping[str, Any], *, node_ip: str, now: str) -> Obj:
    """Return the status of `pod` running on the mock node since `now` (pure).

    Containers running, init containers terminated with exit code 0, the conditions a
    kubelet sets all True, except Ready while a readiness gate's condition is not True
    (False, ReadinessGatesNotReady, as a kubelet reports it). PodScheduled, conditions of
    other types (set by upper controllers) and the qosClass are kept as the upper pod has
    them.
    """
    spec = pod.get("spec") or {}
    current = pod.get("status") or {}
    ours = {"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"}
    kept = [c for c in current.get("conditions") or [] if c.get("type") not in ours]
    types = {c.get("type"): c for c in kept}
    gates = [g.get("conditionType") for g in spec.get("readinessGates") or []]
    unready = [g for g in gates if (types.get(g) or {}).get("status") != "True"]
    scheduled = next(
        (c for c in current.get("conditions") or [] if c.get("type") == "PodScheduled"), None
    )
    conditions: list[Obj] = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodReadyToStartContainers", "Initialized")
    ]
    ready: Obj = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    if unready:
        ready.update(
            status="False",
            reason="ReadinessGatesNotReady",
            message=f"corresponding conditions of pod readiness gates are not True: {unready}",
        )
    conditions += [ready, {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]
    conditions.append(
        scheduled or {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
    )
    status: Obj = {
        "phase": "Running",
        "conditions": conditions + kept,
        "hostIP": node_ip,
        "hostIPs": [{"ip": node_ip}],
        "podIP": node_ip,
        "podIPs": [{"ip": node_ip}],
        "startTime": now,
        "containerStatuses": [
            _container(c, state={"running": {"startedAt": now}}, ready=True)
            for c in spec.get("containers") or []
        ],
    }
    if spec.get("initContainers"):
        done = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
        status["initContainerStatuses"] = [
            _container(c, state={"terminated": done}, ready=True) for c in spec["initContainers"]
        ]
    if current.get("qosClass"):
        status["qosClass"] = current["qosClass"]
    return status


def _container(container: Mapping[str, Any], *, state: Obj, ready: bool) -> Obj:
    return {
        "name": container.get("name"),
        "image": container.get("image") or "",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": "running" in state,
        "state": state,
    }


def _already_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and bool(status.get("containerStatuses"))


class MockProvider:
    """Pods become Running at once; see the module docstring. A `vnode.provider.Provider`
    and so a component of the node, with nothing to watch and no workers of its own."""

    name = "mock-provider"

    def __init__(self, *, node_ip: str, settings: MockSettings | None = None) -> None:
        """`node_ip`: the node's InternalIP, shown as host and pod IP."""
        self._node_ip = node_ip
        self._settings = settings or MockSettings()
        self._pods: dict[str, tuple[str, Obj]] = {}
        """Upper key -> (upper UID, status) of the pods "running" here."""
        self._pod_callbacks: list[Callable[[str], None]] = []
        self._started = False
        self._stopped = asyncio.Event()

    # -- running -----------------------------------------------------------------------------

    def informers(self) -> Sequence[Informer]:
        """None: nothing to watch."""
        return ()

    def components(self) -> Sequence[Component]:
        """None: no mirrors (nothing is copied anywhere)."""
        return ()

    async def start(self) -> None:
        """Nothing to read or bind: the mock has no backend."""
        self._started = True

    def ready(self) -> bool:
        """Ready once started."""
        return self._started

    async def run(self) -> None:
        """Nothing runs in the background; returns once `shut_down` is called."""
        await self._stopped.wait()

    async def shut_down(self) -> None:
        """Let `run` return."""
        self._stopped.set()

    async def cleanup_dangling(self, upper_pods: Iterable[Obj]) -> None:
        """Nothing to clean up: the mock keeps no state across restarts."""

    async def delete_dangling(self, key: str) -> None:
        """Forget the pod `key`, whatever its UID: the node no longer has it."""
        self._pods.pop(key, None)

    # -- PodLifecycleHandler ---------------------------------------------------------------

    async def create_pod(self, pod: Obj) -> list[PodEvent]:
        """Start `pod`: Running from now on (or as the upper cluster already shows it)."""
        key = object_key(pod)
        if _already_running(pod):
            status = dict(pod["status"])
        else:
            now = rfc3339(dt.datetime.now(dt.UTC))
            status = running_status(pod, node_ip=self._node_ip, now=now)
        self._pods[key] = (uid_of(pod), status)
        self._notify(key)
        return []

    async def update_pod(self, pod: Obj) -> None:
        """Nothing runs, so nothing changes."""

    async def delete_pod(self, pod: Obj, *, grace_period: int | None) -> bool:
        """Forget the pod; it is gone at once (True)."""
        key = object_key(pod)
        held = self._pods.get(key)
        if held is not None and held[0] == uid_of(pod):
            del self._pods[key]
        return True

    def backend_pod(self, pod: Obj) -> Obj | None:
        """Return the pod as the mock runs it (same UID), or None."""
        held = self._pods.get(object_key(pod))
        if held is None or held[0] != uid_of(pod):
            return None
        return {"metadata": pod["metadata"], "status": held[1]}

    def pod_status(self, pod: Obj) -> dict[str, Any] | None:
        """Return the Running status of the pod, or None if it is not here."""
        backend = self.backend_pod(pod)
        return None if backend is None else dict(backend["status"])

    def vanished(self, pod: Obj) -> bool:
        """Mock pods never vanish behind the node's back."""
        return False

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        """Register `callback(upper key)`, called when a pod started."""
        self._pod_callbacks.append(callback)

    def _notify(self, key: str) -> None:
        for callback in self._pod_callbacks:
            callback(key)

    # -- NodeProvider ---------------------------------------------------------------------

    async def ping(self) -> None:
        """Always healthy."""

    def capacity(self) -> Mapping[str, str]:
        """Return the configured capacity."""
        return dict(self._settings.capacity)

    def node_info(self) -> Mapping[str, str]:
        """Return status.nodeInfo fields of a mock node."""
        return {
            "kubeletVersion": "v0.0.0-mock",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "mock://",
            "osImage": "tensile mock node",
        }

    def notify_node_changed(self, callback: Callable[[], None]) -> None:
        """The capacity never changes: `callback` is never called."""

    # -- the kubelet API ------------------------------------------------------------------

    async def container_logs(
        self, pod: Obj, *, container: str, options: Mapping[str, str]
    ) -> AsyncGenerator[bytes, None]:
        """An empty log (virtual-kubelet's mock answers the same)."""
        if self.backend_pod(pod) is None:
            raise provider_errors.PodNotFound(f"pod {object_key(pod)} is not running here")
        empty: tuple[bytes, ...] = ()
        for chunk in empty:
            yield chunk

    async def open_exec(
        self, pod: Obj, *, container: str, options: RemoteCommand, attach: bool
    ) -> RemoteSession:
        """Refused: nothing runs. Raises ProviderError."""
        raise provider_errors.ProviderError(f"{_NOTHING_RUNS}: nothing to exec into or attach to")

    async def open_port_forward(self, pod: Obj, *, port: int) -> PortSession:
        """Refused: nothing listens. Raises ProviderError."""
        raise provider_errors.ProviderError(f"{_NOTHING_RUNS}: nothing listens on port {port}")

    async def resource_usage(self) -> NodeUsage:
        """Nothing is measured (nothing runs)."""
        return NodeUsage(pods=(), node=None, complete=True)
