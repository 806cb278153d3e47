"""Faults of a real control plane: a watch expired by compaction, and a status that changes
while the upper apiserver is down. What a lower outage does, and every other partition, is
the partition contract's: tests/e2e/test_partitions.py.

Each test runs on a fleet of its own (one kwok node), since it stops and restarts components.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devcluster.cluster import FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, phase, pod, pod_manifest, wait_for
from tests.fixtures import create_namespace

NODE_GRACE = 20.0
"""Seconds the upper node lifecycle controller waits for a heartbeat before NotReady."""


@pytest.fixture
def own_fleet(start_fleet: Callable[[FleetSettings], Fleet]) -> Fleet:
    # A 20 s node grace period (Kubernetes' default is 50 s) keeps the outages short.
    return start_fleet(
        FleetSettings(
            lowers=(LowerClusterSettings(nodes=1),),
            metrics_server=False,
            node_monitor_grace_period=f"{NODE_GRACE:g}s",
        )
    )


@pytest.fixture
def node_on_own_fleet(own_fleet: Fleet, tmp_path: Path) -> Iterator[VirtualNodeProcess]:
    node = VirtualNodeProcess(own_fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def _namespace(fleet: Fleet) -> str:
    return create_namespace((fleet.upper, fleet.lower), prefix="f")


def test_a_watch_expired_by_compaction_misses_no_deletion(
    own_fleet: Fleet, node_on_own_fleet: VirtualNodeProcess
) -> None:
    fleet, node = own_fleet, node_on_own_fleet
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    ns = _namespace(fleet)
    create(upper, ns, pod_manifest("web", node=node.name))
    wait_for("Running", lambda: phase(upper, ns, "web") == "Running")
    relists_before = _relists(node, "lower-pods")

    assert node.process is not None
    node.process.pause()
    try:
        # While the node sleeps: the lower apiserver restarts (dropping the node's watches
        # before anything it should see happens), its pod is deleted below, and history
        # moves on and is compacted away.
        fleet.stop_component("lower-apiserver")
        fleet.start_component("lower-apiserver")
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
        fleet.compact_etcd()
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


# The status is retried on its own short interval for as long as an outage lasts, outside
# the work queue's retry budget; that the retries are unlimited is shown without waiting in
# tests/unit/test_pod_controller_status.py. Here: an outage of ten retries, end to end.
_OUTAGE = 20.0


@pytest.mark.timeout(300)
def test_a_status_that_changes_while_the_upper_cluster_is_down_lands_when_it_returns(
    own_fleet: Fleet, node_on_own_fleet: VirtualNodeProcess
) -> None:
    fleet, node = own_fleet, node_on_own_fleet
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    ns = _namespace(fleet)
    create(upper, ns, pod_manifest("job", node=node.name, spec={"restartPolicy": "Never"}))
    wait_for("job Running", lambda: phase(upper, ns, "job") == "Running")

    fleet.stop_component("upper-apiserver")
    stopped = time.monotonic()
    # The pod completes below while nobody upstairs can hear of it.
    below = pod(lower, ns, "job") or {}
    started_at = below["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    terminated = {
        "exitCode": 3,
        "reason": "Error",
        "startedAt": started_at,
        "finishedAt": started_at,
    }
    lower.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/job/status",
        body={
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        **below["status"]["containerStatuses"][0],
                        "ready": False,
                        "started": False,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
        content_type="application/strategic-merge-patch+json",
    )
    time.sleep(max(0.0, _OUTAGE - (time.monotonic() - stopped)))
    fleet.start_component("upper-apiserver")

    wait_for("job Failed upstairs", lambda: phase(upper, ns, "job") == "Failed", timeout=60)
    status = (pod(upper, ns, "job") or {})["status"]
    [container] = status["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 3
    node.check()
