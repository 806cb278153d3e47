"""The avoidance record (descheduler writes, webhook reads) and the NotIn merge into a pod's
required node affinity: the matrix of affinity shapes, and a property checked against the
scheduler's own term semantics (tensile.contracts.scheduling.term_matches)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensile.contracts import avoidance
from tensile.contracts.avoidance import Avoidance, Owner, RecordFull
from tensile.contracts.scheduling import term_matches

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(minutes=5)
OWNER = Owner(
    uid="0f3c2a9e-7b1d-4c55-8e2f-5a6b7c8d9e01",
    api_version="apps/v1",
    kind="ReplicaSet",
    namespace="shop",
    name="web-7d9f",
)
R = "requiredDuringSchedulingIgnoredDuringExecution"
P = "preferredDuringSchedulingIgnoredDuringExecution"


def notin(*nodes: str) -> dict[str, Any]:
    return {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": list(nodes)}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {R: {"nodeSelectorTerms": list(terms)}}}


# -- the record ----------------------------------------------------------------------------


def test_an_entry_renders_as_the_documented_compact_json_and_parses_back() -> None:
    entry = Avoidance(owner=OWNER, nodes={"vn-b": LATER, "vn-a": NOW + dt.timedelta(seconds=30)})
    text = avoidance.render_entry(entry)
    assert text == (
        '{"owner":{"apiVersion":"apps/v1","kind":"ReplicaSet","namespace":"shop",'
        '"name":"web-7d9f"},"nodes":{"vn-a":"2026-03-01T12:00:30Z","vn-b":"2026-03-01T12:05:00Z"}}'
    )
    assert avoidance.parse_entry(OWNER.uid, text) == entry


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "not json",
        "[]",
        '{"owner":{}}',
        '{"owner":{"apiVersion":"v1","kind":"K","namespace":"n","name":"x"},"nodes":[]}',
        '{"owner":{"apiVersion":"v1","kind":"K","namespace":"n","name":1},"nodes":{}}',
        '{"owner":{"apiVersion":"v1","kind":"K","namespace":"n","name":"x"},"nodes":{"a":"soon"}}',
        '{"owner":{"apiVersion":"v1","kind":"K","namespace":"n","name":"x"},"nodes":{"a":5}}',
        # No offset: not RFC 3339.
        '{"owner":{"apiVersion":"v1","kind":"K","namespace":"n","name":"x"},'
        '"nodes":{"a":"2026-03-01T12:00:00"}}',
        '{"owner":{"apiVersion":"v1","kind":"K","namespace":"n","name":"x"},"nodes":{"":"2026-03-01T12:00:00Z"}}',
        "[" * 100_000,
    ],
)
def test_entries_that_are_not_valid_are_ignored_not_fatal(value: object) -> None:
    assert avoidance.parse_entry("uid", value) is None
    assert avoidance.avoided_nodes({"uid": value}, owner_uid="uid", now=NOW) == frozenset()  # type: ignore[dict-item]


def test_readers_ignore_expired_nodes() -> None:
    data = avoidance.with_avoidance(None, owner=OWNER, nodes=["vn-a"], until=LATER, now=NOW)
    assert avoidance.avoided_nodes(data, owner_uid=OWNER.uid, now=NOW) == {"vn-a"}
    assert avoidance.avoided_nodes(data, owner_uid=OWNER.uid, now=LATER) == frozenset()
    assert avoidance.avoided_nodes(data, owner_uid="someone-else", now=NOW) == frozenset()
    assert avoidance.avoided_nodes(None, owner_uid=OWNER.uid, now=NOW) == frozenset()


def test_the_writer_merges_nodes_keeps_later_expiries_and_prunes_the_rest() -> None:
    other = Owner(
        uid="other-uid", api_version="apps/v1", kind="StatefulSet", namespace="x", name="db"
    )
    data = avoidance.with_avoidance(None, owner=OWNER, nodes=["vn-a"], until=LATER, now=NOW)
    data = avoidance.with_avoidance(
        data, owner=other, nodes=["vn-a"], until=NOW + dt.timedelta(seconds=10), now=NOW
    )
    data["garbage"] = "{"
    before = copy.deepcopy(data)
    # Later: `other` has expired, and vn-a's longer expiry survives a shorter re-add.
    later = NOW + dt.timedelta(seconds=20)
    result = avoidance.with_avoidance(
        data, owner=OWNER, nodes=["vn-b", "vn-a"], until=NOW + dt.timedelta(seconds=60), now=later
    )
    assert data == before  # inputs are never mutated
    assert set(result) == {OWNER.uid}
    entry = avoidance.parse_entry(OWNER.uid, result[OWNER.uid])
    assert entry is not None
    assert entry.nodes == {"vn-a": LATER, "vn-b": NOW + dt.timedelta(seconds=60)}
    assert avoidance.pruned(result, now=NOW + dt.timedelta(seconds=70)) == {
        OWNER.uid: avoidance.render_entry(Avoidance(owner=OWNER, nodes={"vn-a": LATER}))
    }
    assert avoidance.pruned(result, now=LATER + dt.timedelta(days=1)) == {}


def test_an_owner_uid_that_cannot_be_a_configmap_key_is_refused() -> None:
    bad = Owner(uid="a/b", api_version="v1", kind="K", namespace="n", name="x")
    with pytest.raises(ValueError, match="ConfigMap key"):
        avoidance.with_avoidance(None, owner=bad, nodes=["vn-a"], until=LATER, now=NOW)
    with pytest.raises(ValueError, match="empty"):
        avoidance.with_avoidance(None, owner=OWNER, nodes=[""], until=LATER, now=NOW)


def test_a_full_record_refuses_a_new_owner_and_drops_nobody() -> None:
    def owner(i: int) -> Owner:
        return Owner(
            uid=f"{i:08d}-0000-0000-0000-000000000000",
            api_version="apps/v1",
            kind="ReplicaSet",
            namespace="shop",
            name=f"web-{i}",
        )

    data: dict[str, str] = {}
    size = fitting = 0
    while True:
        entry = avoidance.render_entry(Avoidance(owner=owner(fitting), nodes={"vn-a": LATER}))
        if size + len(owner(fitting).uid) + len(entry) > avoidance.MAX_RECORD_BYTES:
            break
        data[owner(fitting).uid] = entry
        size += len(owner(fitting).uid) + len(entry)
        fitting += 1
    assert fitting > 4000  # the documented capacity: some 4,500 owners
    with pytest.raises(RecordFull, match="waits"):
        avoidance.with_avoidance(data, owner=owner(fitting), nodes=["vn-a"], until=LATER, now=NOW)
    # An owner already there may still add a node when that fits, and nobody is dropped.
    smaller = dict(list(data.items())[:-1])
    grown = avoidance.with_avoidance(smaller, owner=owner(0), nodes=["vn-b"], until=LATER, now=NOW)
    assert set(grown) == set(smaller)
    assert avoidance.record_bytes(grown) <= avoidance.MAX_RECORD_BYTES


def test_the_controller_is_the_owner_reference_with_controller_true() -> None:
    pod = {
        "metadata": {
            "namespace": "shop",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-only", "uid": "u1"},
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d9f",
                    "uid": OWNER.uid,
                    "controller": True,
                },
            ],
        }
    }
    assert avoidance.controller_of(pod) == OWNER
    bare = {"metadata": {"ownerReferences": [{"kind": "ConfigMap", "uid": "u1", "name": "x"}]}}
    assert avoidance.controller_of(bare) is None
    assert avoidance.controller_of({}) is None


# -- the NotIn merge -----------------------------------------------------------------------


def test_no_affinity_gets_one_required_term() -> None:
    assert avoidance.avoiding(None, ["vn-a"]) == required({"matchExpressions": [notin("vn-a")]})


def test_pod_affinity_and_preferred_terms_are_kept() -> None:
    preferred = [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]}}
    ]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}
    affinity = {"nodeAffinity": {P: preferred}, "podAntiAffinity": anti}
    result = avoidance.avoiding(affinity, ["vn-a"])
    assert result == {
        "nodeAffinity": {
            P: preferred,
            R: {"nodeSelectorTerms": [{"matchExpressions": [notin("vn-a")]}]},
        },
        "podAntiAffinity": anti,
    }


def test_every_term_gets_the_requirement_and_none_is_dropped() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    name_field = {"key": "metadata.name", "operator": "In", "values": ["vn-a", "vn-b"]}
    affinity = required(
        {"matchExpressions": [zone]},
        {"matchFields": [name_field]},  # matchFields only: kept, and gets an expression
        {"matchExpressions": [zone, notin("vn-z")], "matchFields": [name_field]},
    )
    before = copy.deepcopy(affinity)
    result = avoidance.avoiding(affinity, ["vn-a", "vn-b", "vn-a"])
    assert affinity == before
    assert result == required(
        {"matchExpressions": [zone, notin("vn-a", "vn-b")]},
        {"matchFields": [name_field], "matchExpressions": [notin("vn-a", "vn-b")]},
        # An existing NotIn gets the values merged: no second expression.
        {"matchExpressions": [zone, notin("vn-z", "vn-a", "vn-b")], "matchFields": [name_field]},
    )


def test_an_empty_term_stays_empty_and_selects_nothing() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    result = avoidance.avoiding(required({}, {"matchExpressions": [zone]}), ["vn-a"])
    assert result == required({}, {"matchExpressions": [zone, notin("vn-a")]})


def test_no_nodes_changes_nothing() -> None:
    affinity = required({"matchExpressions": [notin("x")]})
    assert avoidance.avoiding(affinity, []) == affinity
    assert avoidance.avoiding(None, []) is None


def test_required_without_terms_gets_one() -> None:
    affinity = {"nodeAffinity": {R: {"nodeSelectorTerms": []}}}
    assert avoidance.avoiding(affinity, ["vn-a"]) == required({"matchExpressions": [notin("vn-a")]})


def test_the_avoided_nodes_read_back_from_the_affinity() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    once = avoidance.avoiding(required({"matchExpressions": [zone]}, {}), ["vn-a"])
    twice = avoidance.avoiding(once, ["vn-b"])
    assert avoidance.avoided_by_affinity(twice) == {"vn-a", "vn-b"}
    # A term that excludes nothing: the pod may still go anywhere through it.
    assert (
        avoidance.avoided_by_affinity(
            required({"matchExpressions": [zone]}, {"matchExpressions": [notin("vn-a")]})
        )
        == frozenset()
    )
    assert avoidance.avoided_by_affinity(None) == frozenset()


_NODES = ["vn-a", "vn-b", "vn-c", "vn-d"]
_LABELS = {
    "vn-a": {"zone": "a", "tier": "gold"},
    "vn-b": {"zone": "b"},
    "vn-c": {"zone": "a"},
    "vn-d": {"tier": "gold"},
}
_expressions = st.lists(
    st.one_of(
        st.builds(
            lambda key, op, values: {"key": key, "operator": op, "values": values},
            st.sampled_from(["zone", "tier", "kubernetes.io/hostname"]),
            st.sampled_from(["In", "NotIn"]),
            st.lists(st.sampled_from(["a", "b", "gold", *_NODES]), min_size=1, max_size=3),
        ),
        st.builds(
            lambda key, op: {"key": key, "operator": op},
            st.sampled_from(["zone", "tier"]),
            st.sampled_from(["Exists", "DoesNotExist"]),
        ),
    ),
    max_size=3,
)
_fields = st.lists(
    st.builds(
        lambda op, values: {"key": "metadata.name", "operator": op, "values": values},
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(_NODES), min_size=1, max_size=1),
    ),
    max_size=1,
)
_terms = st.lists(
    st.builds(
        lambda e, f: {k: v for k, v in (("matchExpressions", e), ("matchFields", f)) if v},
        _expressions,
        _fields,
    ),
    max_size=3,
)


def _fits(affinity: dict[str, Any] | None, node: str) -> bool:
    terms = ((affinity or {}).get("nodeAffinity") or {}).get(R, {}).get("nodeSelectorTerms")
    if not terms:
        return True
    labels = {**_LABELS[node], "kubernetes.io/hostname": node}
    return any(term_matches(t, node_name=node, node_labels=labels) for t in terms)


@settings(max_examples=300, deadline=None)
@given(terms=_terms, avoid=st.lists(st.sampled_from(_NODES), max_size=3))
def test_the_merge_excludes_exactly_the_avoided_nodes(
    terms: list[dict[str, Any]], avoid: list[str]
) -> None:
    affinity = required(*terms) if terms else None
    result = avoidance.avoiding(affinity, avoid)
    for node in _NODES:
        expected = _fits(affinity, node) and node not in avoid
        assert _fits(result, node) == expected, (node, result)
    if avoid and any(t for t in terms):
        assert avoidance.avoided_by_affinity(result) >= set(avoid)
    assert json.loads(json.dumps(result)) == result


@settings(max_examples=500, deadline=None)
@given(terms=_terms, avoid=st.lists(st.sampled_from(_NODES), max_size=3))
def test_the_avoidances_taken_out_again_give_the_template_s_affinity(
    terms: list[dict[str, Any]], avoid: list[str]
) -> None:
    """What the descheduler judges an owner's next pod by: the pod's affinity less what the
    webhook noted it added (the avoided nodes the template did not exclude already). For
    every node the template's own NotIn does not share with the avoidance, that selects
    exactly what the template selected; for those it shares, never more (a user's
    `kubernetes.io/hostname NotIn` is kept: a node it excludes is never taken for one the
    replacement could go to)."""
    affinity = required(*terms) if terms else None
    added = set(avoid) - avoidance.excluded_by_name(affinity)
    back = avoidance.without_avoidances(avoidance.avoiding(affinity, avoid), added)
    for node in _NODES:
        if node in set(avoid) - added:
            assert not _fits(back, node) or _fits(affinity, node), (node, back)
        else:
            assert _fits(back, node) == _fits(affinity, node), (node, back)


def test_a_notin_the_user_wrote_is_kept_and_only_the_added_values_go() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    users = required({"matchExpressions": [zone, notin("vn-b")]}, {"matchExpressions": [zone]})
    merged = avoidance.avoiding(users, ["vn-a", "vn-c"])
    assert merged == required(
        {"matchExpressions": [zone, notin("vn-b", "vn-a", "vn-c")]},
        {"matchExpressions": [zone, notin("vn-a", "vn-c")]},
    )
    assert avoidance.without_avoidances(merged, {"vn-a", "vn-c"}) == required(
        {"matchExpressions": [zone, notin("vn-b")]}, {"matchExpressions": [zone]}
    )
    # Told nothing was added: nothing is taken out.
    assert avoidance.without_avoidances(merged, ()) == merged
    assert avoidance.excluded_by_name(merged) == {"vn-a", "vn-b", "vn-c"}
    assert avoidance.excluded_by_name(None) == frozenset()


def test_the_webhook_s_note_of_what_it_added() -> None:
    pod = {"metadata": {"annotations": {avoidance.ADDED_ANNOTATION: "vn-b,vn-a"}}}
    assert avoidance.added_nodes(pod) == {"vn-a", "vn-b"}
    assert avoidance.render_added(["vn-b", "vn-a", "vn-b"]) == "vn-a,vn-b"
    for unusable in ({}, {"metadata": None}, {"metadata": {"annotations": {"x": "y"}}}):
        assert avoidance.added_nodes(unusable) == frozenset()
    odd = {"metadata": {"annotations": {avoidance.ADDED_ANNOTATION: " vn-a,, "}}}
    assert avoidance.added_nodes(odd) == {"vn-a"}


def test_taking_the_avoidances_out_keeps_everything_else() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    field = {"key": "metadata.name", "operator": "In", "values": ["vn-a"]}
    preferred = {"weight": 1, "preference": {"matchExpressions": [zone]}}
    affinity = {
        "nodeAffinity": {
            R: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [zone, notin("vn-b")]},
                    {"matchFields": [field]},
                    {},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [preferred],
        },
        "podAntiAffinity": {"x": 1},
    }
    assert avoidance.without_avoidances(affinity, ["vn-b"]) == {
        "nodeAffinity": {
            R: {"nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [field]}, {}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [preferred],
        },
        "podAntiAffinity": {"x": 1},
    }
    assert affinity["nodeAffinity"][R]["nodeSelectorTerms"][0]["matchExpressions"][1] == notin(
        "vn-b"
    )
    # A term that held only the NotIn admitted every other node: nothing is required now.
    assert avoidance.without_avoidances(avoidance.avoiding(None, ["vn-a"]), ["vn-a"]) == {
        "nodeAffinity": {}
    }
    assert avoidance.without_avoidances(None, ["vn-a"]) is None
