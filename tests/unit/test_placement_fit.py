"""Would kube-scheduler put the pod on this lower node (tensile.placement.fit), and the
summary that carries a lower cluster's nodes to the scheduler extender
(tensile.placement.summary): tables against the scheduler's rules."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from typing import Any

import pytest

from tensile.placement import fit, summary


def _container(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": {**requests, **extra}}}


def _node(
    name: str = "n1",
    *,
    cpu: str = "2",
    memory: str = "4Gi",
    pods: str = "110",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    ready: str = "True",
    unschedulable: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": pods, **(extra or {})},
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def _room(node: dict[str, Any], used: dict[str, str] | None = None, ports: Any = ()) -> Any:
    requested = {k: Fraction(v) for k, v in (used or {}).items()}
    return fit.node_room(node, requested=requested, held_ports=ports)


CASES = [
    # (what, upstream rule, pod spec, node, used on node, reasons)
    ("fits", "fit.go fitsRequest", {"containers": [_container("1", "1Gi")]}, _node(), {}, ()),
    (
        "cpu short",
        "fit.go fitsRequest: Insufficient cpu",
        {"containers": [_container("1500m")]},
        _node(),
        {"cpu": "1"},
        ("Insufficient cpu",),
    ),
    (
        "exact fit",
        "fit.go: request > allocatable - requested is the refusal, equal fits",
        {"containers": [_container("1")]},
        _node(),
        {"cpu": "1"},
        (),
    ),
    (
        "init container larger than the sum",
        "component-helpers PodRequests: max(init, sum(containers))",
        {
            "initContainers": [_container("3")],
            "containers": [_container("500m"), _container("500m")],
        },
        _node(cpu="2"),
        {},
        ("Insufficient cpu",),
    ),
    (
        "sidecar adds to the containers",
        "component-helpers PodRequests: restartable init containers run alongside",
        {
            "initContainers": [{**_container("1"), "restartPolicy": "Always"}],
            "containers": [_container("1500m")],
        },
        _node(cpu="2"),
        {},
        ("Insufficient cpu",),
    ),
    (
        "overhead counted",
        "component-helpers PodRequests: spec.overhead added",
        {"containers": [_container("1900m")], "overhead": {"cpu": "200m"}},
        _node(cpu="2"),
        {},
        ("Insufficient cpu",),
    ),
    (
        "pod slots",
        "fit.go: Too many pods",
        {"containers": [_container("1m")]},
        _node(pods="3"),
        {"pods": "3"},
        ("Too many pods",),
    ),
    (
        "extended resource missing",
        "fit.go: scalar resources, absent allocatable is 0",
        {"containers": [_container("1m", **{"example.com/gpu": "1"})]},
        _node(),
        {},
        ("Insufficient example.com/gpu",),
    ),
    (
        "extended resource present",
        "fit.go: scalar resources",
        {"containers": [_container("1m", **{"example.com/gpu": "1"})]},
        _node(extra={"example.com/gpu": "2"}),
        {"example.com/gpu": "1"},
        (),
    ),
    (
        "cordoned",
        "nodeunschedulable: spec.unschedulable without the toleration",
        {"containers": [_container("1m")]},
        _node(unschedulable=True),
        {},
        (fit.REASON_UNSCHEDULABLE,),
    ),
    (
        "cordoned, tolerated",
        "nodeunschedulable: tolerating node.kubernetes.io/unschedulable:NoSchedule",
        {
            "containers": [_container("1m")],
            "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
        },
        _node(unschedulable=True),
        {},
        (),
    ),
    (
        "not ready",
        "node lifecycle controller's not-ready taint",
        {"containers": [_container("1m")]},
        _node(ready="Unknown"),
        {},
        (fit.REASON_NOT_READY,),
    ),
    (
        "not ready, tolerated",
        "tainttoleration: the not-ready taint tolerated",
        {
            "containers": [_container("1m")],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
        _node(ready="False"),
        {},
        (),
    ),
    (
        "nodeSelector",
        "nodeaffinity: nodeSelector",
        {"containers": [_container("1m")], "nodeSelector": {"pool": "big"}},
        _node(labels={"pool": "small"}),
        {},
        (fit.REASON_AFFINITY,),
    ),
    (
        "required affinity",
        "nodeaffinity: required terms ORed",
        {
            "containers": [_container("1m")],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "pool", "operator": "In", "values": ["x"]}
                                ]
                            },
                            {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
                        ]
                    }
                }
            },
        },
        _node(labels={"pool": "small"}),
        {},
        (),
    ),
    (
        "NoSchedule taint",
        "tainttoleration: untolerated NoSchedule",
        {"containers": [_container("1m")]},
        _node(taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
        {},
        ("node(s) had untolerated taint {gpu: yes}",),
    ),
    (
        "PreferNoSchedule taint",
        "tainttoleration: PreferNoSchedule only scores",
        {"containers": [_container("1m")]},
        _node(taints=[{"key": "gpu", "effect": "PreferNoSchedule"}]),
        {},
        (),
    ),
    (
        "NoExecute tolerated",
        "tainttoleration: Exists tolerates any value",
        {
            "containers": [_container("1m")],
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}],
        },
        _node(taints=[{"key": "gpu", "value": "a", "effect": "NoExecute"}]),
        {},
        (),
    ),
]


@pytest.mark.parametrize(("what", "rule", "spec", "node", "used", "reasons"), CASES)
def test_unfit_follows_the_scheduler(
    what: str, rule: str, spec: Any, node: Any, used: Any, reasons: tuple[str, ...]
) -> None:
    assert fit.unfit(fit.need_of(spec), _room(node, used)) == reasons, (what, rule)


PORT = {"containerPort": 80, "hostPort": 8080}
PORT_CASES = [
    # (pod's port, held on the node, conflict?) -- nodeports / HostPortInfo.CheckConflict
    (PORT, [("0.0.0.0", "TCP", 8080)], True),
    (PORT, [("0.0.0.0", "UDP", 8080)], False),
    ({**PORT, "hostIP": "10.0.0.1"}, [("10.0.0.2", "TCP", 8080)], False),
    ({**PORT, "hostIP": "10.0.0.1"}, [("0.0.0.0", "TCP", 8080)], True),
    (PORT, [("10.0.0.2", "TCP", 8080)], True),
    ({"containerPort": 80}, [("0.0.0.0", "TCP", 80)], False),
]


@pytest.mark.parametrize(("port", "held", "conflict"), PORT_CASES)
def test_host_ports_conflict_as_node_ports_says(port: Any, held: Any, conflict: bool) -> None:
    spec = {"containers": [{"name": "c", "ports": [port]}]}
    reasons = fit.unfit(fit.need_of(spec), _room(_node(), ports=held))
    assert (fit.REASON_PORTS in reasons) is conflict


def test_units_round_up_as_quantities_do() -> None:
    assert fit.units({"cpu": Fraction(1, 3000), "memory": Fraction(3, 2)}) == {
        "cpu": 1,
        "memory": 2,
    }


def _summary(*rooms: fit.NodeRoom) -> summary.Summary:
    return summary.parse(summary.render(summary.summarize(rooms)))


def test_the_summary_says_no_when_cpu_is_in_pieces_too_small() -> None:
    pieces = _summary(_room(_node("a1", cpu="1")), _room(_node("a2", cpu="1")))
    need = fit.need_of({"containers": [_container("1500m")]})
    choice = pieces.best_fit(need)
    assert choice.node is None
    assert choice.message() == "0/2 nodes are available: 2 Insufficient cpu."


def test_the_summary_picks_the_tightest_hole() -> None:
    rooms = _summary(
        _room(_node("big", cpu="8")), _room(_node("small", cpu="2")), _room(_node("tiny", cpu="1"))
    )
    choice = rooms.best_fit(fit.need_of({"containers": [_container("1500m")]}))
    assert choice.node == "small"
    assert choice.tightness == pytest.approx(0.75)


def test_the_summary_keeps_node_names_for_hostname_selectors() -> None:
    rooms = _summary(_room(_node("a1", cpu="1")), _room(_node("a2", cpu="4")))
    need = fit.need_of(
        {"containers": [_container("2")], "nodeSelector": {"kubernetes.io/hostname": "a1"}}
    )
    choice = rooms.best_fit(need)
    assert choice.node is None
    assert choice.reasons == {fit.REASON_AFFINITY: 1, "Insufficient cpu": 1}


def test_the_summary_agrees_with_unfit_node_by_node() -> None:
    """Never "no" where the node-by-node rules say "yes": every case of the table, as a
    one-node cluster."""
    for what, _, spec, node, used, reasons in CASES:
        choice = _summary(_room(node, used)).best_fit(fit.need_of(spec))
        assert (choice.node is not None) == (not reasons), what


def test_the_summarys_reasons_are_the_node_by_node_reasons_counted() -> None:
    """Rows of equal room are judged once; the counts are still every node's, host ports
    included (two rows of equal free room, one holding the pod's port)."""
    rooms = [
        _room(_node("a1", cpu="1", memory="8Gi")),
        _room(_node("a2", cpu="1", memory="8Gi")),
        _room(_node("a3", cpu="1", memory="8Gi")),
        _room(_node("b1", cpu="4", memory="1Gi")),
        _room(_node("b2", cpu="4", memory="1Gi"), ports=[("0.0.0.0", "TCP", 8080)]),
        _room(_node("c1", cpu="4", memory="8Gi", pods="1"), {"pods": "1"}),
    ]
    spec = {
        "containers": [
            {**_container("2", "2Gi"), "ports": [{"containerPort": 80, "hostPort": 8080}]}
        ]
    }
    need = fit.need_of(spec)
    choice = _summary(*rooms).best_fit(need)
    expected: dict[str, int] = {}
    for room in rooms:
        for reason in fit.unfit(need, room):
            expected[reason] = expected.get(reason, 0) + 1
    assert choice.node is None
    assert choice.reasons == expected
    assert expected == {
        "Insufficient cpu": 3,
        "Insufficient memory": 2,
        fit.REASON_PORTS: 1,
        fit.REASON_TOO_MANY_PODS: 1,
    }


def test_headroom_is_the_share_kept_free() -> None:
    rooms = _summary(_room(_node("a", cpu="10", memory="10Gi")))
    need = fit.need_of({"containers": [_container("8")]})
    assert rooms.keeps_headroom(need, headroom=0.2)
    assert not rooms.keeps_headroom(need, headroom=0.25)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "not JSON"),
        ('{"v": 2}', "version 1"),
        ('{"v": 1, "res": ["cpu"], "classes": [], "nodes": [["a", 0, [1]]]}', "bad name or class"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", 0, ["x"]]]}', "1 integers"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", 0, [1.5]]]}', "1 integers"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", 0, [true]]]}', "1 integers"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", 0, [1, 2]]]}', "1 integers"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", true, [1]]]}', "bad name"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [{"a": 0}]}', "must be \\[name"),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", 0, [1], ["x/TCP"]]]}', "port"),
        (
            '{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [["a", 0, [1], ["x/TCP/\u00b2"]]]}',
            "port",
        ),
        ('{"v": 1, "res": ["cpu"], "classes": [{}], "nodes": [], "alloc": [1.0]}', "alloc"),
    ],
)
def test_a_malformed_summary_is_refused_with_its_reason(text: str, error: str) -> None:
    with pytest.raises(summary.SummaryError, match=error):
        summary.parse(text)


