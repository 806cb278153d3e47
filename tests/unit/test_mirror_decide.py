"""What a mirror does with one key (`tensile.kube.mirror.decide`), as a table.

One ConfigMap kind (labelled mirror=yes upstairs; copied with our marks and the source's
UID; an immutable copy is replaced), keys without a prefix, our node US, a sibling of the
same upper cluster and a stranger of another. Each row gives what the mirror knows (the
source, the target as cached and its own writes in flight, whether something uses the
target, the wait held for a sibling's maker, the clock) and the one action expected. The
engine that performs them runs against a fake apiserver in test_mirror_siblings.py and
against real ones in tests/e2e/test_mirror.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.contracts.objects import Obj
from tensile.kube.mirror.decide import (
    Action,
    Create,
    Delete,
    Missing,
    NameTaken,
    Nothing,
    Occasion,
    Recreate,
    StillDeleting,
    Update,
    UpToDate,
    WaitForMaker,
    decide,
)
from tensile.kube.mirror.inflight import known_target
from tensile.kube.mirror.siblings import SIBLING_GRACE, SiblingPolicy, Waiting
from tensile.kube.mirror.spec import Change, Creation, KindSpec, Patch, Replace
from tensile.kube.resources import CONFIG_MAPS
from vnode.providers.k2k import naming

US = ownership.NodeIdentity(node_name="vn-us", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
SIBLING = ownership.NodeIdentity(node_name="vn-sibling", cluster_id=US.cluster_id)
STRANGER = ownership.NodeIdentity(
    node_name="vn-us", cluster_id="bbbbbbbb-0000-4000-8000-000000000002"
)
TENANCY = naming.NodeTenancy(owner=US, prefix="")
KEY = "ns/cfg"
NOW = 1000.0
SOURCE_UID = "test/source-uid"


POLICY = "test/policy"
"""On the targets of a spec whose writers may differ in settings (`spec(policies=True)`):
the settings a copy was written under; ours are "p1"."""
OTHER_POLICY = "written under p2, not p1"


def other_policy(lower: Obj, _upper: Obj) -> str | None:
    theirs = lower["metadata"]["annotations"].get(POLICY, "p1")
    return None if theirs == "p1" else f"written under {theirs}, not p1"


def spec(
    *, creation: Creation = "always", siblings: bool = True, policies: bool = False
) -> KindSpec:
    def translate(upper: Obj) -> Obj:
        return translation(upper["data"], source_uid=upper["metadata"]["uid"])

    def compare(lower: Obj, desired: Obj) -> Change:
        if lower.get("data") == desired["data"]:
            return None
        return Replace("immutable") if lower.get("immutable") else Patch({"data": desired["data"]})

    return KindSpec(
        name="test_decide",
        kind="ConfigMap",
        source=CONFIG_MAPS,
        target=CONFIG_MAPS,
        selects=lambda upper: (upper["metadata"].get("labels") or {}).get("mirror") == "yes",
        translate=translate,
        compare=compare,
        # On request: garbage once nothing uses it (`in_use`); always: once its source went.
        collectable=lambda _lower, upper: upper is None or creation == "on_request",
        creation=creation,
        stands_for=lambda lower, upper: (
            lower["metadata"]["annotations"].get(SOURCE_UID) == upper["metadata"]["uid"]
        ),
        keeps_siblings=(lambda _key, _lower: True) if siblings else (lambda _key, _lower: False),
        sibling_conflict=other_policy if policies else None,
    )


def upper(data: str = "v1", *, uid: str = "u1", selected: bool = True) -> Obj:
    labels = {"mirror": "yes"} if selected else {}
    return {
        "metadata": {"name": "cfg", "namespace": "ns", "uid": uid, "labels": labels},
        "data": {"v": data},
    }


def translation(data: Any, *, owner: ownership.NodeIdentity = US, source_uid: str = "u1") -> Obj:
    """What the spec makes of `upper(data, uid=source_uid)`, in `owner`'s name."""
    labels, annotations = ownership.owner_marks(owner)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "cfg",
            "namespace": "ns",
            "labels": labels,
            "annotations": {**annotations, SOURCE_UID: source_uid},
        },
        "data": data if isinstance(data, dict) else {"v": data},
    }


