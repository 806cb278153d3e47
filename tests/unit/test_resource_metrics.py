"""The k2k provider's pure resource-metrics pipeline: parse, keep ours, rename, sum, rates."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensile.contracts import ownership
from vnode.api import stats
from vnode.provider import ContainerUsage, NodeUsage, PodUsage, Usage
from vnode.providers.k2k import resource_usage
from vnode.providers.k2k.lowerpods import LowerPodBook

NODE = "vn-1"
CLUSTER_ID = "0f3c2a9e-7b1d-4c55-8e2f-5a6b7c8d9e01"
OWNER = ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)

# What a kubelet (or kwok) serves: other series, HELP/TYPE lines, timestamps or none.
KUBELET_TEXT = """\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="main",namespace="lo-team",pod="web"} 2.5 1700000000123
container_cpu_usage_seconds_total{container="side",namespace="lo-team",pod="web"} 0.5 1700000000123
container_cpu_usage_seconds_total{container="c",namespace="lo-team",pod="stranger"} 9 1700000000123
container_cpu_usage_seconds_total{container="c",namespace="lo-team",pod="other-vn"} 9 1700000000123
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="main",namespace="lo-team",pod="web"} 1.6777216e+07
container_memory_working_set_bytes{container="side",namespace="lo-team",pod="web"} 1048576
container_memory_working_set_bytes{container="c",namespace="lo-team",pod="stranger"} 7
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container="main",namespace="lo-team",pod="web"} 1.6999e+09
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 1000 1700000000123
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace="lo-team",pod="web"} 3.25 1700000000123
# TYPE promhttp_metric_handler_errors_total counter
promhttp_metric_handler_errors_total{cause="encoding"} 0
scrape_error 0
"""


def lower_pod(
    name: str,
    *,
    namespace: str = "lo-team",
    node: str | None = "lower-0",
    owner: str | None = NODE,
    uid: str | None = "uid-web",
    upper_namespace: str | None = "team",
    start: str | None = "2023-11-14T22:13:20Z",
    lower_uid: str | None = None,
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if owner is not None:
        labels, annotations = ownership.owner_marks(
            ownership.NodeIdentity(node_name=owner, cluster_id=CLUSTER_ID)
        )
    if uid is not None:
        annotations[ownership.UPPER_UID_ANNOTATION] = uid
    if upper_namespace is not None:
        annotations[ownership.UPPER_NAMESPACE_ANNOTATION] = upper_namespace
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            **({"uid": lower_uid} if lower_uid else {}),
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"startTime": start} if start else {},
    }
    return pod


def test_parse_keeps_the_series_it_reads_with_millisecond_timestamps() -> None:
    samples = resource_usage.parse(KUBELET_TEXT)
    names = {s.name for s in samples}
    assert names == {
        resource_usage.CONTAINER_CPU,
        resource_usage.CONTAINER_MEMORY,
        resource_usage.CONTAINER_START,
        resource_usage.POD_CPU,
    }
    main_cpu = next(
        s
        for s in samples
        if s.name == resource_usage.CONTAINER_CPU and s.labels["container"] == "main"
    )
    assert main_cpu.value == 2.5
    assert main_cpu.time_ms == 1700000000123
    assert main_cpu.labels == {"container": "main", "namespace": "lo-team", "pod": "web"}
    memory = next(s for s in samples if s.name == resource_usage.CONTAINER_MEMORY)
    assert memory.time_ms is None
    assert memory.value == 16777216


@pytest.mark.parametrize(
    "text",
    ['container_cpu_usage_seconds_total{container="a" 1', "x{a=b} 1", 'x{a="b"} one'],
)
def test_parse_refuses_what_is_not_the_text_format(text: str) -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        resource_usage.parse(text)


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from('container_cpu{}=", 1.e+-#\n\\TYPEHELP'), max_size=80))
def test_parse_raises_only_value_error_on_any_text(text: str) -> None:
    try:
        resource_usage.parse(text)
    except ValueError:
        pass


@pytest.mark.parametrize(
    ("annotation", "path"),
    [
        (None, "/metrics/resource"),
        ("/metrics/nodes/n1/metrics/resource", "/metrics/nodes/n1/metrics/resource"),
        ("metrics/resource", "/metrics/resource"),
        ("//evil.example/metrics", "/metrics/resource"),
        ("/metrics/../exec/ns/pod/c", "/metrics/resource"),
        ("/metrics?x=1", "/metrics/resource"),
        ("/metrics/%2e%2e/x", "/metrics/resource"),
        ("", "/metrics/resource"),
    ],
)
def test_the_metrics_path_annotation_is_honoured_when_it_is_a_plain_path(
    annotation: str | None, path: str
) -> None:
    annotations = {} if annotation is None else {resource_usage.PATH_ANNOTATION: annotation}
    assert resource_usage.metrics_path({"metadata": {"annotations": annotations}}) == path


def test_kubelet_url_prefers_the_internal_ip_and_the_published_port() -> None:
    node = {
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": "n1.example"},
                {"type": "InternalIP", "address": "10.0.0.7"},
                {"type": "InternalIP", "address": "10.0.0.8"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 4321}},
        },
    }
    assert (
        resource_usage.kubelet_url(node, "/metrics/resource")
        == "https://10.0.0.7:4321/metrics/resource"
    )
    v6 = {"status": {"addresses": [{"type": "InternalIP", "address": "fd00::1"}]}}
    assert resource_usage.kubelet_url(v6, "/m") == "https://[fd00::1]:10250/m"
    named = {"status": {"addresses": [{"type": "Hostname", "address": "n1.example"}]}}
    assert resource_usage.kubelet_url(named, "/m") == "https://n1.example:10250/m"
    with pytest.raises(ValueError, match="no address"):
        resource_usage.kubelet_url({"metadata": {"name": "n1"}, "status": {}}, "/m")


def test_owned_pods_are_ours_placed_and_named_as_upstairs() -> None:
    pods = [
        lower_pod("web"),
        lower_pod("stranger", owner=None),
        lower_pod("other-vn", owner="vn-2", uid="uid-other"),
        lower_pod("pending", node=None, uid="uid-pending"),
        lower_pod("no-uid", uid=None),
        lower_pod("no-start", uid="uid-ns", start=None),
    ]
    owned = resource_usage.owned_pods(pods, made=LowerPodBook(owner=OWNER).made)
    assert set(owned) == {("lo-team", "web"), ("lo-team", "no-start")}
    web = owned[("lo-team", "web")]
    assert web == resource_usage.OwnedPod(
        node="lower-0", namespace="team", name="web", uid="uid-web", start_time=1700000000.0
    )
    assert owned[("lo-team", "no-start")].start_time is None


def test_a_pod_copying_the_marks_of_a_pod_the_node_made_is_not_measured_as_it() -> None:
    # Anyone who may create pods below can copy the ownership marks; the node's own pod
    # for uid-web is the one whose lower UID it recorded.
    book = LowerPodBook(owner=OWNER)
    book.created("uid-web", lower_uid="lower-uid-1")
    pods = [
        lower_pod("web", lower_uid="lower-uid-1"),
        lower_pod("impostor", lower_uid="lower-uid-2"),
    ]
    assert set(resource_usage.owned_pods(pods, made=book.made)) == {("lo-team", "web")}


def owned() -> dict[resource_usage.LowerKey, resource_usage.OwnedPod]:
    return resource_usage.owned_pods(
        [lower_pod("web"), lower_pod("other-vn", owner="vn-2", uid="uid-other")],
        made=LowerPodBook(owner=OWNER).made,
    )


def test_measure_keeps_only_our_pods_on_that_node_under_upper_names() -> None:
    samples = resource_usage.parse(KUBELET_TEXT)
    [web] = resource_usage.measure(samples, node="lower-0", pods=owned(), fetched_ms=1700000000999)
    assert (web.namespace, web.name, web.uid) == ("team", "web", "uid-web")
    assert [c.name for c in web.containers] == ["main", "side"]
    main, side = web.containers
    assert main.usage == Usage(time_ms=1700000000123, cpu_seconds=2.5, memory_bytes=16777216)
    assert main.start_time == 1.6999e9
    # No start time served: the pod's start stands in.
    assert side.start_time == 1700000000.0
    # The pod-level CPU series wins (it counts the sandbox); memory is summed.
    assert web.usage.cpu_seconds == 3.25
    assert web.usage.memory_bytes == 16777216 + 1048576
    # The same samples read from another node are not our pod's.
    assert resource_usage.measure(samples, node="lower-1", pods=owned(), fetched_ms=1) == []


def test_measure_defaults_times_to_the_fetch_and_missing_values_to_zero() -> None:
    text = 'container_memory_working_set_bytes{container="main",namespace="lo-team",pod="web"} 5\n'
    [web] = resource_usage.measure(
        resource_usage.parse(text), node="lower-0", pods=owned(), fetched_ms=42
    )
    assert web.containers[0].usage == Usage(time_ms=42, cpu_seconds=0.0, memory_bytes=5)
    assert not resource_usage.complete(web)


def pod_usage(
    uid: str = "u1",
    *,
    cpu: float = 1.0,
    memory: float = 10.0,
    time_ms: int = 1000,
    containers: int = 1,
    start: float = 1.0,
) -> PodUsage:
    usage = Usage(time_ms=time_ms, cpu_seconds=cpu, memory_bytes=memory)
    return PodUsage(
        namespace="team",
        name=f"p-{uid}",
        uid=uid,
        start_time=None,
        containers=tuple(
            ContainerUsage(name=f"c{i}", start_time=start, usage=usage) for i in range(containers)
        ),
        usage=Usage(
            time_ms=time_ms, cpu_seconds=cpu * containers, memory_bytes=memory * containers
        ),
    )


@pytest.mark.parametrize(
    ("pod", "kept"),
    [
        (pod_usage(), True),
        (pod_usage(cpu=0.0), False),
        (pod_usage(memory=0.0), False),
        (pod_usage(start=0.0), False),
        (pod_usage(time_ms=0), False),
        (pod_usage(containers=0), False),
    ],
    ids=["complete", "zero-cpu", "zero-memory", "no-start", "no-time", "no-containers"],
)
def test_pods_metrics_server_would_drop_are_left_out(pod: PodUsage, kept: bool) -> None:
    usage, _ = resource_usage.snapshot(
        [pod], history=resource_usage.History(), alive={pod.uid}, complete_scrape=True, now_ms=5
    )
    assert (usage.pods == (pod,)) is kept


def test_the_node_is_the_sum_of_its_pods_and_absent_when_zero() -> None:
    a, b = pod_usage("a", cpu=1.0, memory=10.0), pod_usage("b", cpu=0.0, memory=5.0, time_ms=2000)
    usage, _ = resource_usage.snapshot(
        [a, b], history=resource_usage.History(), alive={"a", "b"}, complete_scrape=False, now_ms=9
    )
    assert [p.uid for p in usage.pods] == ["a"]
    assert usage.node == Usage(time_ms=2000, cpu_seconds=1.0, memory_bytes=15.0)
    assert usage.complete is False
    empty, _ = resource_usage.snapshot(
        [], history=resource_usage.History(), alive=set(), complete_scrape=True, now_ms=9
    )
    assert empty.node is None
    assert empty.pods == ()


def test_rates_come_from_the_previous_measurement_even_a_zero_one() -> None:
    first, history = resource_usage.snapshot(
        [pod_usage(cpu=0.0, time_ms=1000)],
        history=resource_usage.History(),
        alive={"u1"},
        complete_scrape=True,
        now_ms=1000,
    )
    assert first.pods == ()
    second, history = resource_usage.snapshot(
        [pod_usage(cpu=0.5, time_ms=3000)],
        history=history,
        alive={"u1"},
        complete_scrape=True,
        now_ms=3000,
    )
    [pod] = second.pods
    assert pod.usage.cpu_nano_cores == pytest.approx(0.25e9)
    assert pod.containers[0].usage.cpu_nano_cores == pytest.approx(0.25e9)
    assert second.node is not None
    assert second.node.cpu_nano_cores is None  # the node had no value before
    # Same time again (a cached answer read twice), or a counter that went back: no rate.
    third, _ = resource_usage.snapshot(
        [pod_usage(cpu=0.4, time_ms=3000)],
        history=history,
        alive={"u1"},
        complete_scrape=True,
        now_ms=3000,
    )
    assert third.pods[0].usage.cpu_nano_cores is None


def test_the_node_counter_keeps_what_departed_and_unmeasured_pods_used() -> None:
    history = resource_usage.History()
    rounds = [
        ([pod_usage("a", cpu=5.0), pod_usage("b", cpu=3.0)], {"a", "b"}, 8.0),
        ([pod_usage("a", cpu=6.0)], {"a", "b"}, 9.0),  # b not measured: keeps its 3
        ([pod_usage("a", cpu=7.0)], {"a"}, 10.0),  # b gone: its 3 stay
        ([pod_usage("a", cpu=1.0)], {"a"}, 11.0),  # a restarted: its 7 stay, plus 1
    ]
    for measured, alive, expected in rounds:
        usage, history = resource_usage.snapshot(
            measured, history=history, alive=alive, complete_scrape=True, now_ms=1
        )
        assert usage.node is not None
        assert usage.node.cpu_seconds == pytest.approx(expected)


@st.composite
def rounds(draw: st.DrawFn) -> list[tuple[dict[str, float], set[str]]]:
    """Rounds of (measured cumulative CPU by pod, alive pods): counters grow, restart,
    go unmeasured, and pods come and go."""
    cpu: dict[str, float] = {}
    out = []
    for _ in range(draw(st.integers(1, 12))):
        alive = set(draw(st.sets(st.sampled_from("abcde"), max_size=5)))
        measured = {}
        for uid in sorted(alive):
            if draw(st.booleans()):
                restart = draw(st.booleans()) and draw(st.booleans())
                step = draw(st.floats(0, 100, allow_nan=False))
                cpu[uid] = step if restart else cpu.get(uid, 0.0) + step
                measured[uid] = cpu[uid]
        for uid in set(cpu) - alive:
            del cpu[uid]  # gone (should the UID come back, its counter starts again)
        out.append((measured, alive))
    return out


@given(rounds())
def test_the_node_counter_never_goes_backwards(
    sequence: list[tuple[dict[str, float], set[str]]],
) -> None:
    history = resource_usage.History()
    last = 0.0
    for measured, alive in sequence:
        pods = [pod_usage(uid, cpu=value) for uid, value in measured.items()]
        _, history = resource_usage.snapshot(
            pods, history=history, alive=alive, complete_scrape=True, now_ms=1
        )
        total = history.carried + sum(history.counted.values())
        assert total >= last - 1e-9
        last = total


# -- review fixes: the per-container ledger, impossible values, rates ---------------------


def container_text(values: dict[str, float], *, pod_cpu: float | None = None) -> str:
    """What an older kubelet serves for pod "web" (no pod-level series unless `pod_cpu`)."""
    lines = []
    for name, cpu in values.items():
        labels = f'container="{name}",namespace="lo-team",pod="web"'
        lines += [
            f"container_cpu_usage_seconds_total{{{labels}}} {cpu}",
            f"container_memory_working_set_bytes{{{labels}}} 1000",
        ]
    if pod_cpu is not None:
        lines.append(f'pod_cpu_usage_seconds_total{{namespace="lo-team",pod="web"}} {pod_cpu}')
    return "\n".join(lines) + "\n"


def run_rounds(texts: list[str]) -> list[tuple[float, float | None]]:
    """(node CPU, pod CPU or None when the pod is left out) after each round of `texts`."""
    history = resource_usage.History()
    out = []
    for i, text in enumerate(texts):
        measured = resource_usage.measure(
            resource_usage.parse(text),
            node="lower-0",
            pods=owned(),
            fetched_ms=1_700_000_000_000 + i,
        )
        usage, history = resource_usage.snapshot(
            measured, history=history, alive={"uid-web"}, complete_scrape=True, now_ms=1
        )
        assert usage.node is not None
        pod_cpu = usage.pods[0].usage.cpu_seconds if usage.pods else None
        out.append((usage.node.cpu_seconds, pod_cpu))
    return out


def test_a_container_restart_carries_only_that_containers_cpu() -> None:
    """Reproduces the review's case: without pod-level series, container A (100 s)
    restarts while B holds 1000 s; the node (and the pod) must go on from 1100, not add
    the whole pod again (it read 2105 core-s)."""
    rounds = run_rounds(
        [
            container_text({"a": 100.0, "b": 1000.0}),
            container_text({"a": 2.0, "b": 1003.0}),  # a restarted
            container_text({"a": 4.0, "b": 1004.0}),
        ]
    )
    assert rounds == [
        (pytest.approx(1100.0), pytest.approx(1100.0)),
        (pytest.approx(1105.0), pytest.approx(1105.0)),
        (pytest.approx(1108.0), pytest.approx(1108.0)),
    ]


def test_a_pod_level_counter_is_not_counted_twice_when_a_container_restarts() -> None:
    # The pod cgroup's counter keeps what the restarted container used: it is the pod's.
    rounds = run_rounds(
        [
            container_text({"a": 100.0, "b": 1000.0}, pod_cpu=1150.0),
            container_text({"a": 2.0, "b": 1003.0}, pod_cpu=1155.0),
        ]
    )
    assert rounds == [
        (pytest.approx(1150.0), pytest.approx(1150.0)),
        (pytest.approx(1155.0), pytest.approx(1155.0)),
    ]


def test_a_container_whose_series_is_missing_for_a_round_is_not_a_restart() -> None:
    rounds = run_rounds(
        [
            container_text({"a": 100.0, "b": 1000.0}),
            container_text({"a": 0.0, "b": 1001.0}),  # a's CPU not measured this round
            container_text({"a": 101.0, "b": 1002.0}),
        ]
    )
    assert [node for node, _ in rounds] == [
        pytest.approx(1100.0),
        pytest.approx(1101.0),  # a holds its 100
        pytest.approx(1103.0),  # and goes on: not 100 + 101 + 1002
    ]


@st.composite
def container_rounds(draw: st.DrawFn) -> list[dict[str, dict[str, float]]]:
    """Rounds of measured cumulative CPU by pod and container (no pod-level series):
    counters grow, restart (a restart starts below the last value, as it must to be
    seen), pods come and go; every alive pod is measured."""
    cpu: dict[str, dict[str, float]] = {}
    out = []
    for _ in range(draw(st.integers(1, 10))):
        alive = draw(st.sets(st.sampled_from("abc"), min_size=1, max_size=3))
        for uid in set(cpu) - alive:
            del cpu[uid]
        for uid in sorted(alive):
            containers = cpu.setdefault(
                uid, dict.fromkeys(("x", "y", "z")[: 1 + ord(uid) % 3], 0.0)
            )
            for name, before in containers.items():
                if before > 1 and draw(st.booleans()) and draw(st.booleans()):
                    containers[name] = draw(st.floats(0.5, before / 2))  # restarted
                else:
                    containers[name] = before + draw(st.floats(0.5, 100))
        out.append({uid: dict(c) for uid, c in cpu.items()})
    return out


def multi_pod(uid: str, containers: dict[str, float]) -> PodUsage:
    return PodUsage(
        namespace="team",
        name=f"p-{uid}",
        uid=uid,
        start_time=1.0,
        containers=tuple(
            ContainerUsage(
                name=name, start_time=1.0, usage=Usage(time_ms=1, cpu_seconds=v, memory_bytes=1)
            )
            for name, v in containers.items()
        ),
        usage=Usage(time_ms=1, cpu_seconds=sum(containers.values()), memory_bytes=1),
    )


@given(container_rounds())
def test_the_node_counter_is_exactly_the_cpu_its_containers_used(
    sequence: list[dict[str, dict[str, float]]],
) -> None:
    """Summed pods (no pod-level series): whatever restarts, the node counter is the CPU
    every container ever used, gone pods included: nothing counted twice, nothing lost."""
    history = resource_usage.History()
    used: dict[tuple[str, str], float] = {}  # CPU of earlier runs, by container
    last: dict[tuple[str, str], float] = {}
    for pods in sequence:
        for uid, containers in pods.items():
            for name, value in containers.items():
                key = (uid, name)
                if key in last and value < last[key]:
                    used[key] = used.get(key, 0.0) + last[key]
                last[key] = value
        truth = sum(used.values()) + sum(last.values())
        usage, history = resource_usage.snapshot(
            [multi_pod(uid, c) for uid, c in pods.items()],
            history=history,
            alive=set(pods),
            complete_scrape=True,
            now_ms=1,
        )
        assert usage.node is not None
        assert usage.node.cpu_seconds == pytest.approx(truth)
        # A gone pod's key may come back as a new pod (a new counter): forget it here too.
        for key in [k for k in last if k[0] not in pods]:
            used[key] = used.get(key, 0.0) + last.pop(key)


def test_parse_drops_values_no_kubelet_can_mean() -> None:
    text = (
        'container_cpu_usage_seconds_total{container="a",namespace="n",pod="p"} NaN\n'
        'container_cpu_usage_seconds_total{container="b",namespace="n",pod="p"} +Inf\n'
        'container_cpu_usage_seconds_total{container="c",namespace="n",pod="p"} -1\n'
        'container_cpu_usage_seconds_total{container="d",namespace="n",pod="p"} 1 NaN\n'
        'container_cpu_usage_seconds_total{container="e",namespace="n",pod="p"} 1 +Inf\n'
        'container_cpu_usage_seconds_total{container="f",namespace="n",pod="p"} 1e400\n'
        'container_cpu_usage_seconds_total{container="ok",namespace="n",pod="p"} 0 5\n'
    )
    assert [(s.labels["container"], s.value, s.time_ms) for s in resource_usage.parse(text)] == [
        ("ok", 0.0, 5)
    ]


def test_a_nan_or_infinite_sample_does_not_poison_the_node_counter() -> None:
    rounds = run_rounds(
        [
            container_text({"a": 100.0, "b": 1000.0}),
            container_text({"b": 1001.0}).replace("1001.0", "NaN"),
            container_text({"a": 101.0, "b": 1001.0}).replace("101.0", "+Inf"),
            container_text({"a": 102.0, "b": 1002.0}),
        ]
    )
    assert [node for node, _ in rounds] == [
        pytest.approx(1100.0),
        pytest.approx(1100.0),  # b not measured: holds its 1000, as a holds its 100
        pytest.approx(1101.0),
        pytest.approx(1104.0),
    ]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("container_start_time_seconds{%s} 1e12", "start in milliseconds"),
        ("container_start_time_seconds{%s} 1e300", "start beyond year 9999"),
        ("container_cpu_usage_seconds_total{%s} 2.5 1000000000000000", "sample time in µs"),
        ("container_cpu_usage_seconds_total{%s} 2.5 -5", "sample time before 1970"),
        ("container_cpu_usage_seconds_total{%s} 1e300", "CPU beyond uint64 nanoseconds"),
        ("container_memory_working_set_bytes{%s} 1e30", "memory beyond uint64 bytes"),
    ],
)
def test_a_container_with_an_impossible_value_leaves_its_pod_out(line: str, why: str) -> None:
    labels = 'container="main",namespace="lo-team",pod="web"'
    good = {
        "container_cpu_usage_seconds_total": f"container_cpu_usage_seconds_total{{{labels}}} 2.5",
        "container_memory_working_set_bytes": (
            f"container_memory_working_set_bytes{{{labels}}} 1000"
        ),
        "container_start_time_seconds": f"container_start_time_seconds{{{labels}}} 1.6999e9",
    }
    bad = line % labels
    good[bad.partition("{")[0]] = bad
    [web] = resource_usage.measure(
        resource_usage.parse("\n".join(good.values()) + "\n"),
        node="lower-0",
        pods=owned(),
        fetched_ms=1_700_000_000_000,
    )
    assert not resource_usage.complete(web), why
    usage, _ = resource_usage.snapshot(
        [web], history=resource_usage.History(), alive={"uid-web"}, complete_scrape=True, now_ms=1
    )
    assert usage.pods == ()
    stats.summary(usage, node_name=NODE)
    stats.resource_metrics(usage)


def test_a_pod_start_time_no_timestamp_can_hold_is_unknown() -> None:
    owned_pods = resource_usage.owned_pods(
        [lower_pod("web", start="0001-01-01T00:00:00Z")], made=LowerPodBook(owner=OWNER).made
    )
    assert owned_pods[("lo-team", "web")].start_time is None


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def kubelet_answers(draw: st.DrawFn) -> str:
    """Prometheus text for pod "web" (and its pod-level series) with arbitrary floats as
    values and sample timestamps."""
    lines = []
    for name in (
        resource_usage.CONTAINER_CPU,
        resource_usage.CONTAINER_MEMORY,
        resource_usage.CONTAINER_START,
        resource_usage.POD_CPU,
        resource_usage.POD_MEMORY,
    ):
        for container in ("main", "side"):
            if not draw(st.booleans()):
                continue
            labels = 'namespace="lo-team",pod="web"'
            if not name.startswith("pod_"):
                labels += f',container="{container}"'
            stamp = ""
            if draw(st.booleans()):
                stamp = " " + number(draw(st.floats()))
            lines.append(f"{name}{{{labels}}} {number(draw(st.floats()))}{stamp}")
    return "\n".join(lines) + "\n"


@settings(max_examples=300)
@given(st.lists(kubelet_answers(), min_size=1, max_size=3))
def test_whatever_a_kubelet_serves_the_node_renders_without_failing(answers: list[str]) -> None:
    """Arbitrary floats for every value and time, over several rounds: /metrics/resource
    and /stats/summary never raise (a 500), and render only finite numbers."""
    history = resource_usage.History()
    for i, text in enumerate(answers):
        measured = resource_usage.measure(
            resource_usage.parse(text),
            node="lower-0",
            pods=owned(),
            fetched_ms=1_700_000_000_000 + i,
        )
        usage, history = resource_usage.snapshot(
            measured, history=history, alive={"uid-web"}, complete_scrape=True, now_ms=1
        )
        body = json.dumps(stats.summary(usage, node_name=NODE), allow_nan=False)
        text_out = stats.resource_metrics(usage)
        assert "NaN" not in text_out
        assert "Inf" not in text_out
        assert json.loads(body)["node"]["nodeName"] == NODE


def test_lacks_rates_tells_whether_any_reported_cpu_has_no_rate() -> None:
    first, history = resource_usage.snapshot(
        [pod_usage(time_ms=1000)],
        history=resource_usage.History(),
        alive={"u1"},
        complete_scrape=True,
        now_ms=1000,
    )
    assert resource_usage.lacks_rates(first)
    second, _ = resource_usage.snapshot(
        [pod_usage(cpu=2.0, time_ms=2000)],
        history=history,
        alive={"u1"},
        complete_scrape=True,
        now_ms=2000,
    )
    assert not resource_usage.lacks_rates(second)
    assert not resource_usage.lacks_rates(NodeUsage(pods=(), node=None, complete=True))
