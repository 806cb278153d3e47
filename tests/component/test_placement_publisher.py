"""The virtual node's placement summary publisher (`k2k.publisher.SummaryPublisher`): what
it writes on its upper Node and when. FakeApi stands in for the upper apiserver so a Node
can vanish between two writes on demand; the lower informer is a stand-in holding one
lower Node (the publisher only reads its store). The real path is tests/e2e
(test_virtual_node.py, test_scheduler.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tensile.contracts import ownership
from tensile.kube.resources import NODES
from tensile.placement import summary
from vnode.providers.k2k.lowerpods import LowerPodBook
from vnode.providers.k2k.publisher import RESYNC, SummaryPublisher
from vnode.testing.fakeapi import FakeApi

LOWER_NODE = {
    "metadata": {"name": "n1"},
    "status": {
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


def _publisher(upper: FakeApi, clock: list[float]) -> SummaryPublisher:
    lower_nodes: Any = SimpleNamespace(store=[LOWER_NODE])
    return SummaryPublisher(
        upper=upper,
        node_name="vn",
        book=LowerPodBook(owner=ownership.NodeIdentity(node_name="vn", cluster_id="c")),
        nodes=lower_nodes,
        pods=lower_nodes,
        interval=1.0,
        clock=lambda: clock[0],
    )


def _annotation(upper: FakeApi) -> str | None:
    node = upper.get(NODES, "vn") or {}
    return (node.get("metadata", {}).get("annotations") or {}).get(summary.ANNOTATION)


async def test_the_summary_is_written_when_it_changes_and_again_after_resync() -> None:
    upper = FakeApi(objects=[(NODES, {"metadata": {"name": "vn"}})])
    clock = [0.0]
    publisher = _publisher(upper, clock)
    assert await publisher.publish()
    written = _annotation(upper)
    assert written is not None
    assert [r.name for r in summary.parse(written).rows()] == ["n1"]
    assert not await publisher.publish()  # unchanged: no write
    assert len(upper.requests_of("PATCH")) == 1
    # The Node deleted and registered anew, without the annotation: back within RESYNC.
    upper.remove(NODES, "vn")
    upper.put(NODES, {"metadata": {"name": "vn"}})
    clock[0] = RESYNC - 1
    assert not await publisher.publish()
    clock[0] = RESYNC + 1
    assert await publisher.publish()
    assert _annotation(upper) == written


async def test_a_missing_node_is_not_an_error_and_is_written_once_it_exists() -> None:
    upper = FakeApi()
    clock = [0.0]
    publisher = _publisher(upper, clock)
    assert not await publisher.publish()  # 404: logged, tried at the next look
    upper.put(NODES, {"metadata": {"name": "vn"}})
    assert await publisher.publish()
    assert _annotation(upper) is not None