def copy(
    data: str = "v1",
    *,
    owner: ownership.NodeIdentity = US,
    source_uid: str = "u1",
    version: str = "10",
    uid: str = "c1",
    **extra: Any,
) -> Obj:
    """A target as the target cluster has it."""
    made = translation(data, owner=owner, source_uid=source_uid)
    made["metadata"].update(uid=uid, resourceVersion=version)
    return {**made, **extra}


OURS = copy()
OURS_OLD = copy("v0")
OURS_FROZEN = copy("v0", immutable=True)
OURS_EARLIER = copy(source_uid="u0")
THEIRS = copy(owner=SIBLING)
THEIRS_OLD = copy("v0", owner=SIBLING)
THEIRS_OLD_MOVED = copy("v0", owner=SIBLING, version="11")
THEIRS_FROZEN = copy("v0", owner=SIBLING, immutable=True)
THEIRS_EARLIER = copy(owner=SIBLING, source_uid="u0")
THEIRS_OTHER_KEY = copy(owner=SIBLING)
THEIRS_OTHER_KEY["metadata"]["annotations"][ownership.UPPER_NAMESPACE_ANNOTATION] = "elsewhere"
THEIRS_P2 = copy(owner=SIBLING)
THEIRS_P2["metadata"]["annotations"][POLICY] = "p2"
THEIRS_P2_OLD = copy("v0", owner=SIBLING)
THEIRS_P2_OLD["metadata"]["annotations"][POLICY] = "p2"
OURS_P2_OLD = copy("v0")
OURS_P2_OLD["metadata"]["annotations"][POLICY] = "p2"
FOREIGN = copy(owner=STRANGER)
GOING = copy()
GOING["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
FIRST_WAIT = Waiting(resource_version="10", due=NOW + SIBLING_GRACE)
"""The wait a sibling's copy (version 10) first seen differing at NOW gets."""

TAKEN = (
    "ConfigMap ns/cfg exists in the target cluster and is {whose}; leaving it alone "
    "(the ConfigMap ns/cfg is not mirrored)"
)
STRANGERS = TAKEN.format(whose=ownership.owner_of(FOREIGN))
EARLIER = TAKEN.format(whose="kept for an earlier object of the same name")
NOT_OURS = "ConfigMap ns/cfg is not this mirror's"
KEPT_FOR_EARLIER = "ConfigMap ns/cfg is kept for an earlier ConfigMap of the same name"
LEFT_TO_MAKER = (
    f"ConfigMap ns/cfg is {ownership.owner_of(THEIRS)}, {OTHER_POLICY}; leaving it to its maker"
)


@dataclass(frozen=True, kw_only=True)
class Row:
    """What the mirror knows of KEY, and what it must do."""

    expect: Action
    source: Obj | None = None
    cached: Obj | None = None
    created: Obj | None = None
    """What the mirror created at the target key, not yet in the cache."""
    deleted: str | None = None
    """The UID the mirror deleted at the target key, still in the cache."""
    occasion: Occasion = "sync"
    creation: Creation = "always"
    siblings: bool = True
    policies: bool = False
    """The spec's writers may differ in settings (`other_policy`)."""
    in_use: bool = False
    waited: Waiting | None = None
    remade: Obj | None = None
    now: float = NOW


ROWS = [
    # -- nothing there ------------------------------------------------------------------
    pytest.param(Row(expect=Nothing()), id="no source, no target: nothing"),
    pytest.param(
        Row(creation="on_request", expect=Nothing()), id="on request, no source, no target: nothing"
    ),
    pytest.param(
        Row(source=upper(), expect=Create(translation("v1"))),
        id="selected source, no target: create",
    ),
    pytest.param(
        Row(source=upper(), creation="on_request", expect=Nothing()),
        id="on request, selected source, no target: nothing until asked",
    ),
    pytest.param(
        Row(
            source=upper(),
            occasion="ensure",
            creation="on_request",
            expect=Create(translation("v1")),
        ),
        id="ensure, no target: create",
    ),
    pytest.param(
        Row(source=upper(selected=False), expect=Nothing()),
        id="source not selected, no target: nothing",
    ),
    pytest.param(Row(occasion="ensure", expect=Missing()), id="ensure, no source: missing"),
    pytest.param(
        Row(source=upper(selected=False), occasion="ensure", cached=OURS, expect=Missing()),
        id="ensure, source not selected: missing",
    ),
    # -- our own copy -------------------------------------------------------------------
    pytest.param(
        Row(source=upper(), cached=OURS, expect=UpToDate(OURS)), id="ours, equal: up to date"
    ),
    pytest.param(
        Row(source=upper(), cached=OURS_OLD, expect=Update(OURS_OLD, Patch({"data": {"v": "v1"}}))),
        id="ours, different: patch",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_FROZEN,
            expect=Recreate(OURS_FROZEN, translation("v1"), "immutable"),
        ),
        id="ours, different and immutable: replace",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_OLD,
            occasion="ensure",
            creation="on_request",
            in_use=True,
            expect=Update(OURS_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="ensure, ours, different: patch",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_OLD,
            creation="on_request",
            in_use=True,
            expect=Update(OURS_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="on request, ours in use, source changed: patch",
    ),
    # -- gone, not selected, collected ---------------------------------------------------
    pytest.param(Row(cached=OURS, expect=Delete(OURS)), id="source gone, ours: delete"),
    pytest.param(
        Row(source=upper(selected=False), cached=OURS, expect=Delete(OURS)),
        id="source not selected any more, ours: delete",
    ),
    pytest.param(
        Row(cached=OURS, creation="on_request", in_use=True, expect=Nothing()),
        id="on request, source gone, ours in use: keep",
    ),
    pytest.param(
        Row(cached=OURS, creation="on_request", expect=Delete(OURS)),
        id="on request, source gone, ours unused: delete",
    ),
    pytest.param(
        Row(source=upper(), cached=OURS, creation="on_request", expect=Delete(OURS)),
        id="on request, ours unused: delete",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS,
            occasion="ensure",
            creation="on_request",
            expect=UpToDate(OURS),
        ),
        id="ensure, ours unused (the pod will use it): up to date",
    ),
    # -- an on-request copy in use, gone ---------------------------------------------------
    pytest.param(
        Row(source=upper(), creation="on_request", in_use=True, expect=Create(translation("v1"))),
        id="on request, no target, in use (deleted below, or collected by its sibling maker "
        "while our pod on its way needs it): create again, in our name",
    ),
    pytest.param(
        Row(creation="on_request", in_use=True, expect=Nothing()),
        id="on request, no target, in use, source gone: nothing to make it from",
    ),
    pytest.param(
        Row(source=upper(selected=False), creation="on_request", in_use=True, expect=Nothing()),
        id="on request, no target, in use, source not selected: nothing",
    ),
    pytest.param(
        Row(
            source=upper(),
            creation="on_request",
            in_use=True,
            created=OURS,
            expect=UpToDate(OURS),
        ),
        id="on request, in use, made, not yet cached: up to date, not made twice",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS,
            deleted=OURS["metadata"]["uid"],
            creation="on_request",
            in_use=True,
            expect=Create(translation("v1")),
        ),
        id="on request, collected by us, still cached, in use again: create again",
    ),
    pytest.param(
        Row(
            source=upper(),
            creation="on_request",
            in_use=True,
            remade=THEIRS_FROZEN,
            expect=Create(translation("v1", owner=SIBLING)),
        ),
        id="on request, in use, a sibling's copy deleted to be made again: in its maker's name",
    ),
    pytest.param(
        Row(
            source=upper(), occasion="collect", creation="on_request", in_use=True, expect=Nothing()
        ),
        id="collect, no target, in use: nothing (a collection never makes one)",
    ),
    # -- a copy of an earlier source object of the same name -----------------------------
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_EARLIER,
            expect=Recreate(
                OURS_EARLIER,
                translation("v1"),
                "made for an earlier ConfigMap of the same name",
                leftover=True,
            ),
        ),
        id="ours, for an earlier source: make it anew",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_EARLIER,
            creation="on_request",
            in_use=True,
            expect=Nothing(),
        ),
        id="on request, ours for an earlier source, in use: keep",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_EARLIER,
            occasion="ensure",
            creation="on_request",
            in_use=True,
            expect=NameTaken(OURS_EARLIER, KEPT_FOR_EARLIER),
        ),
        id="ensure, ours for an earlier source, in use: name taken",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_EARLIER,
            occasion="ensure",
            creation="on_request",
            expect=Recreate(
                OURS_EARLIER,
                translation("v1"),
                "made for an earlier ConfigMap of the same name",
                leftover=True,
            ),
        ),
        id="ensure, ours for an earlier source, unused: make it anew",
    ),
    # -- not ours ----------------------------------------------------------------------
    pytest.param(
        Row(source=upper(), cached=FOREIGN, expect=NameTaken(FOREIGN, STRANGERS)),
        id="another tenant's: name taken, saying whose",
    ),
    pytest.param(
        Row(cached=FOREIGN, expect=Nothing()), id="another tenant's, source gone: nothing"
    ),
    pytest.param(
        Row(source=upper(), cached=FOREIGN, creation="on_request", expect=Nothing()),
        id="on request, another tenant's: nothing until asked",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=FOREIGN,
            occasion="ensure",
            creation="on_request",
            expect=NameTaken(FOREIGN, NOT_OURS),
        ),
        id="ensure, another tenant's: name taken",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OTHER_KEY,
            expect=NameTaken(THEIRS_OTHER_KEY, TAKEN.format(whose=ownership.owner_of(THEIRS))),
        ),
        id="a sibling's copy of another source key: name taken",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS,
            siblings=False,
            expect=NameTaken(THEIRS, TAKEN.format(whose=ownership.owner_of(THEIRS))),
        ),
        id="a sibling's copy, of a kind that keeps none: name taken",
    ),
    # -- a sibling's copy ----------------------------------------------------------------
    pytest.param(
        Row(source=upper(), cached=THEIRS, expect=UpToDate(THEIRS)),
        id="sibling's, equal: up to date",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            expect=WaitForMaker(THEIRS_OLD, FIRST_WAIT, SIBLING_GRACE),
        ),
        id="sibling's, different, first seen: wait for its maker",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            waited=FIRST_WAIT,
            now=NOW + 1,
            expect=WaitForMaker(THEIRS_OLD, FIRST_WAIT, SIBLING_GRACE - 1),
        ),
        id="sibling's, different, within the wait: wait for its maker",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            waited=FIRST_WAIT,
            now=NOW + SIBLING_GRACE,
            expect=Update(THEIRS_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="sibling's, different, after the wait: patch in its maker's name",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD_MOVED,
            waited=FIRST_WAIT,
            now=NOW + SIBLING_GRACE,
            expect=WaitForMaker(
                THEIRS_OLD_MOVED,
                Waiting(resource_version="11", due=NOW + 2 * SIBLING_GRACE),
                SIBLING_GRACE,
            ),
        ),
        id="sibling's, moved while waited for: wait again",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            waited=FIRST_WAIT,
            now=NOW + 3 * SIBLING_GRACE,
            expect=WaitForMaker(
                THEIRS_OLD,
                Waiting(resource_version="10", due=NOW + 4 * SIBLING_GRACE),
                SIBLING_GRACE,
            ),
        ),
        id="sibling's, a wait nobody came back for: wait afresh",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_FROZEN,
            waited=FIRST_WAIT,
            now=NOW + SIBLING_GRACE,
            expect=Recreate(THEIRS_FROZEN, translation("v1", owner=SIBLING), "immutable"),
        ),
        id="sibling's, immutable, after the wait: replace in its maker's name",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_EARLIER,
            expect=WaitForMaker(THEIRS_EARLIER, FIRST_WAIT, SIBLING_GRACE),
        ),
        id="sibling's, for an earlier source: wait for its maker",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_EARLIER,
            waited=FIRST_WAIT,
            now=NOW + SIBLING_GRACE,
            expect=Recreate(
                THEIRS_EARLIER,
                translation("v1", owner=SIBLING),
                "made for an earlier ConfigMap of the same name",
                leftover=True,
            ),
        ),
        id="sibling's, for an earlier source, after the wait: make it anew in its maker's name",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            occasion="ensure",
            creation="on_request",
            expect=Update(THEIRS_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="ensure, sibling's, different: patch at once in its maker's name",
    ),
    pytest.param(
        Row(cached=THEIRS, expect=WaitForMaker(THEIRS, FIRST_WAIT, SIBLING_GRACE)),
        id="source gone, sibling's: wait for its maker",
    ),
    pytest.param(
        Row(cached=THEIRS, waited=FIRST_WAIT, now=NOW + SIBLING_GRACE, expect=Delete(THEIRS)),
        id="source gone, sibling's, after the wait: delete",
    ),
    pytest.param(
        Row(cached=THEIRS, creation="on_request", expect=Nothing()),
        id="on request, source gone, sibling's: left to its maker to collect",
    ),
    pytest.param(
        Row(source=upper(), remade=THEIRS_FROZEN, expect=Create(translation("v1", owner=SIBLING))),
        id="no target, a sibling's copy deleted to be made again: create in its maker's name",
    ),
    # -- the mirror's own writes in flight ------------------------------------------------
    pytest.param(
        Row(source=upper(), created=OURS, expect=UpToDate(OURS)),
        id="made, not yet cached: up to date, not made twice",
    ),
    pytest.param(
        Row(source=upper(), expect=Create(translation("v1"))),
        id="deleted behind our back (nothing cached, nothing remembered): create",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS,
            deleted=OURS["metadata"]["uid"],
            expect=Create(translation("v1")),
        ),
        id="deleted by us, still cached: create again",
    ),
    pytest.param(
        Row(cached=OURS, deleted=OURS["metadata"]["uid"], expect=Nothing()),
        id="deleted by us, still cached, source gone: nothing",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=FOREIGN,
            deleted=OURS["metadata"]["uid"] + "-gone",
            expect=NameTaken(FOREIGN, STRANGERS),
        ),
        id="deleted by us, another object cached since: that one counts",
    ),
    # -- a create that found an object in the way -----------------------------------------
    pytest.param(
        Row(source=upper(), cached=GOING, occasion="met", expect=StillDeleting(GOING)),
        id="met an object being deleted: try again soon",
    ),
    pytest.param(
        Row(source=upper(), cached=OURS, occasion="met", expect=UpToDate(OURS)),
        id="met ours, equal: up to date",
    ),
    pytest.param(
        Row(source=upper(), cached=FOREIGN, occasion="met", expect=NameTaken(FOREIGN, STRANGERS)),
        id="met another tenant's: name taken, saying whose",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_EARLIER,
            occasion="met",
            expect=NameTaken(OURS_EARLIER, EARLIER),
        ),
        id="met ours for an earlier source: name taken",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            occasion="met",
            expect=WaitForMaker(THEIRS_OLD, FIRST_WAIT, SIBLING_GRACE),
        ),
        id="met a sibling's, different: wait for its maker",
    ),
    pytest.param(
        Row(source=upper(), cached=GOING, occasion="met_ensure", expect=StillDeleting(GOING)),
        id="ensure met an object being deleted: try again soon",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=FOREIGN,
            occasion="met_ensure",
            expect=NameTaken(FOREIGN, NOT_OURS),
        ),
        id="ensure met another tenant's: name taken",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            occasion="met_ensure",
            expect=Update(THEIRS_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="ensure met a sibling's, different: patch at once",
    ),
    # -- a collection asked for -----------------------------------------------------------
    pytest.param(
        Row(cached=OURS, occasion="collect", expect=Delete(OURS)), id="collect, source gone: delete"
    ),
    pytest.param(
        Row(source=upper(), cached=OURS, occasion="collect", expect=Nothing()),
        id="collect, source there: keep",
    ),
    pytest.param(
        Row(source=upper(), cached=OURS_EARLIER, occasion="collect", expect=Delete(OURS_EARLIER)),
        id="collect, ours for an earlier source: delete",
    ),
    pytest.param(
        Row(cached=OURS, occasion="collect", creation="on_request", in_use=True, expect=Nothing()),
        id="collect, in use: keep",
    ),
    pytest.param(
        Row(cached=THEIRS, occasion="collect", expect=Nothing()),
        id="collect, sibling's: left to its maker",
    ),
    pytest.param(Row(occasion="collect", expect=Nothing()), id="collect, no target: nothing"),
    # -- a sibling's copy written under other settings --------------------------------------
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_P2_OLD,
            policies=True,
            waited=FIRST_WAIT,
            now=NOW + SIBLING_GRACE,
            expect=NameTaken(THEIRS_P2_OLD, LEFT_TO_MAKER),
        ),
        id="sibling's under other settings, different, after the wait: left to its maker",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_P2,
            policies=True,
            expect=NameTaken(THEIRS_P2, LEFT_TO_MAKER),
        ),
        id="sibling's under other settings: told, never written",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_P2_OLD,
            policies=True,
            occasion="ensure",
            expect=NameTaken(THEIRS_P2_OLD, LEFT_TO_MAKER),
        ),
        id="ensure, sibling's under other settings: left to its maker",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=THEIRS_OLD,
            policies=True,
            waited=FIRST_WAIT,
            now=NOW + SIBLING_GRACE,
            expect=Update(THEIRS_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="sibling's under the same settings, after the wait: patch as before",
    ),
    pytest.param(
        Row(
            source=upper(),
            cached=OURS_P2_OLD,
            policies=True,
            expect=Update(OURS_P2_OLD, Patch({"data": {"v": "v1"}})),
        ),
        id="ours, written under settings we had before: patch",
    ),
    pytest.param(
        Row(
            cached=THEIRS_P2,
            policies=True,
            waited=Waiting(resource_version="10", due=NOW),
            expect=Delete(THEIRS_P2),
        ),
        id="source gone, sibling's under other settings, after the wait: delete all the same",
    ),
]


