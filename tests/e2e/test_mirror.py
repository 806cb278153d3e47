"""The mirror engine (tensile.kube.mirror) between the fleet's real upper and lower apiservers.

The engine runs in the test's own event loop with a small ConfigMap spec (ConfigMaps
labelled mirror=yes in the test namespace, copied below with ownership marks), so every
rule is seen against real list+watch, real conflicts and real deletions: creation,
updates, repair of copies someone else changed or deleted, conflicts with objects that are
not ours, garbage collection (also of leftovers at start), on-request copies kept while in
use, the race of a delete right after a create the cache has not shown yet, and copies a
sibling made (another writer of the same copies) kept like our own after it is gone; and
the same engine mirroring from the lower cluster up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from devcluster.fleet import Fleet
from tensile.contracts import ownership
from tensile.contracts.objects import Obj
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.mirror.engine import Mirror, NameTakenError
from tensile.kube.mirror.spec import Change, Creation, KindSpec, Patch, Replace
from tensile.kube.resources import CONFIG_MAPS
from tests.e2e.helpers import until
from vnode.providers.k2k import naming

OWNER = ownership.NodeIdentity(node_name="mirror-test", cluster_id="mirror-test-cluster")
OTHER = ownership.NodeIdentity(node_name="mirror-test", cluster_id="someone-else")
SIBLING = ownership.NodeIdentity(node_name="mirror-sibling", cluster_id=OWNER.cluster_id)
"""Another node of OWNER's cluster: its copies are shared."""
TENANCY = naming.NodeTenancy(owner=OWNER, prefix="")
"""OWNER's copies and its siblings' (no prefix: a copy's key is its source's)."""


def spec(*, creation: Creation = "always") -> KindSpec:
    labels, annotations = ownership.owner_marks(OWNER)

    def translate(upper: Obj) -> Obj:
        meta = upper["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": {**annotations, "test/source-uid": meta["uid"]},
            },
            "data": upper.get("data") or {},
        }

    def compare(lower: Obj, desired: Obj) -> Change:
        if (lower.get("data") or {}) == desired["data"]:
            return None
        if lower.get("immutable"):
            return Replace("immutable")
        return Patch({"data": desired["data"]})

    def report(upper: Obj, lower: Obj) -> Obj | None:
        uid = lower["metadata"]["uid"]
        if (upper["metadata"].get("annotations") or {}).get("test/copy") == uid:
            return None
        return {"metadata": {"annotations": {"test/copy": uid}}}

    return KindSpec(
        name=f"test_configmaps_{creation}",
        kind="ConfigMap",
        source=CONFIG_MAPS,
        target=CONFIG_MAPS,
        selects=lambda upper: (upper["metadata"].get("labels") or {}).get("mirror") == "yes",
        translate=translate,
        compare=compare,
        collectable=lambda _lower, upper: upper is None or creation == "on_request",
        creation=creation,
        report=report if creation == "always" else None,
        keeps_siblings=lambda _key, _lower: True,
        stands_for=lambda lower, upper: (
            (lower["metadata"].get("annotations") or {}).get("test/source-uid")
            == upper["metadata"]["uid"]
        ),
    )


@contextlib.asynccontextmanager
async def clients(fleet: Fleet) -> AsyncIterator[tuple[ApiClient, ApiClient]]:
    async with (
        ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as upper,
        ApiClient(config.load(str(fleet.lower.kubeconfig)), name="lower") as lower,
    ):
        yield upper, lower


@contextlib.asynccontextmanager
async def running(
    upper: ApiClient,
    lower: ApiClient,
    namespace: str,
    *,
    creation: Creation = "always",
    in_use: Callable[[str], bool] | None = None,
    problems: list[str] | None = None,
) -> AsyncIterator[Mirror]:
    factory = InformerFactory()
    source = factory.informer(upper, CONFIG_MAPS, namespace=namespace)
    # The copies of OWNER's whole cluster: its siblings' too, as the virtual node's are.
    target = factory.informer(
        lower, CONFIG_MAPS, namespace=namespace, label_selector=ownership.cluster_selector(OWNER)
    )

    async def on_problem(_source: Obj, message: str) -> None:
        if problems is not None:
            problems.append(message)

    mirror = Mirror(
        spec=spec(creation=creation),
        tenancy=TENANCY,
        source=source,
        target=target,
        source_client=upper,
        target_client=lower,
        in_use=in_use,
        on_problem=on_problem,
        collect_delay=0.1,
    )
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(i.run(), name=f"test-{i.name}") for i in (source, target)]
        await asyncio.wait_for(source.wait_synced(), 30)
        await asyncio.wait_for(target.wait_synced(), 30)
        await mirror.start()
        tasks.append(group.create_task(mirror.run(), name="test-mirror"))
        try:
            yield mirror
        finally:
            await mirror.shut_down()
            for task in tasks:
                task.cancel()