def _reference_best_fit(raw: dict[str, Any], need: fit.PodNeed) -> tuple[str | None, float]:
    """The summary's rule written plainly, node by node with `fit.unfit`: per class, its
    first node in ascending free cpu that fits; of those, the greatest tightness, the first
    class on a tie."""
    parsed = summary.Summary(raw)
    rooms = {room.name: room for room in parsed.rows()}
    best: tuple[float, str] | None = None
    for index in range(len(raw["classes"])):
        rows = sorted(
            (row for row in raw["nodes"] if row[1] == index), key=lambda row: row[2][0]
        )  # stable: ties keep the summary's order, as the class does
        for row in rows:
            room = rooms[row[0]]
            if not fit.unfit(need, room):
                share = fit.tightness(need, room.free)
                if best is None or share > best[0]:
                    best = (share, row[0])
                break
    return (None, 0.0) if best is None else (best[1], best[0])


def _random_summary(rng: random.Random) -> dict[str, Any]:
    """Nodes of few sizes, some of a label of their own (a class each), some without the
    disk label, some with a GPU, some cordoned, not ready or tainted, with some pods on them
    (more than fits, on some: free room below 0, as static pods and shrunk allocatable
    make it)."""
    rooms = []
    for i in range(rng.randint(1, 40)):
        labels = {"zone": rng.choice(("a", "b")), "disk": rng.choice(("ssd", "hdd"))}
        if rng.random() < 0.2:
            del labels["disk"]
        if rng.random() < 0.5:
            labels["index"] = str(i)
        taints = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
        node = _node(
            f"n{i}",
            cpu=rng.choice(("2", "4", "8")),
            memory=rng.choice(("4Gi", "8Gi", "16Gi")),
            labels=labels,
            taints=taints if rng.random() < 0.2 else None,
            ready=rng.choice(("True", "True", "True", "False")),
            unschedulable=rng.random() < 0.1,
            pods=rng.choice(("1", "110", "110")),
            extra={"example.com/gpu": "2"} if rng.random() < 0.3 else None,
        )
        used = {
            "pods": str(rng.randint(0, 1)),
            "cpu": str(rng.choice((0, 0.5, 1, 1.5, 9))),
            "memory": str(rng.choice((0, 1, 2, 3, 20)) * 2**30),
        }
        ports = [("0.0.0.0", "TCP", 8080)] if rng.random() < 0.2 else []
        rooms.append(_room(node, used, ports))
    return summary.summarize(rooms)


