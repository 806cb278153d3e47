"""The virtual node offers what usable lower nodes have left, counted as kube-scheduler counts."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensile.kube.quantity import parse_quantity
from tensile.kube.resources import pod_is_terminal
from vnode.providers.k2k.capacity import (
    Ledger,
    capacity,
    counts,
    node_is_usable,
    node_resources,
    pod_requests,
)

GI = 1024**3
MI = 1024**2


def container(
    name: str = "c",
    *,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if limits is not None:
        resources["limits"] = dict(limits)
    result: dict[str, Any] = {"name": name, "image": "busybox", "resources": resources}
    if restart_policy is not None:
        result["restartPolicy"] = restart_policy
    return result


def pod(
    name: str = "p",
    *,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    node_name: str | None = "n1",
    phase: str = "Running",
    overhead: Mapping[str, str] | None = None,
    pod_level: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers if containers is not None else [container()]}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    if node_name is not None:
        spec["nodeName"] = node_name
    if overhead is not None:
        spec["overhead"] = dict(overhead)
    if pod_level is not None:
        spec["resources"] = dict(pod_level)
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "labels": dict(labels or {})}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def node(
    name: str = "n1",
    *,
    allocatable: Mapping[str, str] | None = None,
    ready: str | None = "True",
    unschedulable: bool | None = None,
) -> dict[str, Any]:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    spec: dict[str, Any] = {}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    alloc = dict(
        allocatable or {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    )
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"allocatable": alloc, "capacity": alloc, "conditions": conditions},
    }


def cpu_mem(cpu: str, memory: str) -> dict[str, str]:
    return {"cpu": cpu, "memory": memory}


def never_own(_pod: Mapping[str, Any]) -> bool:
    return False


# --- pod_requests ----------------------------------------------------------------------


def test_a_pod_without_requests_takes_only_a_pod_slot() -> None:
    assert pod_requests(pod(containers=[container()])) == {"pods": 1}
    assert pod_requests({}) == {"pods": 1}
    assert pod_requests({"spec": {"containers": None, "initContainers": None}}) == {"pods": 1}


def test_app_container_requests_add_up() -> None:
    p = pod(
        containers=[
            container("a", requests=cpu_mem("250m", "64Mi")),
            container("b", requests=cpu_mem("1", "1Gi")),
            container("c", requests={"ephemeral-storage": "1Gi"}),
        ]
    )
    assert pod_requests(p) == {
        "cpu": Fraction(5, 4),
        "memory": 64 * MI + GI,
        "ephemeral-storage": GI,
        "pods": 1,
    }


def test_zero_requests_are_kept_as_zero() -> None:
    p = pod(containers=[container(requests=cpu_mem("0", "0"))])
    assert pod_requests(p) == {"cpu": 0, "memory": 0, "pods": 1}


def test_an_init_container_bigger_than_the_app_containers_sets_the_request() -> None:
    p = pod(
        containers=[container("app", requests=cpu_mem("500m", "2Gi"))],
        init_containers=[container("migrate", requests=cpu_mem("2", "1Gi"))],
    )
    # Per resource: cpu from the init container, memory from the app container.
    assert pod_requests(p) == {"cpu": 2, "memory": 2 * GI, "pods": 1}


def test_init_containers_run_one_at_a_time_so_the_largest_counts_not_their_sum() -> None:
    p = pod(
        containers=[container("app", requests={"cpu": "100m"})],
        init_containers=[
            container("one", requests={"cpu": "1"}),
            container("two", requests={"cpu": "3"}),
            container("three", requests={"cpu": "2"}),
        ],
    )
    assert pod_requests(p)["cpu"] == 3


def test_an_init_container_only_resource_still_counts() -> None:
    p = pod(
        containers=[container("app", requests={"cpu": "1"})],
        init_containers=[container("fetch", requests={"ephemeral-storage": "5Gi"})],
    )
    assert pod_requests(p) == {"cpu": 1, "ephemeral-storage": 5 * GI, "pods": 1}


def test_sidecars_add_to_the_app_containers() -> None:
    p = pod(
        containers=[container("app", requests=cpu_mem("1", "1Gi"))],
        init_containers=[
            container("proxy", requests=cpu_mem("500m", "128Mi"), restart_policy="Always"),
            container("logs", requests=cpu_mem("100m", "64Mi"), restart_policy="Always"),
        ],
    )
    assert pod_requests(p) == {"cpu": Fraction(8, 5), "memory": GI + 192 * MI, "pods": 1}


def test_an_init_container_runs_alongside_the_sidecars_declared_before_it() -> None:
    p = pod(
        containers=[container("app", requests={"cpu": "1"})],
        init_containers=[
            container("proxy", requests={"cpu": "500m"}, restart_policy="Always"),
            container("migrate", requests={"cpu": "2"}),
            container("logs", requests={"cpu": "300m"}, restart_policy="Always"),
        ],
    )
    # migrate runs with proxy (2 + 0.5) but not with logs, which starts after it; the app
    # phase needs 1 + 0.5 + 0.3 = 1.8, so the init phase (2.5) wins.
    assert pod_requests(p)["cpu"] == Fraction(5, 2)


def test_a_sidecar_declared_after_an_init_container_does_not_add_to_it() -> None:
    p = pod(
        containers=[container("app", requests={"cpu": "1"})],
        init_containers=[
            container("migrate", requests={"cpu": "2"}),
            container("proxy", requests={"cpu": "500m"}, restart_policy="Always"),
        ],
    )
    assert pod_requests(p)["cpu"] == 2


def test_sidecars_accumulate_for_later_init_containers() -> None:
    p = pod(
        containers=[container("app", requests={"memory": "100Mi"})],
        init_containers=[
            container("s1", requests={"memory": "200Mi"}, restart_policy="Always"),
            container("s2", requests={"memory": "300Mi"}, restart_policy="Always"),
            container("init", requests={"memory": "1Gi"}),
        ],
    )
    assert pod_requests(p)["memory"] == 1024 * MI + 500 * MI


def test_only_restart_policy_always_makes_a_sidecar() -> None:
    p = pod(
        containers=[container("app", requests={"cpu": "1"})],
        init_containers=[container("init", requests={"cpu": "500m"}, restart_policy="Never")],
    )
    assert pod_requests(p)["cpu"] == 1


def test_overhead_is_added_on_top() -> None:
    p = pod(
        containers=[container("app", requests=cpu_mem("1", "1Gi"))],
        init_containers=[container("init", requests=cpu_mem("2", "512Mi"))],
        overhead={"cpu": "250m", "memory": "120Mi"},
    )
    assert pod_requests(p) == {"cpu": Fraction(9, 4), "memory": GI + 120 * MI, "pods": 1}


def test_pod_level_requests_replace_container_sums_for_cpu_memory_and_hugepages() -> None:
    p = pod(
        containers=[
            container(
                "app",
                requests={
                    "cpu": "100m",
                    "memory": "100Mi",
                    "hugepages-2Mi": "10Mi",
                    "ephemeral-storage": "1Gi",
                },
            ),
            container("other", requests={"cpu": "100m"}),
        ],
        init_containers=[container("init", requests={"cpu": "5", "ephemeral-storage": "3Gi"})],
        pod_level={
            "requests": {
                "cpu": "2",
                "memory": "4Gi",
                "hugepages-2Mi": "20Mi",
                # Not a pod-level resource: ignored, the containers' figure stands.
                "ephemeral-storage": "50Gi",
            },
            "limits": {"cpu": "8"},
        },
        overhead={"cpu": "100m"},
    )
    assert pod_requests(p) == {
        "cpu": 2 + Fraction(1, 10),
        "memory": 4 * GI,
        "hugepages-2Mi": 20 * MI,
        "ephemeral-storage": 3 * GI,
        "pods": 1,
    }


def test_pod_level_requests_for_a_resource_no_container_requests() -> None:
    p = pod(containers=[container()], pod_level={"requests": {"memory": "1Gi"}})
    assert pod_requests(p) == {"memory": GI, "pods": 1}


def test_pod_level_limits_alone_are_not_read_as_requests() -> None:
    # The apiserver defaults pod-level requests when it stores the pod.
    p = pod(containers=[container(requests={"cpu": "1"})], pod_level={"limits": {"cpu": "4"}})
    assert pod_requests(p) == {"cpu": 1, "pods": 1}


def test_a_limit_without_a_request_is_the_request() -> None:
    p = pod(
        containers=[
            container("a", limits={"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}),
            container("b", requests={"cpu": "500m"}, limits={"cpu": "4", "memory": "2Gi"}),
        ],
        init_containers=[container("init", limits={"cpu": "3"})],
    )
    # b requests 500m cpu (its own request) and 2Gi memory (its limit).
    assert pod_requests(p) == {
        "cpu": 3,
        "memory": 3 * GI,
        "nvidia.com/gpu": 1,
        "pods": 1,
    }


def test_pods_is_always_one() -> None:
    p = pod(containers=[container("a"), container("b")], init_containers=[container("i")])
    assert pod_requests(p)["pods"] == 1


def test_extended_resources_are_requested_like_any_other() -> None:
    p = pod(
        containers=[
            container("a", requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "1"}),
            container("b", requests={"nvidia.com/gpu": "2", "example.com/foo": "3"}),
        ]
    )
    assert pod_requests(p) == {"nvidia.com/gpu": 3, "example.com/foo": 3, "pods": 1}


def test_a_malformed_request_raises_value_error() -> None:
    with pytest.raises(ValueError, match="invalid quantity '1 Gi'"):
        pod_requests(pod(containers=[container(requests={"memory": "1 Gi"})]))


def test_pod_requests_returns_fractions() -> None:
    result = pod_requests(pod(containers=[container(requests={"cpu": "1500m"})]))
    assert all(isinstance(v, Fraction) for v in result.values())


# --- pod_is_terminal, node_is_usable ----------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "terminal"),
    [
        ("Succeeded", True),
        ("Failed", True),
        ("Pending", False),
        ("Running", False),
        ("Unknown", False),
    ],
)
def test_terminal_phases(phase: str, terminal: bool) -> None:
    assert pod_is_terminal(pod(phase=phase)) is terminal


def test_a_pod_without_status_is_not_terminal() -> None:
    assert pod_is_terminal({"metadata": {"name": "p"}, "spec": {}}) is False
    assert pod_is_terminal({"status": None}) is False


def test_a_ready_schedulable_node_is_usable() -> None:
    assert node_is_usable(node()) is True
    assert node_is_usable(node(unschedulable=False)) is True


@pytest.mark.parametrize(
    "n",
    [
        pytest.param(node(ready="False"), id="not-ready"),
        pytest.param(node(ready="Unknown"), id="ready-unknown"),
        pytest.param(node(ready=None), id="no-ready-condition"),
        pytest.param(node(unschedulable=True), id="cordoned"),
        pytest.param({"metadata": {"name": "bare"}}, id="no-status"),
        pytest.param({"status": {"conditions": None}}, id="null-conditions"),
    ],
)
def test_unusable_nodes(n: dict[str, Any]) -> None:
    assert node_is_usable(n) is False


# --- capacity ---------------------------------------------------------------------------


def test_capacity_sums_allocatable_of_usable_nodes() -> None:
    nodes = [
        node("n1"),
        node(
            "n2",
            allocatable={
                "cpu": "7500m",
                "memory": "32Gi",
                "pods": "110",
                "ephemeral-storage": "50Gi",
                "hugepages-2Mi": "1Gi",
                "nvidia.com/gpu": "4",
            },
        ),
    ]
    assert capacity(nodes=nodes, pods=[], is_own_pod=never_own) == {
        "cpu": Fraction(23, 2),
        "memory": 48 * GI,
        "pods": 220,
        "ephemeral-storage": 150 * GI,
        "hugepages-2Mi": GI,
        "nvidia.com/gpu": 4,
    }


def test_capacity_subtracts_the_requests_of_bound_running_pods() -> None:
    pods = [
        pod("a", containers=[container(requests=cpu_mem("1500m", "1Gi"))]),
        pod(
            "b",
            containers=[container(requests=cpu_mem("100m", "100Mi"))],
            init_containers=[container(requests=cpu_mem("1", "0"))],
        ),
        pod("c", containers=[container(requests={"ephemeral-storage": "10Gi"})], phase="Pending"),
    ]
    assert capacity(nodes=[node()], pods=pods, is_own_pod=never_own) == {
        "cpu": Fraction(3, 2),
        "memory": 16 * GI - GI - 100 * MI,
        "pods": 107,
        "ephemeral-storage": 90 * GI,
    }


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(node("bad", ready="False"), id="not-ready"),
        pytest.param(node("bad", ready="Unknown"), id="ready-unknown"),
        pytest.param(node("bad", ready=None), id="no-ready-condition"),
        pytest.param(node("bad", unschedulable=True), id="cordoned"),
    ],
)
def test_unusable_nodes_and_their_pods_do_not_count(bad: dict[str, Any]) -> None:
    pods = [
        pod("on-bad", node_name="bad", containers=[container(requests=cpu_mem("1", "1Gi"))]),
        pod("on-good", node_name="n1", containers=[container(requests={"cpu": "1"})]),
    ]
    result = capacity(nodes=[node("n1"), bad], pods=pods, is_own_pod=never_own)
    assert result == {"cpu": 3, "memory": 16 * GI, "pods": 109, "ephemeral-storage": 100 * GI}


def test_terminal_pods_free_their_resources() -> None:
    pods = [
        pod("done", phase="Succeeded", containers=[container(requests={"cpu": "1"})]),
        pod("crashed", phase="Failed", containers=[container(requests={"cpu": "1"})]),
        pod("running", containers=[container(requests={"cpu": "1"})]),
    ]
    result = capacity(nodes=[node()], pods=pods, is_own_pod=never_own)
    assert result["cpu"] == 3
    assert result["pods"] == 109


def test_pods_being_deleted_still_hold_their_resources() -> None:
    pods = [pod("going", deleting=True, containers=[container(requests={"cpu": "1"})])]
    assert capacity(nodes=[node()], pods=pods, is_own_pod=never_own)["cpu"] == 3


def test_unbound_pods_do_not_count() -> None:
    pods = [
        pod(
            "pending",
            node_name=None,
            phase="Pending",
            containers=[container(requests={"cpu": "1"})],
        ),
        pod("empty-node-name", node_name="", containers=[container(requests={"cpu": "1"})]),
        pod("elsewhere", node_name="gone", containers=[container(requests={"cpu": "1"})]),
    ]
    assert capacity(nodes=[node()], pods=pods, is_own_pod=never_own)["cpu"] == 4


def test_own_pods_are_not_subtracted_and_only_counting_pods_are_asked_about() -> None:
    asked: list[str] = []

    def is_own(p: Mapping[str, Any]) -> bool:
        asked.append(p["metadata"]["name"])
        return bool(p["metadata"]["labels"].get("virtual-pod") == "true")

    pods = [
        pod("mine", labels={"virtual-pod": "true"}, containers=[container(requests={"cpu": "2"})]),
        pod("theirs", containers=[container(requests={"cpu": "1"})]),
        pod("finished", phase="Succeeded", labels={"virtual-pod": "true"}),
        pod("unbound", node_name=None, labels={"virtual-pod": "true"}),
    ]
    result = capacity(nodes=[node()], pods=pods, is_own_pod=is_own)
    assert result["cpu"] == 3
    assert result["pods"] == 109
    assert sorted(asked) == ["mine", "theirs"]


def test_capacity_is_clamped_at_zero() -> None:
    # tensile-kube reported "Invalid value: -20Gi" once lower pods asked for more memory
    # than the nodes had; the offer must stop at 0 instead.
    pods = [
        pod("big", containers=[container(requests=cpu_mem("6", "30Gi"))]),
        pod("bigger", containers=[container(requests={"memory": "6Gi"})]),
    ]
    result = capacity(nodes=[node()], pods=pods, is_own_pod=never_own)
    assert result == {"cpu": 0, "memory": 0, "pods": 108, "ephemeral-storage": 100 * GI}
    assert node_resources(result)["memory"] == "0"


def test_extended_resources_are_offered_and_used() -> None:
    nodes = [
        node(
            "gpu", allocatable={"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "2"}
        ),
        node("cpu-only"),
    ]
    pods = [
        pod("train", node_name="gpu", containers=[container(limits={"nvidia.com/gpu": "2"})]),
        pod("other", node_name="gpu", containers=[container(requests={"example.com/dongle": "1"})]),
    ]
    result = capacity(nodes=nodes, pods=pods, is_own_pod=never_own)
    # Fully used but still offered (as 0); requested but never offered: left out.
    assert result["nvidia.com/gpu"] == 0
    assert "example.com/dongle" not in result
    assert node_resources(result)["nvidia.com/gpu"] == "0"


def test_a_node_missing_standard_resources_still_yields_them() -> None:
    result = capacity(
        nodes=[node(allocatable={"cpu": "2", "example.com/widget": "5"})],
        pods=[],
        is_own_pod=never_own,
    )
    assert result == {
        "cpu": 2,
        "memory": 0,
        "pods": 0,
        "ephemeral-storage": 0,
        "example.com/widget": 5,
    }


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param([], id="no-nodes"),
        pytest.param([node(ready="False"), node("n2", unschedulable=True)], id="none-usable"),
    ],
)
def test_no_usable_nodes_means_nothing_is_offered(nodes: list[dict[str, Any]]) -> None:
    pods = [pod(containers=[container(requests={"cpu": "1"})])]
    result = capacity(nodes=nodes, pods=pods, is_own_pod=never_own)
    assert result == {"cpu": 0, "memory": 0, "pods": 0, "ephemeral-storage": 0}
    assert all(isinstance(v, Fraction) for v in result.values())


def test_capacity_accepts_one_shot_iterables() -> None:
    nodes = (n for n in [node("n1"), node("n2")])
    pods = (p for p in [pod(containers=[container(requests={"cpu": "1"})])])
    assert capacity(nodes=nodes, pods=pods, is_own_pod=never_own)["cpu"] == 7


def test_a_realistic_lower_cluster() -> None:
    nodes = [
        node(
            "worker-1",
            allocatable={
                "cpu": "3920m",
                "memory": "15928528Ki",
                "pods": "110",
                "ephemeral-storage": "94580335255",
                "hugepages-1Gi": "0",
                "hugepages-2Mi": "0",
            },
        ),
        node("worker-2", allocatable={"cpu": "4", "memory": "16Gi", "pods": "110"}),
    ]
    pods = [
        pod(
            "coredns",
            node_name="worker-1",
            containers=[container(requests=cpu_mem("100m", "70Mi"), limits={"memory": "170Mi"})],
        ),
        pod("kube-proxy", node_name="worker-1", containers=[container()]),
        pod("web", node_name="worker-2", containers=[container(requests=cpu_mem("0.5", "512Mi"))]),
    ]
    result = capacity(nodes=nodes, pods=pods, is_own_pod=never_own)
    assert node_resources(result) == {
        "cpu": "7320m",
        # 15928528Ki + 16Gi - 70Mi - 512Mi, still a whole number of Ki
        "memory": "32109776Ki",
        "pods": "217",
        "ephemeral-storage": "94580335255",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }


def test_inputs_are_never_mutated() -> None:
    nodes = [node("n1"), node("n2", ready="False")]
    pods = [
        pod(
            "a",
            containers=[container(limits={"cpu": "1", "memory": "1Gi"})],
            init_containers=[
                container("s", requests={"cpu": "1"}, restart_policy="Always"),
                container("i", requests={"cpu": "3"}),
            ],
            overhead={"cpu": "100m"},
            pod_level={"requests": {"memory": "2Gi"}},
        ),
        pod("b", node_name="n2"),
        pod("c", phase="Failed"),
    ]
    nodes_before, pods_before = copy.deepcopy(nodes), copy.deepcopy(pods)
    for p in pods:
        pod_requests(p)
        pod_is_terminal(p)
    for n in nodes:
        node_is_usable(n)
    result = capacity(nodes=nodes, pods=pods, is_own_pod=never_own)
    result_before = copy.deepcopy(result)
    node_resources(result)
    assert nodes == nodes_before
    assert pods == pods_before
    assert result == result_before


# --- node_resources ---------------------------------------------------------------------


def test_node_resources_formats_each_kind_of_resource() -> None:
    values = {
        "cpu": Fraction(15, 2),
        "memory": Fraction(64 * GI),
        "pods": Fraction(110),
        "ephemeral-storage": Fraction(1536 * MI),
        "hugepages-2Mi": Fraction(GI),
        "nvidia.com/gpu": Fraction(4),
    }
    assert node_resources(values) == {
        "cpu": "7500m",
        "memory": "64Gi",
        "pods": "110",
        "ephemeral-storage": "1536Mi",
        "hugepages-2Mi": "1Gi",
        "nvidia.com/gpu": "4",
    }


def test_node_resources_rounds_down_to_the_unit_written() -> None:
    values = {
        "cpu": Fraction(1, 3),
        "memory": Fraction(2049, 2),
        "pods": Fraction(21, 2),
        "ephemeral-storage": Fraction(1, 2),
        "hugepages-1Gi": Fraction(3 * GI + 1, 3),
        "nvidia.com/gpu": Fraction(5, 2),
        "example.com/foo": Fraction(9, 10),
    }
    assert node_resources(values) == {
        "cpu": "333m",
        "memory": "1Ki",
        "pods": "10",
        "ephemeral-storage": "0",
        "hugepages-1Gi": "1Gi",
        "nvidia.com/gpu": "2",
        "example.com/foo": "0",
    }


def test_node_resources_writes_whole_cpus_plainly() -> None:
    assert node_resources({"cpu": Fraction(4)})["cpu"] == "4"
    assert node_resources({"cpu": Fraction(40001, 10000)})["cpu"] == "4"


def test_node_resources_always_has_the_standard_keys_first() -> None:
    result = node_resources({"zz.io/thing": Fraction(1), "aa.io/thing": Fraction(2)})
    assert list(result) == [
        "cpu",
        "memory",
        "pods",
        "ephemeral-storage",
        "aa.io/thing",
        "zz.io/thing",
    ]
    assert result["cpu"] == result["memory"] == result["pods"] == "0"
    assert node_resources({}) == {"cpu": "0", "memory": "0", "pods": "0", "ephemeral-storage": "0"}


def test_node_resources_never_writes_a_negative_amount() -> None:
    values = {"cpu": Fraction(-1), "memory": Fraction(-20 * GI), "nvidia.com/gpu": Fraction(-2)}
    assert node_resources(values) == {
        "cpu": "0",
        "memory": "0",
        "pods": "0",
        "ephemeral-storage": "0",
        "nvidia.com/gpu": "0",
    }


_UNIT = {"cpu": Fraction(1, 1000)}


@given(
    st.dictionaries(
        st.sampled_from(
            ["cpu", "memory", "pods", "ephemeral-storage", "hugepages-2Mi", "nvidia.com/gpu"]
        ),
        st.fractions(min_value=0, max_value=2**64),
    )
)
def test_node_resources_never_offers_more_than_the_value(values: dict[str, Fraction]) -> None:
    written = node_resources(values)
    for name, amount in values.items():
        back = parse_quantity(written[name])
        unit = _UNIT.get(name, Fraction(1))
        assert amount - unit < back <= amount


# --- the ledger: capacity kept up to date pod by pod ----------------------------------------

_changes = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),  # pod key
        st.one_of(
            st.none(),  # deleted
            st.builds(
                lambda node_name, phase, cpu, deleting: pod(
                    containers=[container(requests=cpu_mem(cpu, "1Gi"))],
                    node_name=node_name,
                    phase=phase,
                    deleting=deleting,
                ),
                st.sampled_from([None, "n1", "n2", "gone"]),
                st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
                st.sampled_from(["0", "100m", "1", "1500m"]),
                st.booleans(),
            ),
        ),
    ),
    max_size=30,
)


@given(changes=_changes)
def test_the_ledger_agrees_with_a_recount_after_any_changes(
    changes: list[tuple[str, dict[str, Any] | None]],
) -> None:
    nodes = [node("n1"), node("n2", allocatable={"cpu": "2", "memory": "4Gi", "pods": "10"})]
    ledger = Ledger()
    current: dict[str, dict[str, Any]] = {}
    for key, state in changes:
        if state is None:
            ledger.remove(key)
            current.pop(key, None)
        else:
            ledger.put(key, state)
            current[key] = state
        assert ledger.free(nodes) == capacity(
            nodes=nodes, pods=current.values(), is_own_pod=never_own
        )
    assert len(ledger) == sum(1 for p in current.values() if counts(p))


def test_the_ledger_says_when_its_figures_changed() -> None:
    ledger = Ledger()
    running = pod(containers=[container(requests=cpu_mem("1", "1Gi"))])
    assert ledger.put("a", running)
    assert not ledger.put("a", copy.deepcopy(running)), "the same requests on the same node"
    assert ledger.put("a", pod(containers=[container(requests=cpu_mem("2", "1Gi"))]))
    assert ledger.put("a", pod(phase="Succeeded"))  # terminal: no longer counted
    assert not ledger.put("a", pod(node_name=None))
    assert not ledger.remove("a")
    assert ledger.free([node()]) == capacity(nodes=[node()], pods=[], is_own_pod=never_own)


def test_a_malformed_pod_leaves_the_ledger_unchanged() -> None:
    ledger = Ledger()
    ledger.put("a", pod(containers=[container(requests=cpu_mem("1", "1Gi"))]))
    before = ledger.free([node()])
    with pytest.raises(ValueError, match="quantity"):
        ledger.put("a", pod(containers=[container(requests={"cpu": "lots"})]))
    assert ledger.free([node()]) == before