@pytest.mark.parametrize("row", ROWS)
def test_decide(row: Row) -> None:
    kind = spec(creation=row.creation, siblings=row.siblings, policies=row.policies)
    current = known_target(row.cached, created=row.created, deleted=row.deleted)
    action = decide(
        KEY,
        source=row.source,
        current=current,
        spec=kind,
        siblings=SiblingPolicy.of(kind, tenancy=TENANCY),
        occasion=row.occasion,
        in_use=row.in_use,
        waited=row.waited,
        remade=row.remade,
        now=row.now,
    )
    assert action == row.expect


def test_the_decision_changes_none_of_its_inputs() -> None:
    source, current = upper(), THEIRS_FROZEN
    before = (repr(source), repr(current))
    kind = spec()
    decide(
        KEY,
        source=source,
        current=current,
        spec=kind,
        siblings=SiblingPolicy.of(kind, tenancy=TENANCY),
        waited=FIRST_WAIT,
        now=NOW + SIBLING_GRACE,
    )
    assert (repr(source), repr(current)) == before


@pytest.mark.parametrize(
    ("cached", "created", "deleted", "known"),
    [
        pytest.param(None, None, None, None, id="nothing cached or written"),
        pytest.param(OURS, None, None, OURS, id="cached"),
        pytest.param(None, OURS, None, OURS, id="created, not yet cached"),
        pytest.param(OURS_OLD, OURS, None, OURS_OLD, id="created, the cache shows an object"),
        pytest.param(OURS, None, "c1", None, id="deleted, still cached"),
        pytest.param(None, None, "c1", None, id="deleted, cache caught up"),
        pytest.param(FOREIGN, None, "c0", FOREIGN, id="deleted, another object cached since"),
    ],
)
def test_the_target_as_known(
    cached: Obj | None, created: Obj | None, deleted: str | None, known: Obj | None
) -> None:
    assert known_target(cached, created=created, deleted=deleted) == known
