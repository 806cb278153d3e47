"""The descheduler's moves against a scripted FAKE apiserver (aiohttp on 127.0.0.1).

A fake on purpose: these are the answers a real kube-apiserver cannot be made to give on
demand at the right moment -- an Eviction refused with 429 for a Pending pod (the real one
never checks budgets for those), an old pod that changes between the replacement's
creation and its deletion (409 on the delete), the avoidance record changing under every
write, and a Lease lost in the middle of a move. The moves themselves, end to end, are
tests/e2e/test_descheduler.py.

Also one round of `Descheduler` as a whole, its caches filled by hand: the global eviction
rate needs a clock the test moves (a real server cannot be made to wait), and the writes of
rounds minutes apart (the record's prune, a pod's mark, an eviction once an avoidance has
expired) are checked on the requests made.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from descheduler import move_objects
from descheduler.loop import Descheduler
from descheduler.mover import Mover, MoveSettings, NotLeading
from descheduler.policy import Decision
from descheduler.record import WRITE_ATTEMPTS, AvoidanceRecord
from descheduler.settings import Settings
from tensile.contracts import avoidance, descheduling
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.events import EventRecorder

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
OWNER = avoidance.Owner(
    uid="rs-uid", api_version="apps/v1", kind="ReplicaSet", namespace="shop", name="web-1"
)
Handler = Callable[[web.Request], web.Response]


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


class FakeApi:
    """Answers every request from `routes` ((method, path) -> handler); records them all."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Handler] = {}
        self.requests: list[tuple[str, str, Any]] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.server = TestServer(app, host="127.0.0.1")

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, body))
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            if (request.method, request.path) == ("POST", "/api/v1/namespaces/shop/events"):
                return web.json_response(body, status=201)
            return status(404, "NotFound", f"unscripted {request.method} {request.path}")
        return handler(request)

    def made(self, method: str, path: str) -> list[Any]:
        return [body for m, p, body in self.requests if (m, p) == (method, path)]

    def events(self) -> list[dict[str, Any]]:
        return self.made("POST", "/api/v1/namespaces/shop/events")


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    fake = FakeApi()
    await fake.server.start_server(shutdown_timeout=1.0)
    try:
        yield fake
    finally:
        await fake.server.close()


@pytest.fixture
async def client(api: FakeApi) -> AsyncIterator[ApiClient]:
    info = ConnectionInfo(server=f"http://127.0.0.1:{api.server.port}", ssl_context=None)
    async with ApiClient(info, name="upper") as c:
        yield c


def mover(
    client: ApiClient,
    *,
    may_act: Callable[[], bool] = lambda: True,
    clock: Callable[[], float] = time.monotonic,
) -> Mover:
    return Mover(
        client=client,
        recorder=EventRecorder(client, component="tensile-descheduler", host="me"),
        record=AvoidanceRecord(client, namespace="tensile-system", name="tensile-avoid"),
        settings=MoveSettings(settle=0.0, gone_timeout=0.5),
        may_act=may_act,
        clock=clock,
    )


def a_pod(name: str, *, owned: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "shop",
        "uid": f"uid-{name}",
        "resourceVersion": "7",
    }
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-1",
                "uid": "rs-uid",
                "controller": True,
            }
        ]
    return {
        "metadata": meta,
        "spec": {"nodeName": "vn-a", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending"},
    }


def decision(pod: dict[str, Any]) -> Decision:
    owner = avoidance.controller_of(pod)
    return Decision(
        action="evict" if owner else "recreate",
        pod=pod,
        node="vn-a",
        reason="Unschedulable: 0/2 nodes are available: 2 Insufficient cpu.",
        owner=owner,
        avoid=frozenset({"vn-a"}),
    )


async def test_an_eviction_refused_with_429_is_reported_and_waits_its_retry_after(
    api: FakeApi, client: ApiClient
) -> None:
    pod = a_pod("web-1-x", owned=True)
    path = "/api/v1/namespaces/shop/pods/web-1-x"

    def refuse(_request: web.Request) -> web.Response:
        answer = status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        )
        answer.headers["Retry-After"] = "7"
        return answer

    api.routes[("POST", path + "/eviction")] = refuse
    now = [1000.0]
    m = mover(client, clock=lambda: now[0])
    assert await m.move(decision(pod), now=NOW) == "refused"
    # Asked once (a 429 here is a verdict, not throttling to retry through), with the pod
    # as judged as precondition.
    [eviction] = api.made("POST", path + "/eviction")
    assert eviction["deleteOptions"]["preconditions"] == {
        "uid": "uid-web-1-x",
        "resourceVersion": "7",
    }
    # Not moved: the deschedule count is left as it was (it counts moves, not attempts).
    assert api.made("PATCH", path) == []
    [event] = api.events()
    assert event["reason"] == "EvictionRefused"
    assert event["type"] == "Warning"
    assert "disruption budget" in event["message"]
    assert "trying again in 7s" in event["message"]
    assert m.waiting(decision(pod))
    now[0] += 6.9
    assert m.waiting(decision(pod))
    # Its wait served, the pod may be tried again, and nothing of it is kept.
    now[0] += 0.2
    assert not m.waiting(decision(pod))
    assert not m._not_before