async def get(client: ApiClient, namespace: str, name: str) -> Obj | None:
    try:
        return await client.request("GET", CONFIG_MAPS.path(namespace=namespace, name=name))
    except errors.NotFound:
        return None


def cm(name: str, data: dict[str, str], *, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"mirror": "yes"} if labels is None else labels},
        "data": data,
    }


async def test_copies_follow_their_source_are_repaired_and_collected(
    fleet: Fleet, namespace: str
) -> None:
    async with clients(fleet) as (upper, lower), running(upper, lower, namespace):
        path = CONFIG_MAPS.path(namespace=namespace)
        await upper.request("POST", path, body=cm("a", {"v": "1"}))
        await upper.request("POST", path, body=cm("unlabelled", {"v": "1"}, labels={}))

        async def copy_data() -> dict[str, str] | None:
            found = await get(lower, namespace, "a")
            return None if found is None else found.get("data")

        await until("the copy", copy_data)
        copy = await get(lower, namespace, "a")
        assert copy is not None
        assert ownership.is_owned(copy, owner=OWNER)
        source = await until(
            "the copy's UID recorded on the source",
            lambda: _annotated(upper, namespace, "a", copy["metadata"]["uid"]),
        )
        assert source["data"] == {"v": "1"}

        a = CONFIG_MAPS.path(namespace=namespace, name="a")
        merge = "application/merge-patch+json"
        await upper.request("PATCH", a, body={"data": {"v": "2"}}, content_type=merge)
        await until("the update below", lambda: _data_is(lower, namespace, "a", {"v": "2"}))

        # Someone edits our copy, then deletes it: both are repaired.
        await lower.request("PATCH", a, body={"data": {"v": "edited"}}, content_type=merge)
        await until("the edit undone", lambda: _data_is(lower, namespace, "a", {"v": "2"}))
        await lower.request("DELETE", a)
        await until("the copy made again", lambda: _data_is(lower, namespace, "a", {"v": "2"}))

        await upper.request("DELETE", a)
        await until("the copy deleted", lambda: _absent(lower, namespace, "a"))
        assert await get(lower, namespace, "unlabelled") is None


async def test_the_engine_mirrors_from_the_lower_cluster_up_as_well(
    fleet: Fleet, namespace: str
) -> None:
    """Direction is only which informers and clients a mirror gets: the same spec with the
    lower cluster as source copies, follows and collects upstairs."""
    async with clients(fleet) as (upper, lower), running(lower, upper, namespace):
        await lower.request(
            "POST", CONFIG_MAPS.path(namespace=namespace), body=cm("up", {"v": "1"})
        )
        await until("the copy upstairs", lambda: _data_is(upper, namespace, "up", {"v": "1"}))
        copy = await get(upper, namespace, "up")
        assert copy is not None
        assert ownership.is_owned(copy, owner=OWNER)
        up = CONFIG_MAPS.path(namespace=namespace, name="up")
        merge = "application/merge-patch+json"
        await lower.request("PATCH", up, body={"data": {"v": "2"}}, content_type=merge)
        await until("the update upstairs", lambda: _data_is(upper, namespace, "up", {"v": "2"}))
        await lower.request("DELETE", up)
        await until("the copy gone upstairs", lambda: _absent(upper, namespace, "up"))


async def test_an_object_that_is_not_ours_is_a_conflict_and_never_touched(
    fleet: Fleet, namespace: str
) -> None:
    problems: list[str] = []
    async with clients(fleet) as (upper, lower):
        path = CONFIG_MAPS.path(namespace=namespace)
        labels, annotations = ownership.owner_marks(OTHER)
        theirs = cm("taken", {"v": "theirs"}, labels=labels)
        theirs["metadata"]["annotations"] = annotations
        await lower.request("POST", path, body=theirs)
        async with running(upper, lower, namespace, problems=problems):
            await upper.request("POST", path, body=cm("taken", {"v": "ours"}))
            await until("the conflict reported", lambda: problems)
            assert f"ConfigMap {namespace}/taken exists in the target cluster" in problems[0]
            await upper.request("DELETE", CONFIG_MAPS.path(namespace=namespace, name="taken"))
            await asyncio.sleep(1.0)
        kept = await get(lower, namespace, "taken")
        assert kept is not None
        assert kept["data"] == {"v": "theirs"}


