"""Namespace quota slices, the pure decisions as tables: which quota is read, the room of
each virtual node, where slices go (and stay), the record's format, which record is in force
(read from the ResourceQuotas, capped at the quota, refused when unreadable), the decision
for one namespace (who wrote the record), the admission the extender and the virtual node
share, and the flags."""

from __future__ import annotations

import json
from fractions import Fraction as F
from typing import Any

import pytest

from scheduler import cli as scheduler_cli
from scheduler.slices.decide import decide
from scheduler.slices.filter import within_slices
from scheduler.slices.flags import add_slice_flags, slice_settings
from scheduler.slices.placement import (
    MAX_SLICES,
    PodUse,
    allocatable,
    commitments,
    headroom_base,
    kept_free,
    place,
    rooms,
    usable,
    usage_by_place,
)
from scheduler.slices.record import controller_wrote, parse_status
from tensile.contracts.quotaslices import SLICES_ANNOTATION, STATUS_ANNOTATION
from tensile.kube.quantity import parse_quantity
from tensile.placement.slices import (
    UNCONSTRAINED,
    Holding,
    InForce,
    InForceReader,
    RecordError,
    Slice,
    admit,
    format_record,
    parse_record,
    quota_of,
    record_in_force,
    units,
)
from tensile.placement.summary import ANNOTATION as SUMMARY
from tensile.serving.flags import Parser, UsageError

GI = 1 << 30
S = Slice(cpu=F(1, 2), memory=GI)
"""The default slice: (500m,1Gi)."""
M = 1000
"""Millicores in a core: the decisions count cpu in millicores and memory in bytes."""


def quota(hard: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"spec": {"hard": hard, **spec}}


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        (
            [quota({"requests.cpu": "4", "requests.memory": "8Gi"})],
            {"cpu": 4 * M, "memory": 8 * GI},
        ),
        ([quota({"cpu": "2", "memory": "1Gi"})], {"cpu": 2 * M, "memory": GI}),
        # requests.cpu and cpu are the same bound: both hold, the smaller wins
        ([quota({"cpu": "2", "requests.cpu": "1500m"})], {"cpu": 1500}),
        # limits bound bursting, which no node reserves: not read
        ([quota({"limits.cpu": "8", "limits.memory": "8Gi"})], {}),
        ([quota({"pods": "10", "requests.storage": "1Ti"})], {}),
        # several quotas all hold
        ([quota({"requests.cpu": "4"}), quota({"requests.cpu": "3"})], {"cpu": 3 * M}),
        # scoped quotas bound only some pods
        ([quota({"requests.cpu": "1"}, scopes=["BestEffort"])], {}),
        ([quota({"requests.cpu": "1"}, scopeSelector={"matchExpressions": []})], {}),
        # a malformed amount (only in a hand-made object) is skipped, never a crash
        ([quota({"requests.cpu": "lots", "memory": "1Gi"}), {"spec": None}], {"memory": GI}),
    ],
)
def test_quota_of(quotas: list[dict[str, Any]], expected: dict[str, int]) -> None:
    assert quota_of(quotas) == expected