async def test_a_bare_pod_that_changed_before_its_deletion_keeps_its_place(
    api: FakeApi, client: ApiClient
) -> None:
    pod = a_pod("solo", owned=False)
    made = move_objects.replacement(pod, avoid=["vn-a"])
    made["metadata"]["uid"] = "uid-solo-d1"
    api.routes[("POST", "/api/v1/namespaces/shop/pods")] = lambda r: web.json_response(
        made, status=201
    )
    api.routes[("DELETE", "/api/v1/namespaces/shop/pods/solo")] = lambda r: status(
        409, "Conflict", "the ResourceVersion in the precondition (7) does not match (9)"
    )
    api.routes[("DELETE", "/api/v1/namespaces/shop/pods/solo-d1")] = lambda r: web.json_response(
        made
    )
    assert await mover(client).move(decision(pod), now=NOW) == "conflict"
    [old_delete] = api.made("DELETE", "/api/v1/namespaces/shop/pods/solo")
    assert old_delete["preconditions"] == {"uid": "uid-solo", "resourceVersion": "7"}
    [undo] = api.made("DELETE", "/api/v1/namespaces/shop/pods/solo-d1")
    assert undo["preconditions"] == {"uid": "uid-solo-d1"}
    # Never released: no patch lifted its gate.
    assert not [r for r in api.requests if r[0] == "PATCH"]


async def test_the_record_is_rewritten_on_a_conflict_and_given_up_after_repeated_ones(
    api: FakeApi, client: ApiClient
) -> None:
    path = "/api/v1/namespaces/tensile-system/configmaps/tensile-avoid"
    current = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "tensile-avoid",
            "namespace": "tensile-system",
            "resourceVersion": "1",
        },
        "data": {"other": "garbage"},
    }
    api.routes[("GET", path)] = lambda r: web.json_response(current)
    answers = [status(409, "Conflict", "the object has been modified"), web.json_response(current)]
    api.routes[("PUT", path)] = lambda r: answers.pop(0)
    m = mover(client)
    ready = await m.prepare([decision(a_pod("web-1-x", owned=True))], now=NOW)
    assert len(ready) == 1
    puts = api.made("PUT", path)
    assert len(puts) == 2
    assert all(p["metadata"]["resourceVersion"] == "1" for p in puts)
    assert avoidance.avoided_nodes(puts[-1]["data"], owner_uid="rs-uid", now=NOW) == {"vn-a"}
    assert "other" not in puts[-1]["data"]  # unreadable entries are pruned

    api.requests.clear()
    api.routes[("PUT", path)] = lambda r: status(409, "Conflict", "the object has been modified")
    assert await m.prepare([decision(a_pod("web-1-y", owned=True))], now=NOW) == []
    assert len(api.made("PUT", path)) == WRITE_ATTEMPTS
    [event] = api.events()
    assert event["reason"] == "DeschedulingFailed"
    assert "cannot write the avoidance record" in event["message"]


