"""The patrol (vnode.controllers.patrol) on the real fleet: drift made behind the node's
back is repaired within a patrol period, and the event path alone does not repair it.

The node runs as `python -m devcluster.missed_events` (the real command, its reflectors
patched to lose the watch events of chosen informers while a gate file exists): a real
lower cluster never makes a watch lose an event (after an outage or a compaction the
reflector lists again), so the harness makes one, and the test proves the event path
alone does not see the change. A stale upper status needs no fault: the event path never
looks at a status written upstairs by someone else.

With PATROL_PERIOD set to "0" (the patrol off) every test here fails; see the note.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import missed_events
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tensile.kube import config, metadata_protobuf
from tensile.kube.client import METADATA_LIST, ApiClient
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for

PATROL_PERIOD = 3.0
"""Seconds between patrols here (the command's default is minutes)."""
REPAIRED_WITHIN = 2 * PATROL_PERIOD + 18.0
"""Seconds the repair may take: the rest of the period running, one run (its lists, the
looks at a suspect over up to 8 s while the watch could still deliver, a relist), and the
event path's own work."""
LOST = ("lower-pods", "lower-copies-configmaps")
"""The informers whose watch events the gate loses."""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("patrol") / "lose-events"


@pytest.fixture(scope="module")
def patrolled(
    fleet: Fleet, gate: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VirtualNodeProcess]:
    """One node for the module's tests, patrolling every PATROL_PERIOD seconds."""
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-patrol-{secrets.token_hex(3)}",
        log_dir=tmp_path_factory.mktemp("patrol-logs"),
        module="devcluster.missed_events",
        args=[f"--patrol-period={PATROL_PERIOD:g}s"],
        env={missed_events.GATE: str(gate), missed_events.INFORMERS: ",".join(LOST)},
    )
    node.start()
    try:
        yield node
    finally:
        gate.unlink(missing_ok=True)
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


def _running(
    fleet: Fleet, node: VirtualNodeProcess, namespace: str, name: str, **spec: object
) -> None:
    create(fleet.upper.rest(), namespace, pod_manifest(name, node=node.name, spec=dict(spec)))
    wait_for(f"{name} Running", lambda: phase(fleet.upper.rest(), namespace, name) == "Running")


def _lose_events(gate: Path) -> None:
    gate.touch()


def _settle_lost() -> None:
    # The watch events of what the test just did reach the node and are lost meanwhile.
    time.sleep(1.0)


def test_a_lower_pod_deleted_while_its_watch_missed_it_fails_its_upper_pod(
    fleet: Fleet, patrolled: VirtualNodeProcess, gate: Path, namespace: str
) -> None:
    _running(fleet, patrolled, namespace, "lost")
    lower = fleet.lower.rest()
    path = f"/api/v1/namespaces/{namespace}/pods/lost"
    _lose_events(gate)
    try:
        lower.request("DELETE", path, body={"gracePeriodSeconds": 0})
        wait_for("the lower pod gone", lambda: get(lower, path) is None)
        _settle_lost()
    finally:
        gate.unlink()
    # What the event path does when it sees the deletion: the upper pod fails, saying why.
    upper = fleet.upper.rest()
    failed = wait_for(
        "the upper pod Failed",
        lambda: (p := pod(upper, namespace, "lost")) and p["status"].get("phase") == "Failed" and p,
        timeout=REPAIRED_WITHIN,
    )
    assert failed["status"]["reason"] == "LowerPodDeleted"


def test_a_copy_edited_and_one_deleted_below_unseen_are_made_again(
    fleet: Fleet, patrolled: VirtualNodeProcess, gate: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    for name in ("edited", "deleted"):
        create(upper, namespace, _config_map(name, "upstairs"))
    volumes = [{"name": name, "configMap": {"name": name}} for name in ("edited", "deleted")]
    _running(fleet, patrolled, namespace, "uses", volumes=volumes)
    copies = f"/api/v1/namespaces/{namespace}/configmaps"
    _lose_events(gate)
    try:
        lower.request(
            "PATCH",
            f"{copies}/edited",
            body={"data": {"k": "edited below"}},
            content_type="application/merge-patch+json",
        )
        lower.request("DELETE", f"{copies}/deleted")
        _settle_lost()
    finally:
        gate.unlink()
    wait_for(
        "the edited copy repaired",
        lambda: (get(lower, f"{copies}/edited") or {}).get("data") == {"k": "upstairs"},
        timeout=REPAIRED_WITHIN,
    )
    remade = wait_for(
        "the deleted copy made again", lambda: get(lower, f"{copies}/deleted"), timeout=5.0
    )
    assert remade["data"] == {"k": "upstairs"}


def test_an_orphan_lower_pod_with_our_marks_made_unseen_is_deleted(
    fleet: Fleet, patrolled: VirtualNodeProcess, gate: Path, namespace: str
) -> None:
    lower = fleet.lower.rest()
    labels, annotations = ownership.owner_marks(patrolled.owner)
    orphan = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "orphan",
            "labels": labels,
            "annotations": {
                **annotations,
                ownership.UPPER_NAMESPACE_ANNOTATION: namespace,
                ownership.UPPER_UID_ANNOTATION: "a0000000-0000-4000-8000-000000000000",
            },
        },
        # On no node: nothing changes it later, so no later event shows it to the node.
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c", "image": "x"}]},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/orphan"
    _lose_events(gate)
    try:
        create(lower, namespace, orphan)
        _settle_lost()
    finally:
        gate.unlink()
    wait_for(
        "the orphan deleted",
        lambda: (p := get(lower, path)) is None or p["metadata"].get("deletionTimestamp"),
        timeout=REPAIRED_WITHIN,
    )