def node(cpu: str = "4", memory: str = "8Gi", *, ready: str = "True", **spec: Any) -> Any:
    return {
        "spec": spec,
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def test_usable_and_allocatable() -> None:
    assert usable(node()) is None
    assert usable(node(ready="Unknown")) == "is not Ready"
    assert usable(node(unschedulable=True)) == "is cordoned"
    assert usable({}) == "is not Ready"
    assert allocatable(node("1500m", "1Gi")) == {"cpu": 1500, "memory": GI}
    assert allocatable({"status": {"allocatable": {"cpu": "x"}}}) == {"cpu": 0, "memory": 0}


def use(namespace: str, node: str, cpu: str, memory: int = 0) -> PodUse:
    return PodUse(namespace=namespace, node=node, requests={"cpu": int(cpu) * M, "memory": memory})


def test_rooms_leave_out_headroom_other_pods_and_other_slices_but_not_own_pods() -> None:
    nodes = {"a": {"cpu": 10 * M, "memory": 10 * GI}, "b": {"cpu": 10 * M, "memory": 0}}
    pods = [
        use("mine", "a", "3"),  # inside my own slices: not subtracted
        use("free", "a", "1", GI),  # an unconstrained namespace's pod
        use("other", "a", "1"),  # inside other's 2 slices (1 cpu budget): the budget counts
        use("other", "b", "2"),  # beyond other's budget on b (1 cpu): the usage counts
        use("x", "gone", "5"),  # on no virtual node
    ]
    records = {
        "other": {"a": Holding(count=2, size=S), "b": Holding(count=2, size=S)},
        "mine": {"a": Holding(count=8, size=S)},  # its own record: not a reservation
    }
    budgets = {ns: {n: h.budget() for n, h in record.items()} for ns, record in records.items()}
    committed = commitments(nodes=nodes, usage=usage_by_place(pods), budgets=budgets)
    kept = {name: kept_free(alloc, F(1, 10)) for name, alloc in nodes.items()}
    got = rooms(namespace="mine", nodes=nodes, committed=committed, kept=kept)
    assert got == {
        "a": {"cpu": (9 - 1 - 1) * M, "memory": 9 * GI - GI - 2 * GI},
        "b": {"cpu": (9 - 2) * M, "memory": 0 - 2 * GI},
    }


def held(**counts: int) -> dict[str, Holding]:
    return {n: Holding(count=c, size=S) for n, c in counts.items()}


CPU8 = {"cpu": 4 * M}  # 8 slices of 500m
ROOM = {"a": {"cpu": 6 * M}, "b": {"cpu": 2 * M}, "c": {"cpu": 0}}  # room: 12, 4, 0 slices
SIZE = Slice(cpu=F(1, 2), memory=None)


@pytest.mark.parametrize(
    ("case", "quota", "room", "previous", "counts", "unplaced", "dropped"),
    [
        # in proportion to room (12:4 -> 6:2), never on a full node
        ("fresh", CPU8, ROOM, None, {"a": 6, "b": 2}, 0, {}),
        # ties go by name
        ("tie", {"cpu": 1500}, {"b": {"cpu": 1 * M}, "a": {"cpu": 1 * M}}, None,
         {"a": 2, "b": 1}, 0, {}),
        # unchanged inputs: the same record, even where the rule would spread otherwise
        ("stable", CPU8, ROOM, {"a": 4, "b": 4}, {"a": 4, "b": 4}, 0, {}),
        # a node that left: its slices go where there is room, the others stay
        ("gone", CPU8, ROOM, {"a": 4, "d": 4}, {"a": 6, "b": 2}, 0, {"d": "is gone"}),
        # a node that shrank keeps what still fits
        ("shrank", CPU8, {"a": {"cpu": 6 * M}, "b": {"cpu": 1 * M}}, {"a": 4, "b": 4},
         {"a": 6, "b": 2}, 0, {"b": "has room for 2 slices, held 4"}),
        # the quota shrank: slices given back where fullest for the room (4/4 before 4/12)
        ("quota shrank", {"cpu": 2 * M}, ROOM, {"a": 4, "b": 4}, {"a": 3, "b": 1}, 0,
         {"a": "the quota makes fewer slices", "b": "the quota makes fewer slices"}),
        # the quota grew: added by the rule, the existing kept
        ("quota grew", {"cpu": 6 * M}, ROOM, {"a": 4, "b": 4}, {"a": 8, "b": 4}, 0, {}),
        # not enough room anywhere: what fits is placed, the rest reported
        ("unplaceable", {"cpu": 10 * M}, ROOM, None, {"a": 12, "b": 4}, 4, {}),
        ("full", CPU8, {"c": {"cpu": -1 * M}}, None, {}, 8, {}),
        ("nothing", {"cpu": 0 * M}, ROOM, None, {}, 0, {}),
    ],
)  # fmt: skip
def test_place(
    case: str,
    quota: dict[str, int],
    room: dict[str, dict[str, int]],
    previous: dict[str, int] | None,
    counts: dict[str, int],
    unplaced: int,
    dropped: dict[str, str],
) -> None:
    prev = {n: Holding(count=c, size=SIZE) for n, c in previous.items()} if previous else None
    got = place(quota=quota, size=SIZE, rooms=room, previous=prev)
    assert (got.counts, got.unplaced, got.dropped) == (counts, unplaced, dropped), case
    again = place(
        quota=quota,
        size=SIZE,
        rooms=room,
        previous={n: Holding(count=c, size=SIZE) for n, c in got.counts.items()},
    )
    assert again.counts == got.counts, f"{case}: a second run changed the placement"


def test_place_both_resources_and_reasons() -> None:
    # memory is the tighter bound here: 8 slices for cpu, 10 for memory
    got = place(
        quota={"cpu": 4 * M, "memory": 10 * GI},
        size=S,
        rooms={
            "a": {"cpu": 100 * M, "memory": 4 * GI},
            "b": {"cpu": 1 * M, "memory": 100 * GI},
        },
        previous={"a": Holding(count=1, size=Slice(cpu=F(1), memory=GI)), "c": held(c=1)["c"]},
        unusable={"c": "is not Ready"},
    )
    assert (got.wanted, got.counts, got.unplaced) == (10, {"a": 4, "b": 2}, 4)
    assert got.dropped == {
        "a": "the slice size changed from (1,1Gi) to (500m,1Gi)",
        "c": "is not Ready",
    }


def test_place_refuses_absurd_slice_counts() -> None:
    got = place(quota={"cpu": (MAX_SLICES + 1) * M}, size=Slice(cpu=F(1), memory=None), rooms={},
                previous=None)  # fmt: skip
    assert (got.counts, got.unplaced) == ({}, MAX_SLICES + 1)


@pytest.mark.parametrize(
    ("text", "record"),
    [
        ("none", {}),
        ("vnode-a=4x(500m,1Gi)", {"vnode-a": Holding(count=4, size=S)}),
        (
            "b.x=1x(2,-), a=2x(-,512Mi)",
            {
                "b.x": Holding(count=1, size=Slice(cpu=F(2), memory=None)),
                "a": Holding(count=2, size=Slice(cpu=None, memory=512 << 20)),
            },
        ),
    ],
)
def test_parse_record(text: str, record: dict[str, Holding]) -> None:
    assert parse_record(text) == record
    assert parse_record(format_record(record)) == record


def test_format_record_is_ordered_and_skips_empty_holdings() -> None:
    record = {"b": Holding(count=2, size=S), "a": Holding(count=1, size=S), "c": held(c=0)["c"]}
    assert format_record(record) == "a=1x(500m,1Gi),b=2x(500m,1Gi)"
    assert format_record({}) == "none"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("vnode-a=4", "is not <virtual node>=<count>x(<cpu>,<memory>)"),
        ("Vnode=1x(1,1Gi)", "is not <virtual node>"),
        ("a=1x(1,1Gi),a=2x(1,1Gi)", "named twice"),
        ("a=1x(lots,1Gi)", "invalid quantity 'lots'"),
        ("a=1x(0,1Gi)", "greater than 0"),
        ("a=1x(1,1.5)", "whole number of bytes"),
        ("a=1x(1,1Gi),", "is not"),
    ],
)
def test_parse_record_errors(text: str, message: str) -> None:
    with pytest.raises(RecordError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_record(text)


ROOMS = {"a": {"cpu": 6 * M, "memory": 64 * GI}, "b": {"cpu": 2 * M, "memory": 64 * GI}}
QUOTA = {"cpu": 4 * M}


def run(annotations: dict[str, str], quota: dict[str, F] = QUOTA, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "cpu": F(1, 2),
        "memory": GI,
        "headroom": F(0),
        "rooms": ROOMS,
        "unusable": {},
        **kw,
    }
    return decide(annotations=annotations, quota=quota, **args)


def applied(annotations: dict[str, str], decision: Any) -> dict[str, str]:
    out = dict(annotations)
    for key, value in (decision.patch or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def test_decide_places_then_keeps() -> None:
    first = run({})
    assert first.patch[SLICES_ANNOTATION] == "a=6x(500m,-),b=2x(500m,-)"
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "QuotaSlicesPlaced")]
    assert first.outcome == "placed"
    annotations = applied({}, first)
    assert controller_wrote(annotations)
    status = parse_status(annotations[STATUS_ANNOTATION])
    assert status is not None
    assert status.condition == "Placed"
    again = run(annotations)
    assert (again.patch, again.events, again.outcome) == (None, (), None)