async def test_the_record_is_created_when_absent(api: FakeApi, client: ApiClient) -> None:
    api.routes[("POST", "/api/v1/namespaces/tensile-system/configmaps")] = lambda r: (
        web.json_response({}, status=201)
    )
    await mover(client).prepare([decision(a_pod("web-1-x", owned=True))], now=NOW)
    [created] = api.made("POST", "/api/v1/namespaces/tensile-system/configmaps")
    assert created["metadata"] == {
        "name": "tensile-avoid",
        "namespace": "tensile-system",
        "labels": {"app.kubernetes.io/managed-by": "tensile-descheduler"},
    }
    assert json.loads(created["data"]["rs-uid"])["owner"]["name"] == "web-1"


async def test_a_lost_lease_stops_a_move_before_its_next_write(
    api: FakeApi, client: ApiClient
) -> None:
    leading = [True]
    pod = a_pod("solo", owned=False)
    made = move_objects.replacement(pod, avoid=["vn-a"])

    def create(_request: web.Request) -> web.Response:
        leading[0] = False  # the Lease is lost while the replacement is being created
        return web.json_response(
            {**made, "metadata": {**made["metadata"], "uid": "u2"}}, status=201
        )

    api.routes[("POST", "/api/v1/namespaces/shop/pods")] = create
    with pytest.raises(NotLeading):
        await mover(client, may_act=lambda: leading[0]).move(decision(pod), now=NOW)
    assert [(m, p) for m, p, _ in api.requests] == [("POST", "/api/v1/namespaces/shop/pods")]


async def test_a_failed_look_at_one_half_done_move_does_not_stop_the_others(
    api: FakeApi, client: ApiClient
) -> None:
    """Recovery reads each replaced pod; one read refused (403 here; an apiserver in
    trouble in general) leaves that move for the next round, and the others still finish:
    the round is not aborted as if the descheduler had a bug."""
    first = move_objects.replacement(a_pod("one", owned=False), avoid=["vn-a"])
    second = move_objects.replacement(a_pod("two", owned=False), avoid=["vn-a"])
    api.routes[("GET", "/api/v1/namespaces/shop/pods/one")] = lambda r: status(
        403, "Forbidden", 'pods "one" is forbidden'
    )
    # "two" is gone (unscripted GET: 404): its replacement is released.
    api.routes[("PATCH", "/api/v1/namespaces/shop/pods/two-d1")] = lambda r: web.json_response(
        second
    )
    await mover(client).recover([first, second])
    [ungate] = api.made("PATCH", "/api/v1/namespaces/shop/pods/two-d1")
    assert ungate == move_objects.ungate_patch()
    assert not api.made("PATCH", "/api/v1/namespaces/shop/pods/one-d1")
    assert not api.made("DELETE", "/api/v1/namespaces/shop/pods/one-d1")


async def test_a_bare_move_whose_last_step_fails_is_a_move_finished_later(
    api: FakeApi, client: ApiClient
) -> None:
    """The replacement is made and the old pod deleted; then looking whether the old one is
    gone fails. The move happened: it is counted and told as one, and lifting the gate is
    left to the next round's recovery -- not a Warning that the pod was not moved."""
    pod = a_pod("solo", owned=False)
    made = move_objects.replacement(pod, avoid=["vn-a"])
    made["metadata"]["uid"] = "uid-solo-d1"
    api.routes[("POST", "/api/v1/namespaces/shop/pods")] = lambda r: web.json_response(
        made, status=201
    )
    api.routes[("DELETE", "/api/v1/namespaces/shop/pods/solo")] = lambda r: web.json_response(pod)
    api.routes[("GET", "/api/v1/namespaces/shop/pods/solo")] = lambda r: status(
        403, "Forbidden", 'pods "solo" is forbidden'
    )
    assert await mover(client).move(decision(pod), now=NOW) == "moved"
    reasons = [e["reason"] for e in api.events()]
    assert reasons == ["Rescheduled", "Rescheduled"]
    assert not api.made("PATCH", "/api/v1/namespaces/shop/pods/solo-d1")  # still gated


def exhausted(pod: dict[str, Any], *, for_good: bool = True) -> Decision:
    """The policy's verdict on `pod` (on vn-a) when its owner avoids vn-b, the other one."""
    return dataclasses.replace(
        decision(pod),
        action="exhausted",
        avoid=frozenset({"vn-a", "vn-b"}),
        message="every virtual node has been tried (vn-a, vn-b); it stays on vn-a for good",
        for_good=for_good,
    )


