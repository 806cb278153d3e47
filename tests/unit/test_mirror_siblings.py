"""A sibling's copy (made by another virtual node of the same upper cluster): which ones a
mirror keeps, when it writes one, and in whose name.

The rules first, as `SiblingPolicy` states them (pure); then the engine applying them: its
worker runs on informers whose stores the test fills and a fake target
apiserver that records the writes: the fake is for what a real server cannot show on
demand, the moment of each write against a test clock (a live maker and a sibling reacting
to the same change within milliseconds). The same rules on the real apiservers:
tests/e2e/test_mirror.py::test_a_siblings_copy_is_kept_like_our_own_after_the_sibling_is_gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.contracts.objects import Obj
from tensile.kube import errors
from tensile.kube.informer import Informer
from tensile.kube.mirror.engine import Mirror
from tensile.kube.mirror.siblings import SIBLING_GRACE, MakerWaits, SiblingPolicy, Waiting
from tensile.kube.mirror.spec import Change, Creation, KindSpec, Patch, Replace
from tensile.kube.resources import CONFIG_MAPS
from tensile.kube.workqueue import Requeue
from vnode.providers.k2k import naming

US = ownership.NodeIdentity(node_name="vn-us", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
SIBLING = ownership.NodeIdentity(node_name="vn-sibling", cluster_id=US.cluster_id)
TENANCY = naming.NodeTenancy(owner=US, prefix="")
"""Our copies and our siblings' (no prefix: a copy's key is its source's)."""
KEY = "ns/cfg"
PATH = CONFIG_MAPS.path(namespace="ns", name="cfg")


def spec(*, creation: Creation = "always") -> KindSpec:
    """ConfigMaps copied as they are; an immutable copy is replaced."""
    labels, annotations = ownership.owner_marks(US)

    def translate(upper: Obj) -> Obj:
        meta = upper["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": dict(labels),
                "annotations": {**annotations, "test/source-uid": meta["uid"]},
            },
            "data": upper.get("data") or {},
        }

    def compare(lower: Obj, desired: Obj) -> Change:
        if lower.get("data") == desired["data"]:
            return None
        return Replace("immutable") if lower.get("immutable") else Patch({"data": desired["data"]})

    return KindSpec(
        name="test_siblings",
        kind="ConfigMap",
        source=CONFIG_MAPS,
        target=CONFIG_MAPS,
        selects=lambda _upper: True,
        translate=translate,
        compare=compare,
        collectable=lambda _lower, upper: upper is None,
        creation=creation,
        keeps_siblings=lambda _key, _lower: True,
        stands_for=lambda lower, upper: (
            (lower["metadata"].get("annotations") or {}).get("test/source-uid")
            == upper["metadata"]["uid"]
        ),
    )


def upper(data: dict[str, str], *, uid: str = "u1") -> Obj:
    return {"metadata": {"name": "cfg", "namespace": "ns", "uid": uid}, "data": data}


def copy(
    data: dict[str, str],
    *,
    owner: ownership.NodeIdentity,
    version: str,
    source_uid: str = "u1",
    **extra: Any,
) -> Obj:
    labels, annotations = ownership.owner_marks(owner)
    return {
        "metadata": {
            "name": "cfg",
            "namespace": "ns",
            "uid": f"copy-{version}",
            "resourceVersion": version,
            "labels": labels,
            "annotations": {**annotations, "test/source-uid": source_uid},
        },
        "data": data,
        **extra,
    }


STRANGER = ownership.NodeIdentity(
    node_name="vn-us", cluster_id="bbbbbbbb-0000-4000-8000-000000000002"
)


def policy(*, creation: Creation = "always", siblings: bool = True) -> SiblingPolicy:
    return SiblingPolicy(
        tenancy=TENANCY,
        keeps_siblings=lambda _key, _lower: siblings,
        creation=creation,
        grace=SIBLING_GRACE,
    )


@pytest.mark.parametrize(
    ("target", "key", "siblings", "kept"),
    [
        pytest.param(copy({}, owner=US, version="1"), KEY, False, True, id="ours"),
        pytest.param(copy({}, owner=SIBLING, version="1"), KEY, True, True, id="sibling's"),
        pytest.param(
            copy({}, owner=SIBLING, version="1"), "ns/other", True, False, id="sibling's, other key"
        ),
        pytest.param(
            copy({}, owner=SIBLING, version="1"), KEY, False, False, id="sibling's, kind keeps none"
        ),
        pytest.param(
            copy({}, owner=STRANGER, version="1"), KEY, True, False, id="another tenant's"
        ),
        pytest.param(
            {"metadata": {"name": "cfg", "namespace": "ns"}}, KEY, True, False, id="unmarked"
        ),
    ],
)
def test_which_copies_are_kept(target: Obj, key: str, siblings: bool, kept: bool) -> None:
    assert policy(siblings=siblings).keeps(key, target) is kept


def test_a_siblings_on_request_copy_is_collected_by_its_maker_only() -> None:
    theirs, ours = copy({}, owner=SIBLING, version="1"), copy({}, owner=US, version="1")
    assert policy(creation="always").collects(theirs)
    assert not policy(creation="on_request").collects(theirs)
    assert policy(creation="on_request").collects(ours)