def test_decide_redistributes_when_a_node_leaves() -> None:
    annotations = applied({}, run({}))
    moved = run(annotations, rooms={"a": ROOMS["a"], "c": ROOMS["b"]})
    assert moved.patch[SLICES_ANNOTATION] == "a=6x(500m,-),c=2x(500m,-)"
    [event] = moved.events
    assert event.reason == "QuotaSlicesRedistributed"
    assert "b is gone" in event.message
    assert "running pods stay" in event.message


def test_decide_respects_an_administrators_record() -> None:
    ours = applied({}, run({}))
    edited = {**ours, SLICES_ANNOTATION: "b=8x(500m,-)"}
    decision = run(edited)
    assert set(decision.patch) == {STATUS_ANNOTATION}  # the record itself is not touched
    assert [e.reason for e in decision.events] == ["QuotaSlicesSetByAdministrator"]
    after = applied(edited, decision)
    assert after[SLICES_ANNOTATION] == "b=8x(500m,-)"
    assert not controller_wrote(after)
    assert run(after).patch is None  # said once
    # a record with no status at all (set before any controller ran) is an administrator's too
    assert run({SLICES_ANNOTATION: "a=1x(1,1Gi)"}).outcome == "administrator"


def test_decide_reports_an_unreadable_record_and_keeps_it() -> None:
    decision = run({SLICES_ANNOTATION: "a=lots"})
    assert set(decision.patch) == {STATUS_ANNOTATION}
    [event] = decision.events
    assert (event.type, event.reason) == ("Warning", "QuotaSlicesInvalid")
    assert "no virtual node admits the namespace's pods until it is fixed" in event.message
    assert decision.held is None  # it holds no slices: it commits nothing anywhere


