"""Faults a real lower cluster has: an outage of its apiserver, and a watch expired by compaction.

Each test runs on a private pair (one kwok node), since it stops and restarts components.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for
from vnode.testing.cluster import PairSettings
from vnode.testing.fixtures import create_namespace
from vnode.testing.pair import ClusterPair
from vnode.testing.vnodes import VirtualNodeProcess


@pytest.fixture
def private_pair() -> Iterator[ClusterPair]:
    directory = Path(tempfile.mkdtemp(prefix="tensile-private-"))
    pair = ClusterPair.start(
        directory=directory, settings=PairSettings(lower_nodes=1), owns_directory=True
    )
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def node_on_private_pair(private_pair: ClusterPair, tmp_path: Path) -> Iterator[VirtualNodeProcess]:
    node = VirtualNodeProcess(private_pair, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def _namespace(pair: ClusterPair) -> str:
    return create_namespace(pair, prefix="f")


def _ready(pair: ClusterPair, node: str) -> str:
    found = get(pair.upper.rest(), f"/api/v1/nodes/{node}") or {}
    conditions = found.get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


@pytest.mark.timeout(300)
def test_a_lower_outage_makes_the_node_not_ready_and_loses_nothing(
    private_pair: ClusterPair, node_on_private_pair: VirtualNodeProcess
) -> None:
    pair, node = private_pair, node_on_private_pair
    upper, lower = pair.upper.rest(), pair.lower.rest()
    ns = _namespace(pair)
    create(upper, ns, pod_manifest("before", node=node.name))
    wait_for("before Running", lambda: phase(upper, ns, "before") == "Running")
    lower_uid = (pod(lower, ns, "before") or {})["metadata"]["uid"]

    pair.stop_component("lower-apiserver")
    stopped = time.monotonic()
    # Created during the outage: it must run once the lower cluster is back.
    create(upper, ns, pod_manifest("during", node=node.name))
    # No lease renewals: the upper node lifecycle controller gives up on the node after
    # its grace period (50 s by default).
    wait_for("NotReady", lambda: _ready(pair, node.name) != "True", timeout=90)
    not_ready_after = time.monotonic() - stopped
    time.sleep(max(0.0, 60 - (time.monotonic() - stopped)))
    pair.start_component("lower-apiserver")
    back = time.monotonic()
    wait_for("Ready again", lambda: _ready(pair, node.name) == "True", timeout=30)
    ready_after = time.monotonic() - back

    # The lower cluster's own scheduler and kwok take their time to reconnect after their
    # apiserver's restart (client-go backoff, ~45 s here); that is the lower cluster's
    # business. Ours: the pod exists below at once, and the upper pod follows it quickly.
    wait_for("during created below", lambda: pod(lower, ns, "during") is not None, timeout=15)
    wait_for("during Running below", lambda: phase(lower, ns, "during") == "Running", timeout=120)
    running_below = time.monotonic()
    wait_for("during Running upstairs", lambda: phase(upper, ns, "during") == "Running", timeout=10)
    assert time.monotonic() - running_below < 5
    assert phase(upper, ns, "before") == "Running"
    assert (pod(lower, ns, "before") or {})["metadata"]["uid"] == lower_uid
    node.check()
    assert not_ready_after >= 30
    # One lease renewal interval (10 s), plus the apiserver's own warm-up.
    assert ready_after < 25


def test_a_watch_expired_by_compaction_misses_no_deletion(
    private_pair: ClusterPair, node_on_private_pair: VirtualNodeProcess
) -> None:
    pair, node = private_pair, node_on_private_pair
    upper, lower = pair.upper.rest(), pair.lower.rest()
    ns = _namespace(pair)
    create(upper, ns, pod_manifest("web", node=node.name))
    wait_for("Running", lambda: phase(upper, ns, "web") == "Running")
    relists_before = _relists(node, "lower-pods")

    assert node.process is not None
    node.process.pause()
    try:
        # While the node sleeps: the lower apiserver restarts (dropping the node's watches
        # before anything it should see happens), its pod is deleted below, and history
        # moves on and is compacted away.
        pair.stop_component("lower-apiserver")
        pair.start_component("lower-apiserver")
        lower.request(
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods/web",
            body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
        wait_for("the lower pod gone", lambda: pod(lower, ns, "web") is None)
        for i in range(5):
            create(
                lower,
                ns,
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"churn-{i}"}},
            )
        pair.compact_etcd()
    finally:
        node.process.resume()

    # The watch resumes from a compacted resourceVersion: 410 Gone, a relist, and the
    # deletion found in the relist's difference.
    wait_for("the upper pod Failed", lambda: phase(upper, ns, "web") == "Failed", timeout=60)
    status = (pod(upper, ns, "web") or {})["status"]
    assert status["reason"] == "LowerPodDeleted"
    assert _relists(node, "lower-pods") > relists_before


def _relists(node: VirtualNodeProcess, informer: str) -> float:
    prefix = f'tensile_reflector_relists_total{{informer="{informer}"}}'
    for line in node.metrics().splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