def test_a_copy_made_in_place_of_a_siblings_keeps_its_makers_marks() -> None:
    desired = copy({"v": "2"}, owner=US, version="")
    theirs = copy({"v": "1"}, owner=SIBLING, version="1")
    assert policy().in_makers_name(desired, None) is desired
    assert policy().in_makers_name(desired, copy({}, owner=US, version="1")) is desired
    made = policy().in_makers_name(desired, theirs)
    assert ownership.is_owned(made, owner=SIBLING)
    assert not ownership.is_owned(made, owner=US)
    assert made["data"] == {"v": "2"}
    assert ownership.is_owned(desired, owner=US)  # unchanged


@pytest.mark.parametrize(
    ("owner", "version", "waited", "now", "turn"),
    [
        pytest.param(US, "10", None, 0.0, None, id="ours: at once"),
        pytest.param(SIBLING, "10", None, 0.0, Waiting("10", SIBLING_GRACE), id="first seen"),
        pytest.param(
            SIBLING, "10", Waiting("10", 3.0), 1.0, Waiting("10", 3.0), id="within the wait"
        ),
        pytest.param(SIBLING, "10", Waiting("10", 3.0), 3.0, None, id="due: write"),
        pytest.param(
            SIBLING,
            "11",
            Waiting("10", 3.0),
            3.0,
            Waiting("11", 3.0 + SIBLING_GRACE),
            id="moved meanwhile: wait again",
        ),
        pytest.param(SIBLING, "10", Waiting("10", 3.0), 3.0 + SIBLING_GRACE, None, id="late"),
        pytest.param(
            SIBLING,
            "10",
            Waiting("10", 3.0),
            3.1 + SIBLING_GRACE,
            Waiting("10", 3.1 + 2 * SIBLING_GRACE),
            id="nobody came back: afresh",
        ),
    ],
)
def test_the_maker_goes_first(
    owner: ownership.NodeIdentity,
    version: str,
    waited: Waiting | None,
    now: float,
    turn: Waiting | None,
) -> None:
    assert policy().turn(copy({}, owner=owner, version=version), waited, now=now) == turn


def test_waits_nobody_came_back_for_are_dropped_as_new_ones_come() -> None:
    waits = MakerWaits(policy())
    for n in range(63):
        waits.hold(f"ns/{n}", Waiting("1", 0.0), now=0.0)
    assert len(waits) == 63
    waits.settle("ns/0")
    assert waits.get("ns/0") is None
    waits.hold("ns/0", Waiting("1", 0.0), now=0.0)
    assert waits.get("ns/0") == Waiting("1", 0.0)
    late = SIBLING_GRACE + 1.0
    waits.hold("ns/new", Waiting("1", late + SIBLING_GRACE), now=late)  # the 64th: prune
    assert len(waits) == 1
    assert waits.get("ns/new") is not None