def test_decide_reports_records_that_differ_on_several_quotas() -> None:
    ours = applied({}, run({}))
    decision = run(ours, conflict="the ResourceQuotas a, b carry different records (keep one)")
    assert set(decision.patch) == {STATUS_ANNOTATION}
    [event] = decision.events
    assert (event.type, event.reason) == ("Warning", "QuotaSlicesInvalid")
    assert event.message.startswith("the ResourceQuotas a, b carry different records")
    assert json.loads(decision.patch[STATUS_ANNOTATION])["condition"] == "Invalid"


def test_decide_says_where_an_administrators_record_is_capped_at_the_quota() -> None:
    decision = run({SLICES_ANNOTATION: "a=100x(1,-),b=1x(1,-)"})  # the quota: 4 cpu
    [event] = decision.events
    assert "on a it counts as the quota (requests.cpu=4), no more" in event.message
    assert decision.outcome == "administrator"


def test_decide_recomputes_a_cleared_record() -> None:
    ours = applied({}, run({}))
    cleared = {k: v for k, v in ours.items() if k != SLICES_ANNOTATION}
    decision = run(cleared, rooms={"b": ROOMS["b"], "a": ROOMS["a"]})
    assert decision.patch[SLICES_ANNOTATION] == "a=6x(500m,-),b=2x(500m,-)"
    assert [e.reason for e in decision.events] == ["QuotaSlicesRecomputed"]
    # an administrator's record cleared is computed afresh too
    admins = applied({SLICES_ANNOTATION: "b=1x(1,-)"}, run({SLICES_ANNOTATION: "b=1x(1,-)"}))
    again = run({k: v for k, v in admins.items() if k != SLICES_ANNOTATION})
    assert again.patch[SLICES_ANNOTATION] == "a=6x(500m,-),b=2x(500m,-)"


def test_decide_says_when_the_quota_cannot_be_placed() -> None:
    decision = run({}, quota={"cpu": 10 * M})
    assert decision.patch[SLICES_ANNOTATION] == "a=12x(500m,-),b=4x(500m,-)"
    [event] = decision.events
    assert (event.type, event.reason) == ("Warning", "QuotaSlicesUnplaceable")
    assert "only 16 of 20 slices" in event.message
    assert json.loads(decision.patch[STATUS_ANNOTATION])["condition"] == "Unplaceable"
    assert decision.unplaced == 4


def test_decide_without_a_quota() -> None:
    ours = applied({}, run({}))
    removed = run(ours, quota={})
    assert removed.patch == {SLICES_ANNOTATION: None, STATUS_ANNOTATION: None}
    assert [e.reason for e in removed.events] == ["QuotaSlicesRemoved"]
    # a record without a quota is not read (it would take room from others for nothing),
    # and its status says so, once
    admins = run({SLICES_ANNOTATION: "a=1x(1,-)"}, quota={})
    assert admins.held is None
    assert admins.outcome == "ignored"
    [event] = admins.events
    assert (event.type, event.reason) == ("Warning", "QuotaSlicesIgnored")
    assert run(applied({SLICES_ANNOTATION: "a=1x(1,-)"}, admins), quota={}).patch is None
    assert run({}, quota={}).patch is None


