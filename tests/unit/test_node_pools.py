"""A virtual node per lower node pool (--lower-node-selector): the flags, the selector's
string form, the pool's node-affinity term on the lower pod, the labels the pool shares and
which nodes count as having left it. Pure functions only; the real clusters are in
tests/e2e/test_node_pools.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tensile.contracts import clusterselector, selectors
from tensile.placement.lower import lower_placement, pool_term
from tensile.serving.flags import UsageError
from vnode import cli
from vnode.controllers.node_objects import offered
from vnode.providers.k2k import pool

BASE = ["--client-kubeconfig=lower.kubeconfig"]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_the_flags_default_to_the_whole_cluster() -> None:
    node = cli.parse(BASE, env={}).node
    assert node.lower_node_selector == selectors.EVERYTHING
    assert node.lower_node_labels_to_copy == ()


def test_the_flags_are_parsed() -> None:
    node = cli.parse(
        [
            *BASE,
            "--lower-node-selector=pool in (gpu, gpu-2),!cordoned",
            "--lower-node-labels-to-copy=nvidia.com/gpu.product, topology.kubernetes.io/zone,"
            "nvidia.com/gpu.product",
        ],
        env={},
    ).node
    assert selectors.render(node.lower_node_selector) == "pool in (gpu,gpu-2),!cordoned"
    assert node.lower_node_labels_to_copy == (
        "nvidia.com/gpu.product",
        "topology.kubernetes.io/zone",
    )


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            "--lower-node-selector=pool in (gpu",
            "--lower-node-selector: unbalanced '(' in selector 'pool in (gpu'",
        ),
        (
            "--lower-node-selector=pool=gpu,,zone=a",
            "--lower-node-selector: empty requirement in selector 'pool=gpu,,zone=a'",
        ),
        (
            "--lower-node-selector=-pool=gpu",
            "--lower-node-selector: '-pool=gpu': '-pool' is not a label key",
        ),
        (
            "--lower-node-selector=!pool in (a)",
            "--lower-node-selector: '!pool in (a)': '!' only goes with a bare key",
        ),
        (
            "--lower-node-labels-to-copy=zone,bad key",
            "--lower-node-labels-to-copy: 'bad key' is not a label key",
        ),
    ],
)
def test_bad_flags_are_refused_naming_the_part(flag: str, message: str) -> None:
    with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
        cli.parse([*BASE, flag], env={})


@pytest.mark.parametrize(
    "text",
    ["", "pool=gpu", "pool!=gpu", "pool in (b,a)", "pool notin (a)", "gpu", "!gpu", "n>3", "n<3"],
)
def test_render_gives_back_what_parse_reads(text: str) -> None:
    def meaning(selector: selectors.Selector) -> list[tuple[str, str, frozenset[str]]]:
        return [(r.key, r.operator, frozenset(r.values)) for r in selector.requirements]

    parsed = selectors.parse(text)
    assert meaning(selectors.parse(selectors.render(parsed))) == meaning(parsed)


@pytest.mark.parametrize(
    ("text", "expressions"),
    [
        ("pool=gpu", [{"key": "pool", "operator": "In", "values": ["gpu"]}]),
        ("pool!=gpu", [{"key": "pool", "operator": "NotIn", "values": ["gpu"]}]),
        ("gpu", [{"key": "gpu", "operator": "Exists"}]),
        ("!gpu", [{"key": "gpu", "operator": "DoesNotExist"}]),
        ("gpus>3", [{"key": "gpus", "operator": "Gt", "values": ["3"]}]),
        (
            "pool in (a,b),zone=z",
            [
                {"key": "pool", "operator": "In", "values": ["a", "b"]},
                {"key": "zone", "operator": "In", "values": ["z"]},
            ],
        ),
    ],
)
def test_the_pool_term_has_one_expression_per_requirement(
    text: str, expressions: list[dict[str, Any]]
) -> None:
    assert pool_term(selectors.parse(text)) == {"matchExpressions": expressions}


def test_everything_adds_no_term() -> None:
    assert pool_term(selectors.EVERYTHING) is None
    spec = {"containers": [{"name": "c"}]}
    placed = lower_placement(spec, cluster_selector=None, node_name="vn", node_labels={})
    assert "affinity" not in placed


def _terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"])


POOL = selectors.parse("pool=gpu")
GPU = "nvidia.com/gpu"
IN_POOL = {"key": "pool", "operator": "In", "values": ["gpu"]}


def test_a_pod_without_placement_is_confined_to_the_pool() -> None:
    placed = lower_placement(
        {"containers": []}, cluster_selector=None, node_name="vn", node_labels={}, pool=POOL
    )
    assert _terms(placed) == [{"matchExpressions": [IN_POOL]}]


def test_the_pool_joins_every_cluster_selector_term() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    host = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    chosen = {
        "nodeSelector": {"disk": "ssd"},
        "affinity": {
            "nodeAffinity": {
                REQUIRED: {
                    "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [host]}]
                }
            }
        },
    }
    placed = lower_placement(
        {"containers": []}, cluster_selector=chosen, node_name="vn", node_labels={}, pool=POOL
    )
    assert _terms(placed) == [
        {"matchExpressions": [zone, IN_POOL]},
        {"matchFields": [host], "matchExpressions": [IN_POOL]},
    ]
    assert placed["nodeSelector"] == {"disk": "ssd"}


def test_the_pool_is_what_is_kept_when_the_terms_would_be_too_many() -> None:
    many = [
        {"matchExpressions": [{"key": f"k{i}", "operator": "Exists"}]}
        for i in range(clusterselector.MAX_TERMS + 1)
    ]
    spec = {"containers": [], "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": many}}}}
    placed = lower_placement(spec, cluster_selector=None, node_name="vn", node_labels={}, pool=POOL)
    assert _terms(placed) == [{"matchExpressions": [IN_POOL]}]


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


@pytest.mark.parametrize(
    ("nodes", "keys", "shared"),
    [
        ([], ["gpu"], {}),
        ([_node("a", gpu="a100"), _node("b", gpu="a100")], ["gpu"], {"gpu": "a100"}),
        ([_node("a", gpu="a100"), _node("b", gpu="h100")], ["gpu"], {}),
        ([_node("a", gpu="a100"), _node("b")], ["gpu"], {}),
        ([_node("a", gpu="", zone="z")], ["zone", "gpu", "other"], {"zone": "z", "gpu": ""}),
    ],
)
def test_shared_labels(
    nodes: list[dict[str, Any]], keys: list[str], shared: dict[str, str]
) -> None:
    assert pool.shared_labels(nodes, keys) == shared
    assert list(pool.shared_labels(nodes, keys)) == [k for k in keys if k in shared]


@pytest.mark.parametrize(
    ("node", "left"),
    [
        (None, False),  # deleted: its pods are the pod garbage collector's
        (_node("n", pool="gpu"), False),  # matches again (relabelled back)
        (_node("n", pool="cpu"), True),
        (_node("n"), True),
    ],
)
def test_left_pool(node: dict[str, Any] | None, left: bool) -> None:
    assert pool.left_pool(node, POOL) is left


def test_the_left_pool_message_names_node_and_selector() -> None:
    message = pool.left_pool_message(node="lower-node-3", pool=selectors.parse("pool in (gpu)"))
    assert message.startswith(
        "lower node lower-node-3 no longer matches --lower-node-selector pool in (gpu): "
        "the pod keeps running there"
    )


@pytest.mark.parametrize(
    ("shown", "capacity", "patched"),
    [
        (None, {"cpu": "2"}, {"cpu": "2"}),
        ({"cpu": "16", GPU: "4"}, {"cpu": "0"}, {"cpu": "0", GPU: "0"}),
        ({"cpu": "16", GPU: "4"}, {"cpu": "8", GPU: "2"}, {"cpu": "8", GPU: "2"}),
        ({"cpu": "16", GPU: "0"}, {"cpu": "8"}, {"cpu": "8", GPU: "0"}),
    ],
)
def test_a_resource_the_pool_no_longer_offers_is_patched_to_zero(
    shown: dict[str, str] | None, capacity: dict[str, str], patched: dict[str, str]
) -> None:
    """A strategic merge patch keeps keys it does not name: the GPUs of a pool whose last
    GPU node left would stay on the Node without the zero."""
    current = {"status": {"capacity": shown, "allocatable": shown}} if shown else None
    assert offered(current, capacity, field="capacity") == patched
    assert offered(current, capacity, field="allocatable") == patched
