"""What the virtual Node says while its lower apiserver does not answer: the stance as a
table (pure), and the node controller's writes under each policy. The controller runs in
isolation against a fake upper API that records requests (FakeApi), its ping failing on
demand (a fault a real lower cluster cannot be asked for at a given beat); the Node cache
is filled by hand, as a watch would. The real clusters' behaviour is
tests/e2e/test_partitions.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tensile.contracts import lowerhealth
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import LEASES, NODES
from vnode.controllers import lower_outage, node_objects
from vnode.controllers.lower_outage import Outage, Stance
from vnode.controllers.node import NodeController
from vnode.provider_errors import BackendUnavailable
from vnode.settings import LowerOutagePolicy, NodeSettings
from vnode.testing.fakeapi import FakeApi

OUTAGE = Outage(started=100.0, since="2030-01-02T03:04:05Z")


def _conditions(stance: Stance) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in stance.conditions}


@pytest.mark.parametrize(
    ("policy", "outage", "now", "renew", "write", "tainted", "ready", "reachable"),
    [
        # The lower apiserver answers: as a healthy kubelet, whatever the policy.
        ("keep", None, 0.0, True, True, False, "True", "True"),
        ("evict", None, 0.0, True, True, False, "True", "True"),
        # tensile-kube's: silent, so the node lifecycle controller marks it Unknown.
        ("evict", OUTAGE, 101.0, False, False, False, "True", "True"),
        ("evict", OUTAGE, 10_000.0, False, False, False, "True", "True"),
        # keep: Ready, said unreachable, no new pods, for the grace (60 s here)...
        ("keep", OUTAGE, 100.0, True, True, True, "True", "False"),
        ("keep", OUTAGE, 159.9, True, True, True, "True", "False"),
        # ... then not Ready, as a kubelet whose runtime is down: its pods move.
        ("keep", OUTAGE, 160.0, True, True, True, "False", "False"),
        ("keep", OUTAGE, 10_000.0, True, True, True, "False", "False"),
    ],
)
def test_the_stance_in_a_lower_outage(
    policy: LowerOutagePolicy,
    outage: Outage | None,
    now: float,
    renew: bool,
    write: bool,
    tainted: bool,
    ready: str,
    reachable: str,
) -> None:
    stance = lower_outage.stance(policy=policy, grace=60.0, outage=outage, now=now)
    assert (stance.renew_lease, stance.write_status, stance.tainted) == (renew, write, tainted)
    conditions = _conditions(stance)
    assert conditions["Ready"][0] == ready
    assert conditions[lowerhealth.LOWER_REACHABLE_CONDITION][0] == reachable
    if reachable == "False":
        assert (
            conditions[lowerhealth.LOWER_REACHABLE_CONDITION][1] == "LowerControlPlaneUnreachable"
        )
    if ready == "False":
        assert conditions["Ready"][1] == "LowerControlPlaneUnreachable"


def test_no_grace_is_not_ready_at_the_first_unanswered_ping() -> None:
    stance = lower_outage.stance(policy="keep", grace=0.0, outage=OUTAGE, now=OUTAGE.started)
    assert _conditions(stance)["Ready"] == ("False", "LowerControlPlaneUnreachable")


def test_an_outage_says_the_same_at_every_ping_until_the_grace() -> None:
    """Messages name only the start: an outage costs writes when it starts, at the grace
    and when it ends, not one per ping."""
    stances = [
        lower_outage.stance(policy="keep", grace=60.0, outage=OUTAGE, now=OUTAGE.started + t)
        for t in (0, 10, 20, 59)
    ]
    assert all(stance == stances[0] for stance in stances)
    message = {c["type"]: c["message"] for c in stances[0].conditions}
    assert OUTAGE.since in message[lowerhealth.LOWER_REACHABLE_CONDITION]


@pytest.mark.parametrize(
    ("current", "tainted", "written"),
    [
        ([], False, None),
        ([], True, [{"key": "tensile.io/lower-unreachable", "effect": "NoSchedule"}]),
        (
            [{"key": "virtual-kubelet.io/provider", "value": "k8s", "effect": "NoSchedule"}],
            True,
            [
                {"key": "virtual-kubelet.io/provider", "value": "k8s", "effect": "NoSchedule"},
                {"key": "tensile.io/lower-unreachable", "effect": "NoSchedule"},
            ],
        ),
        (
            [
                {"key": "tensile.io/lower-unreachable", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            ],
            False,
            [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}],
        ),
        ([{"key": "tensile.io/lower-unreachable", "effect": "NoSchedule"}], True, None),
        (None, False, None),
    ],
)
def test_the_taint_is_added_and_taken_off_others_kept(
    current: list[dict[str, Any]] | None, tainted: bool, written: list[dict[str, Any]] | None
) -> None:
    stance = lower_outage.stance(
        policy="keep", grace=60.0, outage=OUTAGE if tainted else None, now=OUTAGE.started
    )
    assert lower_outage.taints_to_write(current, stance=stance) == written


def test_the_status_carries_both_conditions_ready_first() -> None:
    stance = lower_outage.stance(policy="keep", grace=60.0, outage=OUTAGE, now=OUTAGE.started)
    body = node_objects.node_status(
        None,
        settings=NodeSettings(name="vn", internal_ip="192.0.2.1"),
        capacity={},
        node_info={},
        now="2030-01-02T03:04:15Z",
        health=stance.conditions,
    )
    types = [c["type"] for c in body["status"]["conditions"]]
    assert types == [
        "Ready",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "LowerControlPlaneReachable",
    ]


# -- the node controller ----------------------------------------------------------------------


class Provider:
    """Answers the ping, or not (`down`)."""

    def __init__(self) -> None:
        self.down = False

    async def ping(self) -> None:
        if self.down:
            raise BackendUnavailable("lower cluster: connection refused")

    def capacity(self) -> Mapping[str, str]:
        return {"cpu": "8", "memory": "16Gi", "pods": "110"}

    def node_info(self) -> Mapping[str, str]:
        return {"kubeletVersion": "v1.37.1"}

    def notify_node_changed(self, callback: Callable[[], None]) -> None:
        return None


def _controller(
    policy: LowerOutagePolicy, *, grace: float = 900.0
) -> tuple[NodeController, FakeApi, Provider]:
    client, provider = FakeApi(name="fake-upper"), Provider()
    client.put(
        NODES,
        {"metadata": {"name": "vn"}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}},
    )
    controller = NodeController(
        upper=client,
        informers=InformerFactory(),
        heartbeat=client,
        provider=provider,
        settings=NodeSettings(
            name="vn", internal_ip="192.0.2.1", lower_outage_policy=policy, lower_outage_grace=grace
        ),
    )
    _cache_shows_server(controller, client)
    return controller, client, provider


def _cache_shows_server(controller: NodeController, client: FakeApi) -> None:
    node = client.get(NODES, "vn")
    assert node is not None
    controller.informer.store.upsert(node)


async def _status_beat(controller: NodeController) -> None:
    """What the status loop does when woken (without its sleeps)."""
    if controller.stance().write_status:
        await controller._update_taints()
        await controller._update_status()


def _lease_writes(client: FakeApi) -> int:
    return len(client.requests_of("PUT", "leases")) + len(client.requests_of("POST", "leases"))


def _condition(client: FakeApi, kind: str) -> dict[str, Any]:
    node = client.get(NODES, "vn") or {}
    return next(c for c in node["status"]["conditions"] if c["type"] == kind)


async def test_keep_renews_the_lease_and_says_why_with_a_condition_and_a_taint() -> None:
    controller, client, provider = _controller("keep")
    provider.down = True
    await controller.heartbeat()
    assert controller.outage is not None
    assert _lease_writes(client) == 1, "the Lease is renewed: the node is alive"
    await _status_beat(controller)
    node = client.get(NODES, "vn") or {}
    assert {"key": "tensile.io/lower-unreachable", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert {"key": "a", "effect": "NoSchedule"} in node["spec"]["taints"], "others' taints kept"
    assert _condition(client, "LowerControlPlaneReachable")["status"] == "False"
    assert _condition(client, "Ready")["status"] == "True"
    assert client.get(LEASES, "vn", namespace="kube-node-lease") is not None

    # Back: the taint goes, the condition turns, resync callbacks run.
    recovered: list[bool] = []
    controller.on_recovered(lambda: recovered.append(True))
    _cache_shows_server(controller, client)
    provider.down = False
    await controller.heartbeat()
    await _status_beat(controller)
    node = client.get(NODES, "vn") or {}
    assert node["spec"]["taints"] == [{"key": "a", "effect": "NoSchedule"}]
    assert _condition(client, "LowerControlPlaneReachable")["status"] == "True"
    assert recovered == [True]


async def test_keep_past_the_grace_says_not_ready() -> None:
    controller, client, provider = _controller("keep", grace=0.0)
    provider.down = True
    await controller.heartbeat()
    await _status_beat(controller)
    ready = _condition(client, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LowerControlPlaneUnreachable")
    assert _lease_writes(client) == 1


async def test_evict_is_silent_as_tensile_kube_is() -> None:
    controller, client, provider = _controller("evict")
    provider.down = True
    await controller.heartbeat()
    await _status_beat(controller)
    assert _lease_writes(client) == 0
    assert [r for r in client.requests if r.method != "GET"] == []


async def test_a_taint_someone_added_meanwhile_is_kept() -> None:
    """The taint write names the resourceVersion it was made from: the node lifecycle
    controller's taint, added after the cache last saw the Node, is not written over."""
    controller, client, provider = _controller("keep")
    node = client.get(NODES, "vn") or {}
    node["spec"]["taints"].append({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"})
    client.put(NODES, node)  # a newer version than the cache's
    provider.down = True
    await controller.heartbeat()
    await controller._update_taints()
    taints = (client.get(NODES, "vn") or {})["spec"]["taints"]
    assert [t["key"] for t in taints] == [
        "a",
        "node.kubernetes.io/not-ready",
        "tensile.io/lower-unreachable",
    ]
    assert len(client.requests_of("PATCH", "nodes")) == 2, "one conflict, one write"
