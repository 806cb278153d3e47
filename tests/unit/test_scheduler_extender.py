"""The extender's decisions (scheduler.extender, scheduler.summaries): kube-scheduler's
extender/v1 shapes, filter and prioritize over the virtual nodes' placement summaries."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from scheduler import extender, service
from scheduler.summaries import Summaries
from tensile.contracts import clusterselector, lowerhealth
from tensile.placement import fit, summary


def _lower_node(name: str, cpu: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _virtual_node(name: str, *lower: dict[str, Any]) -> dict[str, Any]:
    rooms = [fit.node_room(n, requested={"pods": Fraction(0)}) for n in lower]
    text = summary.render(summary.summarize(rooms))
    return {
        "metadata": {
            "name": name,
            "labels": {"type": "virtual-kubelet"},
            "annotations": {summary.ANNOTATION: text},
        }
    }


def _pod(cpu: str, *, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    annotations = {clusterselector.ANNOTATION: json.dumps(selector)} if selector else {}
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }


@pytest.fixture
def summaries() -> Summaries:
    summaries = Summaries()
    summaries.put(_virtual_node("vn-a", _lower_node("a1", "1"), _lower_node("a2", "1")))
    summaries.put(_virtual_node("vn-b", _lower_node("b1", "8")))
    summaries.put(_virtual_node("vn-c", _lower_node("c1", "2", {"pool": "gpu"})))
    return summaries


FILTER_CASES = [
    # (what, pod, passes, fails)
    ("fits anywhere", _pod("500m"), ["vn-a", "vn-b", "vn-c", "real"], []),
    ("pieces too small on A", _pod("1500m"), ["vn-b", "vn-c", "real"], ["vn-a"]),
    ("fits only B", _pod("4"), ["vn-b", "real"], ["vn-a", "vn-c"]),
    (
        "clusterSelector nodeSelector",
        _pod("100m", selector={"nodeSelector": {"pool": "gpu"}}),
        ["vn-c", "real"],
        ["vn-a", "vn-b"],
    ),
]


@pytest.mark.parametrize(("what", "pod", "passes", "fails"), FILTER_CASES)
def test_filter_passes_what_fits_below_and_what_is_not_virtual(
    summaries: Summaries, what: str, pod: Any, passes: list[str], fails: list[str]
) -> None:
    call = extender.read_extender_args({"pod": pod, "NodeNames": ["vn-a", "vn-b", "vn-c", "real"]})
    result = extender.filter_result(
        call, extender.judge(call, summaries=summaries, policy=extender.Policy())
    )
    assert result["NodeNames"] == passes, what
    assert sorted(result["FailedNodes"]) == fails, what
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["Error"] == ""


def test_the_reason_reads_like_the_schedulers(summaries: Summaries) -> None:
    call = extender.read_extender_args({"Pod": _pod("1500m"), "NodeNames": ["vn-a"]})
    result = extender.filter_result(
        call, extender.judge(call, summaries=summaries, policy=extender.Policy())
    )
    assert result["FailedNodes"] == {
        "vn-a": "lower cluster of vn-a: 0/2 nodes are available: 2 Insufficient cpu."
    }


def test_a_node_list_is_answered_with_a_node_list(summaries: Summaries) -> None:
    nodes = {"items": [{"metadata": {"name": "vn-a"}}, {"metadata": {"name": "vn-b"}}]}
    call = extender.read_extender_args({"Pod": _pod("1500m"), "Nodes": nodes})
    result = extender.filter_result(
        call, extender.judge(call, summaries=summaries, policy=extender.Policy())
    )
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["vn-b"]


def test_prioritize_prefers_the_tightest_hole(summaries: Summaries) -> None:
    call = extender.read_extender_args(
        {"Pod": _pod("1500m"), "NodeNames": ["vn-a", "vn-b", "vn-c", "x"]}
    )
    scores = extender.priorities(
        extender.judge(call, summaries=summaries, policy=extender.Policy())
    )
    assert scores == [
        {"Host": "vn-a", "Score": 0},
        {"Host": "vn-b", "Score": 3},  # 1.5 of 8 free cpu: 1 + round(9 * 0.1875)
        {"Host": "vn-c", "Score": 8},  # 1.5 of 2: 1 + round(9 * 0.75)
        {"Host": "x", "Score": 0},
    ]
    assert all(0 <= s["Score"] <= extender.MAX_EXTENDER_PRIORITY for s in scores)


def test_headroom_scores_zero_but_never_filters(summaries: Summaries) -> None:
    call = extender.read_extender_args({"Pod": _pod("1500m"), "NodeNames": ["vn-c"]})
    verdicts = extender.judge(call, summaries=summaries, policy=extender.Policy(headroom=0.5))
    assert verdicts[0].fits
    assert verdicts[0].score == 0


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([], "JSON object"),
        ({"NodeNames": []}, '"Pod"'),
        ({"pod": {"spec": {}}}, 'neither "NodeNames" nor "Nodes"'),
        ({"pod": {"spec": {}}, "NodeNames": [1]}, "list of node names"),
        ({"pod": {"spec": {}}, "nodes": {"items": 3}}, "NodeList"),
    ],
)
def test_bad_args_say_what_is_wrong(body: Any, error: str) -> None:
    with pytest.raises(extender.BadArgs, match=error):
        extender.read_extender_args(body)


def test_an_unreadable_summary_leaves_the_node_untouched() -> None:
    summaries = Summaries()
    summaries.put({"metadata": {"name": "vn", "annotations": {summary.ANNOTATION: "{"}}})
    assert summaries.get("vn") is None
    assert "not JSON" in summaries.unreadable["vn"]
    call = extender.read_extender_args({"Pod": _pod("100"), "NodeNames": ["vn"]})
    result = extender.filter_result(
        call, extender.judge(call, summaries=summaries, policy=extender.Policy())
    )
    assert result["NodeNames"] == ["vn"]


def test_args_as_go_writes_them_are_read(summaries: Summaries) -> None:
    """extender/v1 has no JSON tags: kube-scheduler writes the field names, a nil Nodes as
    null; keys are matched case-insensitively, as Go reads them."""
    sent = {"Pod": _pod("1500m"), "Nodes": None, "NodeNames": ["vn-a", "vn-b"]}
    call = extender.read_extender_args(sent)
    assert call.names == ("vn-a", "vn-b")
    assert call.nodes is None
    lower = extender.read_extender_args({"pod": _pod("1"), "nodenames": ["x"]})
    assert lower.names == ("x",)


def test_a_node_whose_lower_control_plane_does_not_answer_fits_nothing(
    summaries: Summaries,
) -> None:
    """Its summary is as last seen and a pod bound there would wait for the lower apiserver:
    it fails the filter, saying why, and scores 0; it fits again once the condition turns
    (the verdicts remembered for it are not reused)."""
    recent = extender.Recent()
    pod = {
        **_pod("500m"),
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
    }
    call = extender.read_extender_args({"pod": pod, "NodeNames": ["vn-a", "vn-b"]})

    def judged() -> list[extender.Verdict]:
        return extender.judge(call, summaries=summaries, policy=extender.Policy(), recent=recent)

    assert [v.fits for v in judged()] == [True, True]
    away = _virtual_node("vn-b", _lower_node("b1", "8"))
    condition = {"type": lowerhealth.LOWER_REACHABLE_CONDITION, "status": "False"}
    summaries.put({**away, "status": {"conditions": [condition]}})
    result = extender.filter_result(call, judged())
    assert result["NodeNames"] == ["vn-a"]
    assert result["FailedNodes"] == {
        "vn-b": "lower cluster of vn-b: its control plane does not answer "
        "(LowerControlPlaneReachable is False)"
    }
    assert [p["Score"] for p in extender.priorities(judged())][1] == 0
    summaries.put(away)
    assert [v.fits for v in judged()] == [True, True]


def test_the_informer_keeps_only_whether_the_lower_control_plane_answers() -> None:
    node = _virtual_node("vn", _lower_node("n1", "8"))
    down = {
        **node,
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t"},
                {"type": "LowerControlPlaneReachable", "status": "False", "message": "m"},
            ]
        },
    }
    assert service.slim_node(down)["status"] == {
        "conditions": [{"type": "LowerControlPlaneReachable", "status": "False"}]
    }
    assert "status" not in service.slim_node(node)


def _replica(token: str, **changes: Any) -> dict[str, Any]:
    """A pod of one Deployment as kube-scheduler sends it: each replica's service account
    token volume (and its mount) has a name of its own."""
    container = {
        "name": "main",
        "image": "nginx",
        "resources": {"requests": {"cpu": "500m"}},
        "ports": [{"containerPort": 80, "hostPort": 8080}],
        "volumeMounts": [{"name": f"kube-api-access-{token}", "mountPath": "/var/run"}],
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Always"}],
        "volumes": [{"name": f"kube-api-access-{token}", "projected": {"sources": []}}],
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
    }
    for path, value in changes.items():
        *parents, last = path.split(".")
        target: Any = spec
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return {"metadata": {"name": f"web-{token}", "uid": token}, "spec": spec}


def test_replicas_of_one_deployment_share_their_verdicts() -> None:
    assert extender.judged(_replica("abcde")) == extender.judged(_replica("fghij"))


@pytest.mark.parametrize(
    "change",
    [
        {"containers.0.resources": {"requests": {"cpu": "600m"}}},
        {"containers.0.resources": {"limits": {"memory": "1Gi"}}},
        {"containers.0.ports": [{"containerPort": 80, "hostPort": 9090}]},
        {"initContainers.0.restartPolicy": "OnFailure"},
        {"initContainers.0.resources": {"requests": {"cpu": "1"}}},
        {"nodeSelector": {"disk": "ssd"}},
        {"affinity": {"nodeAffinity": {}}},
        {"tolerations": []},
        {"overhead": {"cpu": "100m"}},
        {"resources": {"requests": {"cpu": "2"}}},
        {"hostname": "web-0"},
    ],
)
def test_a_pod_differing_in_what_a_verdict_reads_is_judged_on_its_own(
    change: dict[str, Any],
) -> None:
    assert extender.judged(_replica("abcde", **change)) != extender.judged(_replica("abcde"))


def test_a_pod_whose_containers_are_not_objects_is_digested_whole() -> None:
    odd = _replica("abcde", containers=["not an object"])
    other = _replica("fghij", containers=["not an object"])
    assert extender.judged(odd) != extender.judged(other), "its volumes count then"
