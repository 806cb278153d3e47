"""What the node controller tells Prometheus about its lower cluster: the gauge the alert
TensileLowerClusterUnreachable reads follows the provider's ping. Controller logic in
isolation, with a fake upper API (FakeApi) and a provider whose ping fails on demand (a
real lower apiserver cut off is in tests/e2e/test_monitoring.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import REGISTRY

from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import NODES
from vnode import provider_errors
from vnode.controllers.node import NodeController
from vnode.settings import NodeSettings
from vnode.testing.fakeapi import FakeApi


class Provider:
    def __init__(self) -> None:
        self.answers = True

    async def ping(self) -> None:
        if not self.answers:
            raise provider_errors.BackendUnavailable("lower cluster: /readyz did not answer")

    def capacity(self) -> Mapping[str, str]:
        return {"cpu": "8", "memory": "16Gi", "pods": "110"}

    def node_info(self) -> Mapping[str, str]:
        return {"kubeletVersion": "v1.37.1"}

    def notify_node_changed(self, callback: Callable[[], None]) -> None:
        return None


def reachable() -> float | None:
    return REGISTRY.get_sample_value("tensile_lower_apiserver_reachable")


async def test_the_reachable_gauge_follows_each_ping() -> None:
    upper, provider = FakeApi(name="fake-upper"), Provider()
    upper.put(NODES, {"metadata": {"name": "vn", "uid": "u"}})
    controller = NodeController(
        upper=upper,
        informers=InformerFactory(),
        heartbeat=upper,
        provider=provider,
        settings=NodeSettings(name="vn", internal_ip="192.0.2.1"),
    )
    assert await controller._ping()
    assert reachable() == 1
    provider.answers = False
    assert not await controller._ping()
    assert reachable() == 0
    provider.answers = True
    assert await controller._ping()
    assert reachable() == 1