async def test_a_pod_with_no_virtual_node_left_is_marked_then_told_so(
    api: FakeApi, client: ApiClient
) -> None:
    """One merge patch of the mark (and the UID) before the Event, which says where the pod
    waits and how to have its owner try again; a bare pod is told how to undo the mark."""
    pod = a_pod("web-1-x", owned=True)
    path = "/api/v1/namespaces/shop/pods/web-1-x"
    api.routes[("PATCH", path)] = lambda r: web.json_response(pod)
    assert await mover(client).report(exhausted(pod), now=NOW) == "exhausted"
    assert [(m, p) for m, p, _ in api.requests] == [
        ("PATCH", path),
        ("POST", "/api/v1/namespaces/shop/events"),
    ]
    [patch] = api.made("PATCH", path)
    assert patch == {
        "metadata": {
            "uid": "uid-web-1-x",
            "annotations": {"tensile.io/no-virtual-node-left": "2026-03-01T12:00:00Z"},
        }
    }
    [event] = api.events()
    assert (event["type"], event["reason"]) == ("Warning", "NoVirtualNodeLeft")
    assert event["message"] == (
        "The lower cluster behind virtual node vn-a cannot place it (Unschedulable: 0/2 "
        "nodes are available: 2 Insufficient cpu.), and every virtual node has been tried "
        "(vn-a, vn-b); it stays on vn-a for good (annotation tensile.io/no-virtual-node-left), "
        "Pending until that lower cluster has room. Deleting it lets ReplicaSet web-1 try "
        "the virtual nodes again with a new pod (vn-b once its avoidance expires)."
    )
    api.requests.clear()
    bare = a_pod("solo", owned=False)
    api.routes[("PATCH", "/api/v1/namespaces/shop/pods/solo")] = lambda r: web.json_response(bare)
    assert await mover(client).report(exhausted(bare), now=NOW) == "exhausted"
    [event] = api.events()
    assert event["message"].endswith(
        "Pending until that lower cluster has room. Removing the annotation has it judged again."
    )
    # Not for good (a virtual node it has not tried is down): told, not marked.
    api.requests.clear()
    assert await mover(client).report(exhausted(pod, for_good=False), now=NOW) == "exhausted"
    assert [m for m, _, _ in api.requests] == ["POST"]


async def test_a_mark_that_cannot_be_written_is_a_failure_and_a_dry_run_writes_none(
    api: FakeApi, client: ApiClient
) -> None:
    pod = a_pod("web-1-x", owned=True)
    path = "/api/v1/namespaces/shop/pods/web-1-x"
    api.routes[("PATCH", path)] = lambda r: status(403, "Forbidden", "pods is forbidden")
    assert await mover(client).report(exhausted(pod), now=NOW) == "failed"
    [event] = api.events()
    assert event["reason"] == "DeschedulingFailed"
    assert "could not be marked so" in event["message"]
    assert "judged again next round" in event["message"]
    # Gone meanwhile (unscripted: 404): nothing to tell.
    api.requests.clear()
    del api.routes[("PATCH", path)]
    assert await mover(client).report(exhausted(pod), now=NOW) == "gone"
    assert api.events() == []
    api.requests.clear()
    dry = Mover(
        client=client,
        recorder=EventRecorder(client, component="tensile-descheduler", host="me"),
        record=AvoidanceRecord(client, namespace="tensile-system", name="tensile-avoid"),
        settings=MoveSettings(dry_run=True),
    )
    assert await dry.report(exhausted(pod), now=NOW) == "exhausted"
    assert api.requests == []


async def test_the_count_is_incremented_once_the_eviction_is_accepted(
    api: FakeApi, client: ApiClient
) -> None:
    pod = a_pod("web-1-x", owned=True)
    pod["metadata"]["annotations"] = {"keep": "me", descheduling.DESCHEDULE_COUNT_ANNOTATION: "1"}
    path = "/api/v1/namespaces/shop/pods/web-1-x"
    api.routes[("POST", path + "/eviction")] = lambda r: web.json_response({}, status=201)
    api.routes[("PATCH", path)] = lambda r: web.json_response(pod)
    assert await mover(client).move(decision(pod), now=NOW) == "moved"
    assert [(m, p) for m, p, _ in api.requests if p.startswith(path)] == [
        ("POST", path + "/eviction"),
        ("PATCH", path),
    ]
    [patch] = api.made("PATCH", path)
    assert patch == {
        "metadata": {"uid": "uid-web-1-x", "annotations": {"sigs.k8s.io/deschedule-count": "2"}}
    }
    # Gone before its count could be written: still a move, told as one.
    api.requests.clear()
    del api.routes[("PATCH", path)]  # unscripted: 404
    assert await mover(client).move(decision(pod), now=NOW) == "moved"
    assert [e["reason"] for e in api.events()] == ["Descheduled"]