def in_force(record: dict[str, Holding] | None, quota: dict[str, int] | None = None) -> InForce:
    if record is None:
        return UNCONSTRAINED
    return InForce(quota=quota or {"cpu": 100 * M, "memory": 100 * GI}, record=record)


@pytest.mark.parametrize(
    ("record", "node", "cpu", "placed", "reason"),
    [
        (None, "a", "100", [], None),  # no record: unconstrained
        ({"a": Holding(count=2, size=S)}, "a", "1", [], None),
        ({"a": Holding(count=2, size=S)}, "a", "500m", ["500m"], None),  # exactly the budget
        (
            {"a": Holding(count=2, size=S)},
            "a",
            "600m",
            ["500m"],
            "its namespace's quota slices on a (2x(500m,1Gi)) allow 1 cpu: 500m in use, "
            "the pod requests 600m",
        ),
        (
            {"a": Holding(count=2, size=S)},
            "b",
            "1m",
            [],
            "its namespace holds no quota slices on b (its slices: a=2x(500m,1Gi))",
        ),
        ({}, "a", "1m", [], "its namespace holds no quota slices on a (its slices: none)"),
        # a resource the slice does not bound is bounded by the quota (100 cpu) only
        ({"a": Holding(count=1, size=Slice(cpu=None, memory=GI))}, "a", "64", ["36"], None),
        (
            {"a": Holding(count=1, size=Slice(cpu=None, memory=GI))},
            "a",
            "64",
            ["37"],
            "its namespace's quota slices on a (1x(-,1Gi)) allow 100 cpu (its quota): 37 in "
            "use, the pod requests 64",
        ),
    ],
)
def test_admit(
    record: dict[str, Holding] | None, node: str, cpu: str, placed: list[str], reason: str | None
) -> None:
    got = admit(
        in_force=in_force(record),
        node=node,
        requests={
            "cpu": units({"cpu": parse_quantity(cpu)})["cpu"],
            "memory": GI // 4,
        },
        placed=[units({"cpu": parse_quantity(p)}) for p in placed],
    )
    assert got == reason


def test_admit_memory() -> None:
    reason = admit(
        in_force=in_force({"a": Holding(count=1, size=S)}),
        node="a",
        requests={"cpu": 0 * M, "memory": GI},
        placed=[{"memory": 1}],
    )
    assert reason == (
        "its namespace's quota slices on a (1x(500m,1Gi)) allow 1Gi memory: 1 in use, "
        "the pod requests 1Gi"
    )


def test_admit_caps_a_record_at_the_quota() -> None:
    # 8 slices of 1 cpu on a, of a quota of 1 cpu: a holds 1 cpu, not 8
    record = {"a": Holding(count=8, size=Slice(cpu=F(1), memory=None))}
    bounded = in_force(record, quota={"cpu": 1 * M})
    assert bounded.budget("a") == {"cpu": 1 * M}
    assert bounded.budgets() == {"a": {"cpu": 1 * M}}
    assert admit(in_force=bounded, node="a", requests={"cpu": 600}, placed=[]) is None
    assert admit(in_force=bounded, node="a", requests={"cpu": 600}, placed=[{"cpu": 500}]) == (
        "its namespace's quota slices on a (8x(1,-)) allow 1 cpu (its quota): 500m in use, "
        "the pod requests 600m"
    )
    # a slice bounding what the quota does not bound (memory) bounds nothing there
    both = {"a": Holding(count=1, size=Slice(cpu=F(1), memory=GI))}
    assert in_force(both, quota={"cpu": 4 * M}).budget("a") == {"cpu": 1 * M}
    assert in_force(both, quota={"cpu": 4 * M}).budget("b") == {}


def test_admit_refuses_every_node_when_the_record_cannot_be_read() -> None:
    broken = InForce(quota={"cpu": M}, carrier="compute", error="it is broken")
    assert broken.constrained
    assert admit(in_force=broken, node="a", requests={}, placed=[]) == (
        "its namespace's quota slices are refused: it is broken"
    )


def rq(name: str, hard: dict[str, str] | None = None, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "annotations": annotations},
        "spec": {"hard": {"requests.cpu": "2"} if hard is None else hard},
    }


