"""The descheduler's pure decisions: which pods are due, which never move, what budgets
allow, one round's plan, the policy file, label selectors, and the objects a move writes."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from typing import Any

import pytest

from descheduler import move_objects, policyfile
from descheduler.policy import (
    Criteria,
    considered_nodes,
    disruption_blocker,
    due,
    exclusion,
)
from descheduler.policy import plan as plan_with_waits
from tensile.contracts import avoidance, descheduling, lowerhealth, selectors

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
OWNER_UID = "0f3c2a9e-7b1d-4c55-8e2f-5a6b7c8d9e01"
CRITERIA = Criteria(unschedulable_timeout=60.0)
LOWER_MESSAGE = "0/3 nodes are available: 3 Insufficient cpu."


def ago(seconds: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, *, ready: bool = True, virtual: bool = True, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {**({"type": "virtual-kubelet"} if virtual else {}), **labels},
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(
    name: str = "web-1",
    *,
    on: str = "vn-a",
    since: float = 120,
    reason: str = "Unschedulable",
    owner: bool = True,
    created: float = 300,
    **extra: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "shop",
        "uid": f"uid-{name}",
        "resourceVersion": "42",
        "creationTimestamp": ago(created),
        "labels": {"app": "web", "virtual-pod": "true"},
    }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-7d9f",
                "uid": OWNER_UID,
                "controller": True,
            }
        ]
    result: dict[str, Any] = {
        "metadata": meta,
        "spec": {"nodeName": on, "containers": [{"name": "main", "image": "nginx"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": LOWER_MESSAGE,
                    "lastTransitionTime": ago(since),
                }
            ],
        },
    }
    for key, value in extra.items():
        section, _, field = key.partition("__")
        result[section][field] = value
    return result


NODES = [node("vn-a"), node("vn-b"), node("real-1", virtual=False)]


def plan(pods: Any, **kwargs: Any) -> Any:
    """`policy.plan`, the descheduler having seen every pod unplaceable for 120 s unless the
    test says otherwise (`waited`)."""
    return plan_with_waits(pods, waited=kwargs.pop("waited", lambda _uid: 120.0), **kwargs)


# -- due ------------------------------------------------------------------------------------


def test_a_pod_unschedulable_below_for_the_timeout_is_due_with_the_lower_reason() -> None:
    why = f"Unschedulable: {LOWER_MESSAGE}"
    assert due(pod(), criteria=CRITERIA, now=NOW, waited=60.0) == why
    assert due(pod(), criteria=CRITERIA, now=NOW, waited=59.9) is None
    assert due(pod(), criteria=CRITERIA, now=NOW, waited=None) is None
    assert due(pod(reason="SchedulerError"), criteria=CRITERIA, now=NOW, waited=60.0) is not None
    assert due(pod(reason="SchedulingGated"), criteria=CRITERIA, now=NOW, waited=60.0) is None


@pytest.mark.parametrize(
    ("skew", "waited", "is_due"),
    [
        # The lower cluster's clock behind ours (its lastTransitionTime looks old): before,
        # a 60 s lag made a pod due the moment it became unschedulable.
        (-60.0, 0.0, False),
        (-60.0, 1.0, False),
        (-3600.0, 59.0, False),
        (-60.0, 60.0, True),
        # Ahead (the time looks in the future): before, every move came that much late.
        (60.0, 60.0, True),
        (3600.0, 61.0, True),
        (0.0, 59.0, False),
        (0.0, 60.0, True),
        (-60.0, None, False),  # not seen unplaceable (yet) by this replica
    ],
)
def test_the_timeout_is_measured_on_the_descheduler_clock_whatever_the_lower_clock(
    skew: float, waited: float | None, is_due: bool
) -> None:
    """`skew`: the lower clock minus ours, in seconds; the lower scheduler stamped the
    transition `waited` seconds ago by its clock (or now, when not seen)."""
    lower_now = NOW + dt.timedelta(seconds=skew)
    stamped = lower_now - dt.timedelta(seconds=waited or 0.0)
    found = pod()
    found["status"]["conditions"][0]["lastTransitionTime"] = stamped.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (due(found, criteria=CRITERIA, now=NOW, waited=waited) is not None) == is_due


def test_only_pending_pods_that_are_not_going_away_are_due() -> None:
    running = pod()
    running["status"]["phase"] = "Running"
    assert due(running, criteria=CRITERIA, now=NOW, waited=600.0) is None
    leaving = pod()
    leaving["metadata"]["deletionTimestamp"] = ago(1)
    assert due(leaving, criteria=CRITERIA, now=NOW, waited=600.0) is None
    scheduled = pod()
    scheduled["status"]["conditions"][0]["status"] = "True"
    assert due(scheduled, criteria=CRITERIA, now=NOW, waited=600.0) is None


def test_pod_lifetime_moves_pods_pending_too_long_whatever_their_condition() -> None:
    lifetime = dataclasses.replace(CRITERIA, max_pod_lifetime=180)
    young = pod(created=100)
    old = pod(created=200)
    old["status"]["conditions"] = []
    assert due(young, criteria=lifetime, now=NOW, waited=5.0) is None
    assert due(old, criteria=lifetime, now=NOW, waited=None) == (
        "Pending for more than 180s (PodLifeTime)"
    )
    assert due(old, criteria=CRITERIA, now=NOW, waited=None) is None


def test_a_round_judges_each_pod_by_how_long_the_descheduler_saw_it() -> None:
    pods = [pod("seen-long", since=1), pod("seen-now", since=3600)]
    waited = {"uid-seen-long": 60.0, "uid-seen-now": 0.5}.get
    result = plan(
        pods, nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW, waited=waited
    )
    assert [d.pod["metadata"]["name"] for d in result.decisions] == ["seen-long"]
    assert result.considered == 2


# -- exclusions -----------------------------------------------------------------------------


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    result = copy.deepcopy(base)
    target = result
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return result


DAEMONSET = [
    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": True}
]


@pytest.mark.parametrize(
    ("path", "value", "forced_moves"),
    [
        ("metadata.namespace", "kube-system", False),
        ("metadata.annotations", {"kubernetes.io/config.mirror": "x"}, False),
        ("metadata.annotations", {"kubernetes.io/config.source": "file"}, False),
        ("metadata.ownerReferences", DAEMONSET, False),
        ("spec.schedulingGates", [{"name": "tensile.io/descheduler"}], False),
        # Found with no virtual node left: never judged again (removing the mark undoes it).
        (
            "metadata.annotations",
            {"tensile.io/no-virtual-node-left": "2026-03-01T11:00:00Z"},
            False,
        ),
        ("spec.priority", 2_000_000_000, True),
        ("spec.volumes", [{"name": "scratch", "emptyDir": {}}], True),
        ("spec.volumes", [{"name": "host", "hostPath": {"path": "/x"}}], True),
    ],
)
def test_exclusions_and_what_the_evict_annotation_forces(
    path: str, value: Any, forced_moves: bool
) -> None:
    excluded = _with(pod(), path, value)
    assert exclusion(excluded, criteria=CRITERIA) is not None
    annotations = {
        **excluded["metadata"].get("annotations", {}),
        "descheduler.alpha.kubernetes.io/evict": "",
    }
    forced = _with(excluded, "metadata.annotations", annotations)
    assert (exclusion(forced, criteria=CRITERIA) is None) == forced_moves


def test_an_owned_pod_the_webhook_would_not_see_does_not_move() -> None:
    unlabelled = _with(pod(), "metadata.labels", {"app": "web"})
    assert "webhook" in (exclusion(unlabelled, criteria=CRITERIA) or "")
    # A bare pod is re-created by the descheduler itself: no webhook needed.
    assert exclusion(_with(pod(owner=False), "metadata.labels", {}), criteria=CRITERIA) is None
    other = dataclasses.replace(CRITERIA, pod_selector=selectors.parse("app=web"))
    assert exclusion(unlabelled, criteria=other) is None


def test_local_storage_moves_with_the_flag_and_ordinary_pods_always() -> None:
    scratch = _with(pod(), "spec.volumes", [{"name": "s", "emptyDir": {}}])
    allowed = dataclasses.replace(CRITERIA, evict_local_storage_pods=True)
    assert exclusion(scratch, criteria=allowed) is None
    assert exclusion(pod(), criteria=CRITERIA) is None
    assert exclusion(_with(pod(), "spec.priority", 1_999_999_999), criteria=CRITERIA) is None


# -- disruption budgets ---------------------------------------------------------------------


def budget(
    name: str = "web",
    *,
    selector: Any = None,
    healthy: int = 0,
    desired: int = 1,
    allowed: int = 0,
    policy: str | None = None,
    generation: int = 1,
    observed: int = 1,
    namespace: str = "shop",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "web"}} if selector is None else selector
    }
    if policy:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {
        "metadata": {"name": name, "namespace": namespace, "generation": generation},
        "spec": spec,
        "status": {
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": allowed,
            "observedGeneration": observed,
        },
    }


def test_a_budget_that_allows_no_disruption_blocks_with_its_numbers() -> None:
    message = disruption_blocker(pod(), [budget()])
    assert (
        message == "PodDisruptionBudget web allows no disruption: it needs 1 healthy pods and has 0"
    )


@pytest.mark.parametrize(
    "budgets",
    [
        [],
        [budget(namespace="other")],
        [budget(selector={"matchLabels": {"app": "db"}})],
        [budget(selector={"matchExpressions": [{"key": "app", "operator": "Bogus"}]})],
        [budget(policy="AlwaysAllow")],
        [budget(healthy=2, desired=2)],  # met: moving an unhealthy pod disrupts nothing
        [budget(healthy=1, desired=2, allowed=1)],
    ],
)
def test_budgets_that_allow_the_move(budgets: list[dict[str, Any]]) -> None:
    assert disruption_blocker(pod(), budgets) is None


def test_budgets_that_block_the_move() -> None:
    assert "still being processed" in (disruption_blocker(pod(), [budget(generation=2)]) or "")
    everything = budget(selector={})
    assert disruption_blocker(pod(), [everything]) is not None  # {} selects every pod
    two = disruption_blocker(
        pod(), [budget("a", healthy=5, desired=1), budget("b", healthy=5, desired=1)]
    )
    assert two == "more than one PodDisruptionBudget selects it (a, b)"


# -- a round ---------------------------------------------------------------------------------


def test_considered_nodes_are_usable_virtual_nodes_the_selector_picks() -> None:
    nodes = [
        node("vn-a", zone="x"),
        node("vn-b"),
        node("vn-c", ready=False),
        node("real", virtual=False),
    ]
    cordoned = node("vn-d")
    cordoned["spec"]["unschedulable"] = True
    nodes.append(cordoned)
    assert set(considered_nodes(nodes, criteria=CRITERIA)) == {"vn-a", "vn-b"}
    zoned = dataclasses.replace(CRITERIA, node_selector=selectors.parse("zone=x"))
    assert set(considered_nodes(nodes, criteria=zoned)) == {"vn-a"}


def test_an_owned_pod_is_evicted_and_its_owner_avoids_the_node() -> None:
    result = plan([pod()], nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW)
    [decision] = result.decisions
    assert decision.action == "evict"
    assert decision.avoid == {"vn-a"}
    assert decision.owner is not None
    assert decision.owner.uid == OWNER_UID
    assert decision.reason == f"Unschedulable: {LOWER_MESSAGE}"
    assert result.considered == 1


def test_a_bare_pod_is_recreated() -> None:
    [decision] = plan(
        [pod(owner=False)], nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "recreate"
    assert decision.owner is None


def test_when_every_virtual_node_was_tried_the_pod_stays_for_good() -> None:
    record = avoidance.with_avoidance(
        None,
        owner=avoidance.controller_of(pod()),  # type: ignore[arg-type]
        nodes=["vn-b"],
        until=NOW + dt.timedelta(minutes=5),
        now=NOW,
    )
    [decision] = plan(
        [pod()], nodes=NODES, record=record, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert decision.for_good
    assert decision.message == (
        "every virtual node has been tried (vn-a, vn-b); it stays on vn-a for good"
    )
    # A bare pod's tried nodes are the ones its affinity already avoids.
    tried = pod(owner=False)
    tried["spec"]["affinity"] = avoidance.avoiding(None, ["vn-b"])
    [bare] = plan(
        [tried], nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert bare.action == "exhausted"
    assert bare.for_good


@pytest.mark.parametrize("state", ["not ready", "cordoned"])
def test_a_pod_that_has_not_tried_a_virtual_node_unusable_now_is_not_given_up_on(
    state: str,
) -> None:
    """vn-c is selected but not Ready (its lower cluster unreachable) or cordoned: a pod
    that tried vn-a and vn-b stays, but not for good -- it is judged again each round and
    goes to vn-c once vn-c is back, rather than being pinned to a full cluster by an outage
    elsewhere. A node --node-selector leaves out does not count."""
    down = node("vn-c", ready=state != "not ready")
    if state == "cordoned":
        down["spec"]["unschedulable"] = True
    owner = avoidance.controller_of(pod())
    assert owner is not None
    record = avoidance.with_avoidance(
        None, owner=owner, nodes=["vn-b"], until=NOW + dt.timedelta(minutes=5), now=NOW
    )
    [decision] = plan(
        [pod()], nodes=[*NODES, down], record=record, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert not decision.for_good
    assert decision.message == (
        "every usable virtual node has been tried (vn-a, vn-b); it stays Pending on vn-a "
        "while vn-c is not Ready or cordoned"
    )
    # Its own placement rules vn-b out, and vn-c cannot be judged now: the same.
    pinned = pod(spec__nodeSelector={"clusterID": "a"})
    nodes = [node("vn-a", clusterID="a"), node("vn-b", clusterID="b"), down]
    [decision] = plan(
        [pinned], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert (decision.action, decision.for_good) == ("exhausted", False)
    assert decision.message.startswith("no other usable virtual node admits it (vn-b: ")
    # Back: the pod may go there.
    [decision] = plan(
        [pod()], nodes=[*NODES, node("vn-c")], record=record, budgets=[], criteria=CRITERIA,
        now=NOW,
    ).decisions  # fmt: skip
    assert (decision.action, decision.message) == ("evict", "may go to vn-c")
    # Outside --node-selector it is not a place to go at all: for good.
    selected = dataclasses.replace(
        CRITERIA, node_selector=selectors.parse("type=virtual-kubelet,!off")
    )
    down["metadata"]["labels"]["off"] = "yes"
    [decision] = plan(
        [pod()], nodes=[*NODES, down], record=record, budgets=[], criteria=selected, now=NOW
    ).decisions
    assert (decision.action, decision.for_good) == ("exhausted", True)


def left_alone(found: dict[str, Any], *, now: dt.datetime) -> dict[str, Any]:
    """`found` as the mover's merge patch leaves it (the mark added, the rest untouched)."""
    patch = move_objects.left_alone_patch(found, now=now)
    marked = copy.deepcopy(found)
    marked["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
    return marked


def test_a_pod_with_nowhere_left_is_left_alone_for_good_instead_of_cycling() -> None:
    """web-2, evicted from vn-a (its owner avoids vn-a), is unplaceable on vn-b too.
    Rounds every 10 s over three --avoid-ttl, the mover marking what the plan gives up on:
    web-2 gets one decision, exhausted for good, and none after -- in particular no
    eviction back to vn-a once the avoidance of vn-a has expired (which, repeated from
    cluster to cluster, was the cycling)."""
    ttl, interval = 300.0, 10.0
    owner = avoidance.controller_of(pod())
    assert owner is not None
    record = avoidance.with_avoidance(
        None, owner=owner, nodes=["vn-a"], until=NOW + dt.timedelta(seconds=ttl), now=NOW
    )
    stuck = pod("web-2", on="vn-b")
    now, decided = NOW, []
    while now < NOW + dt.timedelta(seconds=3 * ttl):
        for d in plan(
            [stuck], nodes=NODES, record=record, budgets=[], criteria=CRITERIA, now=now
        ).decisions:
            decided.append((now, d.action, d.for_good))
            if d.action == "exhausted" and d.for_good:
                stuck = left_alone(stuck, now=now)
        now += dt.timedelta(seconds=interval)
    assert decided == [(NOW, "exhausted", True)]
    assert stuck["metadata"]["annotations"] == {
        descheduling.LEFT_ALONE_ANNOTATION: "2026-03-01T12:00:00Z"
    }


def test_the_owners_avoidance_lapses_after_the_ttl_while_the_pod_left_alone_stays() -> None:
    """The same owner: web-2, left alone on vn-b, and web-3 (a scale-up, or another
    replacement) that landed on vn-b later. While vn-a is avoided web-3 has nowhere to go
    either; once the avoidance of vn-a expires (nothing renews it) web-3 may go back to
    vn-a -- lower cluster A may well have room again -- while web-2 stays where it is."""
    ttl = 300.0
    owner = avoidance.controller_of(pod())
    assert owner is not None
    until = NOW + dt.timedelta(seconds=ttl)
    record = avoidance.with_avoidance(None, owner=owner, nodes=["vn-a"], until=until, now=NOW)
    stuck = left_alone(pod("web-2", on="vn-b"), now=NOW)
    before = until - dt.timedelta(seconds=1)
    later = pod("web-3", on="vn-b", created=120)
    [decision] = plan(
        [stuck, later], nodes=NODES, record=record, budgets=[], criteria=CRITERIA, now=before
    ).decisions
    assert (decision.pod["metadata"]["name"], decision.action) == ("web-3", "exhausted")
    assert avoidance.avoided_nodes(record, owner_uid=owner.uid, now=until) == frozenset()
    [decision] = plan(
        [stuck, later], nodes=NODES, record=record, budgets=[], criteria=CRITERIA, now=until
    ).decisions
    assert (decision.pod["metadata"]["name"], decision.action) == ("web-3", "evict")
    assert decision.message == "may go to vn-a"


def test_a_pod_whose_own_placement_admits_no_other_virtual_node_stays() -> None:
    """Its replacement would carry the pod's nodeSelector, affinity and tolerations plus the
    NotIn of the node it left: with no other virtual node admitting it, it would stay
    Pending upstairs for good (its affinity cannot change), where left alone it runs once
    its lower cluster has room."""
    nodes = [node("vn-a", clusterID="a"), node("vn-b", clusterID="b")]
    pinned = pod(spec__nodeSelector={"clusterID": "a"})
    [decision] = plan(
        [pinned], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert decision.message == (
        "no other virtual node admits it (vn-b: its nodeSelector clusterID=a does not "
        "match); it stays on vn-a for good"
    )
    by_name = pod(owner=False)
    by_name["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["vn-a"]}
                        ]
                    }
                ]
            }
        }
    }
    [decision] = plan(
        [by_name], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert "vn-b: its required node affinity does not select it" in decision.message


def test_an_owned_pods_earlier_avoidance_does_not_rule_its_node_out_once_expired() -> None:
    """A replacement carries the NotIn of the move that made it (and the webhook's note that
    it added it); once that avoidance has expired, the owner's next replacement (made from
    its template, through the webhook) no longer has it: the node it names may be tried
    again."""
    nodes = [node(n, **{"kubernetes.io/hostname": n}) for n in ("vn-a", "vn-b")]
    moved_before = pod(on="vn-b")
    moved_before["spec"]["affinity"] = avoidance.avoiding(None, ["vn-a"])
    moved_before["metadata"]["annotations"] = {avoidance.ADDED_ANNOTATION: "vn-a"}
    [decision] = plan(
        [moved_before], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "evict"
    assert decision.message == "may go to vn-a"
    # A bare pod's replacement is a copy: its NotIn stays, vn-a stays ruled out.
    bare = pod(on="vn-b", owner=False)
    bare["spec"]["affinity"] = avoidance.avoiding(None, ["vn-a"])
    [decision] = plan(
        [bare], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"


def test_a_taint_the_pod_does_not_tolerate_rules_a_virtual_node_out() -> None:
    tainted = node("vn-b")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    nodes = [node("vn-a"), tainted]
    [decision] = plan(
        [pod()], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert "vn-b: it does not tolerate the taint dedicated=gpu:NoSchedule" in decision.message
    tolerant = pod(spec__tolerations=[{"key": "dedicated", "operator": "Exists"}])
    [decision] = plan(
        [tolerant], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "evict"
    assert decision.message == "may go to vn-b"
    # Only taints that keep pods off count; PreferNoSchedule merely steers.
    tainted["spec"]["taints"] = [{"key": "dedicated", "effect": "PreferNoSchedule"}]
    [decision] = plan(
        [pod()], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "evict"


def test_a_blocked_pod_is_reported_not_moved() -> None:
    [decision] = plan(
        [pod()], nodes=NODES, record=None, budgets=[budget()], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "blocked"
    assert "allows no disruption" in decision.message


def test_pods_elsewhere_are_not_considered() -> None:
    pods = [pod(on="real-1"), pod(on=""), pod(on="vn-gone")]
    result = plan(pods, nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW)
    assert result.decisions == ()
    assert result.considered == 0
    not_ready = [node("vn-a", ready=False), node("vn-b")]
    assert (
        plan(
            [pod()], nodes=not_ready, record=None, budgets=[], criteria=CRITERIA, now=NOW
        ).decisions
        == ()
    )


def test_the_per_node_limit_moves_the_oldest_first() -> None:
    pods = [pod(f"p{i}", created=300 - i, owner=False) for i in range(4)]
    pods.append(pod("other", on="vn-b", created=100, owner=False))
    limited = dataclasses.replace(CRITERIA, max_pods_per_node=2)
    result = plan(reversed(pods), nodes=NODES, record=None, budgets=[], criteria=limited, now=NOW)
    assert [d.pod["metadata"]["name"] for d in result.decisions] == ["p0", "p1", "other"]
    assert result.deferred == 2


def test_an_owners_pods_move_one_at_a_time() -> None:
    pods = [pod(f"p{i}", created=300 - i) for i in range(3)]
    result = plan(pods, nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW)
    assert [d.pod["metadata"]["name"] for d in result.decisions] == ["p0"]
    assert result.deferred == 2
    # While one of its pods is going away, none of the others moves.
    pods[0]["metadata"]["deletionTimestamp"] = ago(1)
    result = plan(pods, nodes=NODES, record=None, budgets=[], criteria=CRITERIA, now=NOW)
    assert result.decisions == ()
    # Exhausted or blocked pods are still reported.
    blocked = plan(pods, nodes=NODES, record=None, budgets=[budget()], criteria=CRITERIA, now=NOW)
    assert [d.action for d in blocked.decisions] == ["blocked", "blocked"]


# -- the policy file ---------------------------------------------------------------------------

TENSILE_KUBE_POLICY = """
apiVersion: "descheduler/v1alpha1"
kind: "DeschedulerPolicy"
strategies:
  "RemoveDuplicates":
     enabled: false
  "LowNodeUtilization":
     enabled: false
  "PodLifeTime":
     enabled: true
     params:
        maxPodLifeTimeSeconds: 180
"""


def test_tensile_kubes_policy_file_parses() -> None:
    parsed = policyfile.parse(TENSILE_KUBE_POLICY)
    assert parsed.max_pod_lifetime == 180
    assert parsed.warnings == ()
    assert (
        policyfile.parse(
            "apiVersion: descheduler/v1alpha1\nkind: DeschedulerPolicy\n"
        ).max_pod_lifetime
        is None
    )


def test_top_level_settings_and_enabled_strategies_that_do_nothing() -> None:
    text = (
        "apiVersion: descheduler/v1alpha1\nkind: DeschedulerPolicy\nnodeSelector: zone=a\n"
        "evictLocalStoragePods: true\nmaxNoOfPodsToEvictPerNode: 3\n"
        "strategies:\n  RemoveDuplicates:\n    enabled: true\n"
    )
    parsed = policyfile.parse(text)
    assert (parsed.node_selector, parsed.evict_local_storage_pods, parsed.max_pods_per_node) == (
        "zone=a",
        True,
        3,
    )
    assert parsed.warnings == (
        "policy: strategies.RemoveDuplicates is enabled but does nothing for virtual nodes; "
        "ignored",
    )


HEAD = "apiVersion: descheduler/v1alpha1\nkind: DeschedulerPolicy\n"
LIFETIME = HEAD + "strategies:\n  PodLifeTime:\n    enabled: true\n    params:\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid YAML"),
        ("- a\n", "expected a DeschedulerPolicy object, got list"),
        ("", "got nothing"),
        ("apiVersion: v1\nkind: Pod\n", "expected apiVersion descheduler/v1alpha1"),
        (HEAD + "strategy: {}\n", "unknown field(s) strategy"),
        (HEAD + "strategies: [PodLifeTime]\n", "strategies must be a map"),
        (
            HEAD + "strategies:\n  PodLifetime:\n    enabled: true\n",
            "strategies.PodLifetime: unknown strategy",
        ),
        (
            HEAD + "strategies:\n  PodLifeTime:\n    enabled: yes please\n",
            "enabled: expected true or false",
        ),
        (
            HEAD + "strategies:\n  PodLifeTime:\n    enabled: true\n",
            "maxPodLifeTimeSeconds: required",
        ),
        (
            LIFETIME + "      maxPodLifeTimeSeconds: 0\n",
            "positive whole number",
        ),
        (
            LIFETIME + "      maxPodLifeTimeSeconds: 1.5\n",
            "positive whole number",
        ),
        (
            HEAD + "strategies:\n  PodLifeTime:\n    enabled: true\n    param: {}\n",
            "unknown field(s) param",
        ),
        (HEAD + "evictLocalStoragePods: 1\n", "evictLocalStoragePods: expected a bool"),
        (HEAD + "maxNoOfPodsToEvictPerNode: -1\n", "must be >= 0"),
    ],
)
def test_a_bad_policy_is_one_message_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(policyfile.PolicyError) as caught:
        policyfile.parse(text, source="/etc/policy.yaml")
    assert str(caught.value).startswith("/etc/policy.yaml: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_unreadable_policy_file(tmp_path: Any) -> None:
    with pytest.raises(policyfile.PolicyError, match="cannot read it"):
        policyfile.load(str(tmp_path / "missing.yaml"))


# -- selectors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {}, True),
        ("zone=a", {"zone": "a"}, True),
        ("zone==a", {"zone": "b"}, False),
        ("zone!=a", {}, True),
        ("zone in (a, b),tier", {"zone": "b", "tier": ""}, True),
        ("zone notin (a)", {"zone": "a"}, False),
        ("!gpu", {"gpu": "1"}, False),
        ("cores>8", {"cores": "16"}, True),
        ("cores<8", {"cores": "x"}, False),
        ("example.com/team=x", {"example.com/team": "x"}, True),
        ("x in ()", {"x": ""}, True),  # labels.Parse: "()" is the set of the empty value
        ("x notin ()", {"x": "a"}, True),
    ],
)
def test_label_selectors_match_as_kubernetes_does(
    text: str, labels: dict[str, str], matches: bool
) -> None:
    assert selectors.parse(text).matches(labels) is matches


@pytest.mark.parametrize(
    "text", ["a b", "a=b,", "!a=b", "x in (a", "a=b)", "n>x", "-bad=1", "a=" + "v" * 64]
)
def test_bad_label_selectors_are_refused(text: str) -> None:
    with pytest.raises(selectors.SelectorError):
        selectors.parse(text)


# -- what a move writes ------------------------------------------------------------------------


def test_the_count_patch_names_one_annotation_and_the_pod_s_uid() -> None:
    counted = pod()
    counted["metadata"]["annotations"] = {
        "keep": "me",
        descheduling.DESCHEDULE_COUNT_ANNOTATION: "2",
    }
    assert move_objects.count_patch(counted) == {
        "metadata": {"uid": "uid-web-1", "annotations": {"sigs.k8s.io/deschedule-count": "3"}}
    }
    garbled = _with(
        pod(), "metadata.annotations", {descheduling.DESCHEDULE_COUNT_ANNOTATION: "many"}
    )
    assert move_objects.count_patch(garbled)["metadata"]["annotations"] == {
        "sigs.k8s.io/deschedule-count": "1"
    }


def test_the_left_alone_patch_names_one_annotation_and_the_pod_s_uid() -> None:
    marked = pod()
    marked["metadata"]["annotations"] = {"keep": "me"}
    assert move_objects.left_alone_patch(marked, now=NOW + dt.timedelta(microseconds=5)) == {
        "metadata": {
            "uid": "uid-web-1",
            "annotations": {"tensile.io/no-virtual-node-left": "2026-03-01T12:00:00Z"},
        }
    }
    assert not descheduling.is_left_alone(marked)
    assert descheduling.is_left_alone(left_alone(marked, now=NOW))
    assert descheduling.is_left_alone(
        _with(pod(), "metadata.annotations", {descheduling.LEFT_ALONE_ANNOTATION: ""})
    )


def test_the_eviction_is_preconditioned_on_uid_and_version() -> None:
    assert move_objects.eviction(pod()) == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "web-1", "namespace": "shop"},
        "deleteOptions": {"preconditions": {"uid": "uid-web-1", "resourceVersion": "42"}},
    }


def test_a_bare_pods_replacement() -> None:
    original = pod("web", owner=False)
    original["metadata"]["annotations"] = {"clusterSelector": "{}", "keep": "me"}
    original["metadata"]["managedFields"] = [{}]
    original["spec"].update(priority=5, overhead={"cpu": "1"}, schedulingGates=[{"name": "other"}])
    original["spec"]["affinity"] = {"podAntiAffinity": {"x": 1}}
    before = copy.deepcopy(original)
    made = move_objects.replacement(original, avoid=["vn-a"])
    assert original == before
    assert made["metadata"] == {
        "name": "web-d1",
        "namespace": "shop",
        "labels": {"app": "web", "virtual-pod": "true", "create-by-descheduler": "true"},
        "annotations": {
            "clusterSelector": "{}",
            "keep": "me",
            "sigs.k8s.io/deschedule-count": "1",
            "tensile.io/replaces": "web",
            "tensile.io/replaces-uid": "uid-web",
        },
    }
    assert "nodeName" not in made["spec"]
    assert "priority" not in made["spec"]
    assert "overhead" not in made["spec"]
    assert made["spec"]["schedulingGates"] == [
        {"name": "other"},
        {"name": "tensile.io/descheduler"},
    ]
    assert made["spec"]["affinity"] == {
        "podAntiAffinity": {"x": 1},
        **avoidance.avoiding(None, ["vn-a"]),
    }  # type: ignore[dict-item]
    assert "status" not in made
    assert descheduling.is_gated(made)
    assert descheduling.replaces(made) == ("web", "uid-web")
    # Moved again: the count grows, the name keeps its stem.
    again = copy.deepcopy(made)
    again["metadata"]["uid"] = "uid-web-d1"
    again["spec"]["schedulingGates"] = []
    second = move_objects.replacement(again, avoid=["vn-a", "vn-b"])
    assert second["metadata"]["name"] == "web-d2"
    assert second["metadata"]["annotations"]["sigs.k8s.io/deschedule-count"] == "2"
    assert avoidance.avoided_by_affinity(second["spec"]["affinity"]) == {"vn-a", "vn-b"}
    assert (
        move_objects.replacement_name(
            _with(pod("x" * 253, owner=False), "metadata.annotations", {})
        )
        == "x" * 250 + "-d1"
    )


def test_ungating_removes_only_our_gate() -> None:
    assert move_objects.ungate_patch() == {
        "spec": {"schedulingGates": [{"$patch": "delete", "name": "tensile.io/descheduler"}]}
    }


def _pinned_volume(name: str, *, node_name: str) -> dict[str, Any]:
    """An upper PersistentVolume as a virtual node provisions it: pinned to itself."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node_name],
                                }
                            ]
                        }
                    ]
                }
            }
        },
    }


@pytest.mark.parametrize("ephemeral", [False, True])
def test_a_pod_whose_volume_only_its_virtual_node_reaches_stays(ephemeral: bool) -> None:
    """A claim bound to a volume pinned to vn-a (the virtual node provisioned it): the
    replacement, kept off vn-a, could never be scheduled (VolumeBinding), so the pod stays
    and runs once lower cluster A has room; an unbound claim or a volume any node reaches
    does not hold it."""
    nodes = [
        node("vn-a", **{"kubernetes.io/hostname": "vn-a"}),
        node("vn-b", **{"kubernetes.io/hostname": "vn-b"}),
    ]
    volume = (
        {"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
        if ephemeral
        else {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}}
    )
    claim_name = "web-1-data" if ephemeral else "data-web-1"
    with_claim = pod()
    with_claim["spec"]["volumes"] = [volume]
    claims = {f"shop/{claim_name}": {"spec": {"volumeName": "pvc-1"}}}
    volumes = {"pvc-1": _pinned_volume("pvc-1", node_name="vn-a")}
    [decision] = plan(
        [with_claim],
        nodes=nodes,
        record=None,
        budgets=[],
        criteria=CRITERIA,
        now=NOW,
        claims=claims,
        volumes=volumes,
    ).decisions
    assert decision.action == "exhausted"
    assert decision.message == (
        f"no other virtual node admits it (vn-b: its volume pvc-1 (claim {claim_name}) is "
        "not reachable from it (the volume's node affinity)); it stays on vn-a for good"
    )
    unbound = {f"shop/{claim_name}": {"spec": {}}}
    anywhere = {"pvc-1": {"metadata": {"name": "pvc-1"}, "spec": {}}}
    for found_claims, found_volumes in ((unbound, volumes), (claims, anywhere), ({}, {})):
        [moved] = plan(
            [with_claim],
            nodes=nodes,
            record=None,
            budgets=[],
            criteria=CRITERIA,
            now=NOW,
            claims=found_claims,
            volumes=found_volumes,
        ).decisions
        assert moved.action == "evict"


def test_a_hostname_notin_of_the_template_is_kept_when_judging_the_owner_s_next_pod() -> None:
    """The template itself keeps the pods off vn-b (`kubernetes.io/hostname NotIn [vn-b]`,
    written by the user): evicting the pod from vn-a would leave its replacement, which
    carries that NotIn plus the avoidance of vn-a, fitting no virtual node -- Pending
    upstairs, bound nowhere, never looked at again. It stays on vn-a instead. Only what
    the webhook added (its annotation names those nodes) is taken out."""
    nodes = [node(n, **{"kubernetes.io/hostname": n}) for n in ("vn-a", "vn-b")]
    user_wrote = pod()
    user_wrote["spec"]["affinity"] = avoidance.avoiding(None, ["vn-b"])
    [decision] = plan(
        [user_wrote], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert decision.message == (
        "no other virtual node admits it (vn-b: its required node affinity does not select "
        "it); it stays on vn-a for good"
    )
    # The webhook merged a later avoidance of vn-c into that NotIn and noted it: vn-c is
    # taken out again (its avoidance expired), the user's vn-b stays.
    nodes.append(node("vn-c", **{"kubernetes.io/hostname": "vn-c"}))
    user_wrote["spec"]["affinity"] = avoidance.avoiding(
        avoidance.avoiding(None, ["vn-b"]), ["vn-c"]
    )
    user_wrote["metadata"]["annotations"] = {avoidance.ADDED_ANNOTATION: "vn-c"}
    [decision] = plan(
        [user_wrote], nodes=nodes, record=None, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "evict"
    assert decision.message == "may go to vn-c"


def test_a_replacement_the_webhook_admitted_without_the_avoidance_is_moved_again() -> None:
    """The webhook's watch of the record may lag the descheduler's write: the owner's
    replacement then carries no NotIn and can land on the very node its pod left. Once
    unschedulable there it is due, and the record (not the pod) says to avoid that node:
    it is evicted again, towards the other one."""
    owner = avoidance.controller_of(pod())
    assert owner is not None
    record = avoidance.with_avoidance(
        None, owner=owner, nodes=["vn-a"], until=NOW + dt.timedelta(minutes=5), now=NOW
    )
    [decision] = plan(
        [pod("web-2", on="vn-a")], nodes=NODES, record=record, budgets=[], criteria=CRITERIA,
        now=NOW,
    ).decisions  # fmt: skip
    assert decision.action == "evict"
    assert decision.avoid == {"vn-a"}
    assert decision.message == "may go to vn-b"


def _lower_away(name: str) -> dict[str, Any]:
    away = node(name)
    away["status"]["conditions"].append(
        {"type": lowerhealth.LOWER_REACHABLE_CONDITION, "status": "False"}
    )
    return away


def test_a_node_whose_lower_control_plane_does_not_answer_neither_gives_nor_takes_pods() -> None:
    """Its pods' statuses are as last seen (a pod Pending there may run below by now): none
    is judged; and nothing is sent there. A pod that has tried every other node waits, not
    for good."""
    assert (
        plan(
            [pod()],
            nodes=[_lower_away("vn-a"), *NODES[1:]],
            record=None,
            budgets=[],
            criteria=CRITERIA,
            now=NOW,
        ).decisions
        == ()
    )
    owner = avoidance.controller_of(pod())
    assert owner is not None
    record = avoidance.with_avoidance(
        None, owner=owner, nodes=["vn-b"], until=NOW + dt.timedelta(minutes=5), now=NOW
    )
    nodes = [node("vn-a"), node("vn-b"), _lower_away("vn-c")]
    [decision] = plan(
        [pod()], nodes=nodes, record=record, budgets=[], criteria=CRITERIA, now=NOW
    ).decisions
    assert decision.action == "exhausted"
    assert not decision.for_good