# -- one round ----------------------------------------------------------------------------

RECORD_PATH = "/api/v1/namespaces/tensile-system/configmaps/tensile-avoid"


def a_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"type": "virtual-kubelet"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def unplaceable(name: str, *, owned: bool, on: str = "vn-a") -> dict[str, Any]:
    """A pod the lower cluster behind `on` has called Unschedulable for ten minutes."""
    pod = a_pod(name, owned=owned)
    pod["metadata"]["labels"] = {"virtual-pod": "true"}
    pod["metadata"]["creationTimestamp"] = "2026-03-01T11:00:00Z"
    pod["spec"]["nodeName"] = on
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient cpu.",
            "lastTransitionTime": "2026-03-01T11:50:00Z",
        }
    ]
    return pod


def a_round(
    client: ApiClient,
    *,
    settings: Settings,
    pods: list[dict[str, Any]],
    record: dict[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    now: dt.datetime = NOW,
) -> Descheduler:
    """A Descheduler whose caches hold `pods` (seen unplaceable ten minutes before
    `clock`'s first reading), virtual nodes vn-a and vn-b, and `record`; its rounds judge
    at `now`."""
    earlier = [600.0]  # by `clock`, while the pods are filled in: their first sight
    made = Descheduler(
        client=client, events=client, settings=settings, identity="me", now=lambda: now,
        clock=lambda: clock() - earlier[0],
    )  # fmt: skip
    for obj in (a_node("vn-a"), a_node("vn-b")):
        made.nodes.store.upsert(obj)
    for pod in pods:
        made.pods.store.upsert(pod)
        made.waits.observe(pod)  # what the informer's handlers do for it
    earlier[0] = 0.0
    if record is not None:
        made.record.informer.store.upsert(
            {
                "metadata": {"name": "tensile-avoid", "namespace": "tensile-system"},
                "data": record,
            }
        )
    return made


def moved(outcome: str) -> float:
    labels = {"kind": "recreate", "outcome": outcome}
    return REGISTRY.get_sample_value("tensile_descheduler_moves_total", labels) or 0.0


def considered() -> float:
    return REGISTRY.get_sample_value("tensile_descheduler_pods_considered_total") or 0.0


async def test_a_round_moves_within_the_global_eviction_rate(client: ApiClient) -> None:
    """--eviction-rate 1 --eviction-burst 2, five bare pods due (a dry run: the moves are
    counted, nothing is written). A pod over the rate is planned again next round."""
    now = [100.0]
    settings = Settings(
        eviction_rate=1.0, eviction_burst=2, moves=MoveSettings(dry_run=True), interval=1.0
    )
    pods = [unplaceable(f"p{i}", owned=False) for i in range(5)]
    descheduler = a_round(client, settings=settings, pods=pods, clock=lambda: now[0])
    results = []
    for at in (100.0, 100.5, 101.5, 200.0):
        now[0] = at
        before = (moved("dry_run"), moved("rate_limited"), considered())
        await descheduler.round()
        after = (moved("dry_run"), moved("rate_limited"), considered())
        results.append(tuple(a - b for a, b in zip(after, before, strict=True)))
    assert results == [
        (2, 3, 5),  # the burst
        (0, 5, 5),  # half a token: none
        # One more second, one more token: the refused reservations of the two rounds
        # before were handed back, not owed.
        (1, 4, 5),
        (2, 3, 5),  # long after: the burst again, never more
    ]
    # Without a rate, all of them.
    unlimited = a_round(
        client, settings=Settings(eviction_rate=0, moves=MoveSettings(dry_run=True)), pods=pods
    )
    before = moved("dry_run")
    await unlimited.round()
    assert moved("dry_run") - before == 5


async def test_rounds_leave_a_pod_with_nowhere_left_alone_and_let_its_owners_avoidance_lapse(
    api: FakeApi, client: ApiClient
) -> None:
    """The record holds an expired entry, and the owner's avoidance of vn-b a minute from
    its end. A round with no pod due prunes the expired entry (one write; only pods on
    virtual nodes are counted as considered). At the next, web-1-x (unplaceable on vn-a,
    vn-b avoided) has nowhere left: it is marked and told so, not evicted, and the record is
    not written -- nothing keeps the owner's avoidance alive. Two minutes later that
    avoidance has expired: the marked pod is left alone, and web-1-y, another pod of the
    owner unplaceable on vn-a, is evicted towards vn-b, which lower cluster B may fit now."""
    gone = avoidance.Owner(uid="old", api_version="v1", kind="ReplicaSet", namespace="x", name="o")
    expired = avoidance.Avoidance(owner=gone, nodes={"vn-a": NOW - dt.timedelta(minutes=30)})
    ending = avoidance.Avoidance(owner=OWNER, nodes={"vn-b": NOW + dt.timedelta(minutes=1)})
    record = {
        gone.uid: avoidance.render_entry(expired),
        OWNER.uid: avoidance.render_entry(ending),
    }
    stored = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "tensile-avoid",
            "namespace": "tensile-system",
            "resourceVersion": "1",
        },
        "data": dict(record),
    }

    def put(_request: web.Request) -> web.Response:
        stored["data"] = api.requests[-1][2]["data"]
        return web.json_response(stored)

    api.routes[("GET", RECORD_PATH)] = lambda r: web.json_response(stored)
    api.routes[("PUT", RECORD_PATH)] = put
    elsewhere = unplaceable("elsewhere", owned=False, on="real-node")
    settings = Settings(moves=MoveSettings(avoid_ttl=300.0, settle=0.0))
    descheduler = a_round(client, settings=settings, pods=[elsewhere], record=record)
    before = considered()
    await descheduler.round()
    assert considered() - before == 0
    [pruned] = api.made("PUT", RECORD_PATH)
    assert pruned["data"] == {OWNER.uid: record[OWNER.uid]}

    api.requests.clear()
    stuck = unplaceable("web-1-x", owned=True)
    stuck_path = "/api/v1/namespaces/shop/pods/web-1-x"
    api.routes[("PATCH", stuck_path)] = lambda r: web.json_response(stuck)
    descheduler = a_round(
        client, settings=settings, pods=[stuck, elsewhere], record=dict(stored["data"])
    )
    before = considered()
    await descheduler.round()
    assert considered() - before == 1
    [mark] = api.made("PATCH", stuck_path)
    assert mark == move_objects.left_alone_patch(stuck, now=NOW)
    assert not api.made("POST", f"{stuck_path}/eviction")
    assert not api.made("PUT", RECORD_PATH)
    assert [e["reason"] for e in api.events()] == ["NoVirtualNodeLeft"]

    api.requests.clear()
    later = NOW + dt.timedelta(minutes=2)
    marked = {
        **stuck,
        "metadata": {**stuck["metadata"], "annotations": mark["metadata"]["annotations"]},
    }
    sibling = unplaceable("web-1-y", owned=True)
    sibling_path = "/api/v1/namespaces/shop/pods/web-1-y"
    api.routes[("POST", f"{sibling_path}/eviction")] = lambda r: web.json_response({}, status=201)
    api.routes[("PATCH", sibling_path)] = lambda r: web.json_response(sibling)
    descheduler = a_round(
        client, settings=settings, pods=[marked, sibling], record=dict(stored["data"]), now=later
    )
    await descheduler.round()
    assert [(m, p) for m, p, _ in api.requests if p.startswith(stuck_path)] == []
    assert api.made("POST", f"{sibling_path}/eviction")
    [avoided] = api.made("PUT", RECORD_PATH)
    assert avoidance.parse_entry(OWNER.uid, avoided["data"][OWNER.uid]) == avoidance.Avoidance(
        owner=OWNER, nodes={"vn-a": later + dt.timedelta(minutes=5)}
    )
    assert [e["reason"] for e in api.events()] == ["Descheduled"]