@pytest.mark.parametrize(
    ("quotas", "record", "error"),
    [
        ([], None, None),
        ([rq("compute")], None, None),  # a quota, no record yet: unconstrained
        ([rq("compute", **{SLICES_ANNOTATION: "a=2x(500m,-)"})], "a=2x(500m,-)", None),
        # a record is read wherever it is among the namespace's quotas
        (
            [rq("a-pods", {"pods": "10"}, **{SLICES_ANNOTATION: "b=1x(1,-)"}), rq("compute")],
            "b=1x(1,-)",
            None,
        ),
        # no quota bounds requests: the record is not read at all (it would take room from
        # other namespaces for a bound that does not exist)
        ([rq("pods", {"pods": "10"}, **{SLICES_ANNOTATION: "a=9x(9,-)"})], None, None),
        # unreadable: refused, not unconstrained
        (
            [rq("compute", **{SLICES_ANNOTATION: "a=lots"})],
            None,
            "the tensile.io/quota-slices record of ResourceQuota compute cannot be read: entry "
            "'a=lots' is not <virtual node>=<count>x(<cpu>,<memory>), e.g. vnode-a=4x(500m,1Gi)",
        ),
        (
            [
                rq("one", **{SLICES_ANNOTATION: "a=1x(1,-)"}),
                rq("two", **{SLICES_ANNOTATION: "a=2x(1,-)"}),
            ],
            None,
            "the ResourceQuotas one, two carry different tensile.io/quota-slices records "
            "(keep one)",
        ),
        (
            [
                rq("one", **{SLICES_ANNOTATION: "a=1x(1,-)"}),
                rq("two", **{SLICES_ANNOTATION: "a=1x(1,-)"}),
            ],
            "a=1x(1,-)",
            None,
        ),
    ],
)
def test_record_in_force(
    quotas: list[dict[str, Any]], record: str | None, error: str | None
) -> None:
    got = record_in_force(quotas)
    assert (None if got.record is None else format_record(got.record)) == record
    assert got.error == error
    assert got.constrained == (record is not None or error is not None)


def test_the_reader_reads_a_namespaces_quotas_again_only_when_they_change() -> None:
    reader = InForceReader()
    first = [rq("compute", **{SLICES_ANNOTATION: "a=1x(1,-)"})]
    assert reader.read("t", first) is reader.read("t", first)
    changed = [{**first[0], "metadata": {**first[0]["metadata"], "resourceVersion": "2"}}]
    changed[0]["metadata"]["annotations"] = {SLICES_ANNOTATION: "a=2x(1,-)"}
    assert reader.read("t", changed).record == {
        "a": Holding(count=2, size=Slice(cpu=F(1), memory=None))
    }
    assert reader.read("t", []) is UNCONSTRAINED


def flags(*argv: str) -> Any:
    p = Parser(prog="tensile-scheduler")  # raises UsageError, as the commands' parsers do
    add_slice_flags(p)
    return slice_settings(p.parse_args(list(argv)))


@pytest.mark.parametrize(
    ("argv", "cpu", "memory", "headroom"),
    [
        ((), F(1, 2), GI, F(0)),
        (("--slice-cpu=250", "--slice-memory=512Mi"), F(1, 4), 512 << 20, F(0)),
        (("--slice-cpu=1.5", "--slice-memory=1000"), F(3, 2), 1000, F(0)),
        (("--slice-cpu=2000m", "--headroom=0.1"), F(2), GI, F(1, 10)),
        (("--headroom=25%",), F(1, 2), GI, F(1, 4)),
    ],
)
def test_flags(argv: tuple[str, ...], cpu: F, memory: int, headroom: F) -> None:
    settings = flags(*argv)
    assert (settings.cpu, settings.memory, settings.headroom) == (cpu, memory, headroom)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--slice-cpu=0",), "--slice-cpu must be greater than 0"),
        (("--slice-cpu=lots",), "--slice-cpu: invalid quantity"),
        (("--slice-cpu=0.0001",), "whole number of millicores"),
        (("--slice-memory=-1Gi",), "--slice-memory must be greater than 0"),
        (("--slice-memory=1.5",), "whole number of bytes"),
        (("--slice-memory=2Pi",), "up to 1Pi"),
        (("--headroom=1",), "below 1"),
        (("--headroom=-0.1",), "at least 0"),
        (("--headroom=ten",), "a number"),
        (("--slice-sync-delay=-1s",), "--slice-sync-delay"),
    ],
)
def test_flag_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        flags(*argv)


