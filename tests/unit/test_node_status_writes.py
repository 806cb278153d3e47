"""When the node controller patches the Node's status: on news only, judged against what it
last wrote and what its cache shows. Controller logic in isolation, with a fake upper
API that records requests (FakeApi) (the real apiserver path is tests/e2e/test_virtual_node*.py);
the cache is filled by hand to play a watch that lags behind."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import NODES
from vnode.controllers.node import NodeController
from vnode.settings import NodeSettings
from vnode.testing.fakeapi import FakeApi


def recording_client() -> FakeApi:
    """An upper API holding Node vn, whose status PATCHes are read back (`patches`)."""
    client = FakeApi(name="fake-upper")
    client.put(NODES, {"metadata": {"name": "vn", "uid": "u"}})
    return client


def patches(client: FakeApi) -> list[dict[str, Any]]:
    return [r.body for r in client.requests_of("PATCH") if r.path.endswith("/status")]


class Provider:
    def __init__(self) -> None:
        self.cpu = "8"

    async def ping(self) -> None:
        return None

    def capacity(self) -> Mapping[str, str]:
        return {"cpu": self.cpu, "memory": "16Gi", "pods": "110"}

    def node_info(self) -> Mapping[str, str]:
        return {"kubeletVersion": "v1.37.1"}

    def notify_node_changed(self, callback: Callable[[], None]) -> None:
        return None


def cache_shows(controller: NodeController, patch: dict[str, Any]) -> None:
    controller.informer.store.upsert({"metadata": {"name": "vn"}, "status": patch["status"]})


async def test_a_change_back_is_written_though_the_cache_lags_one_write_behind() -> None:
    client, provider = recording_client(), Provider()
    controller = NodeController(
        upper=client,
        informers=InformerFactory(),
        heartbeat=client,
        provider=provider,
        settings=NodeSettings(name="vn", internal_ip="192.0.2.1"),
    )
    await controller._update_status()
    first = patches(client)[-1]
    cache_shows(controller, first)
    await controller._update_status(only_news=True)
    assert len(patches(client)) == 1, "nothing changed: no write"

    provider.cpu = "12"
    await controller._update_status(only_news=True)
    assert patches(client)[-1]["status"]["capacity"]["cpu"] == "12"
    # The lower node goes again before the cache shows the write of 12: the cache says 8,
    # which is what the node must say now; the Node says 12 until it is told.
    provider.cpu = "8"
    await controller._update_status(only_news=True)
    assert len(patches(client)) == 3
    assert patches(client)[-1]["status"]["capacity"]["cpu"] == "8"