def _random_need(rng: random.Random) -> fit.PodNeed:
    spec: dict[str, Any] = {
        "containers": [
            _container(
                rng.choice(("100m", "500m", "1", "2", "3", None)),
                rng.choice(("256Mi", "1Gi", "4Gi", "9Gi", None)),
            )
        ]
    }
    if rng.random() < 0.2:
        spec["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    if rng.random() < 0.15:
        spec["containers"][0]["resources"]["requests"]["example.com/gpu"] = "1"
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"zone": rng.choice(("a", "b"))}
    if rng.random() < 0.3:
        disk = rng.choice(("ssd", "hdd"))
        expression = rng.choice(
            (
                {"key": "disk", "operator": "In", "values": [disk]},
                {"key": "disk", "operator": "NotIn", "values": [disk]},
                {"key": "disk", "operator": rng.choice(("Exists", "DoesNotExist"))},
            )
        )
        terms = [{"matchExpressions": [expression]}]
        if rng.random() < 0.3:
            terms.append({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]})
        spec["affinity"] = {"nodeAffinity": {fit.REQUIRED: {"nodeSelectorTerms": terms}}}
    if rng.random() < 0.2:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    if rng.random() < 0.1:
        spec["nodeSelector"] = {"kubernetes.io/hostname": f"n{rng.randint(0, 10)}"}
    return fit.need_of(spec)


