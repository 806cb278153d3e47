"""What a virtual node publishes for its lower nodes (`LowerPodBook.rooms`, the slim lower
pod's host ports) and how the extender reuses a verdict between filter and prioritize
(`scheduler.extender.Recent`)."""

from __future__ import annotations

from typing import Any

from scheduler import extender
from scheduler.summaries import Summaries
from tensile.contracts import ownership
from tensile.placement import fit
from tests.unit.test_lower_pod_book import NODE, OTHER, lower_pod
from tests.unit.test_scheduler_extender import _lower_node, _pod, _virtual_node
from vnode.providers.k2k.lowerpods import LowerPodBook
from vnode.providers.k2k.slim import slim_lower_pod

OWNER = ownership.NodeIdentity(node_name="vn-1", cluster_id="c-1")


def _with_port(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["containers"][0]["ports"] = [
        {"containerPort": 80, "hostPort": 8080},
        {"containerPort": 81},
    ]
    return pod


def test_rooms_count_every_pod_ours_too_and_their_host_ports() -> None:
    book = LowerPodBook(owner=OWNER)
    ours = slim_lower_pod(_with_port(lower_pod("ours", cpu="1")), owner=OWNER)
    theirs = slim_lower_pod(lower_pod("theirs", owner=OTHER, cpu="2"), owner=OWNER)
    book.seen(ours)
    book.seen(theirs)
    [room] = book.rooms([NODE])
    assert room.free["cpu"] == 1000  # 4 cores less 1 (ours) and 2 (another's)
    assert room.free["pods"] == 108
    assert room.host_ports == {("0.0.0.0", "TCP", 8080)}
    assert book.free([NODE])["cpu"] == 2  # the capacity still leaves our own pods out
    book.gone(ours)
    [room] = book.rooms([NODE])
    assert room.free["cpu"] == 2000
    assert room.host_ports == frozenset()


def test_the_slim_pod_keeps_only_host_ports() -> None:
    slim = slim_lower_pod(_with_port(lower_pod("p")), owner=OWNER)
    assert slim["spec"]["containers"][0]["ports"] == [{"containerPort": 80, "hostPort": 8080}]
    assert fit.host_ports(slim["spec"]) == {("0.0.0.0", "TCP", 8080)}


def test_prioritize_reuses_filters_verdicts_and_filter_never_takes_one_without_reasons() -> None:
    summaries = Summaries()
    summaries.put(_virtual_node("vn-a", _lower_node("a1", "1")))
    pod = _pod("1500m")
    pod["metadata"].update(uid="u1", resourceVersion="7")
    call = extender.read_extender_args({"Pod": pod, "NodeNames": ["vn-a"]})
    recent = extender.Recent()
    policy = extender.Policy()
    [after_prioritize] = extender.judge(
        call, summaries=summaries, policy=policy, recent=recent, explain=False
    )
    assert after_prioritize.choice is not None
    assert after_prioritize.choice.reasons == {}
    [after_filter] = extender.judge(call, summaries=summaries, policy=policy, recent=recent)
    assert after_filter is not after_prioritize  # judged again, to explain
    assert after_filter.choice is not None
    assert after_filter.choice.reasons == {"Insufficient cpu": 1}
    [again] = extender.judge(call, summaries=summaries, policy=policy, recent=recent, explain=False)
    assert again is after_filter
    # what was judged is the pod's spec and clusterSelector, not its UID or version: a new
    # version of the same spec is judged alike, a changed spec afresh
    pod["metadata"]["resourceVersion"] = "8"
    same = extender.read_extender_args({"Pod": pod, "NodeNames": ["vn-a"]})
    assert extender.judge(same, summaries=summaries, policy=policy, recent=recent) == [again]
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    changed = extender.read_extender_args({"Pod": pod, "NodeNames": ["vn-a"]})
    [fresh] = extender.judge(changed, summaries=summaries, policy=policy, recent=recent)
    assert fresh is not after_filter


def test_a_call_cannot_plant_a_verdict_for_another_pod() -> None:
    """A caller that names a pending pod's UID and resourceVersion with a spec of its own
    (one that fits) leaves no verdict the real pod's call would take."""
    summaries = Summaries()
    summaries.put(_virtual_node("vn-a", _lower_node("a1", "1")))
    recent, policy = extender.Recent(), extender.Policy()
    real, forged = _pod("1500m"), _pod("100m")
    for pod in (real, forged):
        pod["metadata"].update(uid="u1", resourceVersion="7")
    [planted] = extender.judge(
        extender.read_extender_args({"Pod": forged, "NodeNames": ["vn-a"]}),
        summaries=summaries,
        policy=policy,
        recent=recent,
    )
    assert planted.fits
    [verdict] = extender.judge(
        extender.read_extender_args({"Pod": real, "NodeNames": ["vn-a"]}),
        summaries=summaries,
        policy=policy,
        recent=recent,
    )
    assert not verdict.fits
    assert extender.judged(real) != extender.judged(forged)
    # the clusterSelector annotation is part of what was judged
    selected = _pod("100m", selector={"nodeSelector": {"x": "y"}})
    assert extender.judged(selected) != extender.judged(_pod("100m"))
