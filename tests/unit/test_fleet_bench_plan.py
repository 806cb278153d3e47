"""The fleet benchmark's pure plan (bench/fleet_plan.py): the fleet it builds must mislead a
scheduler that sees sums (free capacity fragmented so no fragmented Node takes a large
pod), the mix must add up, bad scales are refused with the flag to change, and the report's
arithmetic (histogram quantiles, ratios, component groups) is right."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fleet_plan as plan


@pytest.mark.parametrize(
    ("pods", "statefulset", "bare", "bare_large", "large", "quota", "small"),
    [
        (50, 2, 2, 1, 2, 5, 34),
        (200, 2, 10, 2, 10, 20, 138),
        (10_000, 20, 500, 125, 500, 1000, 6980),
    ],
)
def test_the_mix_divides_the_pods_and_adds_up(
    pods: int, statefulset: int, bare: int, bare_large: int, large: int, quota: int, small: int
) -> None:
    m = plan.mix(pods)
    assert (m.statefulset, m.bare, m.bare_large, m.large, m.quota, m.small) == (
        statefulset, bare, bare_large, large, quota, small,
    )  # fmt: skip
    assert m.total == pods
    work = plan.workload("a", m)
    made = 0
    for _, _, obj in work.objects:
        made += obj["spec"].get("replicas", 1) if obj["kind"] != "Pod" else 1
    assert made == work.pods == pods
    quotas = [q for q in work.namespaces.values() if q is not None]
    assert len(quotas) == plan.QUOTA_NAMESPACES
    assert len(work.namespaces) == plan.QUOTA_NAMESPACES + 1


def test_too_few_pods_is_refused() -> None:
    with pytest.raises(ValueError, match="--pods must be at least 50"):
        plan.mix(49)


def _millicores(text: str) -> int:
    return int(text.removesuffix("m"))


def test_a_fragmented_cluster_offers_much_in_sum_and_no_node_for_a_large_pod() -> None:
    nodes = plan.lower_nodes("lower-2", 1, count=40, disks=2)
    assert plan.fragmented(1)
    free = [n.free[0] for n in nodes]
    assert max(free) < plan.LARGE[0]  # no single Node takes one
    assert sum(free) >= 10 * plan.LARGE[0]  # the sum says ten would fit
    for n in nodes:  # the filler takes the rest of the Node, whatever its size
        assert n.filler[0] + n.free[0] == int(n.cpu) * 1000
        assert n.filler[1] + n.free[1] == n.memory_gib * 1024
        filler = plan.filler_pod(n)
        assert filler["spec"]["nodeName"] == n.name
        requests = filler["spec"]["containers"][0]["resources"]["requests"]
        assert _millicores(requests["cpu"]) == n.filler[0]
    assert {n.cpu for n in nodes} == {cpu for cpu, _ in plan.SHAPES}  # mixed sizes


def test_a_roomy_cluster_keeps_holes_for_large_pods_and_its_disk_nodes_for_the_statefulset() -> (
    None
):
    nodes = plan.lower_nodes("lower", 0, count=8, disks=3)
    assert [n.disk for n in nodes] == [True, True, True, False, False, False, False, False]
    assert [n.free for n in nodes] == [plan.HOLE_FREE] * 3 + [
        plan.SLIVER_FREE,
        plan.HOLE_FREE,
        plan.SLIVER_FREE,
        plan.HOLE_FREE,
        plan.SLIVER_FREE,
    ]
    assert plan.HOLE_FREE[0] >= plan.LARGE[0]


@pytest.mark.parametrize(
    ("lower_clusters", "nodes", "pods", "error"),
    [
        (1, 100, 200, "--lower-clusters must be at least 2"),
        (2, 1, 200, "--nodes-per-cluster must be at least 2"),
        (2, 20, 2000, "room for 16 large pods, the mix has 125: raise --nodes-per-cluster to 157"),
        (2, 20, 200, None),
        (10, 1000, 10_000, None),
        (5, 1000, 10_000, None),
    ],
)
def test_a_scale_the_roomy_clusters_cannot_hold_is_refused(
    lower_clusters: int, nodes: int, pods: int, error: str | None
) -> None:
    scale = plan.Scale(lower_clusters=lower_clusters, nodes_per_cluster=nodes, pods=pods)
    if error is None:
        plan.check_fits(scale)
    else:
        with pytest.raises(ValueError, match=error.replace("(", r"\(")):
            plan.check_fits(scale)


def test_the_statefulset_goes_to_the_disk_nodes_below_with_a_claim_each() -> None:
    made = plan.statefulset("db", config="b", replicas=3)
    spec = made["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {plan.DISK_TAINT_KEY: "true"}
    assert {"key": plan.DISK_TAINT_KEY, "operator": "Exists"} in spec["tolerations"]
    assert plan.VIRTUAL_TOLERATION in spec["tolerations"]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    [claim] = made["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == plan.UPPER_STORAGE_CLASS
    assert made["spec"]["podManagementPolicy"] == "Parallel"
    assert made["spec"]["template"]["metadata"]["labels"][plan.BENCH_LABEL] == "b"


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, {}, None),
        (0.5, {0.001: 0, 0.01: 0, math.inf: 0}, None),
        (0.5, {0.001: 0, 0.002: 10, math.inf: 10}, 0.0015),
        (0.99, {0.001: 50, 0.005: 100, math.inf: 100}, 0.001 + 0.004 * 49 / 50),
        (0.5, {0.001: 100, math.inf: 100}, 0.0005),
        (0.99, {0.001: 10, 0.01: 10, math.inf: 20}, 0.01),  # in +Inf: the largest finite bound
    ],
)
def test_histogram_quantiles_interpolate_inside_the_bucket_as_promql_does(
    q: float, buckets: dict[float, float], expected: float | None
) -> None:
    found = plan.histogram_quantile(q, buckets)
    if expected is None:
        assert found is None
    else:
        assert found == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "base", "expected"),
    [(5, 10, "0.50x"), (None, 10, "-"), (3, None, "-"), (0, 0, "="), (4, 0, "new")],
)
def test_ratios_against_the_baseline(
    value: float | None, base: float | None, expected: str
) -> None:
    assert plan.ratio(value, base) == expected


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("etcd", "etcd"),
        ("upper-apiserver", "upper apiserver"),
        ("upper-controller-manager", "upper controller-manager"),
        ("upper-scheduler", None),  # the fleet's own, stopped for the benchmark
        ("upper scheduler", "upper scheduler"),  # the benchmark's
        ("lower-apiserver", "lower apiservers"),
        ("lower-10-apiserver", "lower apiservers"),
        ("lower-3-controller-manager", "lower controller-managers"),
        ("lower-2-scheduler", "lower schedulers"),
        ("lower-2-kwok", "kwok"),
        ("upper-kwok", "kwok"),
        ("virtual node vn-lower-2", "virtual nodes"),
        ("extender", "extender"),
        ("forward-target", None),
    ],
)
def test_processes_are_counted_in_their_component_group(name: str, group: str | None) -> None:
    assert plan.component_group(name) == group


def test_the_table_has_a_ratio_column_per_configuration_after_the_first() -> None:
    lines = plan.table([("pods stranded", [4, 0, None], ".0f")], ["(a)", "(b)", "(c)"])
    assert lines[0].split() == ["(a)", "(b)", "(c)", "(b)/(a)", "(c)/(a)"]
    assert lines[1].split() == ["pods", "stranded", "4", "0", "-", "0.00x", "-"]


def test_a_namespace_exempted_from_slices_may_use_each_virtual_node_for_its_whole_quota() -> None:
    work = plan.workload("b", plan.mix(200), exempt_on=["vn-lower", "vn-lower-2"])
    quotas = {ns: q for ns, q in work.namespaces.items() if q is not None}
    assert quotas
    for quota in quotas.values():
        assert quota["spec"]["hard"] == {"requests.cpu": "1500m", "requests.memory": "1920Mi"}
        assert quota["metadata"]["annotations"] == {  # on the quota: where records are read
            plan.SLICES_ANNOTATION: "vn-lower=1x(1500m,1920Mi),vn-lower-2=1x(1500m,1920Mi)"
        }
    for quota in plan.workload("c", plan.mix(200)).namespaces.values():
        assert quota is None or "annotations" not in quota["metadata"]


@pytest.mark.parametrize(
    ("binds", "rate"),
    [
        ([], None),
        ([5.0], None),
        ([10.0, 11.0], 2.0),
        ([float(t) for t in range(11)], 10 / 9),  # the first 90 %: 10 of 11 binds over 9 s
        ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 60.0], 9 / 8),  # a straggler left out
    ],
)
def test_the_bind_rate_leaves_out_the_schedulers_start_and_a_few_stragglers(
    binds: list[float], rate: float | None
) -> None:
    found = plan.bind_rate(binds)
    assert found == (None if rate is None else pytest.approx(rate))