def _check_against_the_rule(
    parsed: summary.Summary, raw: dict[str, Any], rng: random.Random
) -> None:
    for _ in range(25):
        need = _random_need(rng)
        choice = parsed.best_fit(need)
        assert (choice.node, choice.tightness) == _reference_best_fit(raw, need)
        quiet = parsed.best_fit(need, explain=False)
        assert (quiet.node, quiet.tightness, quiet.reasons) == (choice.node, choice.tightness, {})
        if choice.node is None:
            expected: dict[str, int] = {}
            for room in parsed.rows():
                for reason in fit.unfit(need, room):
                    expected[reason] = expected.get(reason, 0) + 1
            assert choice.reasons == expected


@pytest.mark.parametrize("seed", range(40))
def test_the_summarys_best_fit_and_reasons_are_the_rule_node_by_node(seed: int) -> None:
    rng = random.Random(seed)
    raw = _random_summary(rng)
    parsed = summary.parse(summary.render(raw))
    _check_against_the_rule(parsed, raw, rng)

    # The next summary, parsed with this one as `previous` (whose classes and groupings
    # it takes over where they still hold): its room moved, and sometimes its classes.
    moved = json.loads(summary.render(raw))
    for row in moved["nodes"]:
        row[2][0] += rng.choice((-500, 0, 500))  # below 0 on some
    if rng.random() < 0.5:
        moved["classes"][0]["labels"]["zone"] = "c"
    if rng.random() < 0.3:
        moved["classes"].append({"labels": {"zone": "a"}, "taints": [], "ready": True})
        moved["nodes"][-1][1] = len(moved["classes"]) - 1
    _check_against_the_rule(summary.Summary(moved, previous=parsed), moved, rng)