def test_flags_share_the_commands_headroom() -> None:
    p = Parser(prog="tensile-scheduler")
    p.add_argument("--headroom", type=float, default=0.0)  # the extender's own
    add_slice_flags(p, headroom=False)
    assert slice_settings(p.parse_args(["--headroom=0.2"])).headroom == F(1, 5)


def test_within_slices_moves_refused_virtual_nodes_to_failed_and_unresolvable() -> None:
    def refusals(pod: Any, nodes: Any) -> dict[str, str]:
        return {node: f"no slices on {node}" for node in nodes if node != "vn-a"}

    by_name = {
        "nodenames": ["vn-a", "vn-b", "real"],
        "failedNodes": {"vn-c": "full below"},
        "failedAndUnresolvableNodes": {"vn-d": "gone"},
    }
    got = within_slices(by_name, pod={}, candidates=["vn-a", "vn-b"], refusals=refusals)
    assert got["nodenames"] == ["vn-a", "real"]  # a node that is not virtual passes untouched
    assert got["failedNodes"] == {"vn-c": "full below"}
    # preemption must not evict pods there for nothing
    assert got["failedAndUnresolvableNodes"] == {"vn-d": "gone", "vn-b": "no slices on vn-b"}
    assert by_name["nodenames"] == ["vn-a", "vn-b", "real"]  # the input is not changed
    items = [{"metadata": {"name": n}} for n in ("vn-a", "vn-b")]
    by_list = {"Nodes": {"kind": "NodeList", "items": items}, "FailedNodes": {}, "Error": ""}
    got = within_slices(by_list, pod={}, candidates=["vn-a", "vn-b"], refusals=refusals)
    assert [i["metadata"]["name"] for i in got["Nodes"]["items"]] == ["vn-a"]  # Go's names
    assert got["FailedAndUnresolvableNodes"] == {"vn-b": "no slices on vn-b"}
    assert got["FailedNodes"] == {}
    assert within_slices(by_name, pod={}, candidates=["vn-a"], refusals=refusals) == by_name


def test_the_scheduler_command_takes_the_slice_flags() -> None:
    tls = ["--tls-cert-file=c", "--tls-private-key-file=k", "--client-ca-file=ca"]
    settings = scheduler_cli.parse(
        [*tls, "--slice-cpu=250m", "--slice-memory=2Gi", "--headroom=0.25"]
    )
    assert (settings.slices.cpu, settings.slices.memory) == (F(1, 4), 2 * GI)
    assert settings.slices.headroom == F(1, 4) == F(settings.policy.headroom)  # one flag
    with pytest.raises(UsageError, match="--slice-memory must be greater than 0"):
        scheduler_cli.parse([*tls, "--slice-memory=0"])


def test_decide_places_afresh_over_its_own_unreadable_record() -> None:
    # a record the controller wrote in a format this version cannot read: never a crash
    ours = {
        SLICES_ANNOTATION: "a=2",
        STATUS_ANNOTATION: json.dumps({"writer": "tensile-scheduler", "written": "a=2"}),
    }
    assert run(ours).patch[SLICES_ANNOTATION] == "a=6x(500m,-),b=2x(500m,-)"


def test_headroom_is_a_share_of_the_lower_clusters_allocatable_from_its_summary() -> None:
    published = json.dumps(
        {"v": 1, "res": ["cpu", "memory"], "classes": [], "nodes": [], "alloc": [40000, 80 * GI],
         "free": [10000, 20 * GI]}
    )  # fmt: skip
    with_summary = {**node("10", "20Gi"), "metadata": {"annotations": {SUMMARY: published}}}
    assert headroom_base(with_summary) == {"cpu": 40000, "memory": 80 * GI}
    assert kept_free(headroom_base(with_summary), F(1, 10)) == {"cpu": 4000, "memory": 8 * GI}
    # no summary, or one that cannot be read: the virtual node's own allocatable
    assert headroom_base(node("10", "20Gi")) == {"cpu": 10000, "memory": 20 * GI}
    broken = {**node("10", "20Gi"), "metadata": {"annotations": {SUMMARY: "{"}}}
    assert headroom_base(broken) == {"cpu": 10000, "memory": 20 * GI}
