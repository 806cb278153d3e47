"""The mirror engine and a sibling's copy (made by another virtual node of the same upper
cluster): when it writes one, and in whose name.

The engine's worker runs on informers whose stores the test fills and a fake target
apiserver that records the writes: the fake is for what a real server cannot show on
demand, the moment of each write against a test clock (a live maker and a sibling reacting
to the same change within milliseconds). The same rules on the real apiservers:
tests/e2e/test_mirror.py::test_a_siblings_copy_is_kept_like_our_own_after_the_sibling_is_gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from vnode.contracts.objects import Obj
from vnode.kube import errors
from vnode.kube.informer import Informer
from vnode.kube.mirror import SIBLING_GRACE, Change, Creation, Mirror, MirrorSpec, Patch, Replace
from vnode.kube.resources import CONFIG_MAPS
from vnode.kube.workqueue import Requeue
from vnode.providers.k2k import naming

US = naming.Owner(node_name="vn-us", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
SIBLING = naming.Owner(node_name="vn-sibling", cluster_id=US.cluster_id)
KEY = "ns/cfg"
PATH = CONFIG_MAPS.path(namespace="ns", name="cfg")


def spec(*, creation: Creation = "always") -> MirrorSpec:
    """ConfigMaps copied as they are; an immutable copy is replaced."""
    labels, annotations = naming.owner_marks(US)

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

    return MirrorSpec(
        name="test_siblings",
        kind="ConfigMap",
        source=CONFIG_MAPS,
        target=CONFIG_MAPS,
        selects=lambda _upper: True,
        translate=translate,
        compare=compare,
        collectable=lambda _lower, upper: upper is None,
        owned=lambda lower: naming.is_owned(lower, owner=US),
        target_key=lambda key: key,
        source_key=lambda lower: f"{lower['metadata']['namespace']}/{lower['metadata']['name']}",
        creation=creation,
        shared=lambda lower: naming.same_cluster(lower, owner=US),
        as_shared=naming.in_name_of,
        stands_for=lambda lower, upper: (
            (lower["metadata"].get("annotations") or {}).get("test/source-uid")
            == upper["metadata"]["uid"]
        ),
    )


def upper(data: dict[str, str], *, uid: str = "u1") -> Obj:
    return {"metadata": {"name": "cfg", "namespace": "ns", "uid": uid}, "data": data}


def copy(
    data: dict[str, str], *, owner: naming.Owner, version: str, source_uid: str = "u1", **extra: Any
) -> Obj:
    labels, annotations = naming.owner_marks(owner)
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

    def __init__(self, *, creation: Creation = "always") -> None:
        self.now = 1000.0
        self.lower = _Lower()
        self.source = Informer(self.lower, CONFIG_MAPS, name="test-upper")
        self.target = Informer(self.lower, CONFIG_MAPS, name="test-lower")
        self.mirror = Mirror(
            spec=spec(creation=creation),
            source=self.source,
            target=self.target,
            source_client=self.lower,
            target_client=self.lower,
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
    assert naming.is_owned(made, owner=SIBLING)
    assert not naming.is_owned(made, owner=US)


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
    assert naming.is_owned(made, owner=SIBLING)


async def test_a_siblings_copy_whose_source_went_is_left_to_its_maker_then_deleted() -> None:
    engine = Engine()
    engine.target.store.upsert(copy({"v": "1"}, owner=SIBLING, version="10"))
    assert await engine.waits() == SIBLING_GRACE
    assert engine.lower.writes == []
    engine.now += SIBLING_GRACE
    await engine.mirror.sync(KEY)
    assert [method for method, _path, _body in engine.lower.writes] == ["DELETE"]