def test_a_stale_upper_status_is_written_again(
    fleet: Fleet, patrolled: VirtualNodeProcess, namespace: str
) -> None:
    _running(fleet, patrolled, namespace, "stale")
    upper = fleet.upper.rest()
    path = f"/api/v1/namespaces/{namespace}/pods/stale/status"
    upper.request(
        "PATCH",
        path,
        body={"status": {"message": "written by someone else"}},
        content_type="application/merge-patch+json",
    )
    assert (pod(upper, namespace, "stale") or {})["status"].get("message")
    wait_for(
        "the upper status mirrored from below again",
        lambda: (
            "message"
            not in (pod(upper, namespace, "stale") or {"status": {"message": 1}})["status"]
        ),
        timeout=REPAIRED_WITHIN,
    )
    assert (
        _metric(
            patrolled, 'tensile_patrol_mismatches_found_total{kind="pods",reason="stale_status"}'
        )
        >= 1
    )


def _config_map(name: str, value: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"k": value},
    }


def _metric(node: VirtualNodeProcess, series: str) -> float:
    for line in node.metrics().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_node_in_step_shows_no_drift(
    fleet: Fleet, patrolled: VirtualNodeProcess, namespace: str
) -> None:
    # A pod with the namespace's default ServiceAccount (never copied: each lower namespace
    # has its own) and a ConfigMap copy: two whole runs after it runs find nothing.
    create(fleet.upper.rest(), namespace, _config_map("plain", "v"))
    _running(
        fleet,
        patrolled,
        namespace,
        "steady",
        volumes=[{"name": "c", "configMap": {"name": "plain"}}],
    )
    runs = _metric(patrolled, "tensile_patrol_runs_total")
    wait_for(
        "two more patrol runs",
        lambda: _metric(patrolled, "tensile_patrol_runs_total") >= runs + 2,
        timeout=3 * PATROL_PERIOD + 10.0,
    )
    outstanding = [
        line
        for line in patrolled.metrics().splitlines()
        if line.startswith("tensile_patrol_mismatches{") and not line.endswith(" 0.0")
    ]
    assert outstanding == [], "the last run found drift in a node in step"
    # Its lists go through clients of their own (their own rate budget).
    for client in ("upper-patrol", "lower-patrol"):
        series = f'tensile_api_requests_total{{cluster="{client}",code="200",verb="GET"}}'
        assert _metric(patrolled, series) > 0, series


async def test_the_audits_lists_come_in_protobuf_and_say_what_json_says(
    fleet: Fleet, namespace: str
) -> None:
    """The audit's metadata-only list (`METADATA_LIST`) is answered in Kubernetes' protobuf
    encoding by a real apiserver, and reads as the JSON list does: the same keys and
    resourceVersions, page by page, with the same continue tokens' effect."""
    for i in range(3):
        made = _config_map(f"audited-{i}", str(i))
        made["metadata"] = {"name": f"audited-{i}", "labels": {"audit-check": "yes"}}
        create(fleet.upper.rest(), namespace, made)
    only = {"labelSelector": "audit-check=yes"}
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    json_list = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

    def keys(page: dict[str, object]) -> list[tuple[str, str]]:
        items = page.get("items") or []
        assert isinstance(items, list)
        return [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in items]

    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="audit-check") as client:
        raw = await client.session.get(
            client.url(path),
            params={**only, "limit": "2"},
            headers=client.headers({"Accept": METADATA_LIST}),
            server_hostname=client.info.tls_server_name,
        )
        assert raw.content_type == metadata_protobuf.PROTOBUF
        raw.release()
        listed: dict[str, list[list[tuple[str, str]]]] = {}
        for accept in (METADATA_LIST, json_list):
            listed[accept] = [
                keys({"items": page.items})
                async for page in client.pages(path, limit=2, accept=accept)
            ]
    assert listed[METADATA_LIST] == listed[json_list]
    assert [len(page) for page in listed[METADATA_LIST]] == [
        2,
        2,
    ]  # 3 ConfigMaps + kube-root-ca.crt
