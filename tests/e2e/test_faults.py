"""Faults a real lower cluster has: an outage of its apiserver, and a watch expired by compaction.

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
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for
from tests.fixtures import create_namespace

NODE_GRACE = 20.0
"""Seconds the upper node lifecycle controller waits for a heartbeat before NotReady."""
LEASE_RENEW_INTERVAL = 10.0
LOWER_CLIENTS = ("lower-scheduler", "lower-kwok")
"""The lower control plane's own clients, down with its apiserver in an outage."""


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


def _ready(fleet: Fleet, node: str) -> str:
    found = get(fleet.upper.rest(), f"/api/v1/nodes/{node}") or {}
    conditions = found.get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


@pytest.mark.timeout(300)
def test_a_lower_outage_makes_the_node_not_ready_and_loses_nothing(
    own_fleet: Fleet, node_on_own_fleet: VirtualNodeProcess
) -> None:
    fleet, node = own_fleet, node_on_own_fleet
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    ns = _namespace(fleet)
    create(upper, ns, pod_manifest("before", node=node.name))
    create(upper, ns, pod_manifest("doomed", node=node.name))
    wait_for("before Running", lambda: phase(upper, ns, "before") == "Running")
    wait_for("doomed Running", lambda: phase(upper, ns, "doomed") == "Running")
    lower_uid = (pod(lower, ns, "before") or {})["metadata"]["uid"]

    # The whole lower control plane goes down and comes back: its scheduler and kwok start
    # fresh after the apiserver instead of waiting out client-go's reconnect backoff (up to
    # ~45 s here, the lower cluster's business, not what this test is about).
    for component in LOWER_CLIENTS:
        fleet.stop_component(component)
    fleet.stop_component("lower-apiserver")
    stopped = time.monotonic()
    # Created during the outage: they must run once the lower cluster is back, the one that
    # may never restart too (an unreachable lower cluster fails no pod).
    create(upper, ns, pod_manifest("during", node=node.name))
    create(upper, ns, pod_manifest("once", node=node.name, spec={"restartPolicy": "Never"}))
    # Force-deleted (kubectl delete --force --grace-period=0): the upper pod is gone at once,
    # while its lower pod cannot be deleted yet; that deletion must wait, not be forgotten.
    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{ns}/pods/doomed",
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
    )
    assert pod(upper, ns, "doomed") is None
    # No lease renewals: the upper node lifecycle controller gives up on the node after
    # its grace period.
    wait_for("NotReady", lambda: _ready(fleet, node.name) != "True", timeout=NODE_GRACE + 40)
    not_ready_after = time.monotonic() - stopped
    time.sleep(max(0.0, NODE_GRACE + 10 - (time.monotonic() - stopped)))
    fleet.start_component("lower-apiserver")
    back = time.monotonic()
    for component in LOWER_CLIENTS:
        fleet.start_component(component)
    wait_for("Ready again", lambda: _ready(fleet, node.name) == "True", timeout=30)
    ready_after = time.monotonic() - back
    # The lower pod of the deleted upper pod goes once the lower cluster answers again.
    wait_for("doomed gone below", lambda: pod(lower, ns, "doomed") is None, timeout=15)

    # Ours: the pod exists below at once, and the upper pod follows it quickly.
    wait_for("during created below", lambda: pod(lower, ns, "during") is not None, timeout=15)
    wait_for("during Running below", lambda: phase(lower, ns, "during") == "Running", timeout=60)
    running_below = time.monotonic()
    wait_for("during Running upstairs", lambda: phase(upper, ns, "during") == "Running", timeout=10)
    assert time.monotonic() - running_below < 5
    assert phase(upper, ns, "before") == "Running"
    assert (pod(lower, ns, "before") or {})["metadata"]["uid"] == lower_uid
    wait_for("once Running upstairs", lambda: phase(upper, ns, "once") == "Running", timeout=30)
    node.check()
    # Not before the grace period counted from the last renewal (at most one interval
    # before the outage): the node itself does not give up sooner.
    assert not_ready_after >= NODE_GRACE - LEASE_RENEW_INTERVAL
    # One lease renewal interval (10 s), plus the apiserver's own warm-up.
    assert ready_after < 25


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
