"""`kubectl tensile`'s pure reports (kubectl_tensile.status, .why) and their rendering
(.render): tables of objects as the clusters hold them."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import yaml

from kubectl_tensile import render, status, why
from tensile.contracts import avoidance

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def _ago(seconds: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _node(name: str = "vn-a", *, ready: str = "True", **allocatable: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"type": "virtual-kubelet"}},
        "status": {
            "allocatable": allocatable or {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [
                {"type": "Ready", "status": ready, "reason": "KubeletNotReady" if ready != "True"
                 else "KubeletReady", "message": "lower cluster unreachable"}
            ],
        },
    }  # fmt: skip


def _lease(age: float, duration: int = 40) -> dict[str, Any]:
    return {"spec": {"renewTime": _ago(age), "leaseDurationSeconds": duration}}


def _pod(
    name: str, *, node: str = "vn-a", cpu: str = "500m", phase: str = "Running", **extra: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}",
                     **extra.pop("metadata", {})},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {
            "cpu": cpu, "memory": "1Gi"}}}], **extra.pop("spec", {})},
        "status": {"phase": phase, **extra.pop("status", {})},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("ready", "lease", "state"),
    [
        ("True", _lease(5), "ok"),
        ("True", _lease(41), "stale"),
        ("True", _lease(41, duration=60), "ok"),
        ("True", None, "stale"),
        ("False", _lease(5), "down"),
        ("Unknown", _lease(500), "down"),
    ],
)
def test_health(ready: str, lease: dict[str, Any] | None, state: str) -> None:
    assert status.health(_node(ready=ready), lease, now=NOW)["state"] == state


def test_health_of_a_node_whose_lower_control_plane_does_not_answer() -> None:
    node = _node(ready="True")
    node["status"]["conditions"].append(
        {"type": "LowerControlPlaneReachable", "status": "False",
         "reason": "LowerControlPlaneUnreachable", "message": "not answered since T"}
    )  # fmt: skip
    found = status.health(node, _lease(5), now=NOW)
    assert (found["state"], found["reason"], found["message"]) == (
        "unreachable",
        "LowerControlPlaneUnreachable",
        "not answered since T",
    )


UNPLACEABLE = {
    "phase": "Pending",
    "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available", "lastTransitionTime": _ago(90)}],
}  # fmt: skip


def test_usage_counts_live_pods_requests() -> None:
    pods = [
        _pod("a", cpu="1500m"),
        _pod("b", cpu="500m"),
        _pod("done", cpu="2", phase="Succeeded"),  # terminal: frees its requests
    ]
    assert status.usage(_node(), pods) == {
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "used": {"cpu": "2", "memory": "2Gi", "pods": "2"},
        "free": {"cpu": "2", "memory": "6Gi", "pods": "108"},
        "pods": 2,
    }


def test_status_report_and_pending_moves() -> None:
    owner = avoidance.Owner(uid="u1", api_version="apps/v1", kind="ReplicaSet",
                            namespace="shop", name="web-1")  # fmt: skip
    record = {
        "u1": avoidance.render_entry(
            avoidance.Avoidance(
                owner=owner,
                nodes={"vn-a": NOW + dt.timedelta(minutes=5), "vn-b": NOW - dt.timedelta(1)},
            )
        ),
        "broken": "not json",
    }
    gated = _pod("web-2-d1", node="", phase="Pending", spec={"schedulingGates": [
        {"name": "tensile.io/descheduler"}]}, metadata={"annotations": {
        "tensile.io/replaces": "web-2", "tensile.io/replaces-uid": "x"}})  # fmt: skip
    report = status.status(
        nodes=[_node("vn-b", ready="False"), _node("vn-a")],
        leases={"vn-a": _lease(3), "vn-b": _lease(100)},
        pods=[_pod("web-1"), _pod("stuck", phase="Pending", status=UNPLACEABLE), gated],
        record=record,
        lower_ready={"vn-a": "ok"},
        now=NOW,
    )
    assert [n["name"] for n in report["nodes"]] == ["vn-a", "vn-b"]
    assert report["nodes"][0]["pendingMoves"] == 1
    assert report["nodes"][0]["lower"]["readyz"] == "ok"
    assert report["pendingMoves"] == {
        "unplaceable": [{"pod": "shop/stuck", "node": "vn-a", "forSeconds": 90,
                         "message": "0/3 nodes are available"}],
        "avoidances": [{"owner": "ReplicaSet shop/web-1", "ownerUID": "u1", "node": "vn-a",
                        "until": "2026-03-01T12:05:00Z", "remainingSeconds": 300}],
        "reCreations": [{"pod": "shop/web-2-d1", "replaces": "web-2"}],
    }  # fmt: skip
    text = render.render(report, command="status", output="text")
    assert text.splitlines()[:3] == [
        "NODE  LOWER         BEAT  CPU USED/FREE  MEM USED/FREE  PODS   MOVES",
        "vn-a  ok/readyz ok  3s    1/3            2Gi/6Gi        2/110  1",
        "vn-b  down          100s  0/4            0/8Gi          0/110  0",
    ]
    assert "vn-b: KubeletNotReady: lower cluster unreachable" in text
    assert "  shop/stuck on vn-a: unplaceable below 90s" in text
    assert "  ReplicaSet shop/web-1 avoids vn-a for 5m more" in text
    assert "  shop/web-2-d1 being re-created (replaces web-2)" in text
    assert json.loads(render.render(report, command="status", output="json")) == report
    assert yaml.safe_load(render.render(report, command="status", output="yaml")) == report


def test_table_narrows_the_first_column_to_fit() -> None:
    lines = render.table(("NODE", "X"), [("n" * 120, "y" * 10)], width=40)
    assert all(len(line) <= 40 for line in lines)
    assert lines[1].startswith("n" * 25 + "...")


@pytest.mark.parametrize(
    ("pod", "node", "state", "reason"),
    [
        (_pod("a", metadata={"deletionTimestamp": _ago(1)}), _node(), "deleting",
         "the pod is being deleted"),
        (_pod("a", node="", phase="Pending", spec={"schedulingGates": [
            {"name": "tensile.io/descheduler"}]}), None, "re-creating",
         "held back by the descheduler's scheduling gate: it is the replacement, released "
         "once the old pod is gone"),
        (_pod("a", node="", phase="Pending", status={"conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": "0/5 nodes"}]}), None,
         "unscheduled", "not scheduled upstairs (Unschedulable: 0/5 nodes)"),
        (_pod("a", node="", phase="Pending"), None, "unscheduled",
         "not scheduled upstairs (no scheduling decision yet)"),
        (_pod("a", node="w1"), {"metadata": {"name": "w1", "labels": {}}}, "not-virtual",
         "runs on w1, an ordinary node: tensile plays no part"),
        (_pod("a", phase="Pending", status=UNPLACEABLE), _node(), "unplaceable-below",
         "bound to virtual node vn-a, whose lower cluster cannot place it for 90s: 0/3 nodes "
         "are available; the descheduler moves it once --unschedulable-timeout has passed"),
        (_pod("a"), _node(), "on-virtual-node", "runs on virtual node vn-a (phase Running)"),
    ],
)  # fmt: skip
def test_placement(pod: dict[str, Any], node: Any, state: str, reason: str) -> None:
    found = why.placement(pod, node, now=NOW)
    assert (found["state"], found["reason"]) == (state, reason)


@pytest.mark.parametrize(
    ("annotations", "changes"),
    [
        ({}, []),
        ({"clusterSelector": "{}"}, ["converted by the webhook; nothing needed moving"]),
        ({"clusterSelector": "{"}, ["annotation clusterSelector is not readable: {"]),
        (
            {
                "clusterSelector": json.dumps({
                    "nodeSelector": {"zone": "b", "disk": "ssd"},
                    "tolerations": [{"key": "k", "operator": "Exists"}],
                }),
                "tensile.io/avoided-nodes": "vn-b,vn-c",
            },
            [
                "nodeSelector moved below (for the lower scheduler): disk=ssd, zone=b",
                "1 toleration(s) kept for below; the virtual nodes' taint tolerated upstairs",
                "kept off virtual node(s) vn-b, vn-c (the descheduler's avoidance record)",
            ],
        ),
    ],
)  # fmt: skip
def test_webhook_changes(annotations: dict[str, str], changes: list[str]) -> None:
    assert why.webhook_changes(_pod("a", metadata={"annotations": annotations})) == changes


def test_why_text_fits_and_names_everything() -> None:
    pod = _pod("web-2-d1", metadata={"annotations": {
        "tensile.io/replaces": "web-2", "tensile.io/replaces-uid": "x",
        "sigs.k8s.io/deschedule-count": "2"}})  # fmt: skip
    lower_pod = _pod("web-2-d1", node="lower-node-1")
    event = {"type": "Warning", "reason": "FailedScheduling", "lastTimestamp": _ago(30),
             "message": "x" * 200, "count": 3}  # fmt: skip
    report = why.why(
        pod=pod,
        node=_node(),
        pod_events=[event],
        record=None,
        lower={"pod": lower_pod, "events": [event]},
        now=NOW,
    )
    text = render.render(report, command="why", output="text")
    assert all(len(line) <= 80 for line in text.splitlines())
    assert text.splitlines()[:3] == [
        "Pod shop/web-2-d1",
        "  runs on virtual node vn-a (phase Running)",
        "Lower: pod shop/web-2-d1 on node lower-node-1 (Running)",
    ]
    assert "  - replaces pod web-2 (re-created by the descheduler)" in text
    assert "  - moved 2 time(s) by the descheduler" in text
    assert "   30s  Warning FailedScheduling: xxx" in text
    not_read = why.why(pod=pod, node=_node(), pod_events=[], record=None, lower=None, now=NOW)
    assert "Lower: not read (add --lower vn-a=KUBECONFIG)" in render.why_text(not_read)