async def test_copies_whose_source_went_while_no_one_watched_are_collected_at_start(
    fleet: Fleet, namespace: str
) -> None:
    async with clients(fleet) as (upper, lower):
        labels, annotations = ownership.owner_marks(OWNER)
        leftover = cm("leftover", {}, labels=labels)
        leftover["metadata"]["annotations"] = annotations
        await lower.request("POST", CONFIG_MAPS.path(namespace=namespace), body=leftover)
        async with running(upper, lower, namespace):
            await until("the leftover collected", lambda: _absent(lower, namespace, "leftover"))


async def test_a_copy_of_an_earlier_object_of_the_same_name_is_made_again(
    fleet: Fleet, namespace: str
) -> None:
    async with clients(fleet) as (upper, lower):
        path = CONFIG_MAPS.path(namespace=namespace)
        x = CONFIG_MAPS.path(namespace=namespace, name="x")
        async with running(upper, lower, namespace):
            first = await upper.request("POST", path, body=cm("x", {"v": "1"}))
            await until("the copy", lambda: _data_is(lower, namespace, "x", {"v": "1"}))
        # While no mirror runs, the source is deleted and made again under the same name.
        await upper.request("DELETE", x)
        second = await upper.request("POST", path, body=cm("x", {"v": "1"}))
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        stale = await get(lower, namespace, "x")
        assert stale is not None
        async with running(upper, lower, namespace):

            async def remade() -> bool:
                found = await get(lower, namespace, "x")
                annotations = (found or {}).get("metadata", {}).get("annotations") or {}
                return annotations.get("test/source-uid") == second["metadata"]["uid"]

            await until("the copy made for the new object", remade)
        fresh = await get(lower, namespace, "x")
        assert fresh is not None
        assert fresh["metadata"]["uid"] != stale["metadata"]["uid"]


async def test_on_request_copies_are_made_when_asked_and_kept_while_in_use(
    fleet: Fleet, namespace: str
) -> None:
    used: set[str] = set()
    problems: list[str] = []
    async with (
        clients(fleet) as (upper, lower),
        running(
            upper,
            lower,
            namespace,
            creation="on_request",
            in_use=lambda copy_key: copy_key.partition("/")[2] in used,
            problems=problems,
        ) as mirror,
    ):
        path = CONFIG_MAPS.path(namespace=namespace)
        for name in ("used", "race", "theirs"):
            await upper.request("POST", path, body=cm(name, {"v": "1"}))
        await until("the sources cached", lambda: len(list(mirror.source.store)) >= 3)
        await asyncio.sleep(0.5)
        assert await get(lower, namespace, "used") is None  # nothing asked for it yet

        used.add("used")
        assert await mirror.ensure(f"{namespace}/used") == "created"
        assert await mirror.ensure(f"{namespace}/used") == "present"
        mirror.schedule_collection([f"{namespace}/used"])
        await asyncio.sleep(1.0)
        assert await get(lower, namespace, "used") is not None
        used.discard("used")
        mirror.schedule_collection([f"{namespace}/used"])
        await until("the unused copy collected", lambda: _absent(lower, namespace, "used"))

        # Created and collected at once, before the cache can have shown the copy: the
        # collection finds it by what the create returned.
        assert await mirror.ensure(f"{namespace}/race") == "created"
        await mirror.collect(f"{namespace}/race")
        assert await get(lower, namespace, "race") is None
        # ... and a copy collected a moment ago is made again, not taken as present.
        assert await mirror.ensure(f"{namespace}/race") == "created"
        assert await get(lower, namespace, "race") is not None

        labels, annotations = ownership.owner_marks(OTHER)
        foreign = cm("theirs", {"v": "x"}, labels=labels)
        foreign["metadata"]["annotations"] = annotations
        await lower.request("POST", path, body=foreign)
        with pytest.raises(NameTakenError):
            await mirror.ensure(f"{namespace}/theirs")
        with pytest.raises(KeyError):
            await mirror.ensure(f"{namespace}/missing")


