"""ANDing two lists of required nodeSelectorTerms (`clusterselector.and_terms`): the one
function both sides of the clusterSelector contract use, with the rules each side passes
(the webhook's `mutation.TERM_RULES`, the virtual node's `placement.TERM_RULES`).

Checked against Kubernetes' meaning of a NodeSelector (terms ORed, a term's requirements
ANDed, a term without requirements selects nothing), evaluated by
`tensile.contracts.scheduling.selector_matches` on every node of a small universe."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensile.contracts import clusterselector
from tensile.contracts.clusterselector import TermRules
from tensile.contracts.scheduling import selector_matches
from tensile.placement.lower import TERM_RULES as NODE_RULES
from webhook.mutation import TERM_RULES as WEBHOOK_RULES

KEYS = ("a", "b", "c", "d")
VALUES = ("1", "2")
NAMES = ("n1", "n2")
NODES = [
    (name, {k: v for k, v in zip(KEYS, chosen, strict=True) if v is not None})
    for name in NAMES
    for chosen in itertools.product((None, *VALUES), repeat=len(KEYS))
]
"""Every node a term over KEYS, VALUES and NAMES can tell apart."""


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


def name_in(*names: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": list(names)}


A = {"matchExpressions": [expr("a", "In", "1")]}
B = {"matchExpressions": [expr("b", "Exists")]}
C = {"matchExpressions": [expr("c", "NotIn", "2")]}
N1 = {"matchFields": [name_in("n1")]}
EMPTY: dict[str, Any] = {}
NO_REQUIREMENTS = {"matchExpressions": [], "matchFields": []}


def and_(left: Sequence[Any], right: Sequence[Any], rules: TermRules) -> list[dict[str, Any]]:
    return clusterselector.and_terms(left, right, **rules)


def selected(terms: Sequence[Any]) -> frozenset[int]:
    """The nodes (indexes into NODES) a NodeSelector of `terms` selects."""
    selector = {"nodeSelectorTerms": list(terms)}
    return frozenset(
        i
        for i, (name, labels) in enumerate(NODES)
        if selector_matches(selector, node_name=name, node_labels=labels)
    )


def constraint(terms: Sequence[Any]) -> frozenset[int]:
    """What one side allows: no terms at all is no constraint."""
    return selected(terms) if terms else frozenset(range(len(NODES)))


def kubernetes_and(left: Sequence[Any], right: Sequence[Any]) -> frozenset[int]:
    return constraint(left) & constraint(right)


# -- the rules each side passes ---------------------------------------------------------------


def test_the_sides_share_the_limit_and_differ_where_the_docstring_says() -> None:
    assert NODE_RULES["max_terms"] == WEBHOOK_RULES["max_terms"] == clusterselector.MAX_TERMS == 64
    assert (NODE_RULES["overflow"], WEBHOOK_RULES["overflow"]) == ("loosen", "refuse")
    assert (NODE_RULES["drop_empty"], WEBHOOK_RULES["drop_empty"]) == (True, False)
    assert (NODE_RULES["dedupe"], WEBHOOK_RULES["dedupe"]) == (False, True)


# -- table ------------------------------------------------------------------------------------

AB = {"matchExpressions": [*A["matchExpressions"], *B["matchExpressions"]]}
AC = {"matchExpressions": [*A["matchExpressions"], *C["matchExpressions"]]}
BC = {"matchExpressions": [*B["matchExpressions"], *C["matchExpressions"]]}
A_N1 = {**A, **N1}
AA = {"matchExpressions": [*A["matchExpressions"], *A["matchExpressions"]]}


@pytest.mark.parametrize(
    ("left", "right", "rules", "expected"),
    [
        # one side without terms: the other as it is (never an empty, invalid list)
        ([], [], NODE_RULES, []),
        ([], [], WEBHOOK_RULES, []),
        ([A], [], NODE_RULES, [A]),
        ([], [B], WEBHOOK_RULES, [B]),
        # the cross product, left's requirements first; matchFields joined apart
        ([A], [B], NODE_RULES, [AB]),
        ([A], [B], WEBHOOK_RULES, [AB]),
        ([A, B], [C, N1], NODE_RULES, [AC, A_N1, BC, {**B, **N1}]),
        ([A, B], [C, N1], WEBHOOK_RULES, [AC, A_N1, BC, {**B, **N1}]),
        # a requirement on both sides: concatenated by the node, once by the webhook
        ([A], [A], NODE_RULES, [AA]),
        ([A], [A], WEBHOOK_RULES, [A]),
        # terms without requirements: dropped by the node ...
        ([EMPTY, A], [B, NO_REQUIREMENTS], NODE_RULES, [AB]),
        ([EMPTY], [B], NODE_RULES, [B]),
        ([A], [EMPTY, NO_REQUIREMENTS], NODE_RULES, [A]),
        # ... joined by the webhook: {} AND B gives B alone
        ([EMPTY, A], [B], WEBHOOK_RULES, [B, AB]),
        ([EMPTY], [B], WEBHOOK_RULES, [B]),
        # items that are not objects are left out by both
        (["x", A], [B, None], NODE_RULES, [AB]),
        (["x", A], [B, None], WEBHOOK_RULES, [AB]),
    ],
)
def test_and_terms(
    left: list[Any], right: list[Any], rules: TermRules, expected: list[dict[str, Any]]
) -> None:
    before = json.dumps([left, right])
    assert and_(left, right, rules) == expected
    assert json.dumps([left, right]) == before  # inputs untouched


def test_at_the_limit_the_product_is_built_and_past_it_each_side_does_its_own() -> None:
    lefts = [{"matchExpressions": [expr("a", "In", str(i))]} for i in range(9)]
    rights = [{"matchExpressions": [expr("b", "In", str(i))]} for i in range(8)]
    for rules in (NODE_RULES, WEBHOOK_RULES):
        assert len(and_(lefts[:8], rights, rules)) == 64
    # the node loosens: the right-hand terms alone
    assert and_(lefts, rights, NODE_RULES) == rights
    # the webhook refuses, saying how many
    with pytest.raises(clusterselector.TooManyTerms) as refused:
        and_(lefts, rights, WEBHOOK_RULES)
    assert (refused.value.left, refused.value.right, refused.value.limit) == (9, 8, 64)


def test_the_limit_counts_the_terms_as_given() -> None:
    # Terms the node drops still count toward its limit (as before the one function).
    many_empty = [EMPTY] * 65
    assert and_(many_empty, [A, B], NODE_RULES) == [A, B]
    ca = {"matchExpressions": [*C["matchExpressions"], *A["matchExpressions"]]}
    cb = {"matchExpressions": [*C["matchExpressions"], *B["matchExpressions"]]}
    assert and_([C, *many_empty[:31]], [A, B], NODE_RULES) == [ca, cb]
    assert and_([C, *many_empty[:32]], [A, B], NODE_RULES) == [A, B]  # 33 x 2 > 64: loosened


def test_the_result_shares_requirements_but_no_containers() -> None:
    left, right = [A], [B]
    out = and_(left, right, WEBHOOK_RULES)
    out[0]["matchExpressions"].append(expr("z", "Exists"))
    assert A["matchExpressions"] == [expr("a", "In", "1")]
    assert out[0]["matchExpressions"][0] is A["matchExpressions"][0]
    lone = and_([A], [], NODE_RULES)
    assert lone == [A]
    assert lone[0] is not A


# -- properties -------------------------------------------------------------------------------

label_requirements = st.one_of(
    st.builds(
        expr,
        st.sampled_from(KEYS),
        st.sampled_from(("In", "NotIn")),
        st.sampled_from(VALUES),
    ),
    st.builds(expr, st.sampled_from(KEYS), st.sampled_from(("Exists", "DoesNotExist"))),
)
field_requirements = st.builds(
    lambda operator, name: {"key": "metadata.name", "operator": operator, "values": [name]},
    st.sampled_from(("In", "NotIn")),
    st.sampled_from(NAMES),
)


def _term(expressions: list[Any], fields: list[Any]) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return term


unique = json.dumps
real_terms = st.builds(
    _term,
    st.lists(label_requirements, min_size=1, max_size=3, unique_by=unique),
    st.lists(field_requirements, max_size=1),
)
"""Terms with at least one requirement, none repeated: what either side writes."""
any_terms = st.one_of(real_terms, st.just(EMPTY), st.just(NO_REQUIREMENTS))
term_lists = st.lists(real_terms, max_size=4)


@settings(max_examples=300, deadline=None)
@given(left=term_lists, right=term_lists)
def test_within_the_limit_both_sides_select_what_kubernetes_ands(
    left: list[Any], right: list[Any]
) -> None:
    webhook = and_(left, right, WEBHOOK_RULES)
    node = and_(left, right, NODE_RULES)
    assert constraint(webhook) == constraint(node) == kubernetes_and(left, right)
    assert bool(webhook) == bool(node) == bool(left or right)  # never an empty, invalid list


@settings(max_examples=300, deadline=None)
@given(
    left=term_lists,
    right=st.lists(
        st.builds(
            _term,
            st.lists(label_requirements, min_size=1, max_size=3, unique_by=unique),
            st.just([]),
        ),
        max_size=4,
    ),
)
def test_without_a_requirement_on_both_sides_the_two_results_are_the_same_terms(
    left: list[Any], right: list[Any]
) -> None:
    shared = {unique(r) for term in left for r in term.get("matchExpressions", [])}
    right = [
        _term([r for r in term["matchExpressions"] if unique(r) not in shared], [])
        for term in right
    ]
    right = [term for term in right if term]
    assert and_(left, right, WEBHOOK_RULES) == and_(left, right, NODE_RULES)


@settings(max_examples=300, deadline=None)
@given(left=st.lists(any_terms, max_size=4), right=st.lists(any_terms, max_size=4))
def test_with_terms_that_select_nothing_neither_side_is_ever_tighter_than_kubernetes(
    left: list[Any], right: list[Any]
) -> None:
    exact = kubernetes_and(left, right)
    node = constraint(and_(left, right, NODE_RULES))
    assert exact <= node
    assert exact <= constraint(and_(left, right, WEBHOOK_RULES))
    # The node's rules are exact unless a side has terms, all of them empty.
    if all(
        not side or any(clusterselector.has_requirements(t) for t in side) for side in (left, right)
    ):
        assert node == exact


@settings(max_examples=50, deadline=None)
@given(
    left=st.lists(real_terms, min_size=9, max_size=12),
    right=st.lists(real_terms, min_size=8, max_size=9),
)
def test_past_the_limit_the_node_loosens_to_the_right_side_and_the_webhook_refuses(
    left: list[Any], right: list[Any]
) -> None:
    loosened = and_(left, right, NODE_RULES)
    assert loosened == right
    assert kubernetes_and(left, right) <= selected(loosened)
    with pytest.raises(clusterselector.TooManyTerms):
        and_(left, right, WEBHOOK_RULES)
