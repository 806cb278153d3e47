"""The patrol's comparisons as tables (`tensile.kube.cacheaudit`, `patrol_decisions`), and its
accounting of what it found and repaired (`Patrol`, with scripted checks standing in for
the pod controller and the mirrors: the accounting is what is tested here; the real checks
run against real clusters in tests/e2e/test_patrol.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Container, Hashable
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tensile.kube import errors
from tensile.kube.cacheaudit import Suspect, confirmed, page_suspects, repaired, unlisted_suspects
from tensile.kube.client import ApiClient
from tensile.kube.mirror.decide import (
    Action,
    Create,
    Delete,
    NameTaken,
    Nothing,
    Recreate,
    StillDeleting,
    Update,
    UpToDate,
    WaitForMaker,
)
from tensile.kube.mirror.siblings import Waiting
from tensile.kube.mirror.spec import Patch
from tensile.kube.resources import PODS
from vnode.controllers.patrol import Patrol
from vnode.controllers.patrol_decisions import (
    Mismatch,
    backend_pod_drift,
    copy_drift,
    stale_fields,
    upper_pod_drift,
)

# --- the cache audit ----------------------------------------------------------------------

STORE = {"ns/a": "1", "ns/b": "2", "ns/c": "3"}


def test_a_page_names_keys_the_store_lacks_or_holds_at_another_version() -> None:
    page = [("ns/a", "1"), ("ns/b", "20"), ("ns/d", "4")]
    assert page_suspects(page, STORE.get) == [
        Suspect(key="ns/b", reason="missed_update", cached="2"),
        Suspect(key="ns/d", reason="missed_add", cached=None),
    ]


def test_stored_keys_no_page_named_are_suspected_deleted() -> None:
    assert unlisted_suspects(list(STORE), {"ns/a", "ns/b"}, STORE.get) == [
        Suspect(key="ns/c", reason="missed_delete", cached="3")
    ]


ADD = Suspect(key="k", reason="missed_add", cached=None)
UPDATE = Suspect(key="k", reason="missed_update", cached="2")
DELETE = Suspect(key="k", reason="missed_delete", cached="2")


@pytest.mark.parametrize(
    ("suspect", "server", "cached_now", "drift"),
    [
        # (what was suspected, the server now, the store now, drift?)
        (ADD, "5", None, True),  # the store never got it
        (ADD, None, None, False),  # created and deleted after the list
        (ADD, "5", "5", False),  # the watch delivered it meanwhile
        (DELETE, None, "2", True),  # deleted on the server, still stored
        (DELETE, "7", "7", False),  # created after the list, the watch told
        (DELETE, None, None, False),  # the watch delivered the deletion meanwhile
        (DELETE, None, "9", False),  # the store moved: its own events decide
        (UPDATE, "5", "2", True),  # the store kept an old version
        (UPDATE, "5", "5", False),  # caught up meanwhile
        (UPDATE, "6", "5", False),  # moved since the list: in flight
        (UPDATE, None, "2", False),  # deleted since: the next audit sees it
    ],
)
def test_a_suspect_is_drift_only_if_the_server_still_disagrees_with_an_unmoved_store(
    suspect: Suspect, server: str | None, cached_now: str | None, drift: bool
) -> None:
    assert confirmed(suspect, server=server, cached_now=cached_now) is drift


@pytest.mark.parametrize(
    ("suspect", "cached_now", "expect"),
    [
        (ADD, "5", True),
        (ADD, None, False),
        (DELETE, None, True),
        (DELETE, "2", False),
        (UPDATE, "5", True),
        (UPDATE, "2", False),
    ],
)
def test_a_relist_repaired_the_drift_when_the_store_moved(
    suspect: Suspect, cached_now: str | None, expect: bool
) -> None:
    assert repaired(suspect, cached_now=cached_now) is expect


# --- upper and lower pods -----------------------------------------------------------------

RUNNING = {"phase": "Running", "hostIP": "192.0.2.1"}


def upper(*, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u1", **meta},
        "spec": {"containers": [{"name": "c"}]},
        "status": RUNNING if status is None else status,
    }


LOWER = {"metadata": {"name": "p", "namespace": "ns"}}
LOWER_DELETING = {"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
DELETING = {"deletionTimestamp": "2026-01-01T00:00:00Z"}


@dataclass(frozen=True)
class PodRow:
    pod: dict[str, Any]
    backend: dict[str, Any] | None
    desired: dict[str, Any] | None
    expect: str | None
    in_hand: bool = False
    status_unseen: bool = False
    deletion_unseen: bool = False


POD_ROWS = {
    "in step": PodRow(upper(), LOWER, RUNNING, None),
    "status differs, a status write of ours on its way": PodRow(
        upper(status={"phase": "Pending"}), LOWER, RUNNING, None, status_unseen=True
    ),
    "no backend pod, a status write of ours on its way": PodRow(
        upper(), None, None, "missing_below", status_unseen=True
    ),
    "deleting, backend pod gone, our deletion on its way": PodRow(
        upper(**DELETING), None, None, None, deletion_unseen=True
    ),
    "status differs, our deletion on its way": PodRow(
        upper(status={"phase": "Pending"}), LOWER, RUNNING, "stale_status", deletion_unseen=True
    ),
    "no backend pod": PodRow(upper(), None, None, "missing_below"),
    "no backend pod, in hand": PodRow(upper(), None, None, None, in_hand=True),
    "status differs": PodRow(
        upper(status={**RUNNING, "message": "x"}), LOWER, RUNNING, "stale_status"
    ),
    "status differs, in hand": PodRow(
        upper(status={"phase": "Pending"}), LOWER, RUNNING, None, in_hand=True
    ),
    "the backend says nothing yet": PodRow(upper(status={}), LOWER, {"phase": "Pending"}, None),
    "finished": PodRow(upper(status={"phase": "Succeeded"}), None, None, None),
    "refused (kube-system)": PodRow(
        {**upper(), "metadata": {"namespace": "kube-system", "name": "p"}}, None, None, None
    ),
    "deleting, backend pod deleting": PodRow(upper(**DELETING), LOWER_DELETING, RUNNING, None),
    "deleting, backend pod not told": PodRow(upper(**DELETING), LOWER, RUNNING, "lost_deletion"),
    "deleting, backend pod gone": PodRow(upper(**DELETING), None, None, "lost_deletion"),
    "deleting, in hand": PodRow(upper(**DELETING), None, None, None, in_hand=True),
}


@pytest.mark.parametrize("row", POD_ROWS.values(), ids=POD_ROWS.keys())
def test_upper_pod_drift(row: PodRow) -> None:
    found = upper_pod_drift(
        row.pod,
        backend=row.backend,
        desired_status=row.desired,
        in_hand=row.in_hand,
        status_unseen=row.status_unseen,
        deletion_unseen=row.deletion_unseen,
    )
    assert found == row.expect


@pytest.mark.parametrize(
    ("upper_exists", "deleting", "in_hand", "expect"),
    [
        (False, False, False, "orphan_below"),  # its upper pod is gone
        # Its upper pod is there, or a pod of the same name again: its own sync decides.
        (True, False, False, None),
        (False, True, False, None),  # the controller still deletes it
        (False, False, True, None),  # in hand
    ],
)
def test_backend_pod_drift(
    upper_exists: bool, deleting: bool, in_hand: bool, expect: str | None
) -> None:
    found = backend_pod_drift(
        upper_uid="u1", upper_exists=upper_exists, deleting=deleting, in_hand=in_hand
    )
    assert found == expect


# --- copies -------------------------------------------------------------------------------

T: dict[str, Any] = {"metadata": {"name": "t"}}
ACTIONS: dict[str, tuple[Action, str | None]] = {
    "create": (Create(desired=T), "copy_missing"),
    "update": (Update(target=T, patch=Patch({"data": {}})), "copy_differs"),
    "recreate": (Recreate(target=T, desired=T, reason="immutable"), "copy_differs"),
    "delete": (Delete(target=T), "copy_orphaned"),
    "nothing": (Nothing(), None),
    "up to date": (UpToDate(target=T), None),
    "a sibling's maker goes first": (
        WaitForMaker(target=T, waiting=Waiting(resource_version="1", due=0.0), after=1.0),
        None,
    ),
    "still deleting": (StillDeleting(target=T), None),
    "name taken (the event path reports it)": (NameTaken(target=T, message="m"), None),
}


@pytest.mark.parametrize(("action", "expect"), ACTIONS.values(), ids=ACTIONS.keys())
def test_copy_drift(action: Action, expect: str | None) -> None:
    assert copy_drift(action) == expect


# --- accounting ---------------------------------------------------------------------------


class Scripted:
    """A check answering the next of `runs` at each patrol run; records what it repaired."""

    name = "scripted"

    def __init__(self, runs: list[list[Mismatch]], *, held: list[set[str]] | None = None) -> None:
        """`held`: per run, the keys its queue still holds after the run (default none)."""
        self._runs = runs
        self._held = held or []
        self._run = -1
        self.repaired: list[str] = []

    async def mismatches(self) -> AsyncIterator[Mismatch]:
        self._run += 1
        for mismatch in self._runs.pop(0):
            yield mismatch

    def repair(self, mismatch: Mismatch) -> None:
        self.repaired.append(mismatch.key)

    def in_hand(self, mismatch: Mismatch) -> bool:
        return self._run < len(self._held) and mismatch.key in self._held[self._run]


def sample(name: str, kind: str, reason: str) -> float:
    labels = {"kind": kind, "reason": reason}
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counters(kind: str, reason: str) -> Callable[[], tuple[float, float, float]]:
    return lambda: (
        sample("tensile_patrol_mismatches_found_total", kind, reason),
        sample("tensile_patrol_mismatches_repaired_total", kind, reason),
        sample("tensile_patrol_mismatches", kind, reason),
    )


async def test_drift_is_counted_once_when_found_and_repaired_when_no_longer_found(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    a = Mismatch(kind="widgets", reason="test_reason", key="ns/a")
    b = Mismatch(kind="widgets", reason="test_reason", key="ns/b")
    check = Scripted([[a], [a, b], [b], []])
    patrol = Patrol(period=0, audits=[], checks=[check])
    read = counters("widgets", "test_reason")
    before = read()
    seen = []
    for _ in range(4):
        await patrol.patrol()
        now = read()
        seen.append(tuple(n - o for n, o in zip(now[:2], before[:2], strict=True)) + now[2:])
    # (found so far, repaired so far, outstanding)
    assert seen == [(1, 0, 1), (2, 0, 2), (2, 1, 1), (2, 2, 0)]
    assert check.repaired == ["ns/a", "ns/a", "ns/b", "ns/b"], "queued at every run found"
    lines = [r.getMessage() for r in caplog.records if "ns/" in r.getMessage()]
    assert lines == [
        "patrol: widgets ns/a: test_reason; queued for repair",
        "patrol: widgets ns/b: test_reason; queued for repair",
        "patrol: repaired widgets ns/a (test_reason)",
        "patrol: repaired widgets ns/b (test_reason)",
    ]


@pytest.mark.parametrize(
    ("held", "expect"),
    [
        # (found so far, repaired so far, outstanding) after each of 4 runs; ns/a is found
        # at run 1 only: at runs 2 and 3 its key is in its queue (the checks then say
        # nothing of it), at run 4 the queue is done with it.
        pytest.param([set(), set(), set()], [(1, 0, 1), (1, 1, 0), (1, 1, 0)], id="repaired"),
        pytest.param([set(), {"ns/a"}, {"ns/a"}], [(1, 0, 1), (1, 0, 1), (1, 0, 1)], id="retrying"),
        pytest.param([set(), {"ns/a"}, set()], [(1, 0, 1), (1, 0, 1), (1, 1, 0)], id="late"),
    ],
)
async def test_drift_whose_repair_is_still_queued_or_retried_is_not_counted_repaired(
    held: list[set[str]], expect: list[tuple[float, float, float]]
) -> None:
    a = Mismatch(kind="widgets", reason="held_reason", key="ns/a")
    check = Scripted([[a], [], []], held=held)
    patrol = Patrol(period=0, audits=[], checks=[check])
    read = counters("widgets", "held_reason")
    before = read()
    seen = []
    for _ in range(3):
        await patrol.patrol()
        now = read()
        seen.append(tuple(n - o for n, o in zip(now[:2], before[:2], strict=True)) + now[2:])
    assert seen == expect


async def test_a_period_of_zero_runs_no_patrol() -> None:
    check = Scripted([])
    patrol = Patrol(period=0, audits=[], checks=[check])
    await patrol.shut_down()
    await patrol.run()  # returns at once, without a run (the script is empty)
    assert check.repaired == []


# --- the pod check, on a pod controller's cache and a scripted provider ---------------------


class Book:
    """A provider (scripted: the check's facts, not the k2k provider's I/O) whose backend
    pods are `backend` (upper key -> status) plus `owned` extra (upper key, UID) pairs, with
    the writes in flight of `writing` (upper UIDs)."""

    def __init__(
        self,
        backend: dict[str, dict[str, Any]],
        *,
        owned: list[tuple[str, str]],
        writing: set[str],
    ) -> None:
        self._backend, self._owned, self._writing = backend, owned, writing

    def backend_pod(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        status = self._backend.get(f"ns/{pod['metadata']['name']}")
        meta = {"namespace": "below", "name": pod["metadata"]["name"]}
        return None if status is None else {"metadata": meta, "status": status}

    def pod_status(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        return self._backend.get(f"ns/{pod['metadata']['name']}")

    def vanished(self, pod: dict[str, Any]) -> bool:
        return False

    def notify_pods(self, callback: Callable[[str], None]) -> None:
        pass

    def owned_backend_pods(self, *, besides: Container[str] = frozenset()) -> list[tuple[str, str]]:
        self.passed_over = besides
        backend = [(k, f"u-{k[3:]}") for k in self._backend if f"below/{k[3:]}" not in besides]
        return backend + self._owned

    def backend_writing(self, upper_uid: str) -> bool:
        return upper_uid in self._writing


def _pod_controller(provider: Book, upper: Any = None, **settings: Any) -> Any:
    """A pod controller on `provider`, its informer not running (the test fills its cache);
    `upper` (default: a fake API never called) and `settings` as the controller takes them."""
    from tensile.kube.events import EventRecorder  # noqa: PLC0415
    from tensile.kube.informer_factory import InformerFactory  # noqa: PLC0415
    from vnode.controllers.pods import PodController  # noqa: PLC0415
    from vnode.testing.fakeapi import FakeApi  # noqa: PLC0415

    upper = upper or FakeApi(name="upper")  # by default never called: the check reads caches
    return PodController(
        upper=upper,
        informers=InformerFactory(),
        provider=provider,  # type: ignore[arg-type]
        node_name="vn",
        namespace=None,
        workers=1,
        recorder=EventRecorder(upper, component="vn/pod-controller", host="vn"),
        **settings,
    )


async def test_the_pod_check_finds_each_drift_and_hands_it_to_its_queue() -> None:
    from vnode.controllers.patrol_checks import PodCheck  # noqa: PLC0415

    provider = Book(
        {"ns/a": RUNNING, "ns/b": RUNNING},
        owned=[("ns/orphan", "u-orphan"), ("ns/leaving", "u-leaving")],
        writing={"u-c", "u-leaving"},
    )
    pods = _pod_controller(provider)
    statuses = {"a": RUNNING, "b": {**RUNNING, "message": "stale"}, "c": {}, "d": {}}
    for name, status in statuses.items():
        meta = {"namespace": "ns", "name": name, "uid": f"u-{name}", "resourceVersion": "1"}
        pods.informer.store.upsert({"metadata": meta, "spec": {}, "status": status})
    check = PodCheck(pods=pods, provider=provider)  # type: ignore[arg-type]
    found = [m async for m in check.mismatches()]
    assert found == [
        Mismatch(kind="pods", reason="stale_status", key="ns/b"),
        # ns/c: its create is in flight
        Mismatch(kind="pods", reason="missing_below", key="ns/d"),
        Mismatch(kind="pods", reason="orphan_below", key="ns/orphan"),
        # ns/leaving: its delete is in flight
    ]
    assert provider.passed_over == {"below/a", "below/b"}, (
        "the backend pods found with their upper pods are not looked at again"
    )
    for mismatch in found:
        check.repair(mismatch)
    assert pods.status_from_lower.pending("ns/b")
    assert not pods.pods_from_upper.pending("ns/b")
    assert pods.pods_from_upper.pending("ns/d")
    assert pods.pods_from_upper.pending("ns/orphan")


@pytest.mark.parametrize(
    ("seen_within", "event_meanwhile"),
    [(30.0, False), (30.0, True), (0.0, False)],
    ids=["on-its-way", "on-its-way-behind-an-earlier-event", "past-the-bound"],
)
async def test_a_status_write_the_watch_has_not_brought_yet_is_not_drift(
    seen_within: float, event_meanwhile: bool
) -> None:
    """The status worker wrote the backend's status and the apiserver answered, but the
    upper watch has not brought the write to the cache yet (under the fleet benchmark the
    patrol compared 0.03-0.7 s after such answers, and called those pods stale; a loaded
    apiserver also delivered an earlier write's event while the next write was on its way).
    The cached status is older than the pod's: the check holds its verdict until the cache
    shows the write, or until `write_seen_within` has passed (a write no event follows hides
    nothing)."""
    from vnode.controllers.patrol_checks import PodCheck  # noqa: PLC0415
    from vnode.testing.fakeapi import FakeApi  # noqa: PLC0415

    provider = Book({"ns/a": RUNNING}, owned=[], writing=set())

    def version(number: int, status: dict[str, Any]) -> dict[str, Any]:
        meta = {"namespace": "ns", "name": "a", "uid": "u-a", "resourceVersion": str(number)}
        return {"metadata": meta, "spec": {}, "status": status}

    upper = FakeApi(name="upper", objects=[(PODS, version(1, {"phase": "Pending"}))])
    pods = _pod_controller(provider, upper, write_seen_within=seen_within)
    pods.informer.store.upsert(version(1, {"phase": "Pending"}))
    check = PodCheck(pods=pods, provider=provider)  # type: ignore[arg-type]
    stale = Mismatch(kind="pods", reason="stale_status", key="ns/a")

    answer = asyncio.Event()
    upper.delay("PATCH", "pods", until=answer, times=1)
    write = asyncio.create_task(pods._sync_status("ns/a"))  # the status worker's write
    await asyncio.sleep(0.01)
    if event_meanwhile:  # an earlier write's event, delivered while this one is on its way
        pods.informer.store.upsert(version(2, {"phase": "Pending", "message": "scheduled"}))
    answer.set()
    await write
    assert upper.get(PODS, "a", namespace="ns")["status"] == RUNNING  # type: ignore[index]
    assert pods.informer.store.get("ns/a")["status"]["phase"] == "Pending", "not seen yet"
    assert pods._written["ns/a"].started == "1", "sent again only while the cache shows 1"
    found = [m async for m in check.mismatches()]
    if seen_within:
        assert found == [], "a write on its way is not drift"
        assert check.in_hand(stale)
    else:
        assert found == [stale]

    def deliver(pod: dict[str, Any]) -> None:  # a watch event, as the informer hands it
        old = pods.informer.store.get("ns/a")
        pods.informer.store.upsert(pod)
        pods._updated(old, pod)

    # An event that is not this write (an earlier write's, late): the write is still to come.
    deliver(version(3, {"phase": "Pending", "message": "scheduled"}))
    assert [m async for m in check.mismatches()] == ([] if seen_within else [stale])
    assert check.in_hand(stale) is bool(seen_within)

    # The watch brings it: the cache shows the written status, and the pod is compared, clean.
    deliver(version(4, RUNNING))
    assert [m async for m in check.mismatches()] == []
    assert not check.in_hand(stale)
    assert pods._written == {}, "a write the cache shows is forgotten"


async def test_a_status_write_whose_event_came_before_its_answer_is_not_kept() -> None:
    """The watch can bring a write before the apiserver's answer does (a light load): then
    no event follows it, and a write kept until one came would stay for the pod's life."""
    from vnode.testing.fakeapi import FakeApi  # noqa: PLC0415

    provider = Book({"ns/a": RUNNING}, owned=[], writing=set())
    meta = {"namespace": "ns", "name": "a", "uid": "u-a", "resourceVersion": "1"}
    pending = {"metadata": meta, "spec": {}, "status": {"phase": "Pending"}}
    upper = FakeApi(name="upper", objects=[(PODS, pending)])
    pods = _pod_controller(provider, upper)
    pods.informer.store.upsert(pending)
    answer = asyncio.Event()
    upper.delay("PATCH", "pods", until=answer, times=1)
    write = asyncio.create_task(pods._sync_status("ns/a"))
    await asyncio.sleep(0.01)
    written = {"metadata": {**meta, "resourceVersion": "2"}, "spec": {}, "status": RUNNING}
    pods.informer.store.upsert(written)  # its event, before its answer
    pods._updated(pending, written)
    answer.set()
    await write
    assert not pods.status_unseen("ns/a")
    assert pods._written == {}, "nothing kept for an event that already came"


class GoneBelow(Book):
    """`Book` whose backend pods are all gone: a deletion below is done at once."""

    async def delete_pod(self, pod: dict[str, Any], *, grace_period: int | None) -> bool:
        return True


@pytest.mark.parametrize(
    ("seen_within", "refused"),
    [(30.0, False), (0.0, False), (30.0, True)],
    ids=["on-its-way", "past-the-bound", "refused-another-pod-of-the-name"],
)
async def test_a_final_deletion_the_watch_has_not_brought_yet_is_not_a_lost_one(
    seen_within: float, refused: bool
) -> None:
    """The pod controller finished an upper pod's deletion (its backend pod gone, the upper
    pod deleted with grace 0) and the apiserver answered, but the watch has not brought the
    deletion yet: the cache shows a pod being deleted with nothing below, which is what a
    lost deletion looks like (under the fleet benchmark the patrol reported 75 of them
    while 2,000 pods were deleted). It is in hand until the cache drops the pod."""
    from vnode.controllers.patrol_checks import PodCheck  # noqa: PLC0415
    from vnode.testing.fakeapi import FakeApi  # noqa: PLC0415

    provider = GoneBelow({}, owned=[], writing=set())
    meta = {
        "namespace": "ns",
        "name": "a",
        "uid": "u-a",
        "resourceVersion": "5",
        "deletionTimestamp": "2026-11-28T20:44:00Z",
        "deletionGracePeriodSeconds": 30,
    }
    deleting = {"metadata": meta, "spec": {}, "status": RUNNING}
    upper = FakeApi(name="upper", objects=[(PODS, deleting)])
    pods = _pod_controller(provider, upper, write_seen_within=seen_within)
    pods.informer.store.upsert(deleting)
    check = PodCheck(pods=pods, provider=provider)  # type: ignore[arg-type]
    lost = Mismatch(kind="pods", reason="lost_deletion", key="ns/a")

    if refused:  # the UID precondition: the name holds another pod now
        upper.fail("DELETE", "pods", error=errors.Conflict(code=409, status={"message": "uid"}))
    await pods._sync_pod_now("ns/a")  # the pod worker: gone below, so deleted upstairs
    assert (upper.get(PODS, "a", namespace="ns") is None) is not refused
    found = [m async for m in check.mismatches()]
    on_its_way = bool(seen_within) and not refused
    assert found == ([] if on_its_way else [lost])
    assert check.in_hand(lost) is on_its_way
    assert not check.in_hand(Mismatch(kind="pods", reason="stale_status", key="ns/a")), (
        "a deletion on its way explains a lost deletion only"
    )
    if refused:
        return

    # The watch brings the deletion: nothing left to compare, nothing kept.
    pods.informer.store.delete("ns/a")
    pods._deleted(deleting)
    assert [m async for m in check.mismatches()] == []
    assert pods._deletes == {}


class StampedBook(Book):
    """`Book` with `BackendStamp`: each backend pod's stamp is its entry in `stamps` (the
    test moves it as a backend pod's resourceVersion would move), and the pods looked up
    are counted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stamps: dict[str, int] = {}
        self.looked_up: list[str] = []

    def backend_pod(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        self.looked_up.append(pod["metadata"]["name"])
        return super().backend_pod(pod)

    def backend_stamp(self, pod_key: str, *, upper_uid: str) -> Hashable:
        return (pod_key, upper_uid, self.stamps.get(pod_key, 0))


async def test_the_pod_check_passes_over_pods_found_clean_until_either_side_moves() -> None:
    from vnode.controllers.patrol_checks import PodCheck  # noqa: PLC0415

    backend = {"ns/a": RUNNING, "ns/b": RUNNING, "ns/c": RUNNING, "ns/q": RUNNING}
    provider = StampedBook(backend, owned=[], writing=set())
    pods = _pod_controller(provider)

    def put(name: str, *, version: str, status: dict[str, Any]) -> None:
        meta = {"namespace": "ns", "name": name, "uid": f"u-{name}", "resourceVersion": version}
        pods.informer.store.upsert({"metadata": meta, "spec": {}, "status": status})

    for name in ("a", "b", "c", "q"):
        put(name, version="1", status=RUNNING)
    put("s", version="1", status=RUNNING)  # no backend pod: missing below
    pods.status_from_lower.add("ns/q")  # in hand: no verdict on it, so not remembered
    check = PodCheck(pods=pods, provider=provider)  # type: ignore[arg-type]

    async def run() -> list[Mismatch]:
        provider.looked_up.clear()
        return [m async for m in check.mismatches()]

    assert await run() == [Mismatch(kind="pods", reason="missing_below", key="ns/s")]
    assert sorted(provider.looked_up) == ["a", "b", "c", "q", "s"]

    # Nothing moved: the clean pods are passed over, their backend pods still matched.
    assert await run() == [Mismatch(kind="pods", reason="missing_below", key="ns/s")]
    assert sorted(provider.looked_up) == ["q", "s"], "only the pods not found clean"
    assert provider.passed_over == {"below/a", "below/b", "below/c", "below/q"}

    # The backend pod of b moved (its status with it); the upper pod c moved.
    backend["ns/b"] = {**RUNNING, "message": "new below"}
    provider.stamps["ns/b"] = 1
    put("c", version="2", status={**RUNNING, "message": "edited above"})
    assert await run() == [
        Mismatch(kind="pods", reason="stale_status", key="ns/b"),
        Mismatch(kind="pods", reason="stale_status", key="ns/c"),
        Mismatch(kind="pods", reason="missing_below", key="ns/s"),
    ]
    assert sorted(provider.looked_up) == ["b", "c", "q", "s"]

    # A stale pod is not remembered: found again until repaired; the log says what differs.
    found = {m.key: m.detail async for m in check.mismatches()}
    assert found == {"ns/b": "message", "ns/c": "message", "ns/s": ""}


@pytest.mark.parametrize(
    ("upper_status", "desired", "fields"),
    [
        (RUNNING, RUNNING, ()),
        (RUNNING, None, ()),
        (RUNNING, {**RUNNING, "message": "m"}, ("message",)),
        ({**RUNNING, "reason": "r"}, {**RUNNING, "phase": "Failed"}, ("phase", "reason")),
        ({}, RUNNING, tuple(sorted(RUNNING))),
    ],
)
def test_stale_fields_are_those_a_status_write_would_change(
    upper_status: dict[str, Any], desired: dict[str, Any] | None, fields: tuple[str, ...]
) -> None:
    pod = upper(status=upper_status)
    assert stale_fields(pod, desired) == fields


# --- the mirror check -----------------------------------------------------------------------


class DecidingMirror:
    """The part of a `Mirror` the check reads (a stub, not a Mirror: what matters is which
    keys it asks `decision` about), whose queue holds `queued`; records each decision."""

    name = "widgets"

    @dataclass
    class _Queue:
        keys: set[str]

        def pending(self, key: str) -> bool:
            return key in self.keys

        def add(self, key: str) -> None:
            self.keys.add(key)

    @dataclass
    class _Spec:
        @dataclass
        class _Source:
            plural: str = "widgets"

        source: _Source

    def __init__(self, keys: set[str], *, queued: set[str]) -> None:
        self._keys = keys
        self.queue = self._Queue(set(queued))
        self.spec = self._Spec(self._Spec._Source())
        self.decided: list[str] = []

    def keys(self) -> set[str]:
        return set(self._keys)

    def decision(self, key: str) -> Action:
        self.decided.append(key)
        return Create(desired={})


async def test_the_mirror_check_leaves_queued_keys_to_their_worker_undecided() -> None:
    """A decision may consume what the worker waits for (the claims mirror's read of an upper
    PV, `VolumeProvisioner._policy_in_force`): a key in the queue is not decided at all."""
    from vnode.controllers.patrol_checks import MirrorCheck  # noqa: PLC0415

    mirror = DecidingMirror({"ns/queued", "ns/idle"}, queued={"ns/queued"})
    check = MirrorCheck(mirror)  # type: ignore[arg-type]
    found = [m async for m in check.mismatches()]
    assert found == [Mismatch(kind="widgets", reason="copy_missing", key="ns/idle")]
    assert mirror.decided == ["ns/idle"]


# --- audits that cannot list --------------------------------------------------------------


class Answering:
    """The patrol's client of a cluster (a stub of `request`, raising `error`, under the
    client's own pager)."""

    pages = ApiClient.pages

    def __init__(self, error: Exception) -> None:
        self._error = error

    async def request(self, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        raise self._error


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ValueError("unexpected character: line 1 column 1"), id="not-json"),
        pytest.param(errors.ApiUnavailable("down"), id="down"),
    ],
)
async def test_an_audit_that_cannot_list_leaves_the_store_alone_and_the_run_goes_on(
    error: Exception,
) -> None:
    from tensile.kube.informer import Informer  # noqa: PLC0415
    from tensile.kube.resources import CONFIG_MAPS  # noqa: PLC0415
    from vnode.controllers.patrol import Audit  # noqa: PLC0415
    from vnode.testing.fakeapi import FakeApi  # noqa: PLC0415

    informer = Informer(FakeApi(name="upper"), CONFIG_MAPS, name=f"audited-{error}")
    a = Mismatch(kind="widgets", reason="after_audit", key="ns/a")
    check = Scripted([[a]])
    audit = Audit(informer=informer, client=Answering(error))  # type: ignore[arg-type]
    patrol = Patrol(period=0, audits=[audit], checks=[check])
    assert await patrol.patrol() == {a}, "the comparisons still ran"
    failures = REGISTRY.get_sample_value(
        "tensile_patrol_audit_failures_total", {"informer": informer.name}
    )
    assert failures == 1