async def test_a_siblings_copy_is_kept_like_our_own_after_the_sibling_is_gone(
    fleet: Fleet, namespace: str
) -> None:
    """A copy another writer of the same copies made (a virtual node of the same upper
    cluster over the same lower cluster), whose maker no longer runs: followed, repaired,
    replaced and collected like our own, and left in its maker's name throughout (also
    the copy made again in place of an immutable one)."""
    merge = "application/merge-patch+json"
    async with clients(fleet) as (upper, lower):
        path = CONFIG_MAPS.path(namespace=namespace)
        made = {}
        for name in ("always", "asked", "frozen"):
            source = await upper.request("POST", path, body=cm(name, {"v": "1"}))
            labels, annotations = ownership.owner_marks(SIBLING)
            copy = cm(name, {"v": "1"}, labels=labels)
            copy["metadata"]["annotations"] = {
                **annotations,
                "test/source-uid": source["metadata"]["uid"],
            }
            if name == "frozen":
                copy["immutable"] = True  # a change replaces it
            made[name] = await lower.request("POST", path, body=copy)

        async def theirs_with(name: str, data: dict[str, str]) -> bool:
            found = await get(lower, namespace, name)
            return (
                found is not None
                and found.get("data") == data
                and found["metadata"]["uid"] == made[name]["metadata"]["uid"]
                and ownership.is_owned(found, owner=SIBLING)
            )

        async def remade_theirs(name: str, data: dict[str, str]) -> bool:
            found = await get(lower, namespace, name)
            return (
                found is not None
                and found.get("data") == data
                and found["metadata"]["uid"] != made[name]["metadata"]["uid"]
                and ownership.is_owned(found, owner=SIBLING)
                and not ownership.is_owned(found, owner=OWNER)
            )

        always = CONFIG_MAPS.path(namespace=namespace, name="always")
        frozen = CONFIG_MAPS.path(namespace=namespace, name="frozen")
        async with running(upper, lower, namespace):
            await upper.request("PATCH", always, body={"data": {"v": "2"}}, content_type=merge)
            await upper.request("PATCH", frozen, body={"data": {"v": "2"}}, content_type=merge)
            await until("the sibling's copy updated", lambda: theirs_with("always", {"v": "2"}))
            await until("the sibling's copy replaced", lambda: remade_theirs("frozen", {"v": "2"}))
            await lower.request("PATCH", always, body={"data": {"v": "x"}}, content_type=merge)
            await until("the edit undone", lambda: theirs_with("always", {"v": "2"}))
            await upper.request("DELETE", always)
            await until("the sibling's copy collected", lambda: _absent(lower, namespace, "always"))

        asked = CONFIG_MAPS.path(namespace=namespace, name="asked")
        async with running(upper, lower, namespace, creation="on_request") as mirror:
            # Used by our pods as it is, brought up to date when asked and when its source
            # changes, and never collected by us (the sibling's pods are what use it).
            await upper.request("PATCH", asked, body={"data": {"v": "2"}}, content_type=merge)
            await until("the source change cached", lambda: _source_is(mirror, namespace))
            assert await mirror.ensure(f"{namespace}/asked") == "shared"
            assert await theirs_with("asked", {"v": "2"})
            await upper.request("PATCH", asked, body={"data": {"v": "3"}}, content_type=merge)
            await until("the sibling's copy updated", lambda: theirs_with("asked", {"v": "3"}))
            await mirror.collect(f"{namespace}/asked")
            assert await theirs_with("asked", {"v": "3"})


def _source_is(mirror: Mirror, namespace: str) -> bool:
    found = mirror.source.store.get(f"{namespace}/asked")
    return found is not None and found.get("data") == {"v": "2"}


async def _annotated(client: ApiClient, namespace: str, name: str, uid: str) -> Obj | None:
    found = await get(client, namespace, name)
    annotations = (found or {}).get("metadata", {}).get("annotations") or {}
    return found if annotations.get("test/copy") == uid else None


async def _data_is(client: ApiClient, namespace: str, name: str, data: dict[str, str]) -> bool:
    found = await get(client, namespace, name)
    return found is not None and found.get("data") == data


async def _absent(client: ApiClient, namespace: str, name: str) -> bool:
    return await get(client, namespace, name) is None