class _Lower:
    """A lower apiserver that records the writes. `being_deleted`: the copy's name is
    still held by an object being deleted (a create of it answers AlreadyExists)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.being_deleted = False

    async def request(
        self, method: str, path: str, *, body: Any = None, content_type: str | None = None
    ) -> Obj:
        if method == "GET":
            return {"metadata": {"name": "cfg", "namespace": "ns", "deletionTimestamp": "x"}}
        self.writes.append((method, path, body))
        if method == "POST" and self.being_deleted:
            raise errors.AlreadyExists(code=409, status={"reason": "AlreadyExists"})
        if method == "POST":
            return {**body, "metadata": {**body["metadata"], "uid": "made", "resourceVersion": "9"}}
        return {}


class Engine:
    """A mirror of `spec()` over stores the test fills, with a test clock."""

    def __init__(
        self, *, creation: Creation = "always", in_use: Callable[[str], bool] | None = None
    ) -> None:
        self.now = 1000.0
        self.lower = _Lower()
        self.source = Informer(self.lower, CONFIG_MAPS, name="test-upper")
        self.target = Informer(self.lower, CONFIG_MAPS, name="test-lower")
        self.mirror = Mirror(
            spec=spec(creation=creation),
            tenancy=TENANCY,
            source=self.source,
            target=self.target,
            source_client=self.lower,
            target_client=self.lower,
            in_use=in_use,
            clock=lambda: self.now,
        )

    async def waits(self) -> float:
        """Sync the key; return how long it is left to its maker (fails if it is not)."""
        with pytest.raises(Requeue) as requeued:
            await self.mirror.sync(KEY)
        return requeued.value.after


async def test_a_sibling_leaves_a_changed_copy_to_its_maker_and_writes_it_after_the_grace() -> None:
    engine = Engine()
    engine.source.store.upsert(upper({"v": "2"}))
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10"))

    # Every sibling sees the upstairs change when the maker does: none writes at once,
    assert await engine.waits() == SIBLING_GRACE
    engine.now += 1.0
    assert await engine.waits() == SIBLING_GRACE - 1.0  # another event: the same wait
    assert engine.lower.writes == []
    # ... and the maker's update, in time, settles the key without a write of ours.
    engine.target.store.upsert(copy({"v": "2"}, owner=SIBLING, version="11"))
    await engine.mirror.sync(KEY)
    assert engine.lower.writes == []

    # A maker that does not follow (gone): the sibling writes once the grace is over,
    # leaving the copy in its maker's name.
    engine.source.store.upsert(upper({"v": "3"}))
    assert await engine.waits() == SIBLING_GRACE
    engine.now += SIBLING_GRACE
    await engine.mirror.sync(KEY)
    assert engine.lower.writes == [("PATCH", PATH, {"data": {"v": "3"}})]

    # A sibling that translates differently (a rolling upgrade) writes it back at once:
    # this one waits a grace again before it answers, so the two write at most once per
    # grace each instead of back and forth without pause.
    engine.target.store.upsert(copy({"v": "3-old"}, owner=SIBLING, version="13"))
    assert await engine.waits() == SIBLING_GRACE
    engine.now += SIBLING_GRACE - 0.5
    # A copy that moves while it waits is being kept by someone: the wait starts again.
    engine.target.store.upsert(copy({"v": "3-older"}, owner=SIBLING, version="14"))
    assert await engine.waits() == SIBLING_GRACE
    assert len(engine.lower.writes) == 1
    engine.now += SIBLING_GRACE
    await engine.mirror.sync(KEY)
    assert len(engine.lower.writes) == 2


async def test_the_maker_writes_its_own_copy_at_once() -> None:
    engine = Engine()
    engine.source.store.upsert(upper({"v": "2"}))
    engine.target.store.upsert(copy({"v": "1"}, owner=US, version="10"))
    await engine.mirror.sync(KEY)
    assert engine.lower.writes == [("PATCH", PATH, {"data": {"v": "2"}})]


async def test_a_pod_asking_for_a_siblings_copy_gets_it_current_at_once() -> None:
    engine = Engine(creation="on_request")
    engine.source.store.upsert(upper({"v": "2"}))
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10"))
    assert await engine.mirror.ensure(KEY) == "shared"
    assert engine.lower.writes == [("PATCH", PATH, {"data": {"v": "2"}})]


async def test_a_replaced_siblings_copy_is_made_again_in_its_makers_name() -> None:
    engine = Engine()
    engine.source.store.upsert(upper({"v": "2"}))
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10", immutable=True))
    assert await engine.waits() == SIBLING_GRACE
    engine.now += SIBLING_GRACE
    # The old copy is held a while by a finalizer: the copy is made once it is gone.
    engine.lower.being_deleted = True
    assert await engine.waits() == 1.0
    engine.lower.being_deleted = False
    await engine.mirror.sync(KEY)
    methods = [method for method, _path, _body in engine.lower.writes]
    assert methods == ["DELETE", "POST", "POST"]
    made = engine.lower.writes[-1][2]
    assert made["data"] == {"v": "2"}
    assert ownership.is_owned(made, owner=SIBLING)
    assert not ownership.is_owned(made, owner=US)


async def test_a_siblings_copy_of_an_earlier_object_is_made_again_in_its_makers_name() -> None:
    engine = Engine()
    engine.source.store.upsert(upper({"v": "2"}, uid="u2"))
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10", source_uid="u1"))
    assert await engine.waits() == SIBLING_GRACE
    engine.now += SIBLING_GRACE
    await engine.mirror.sync(KEY)
    methods = [method for method, _path, _body in engine.lower.writes]
    assert methods == ["DELETE", "POST"]
    made = engine.lower.writes[-1][2]
    assert made["metadata"]["annotations"]["test/source-uid"] == "u2"
    assert ownership.is_owned(made, owner=SIBLING)


async def test_a_siblings_copy_whose_source_went_is_left_to_its_maker_then_deleted() -> None:
    engine = Engine()
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10"))
    assert await engine.waits() == SIBLING_GRACE
    assert engine.lower.writes == []
    engine.now += SIBLING_GRACE
    await engine.mirror.sync(KEY)
    assert [method for method, _path, _body in engine.lower.writes] == ["DELETE"]


async def test_a_siblings_copy_we_need_is_made_again_when_its_maker_collects_it() -> None:
    # The sibling that made the copy cannot know our pod creations in flight: it collects the
    # copy its own pods no longer use while ours is between its `ensure` and its POST.
    ours_on_its_way: set[str] = set()
    engine = Engine(creation="on_request", in_use=lambda key: key in ours_on_its_way)
    engine.source.store.upsert(upper({"v": "1"}))
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10"))
    ours_on_its_way.add(KEY)
    assert await engine.mirror.ensure(KEY) == "shared"
    assert engine.lower.writes == []

    engine.target.store.delete(KEY)  # the maker's collection, as the informer shows it
    await engine.mirror.sync(KEY)  # the key its deletion event brought back
    [(method, path, made)] = engine.lower.writes
    assert (method, path) == ("POST", CONFIG_MAPS.path(namespace="ns"))
    assert made["data"] == {"v": "1"}
    assert ownership.is_owned(made, owner=US)  # ours now: our pods use it, we collect it
