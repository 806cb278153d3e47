"""The kubelet API's renderers: /metrics/resource text, /stats/summary, /runningpods/, /run."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from vnode.api import run, stats
from vnode.provider import ContainerUsage, NodeUsage, PodUsage, RemoteCommand, Usage

T = 1_700_000_000_123


def usage(cpu: float = 2.5, memory: float = 1024.0, *, rate: float | None = None) -> Usage:
    return Usage(time_ms=T, cpu_seconds=cpu, memory_bytes=memory, cpu_nano_cores=rate)


def pod(name: str = "web", *, containers: tuple[str, ...] = ("main",)) -> PodUsage:
    return PodUsage(
        namespace="team",
        name=name,
        uid=f"uid-{name}",
        start_time=1_699_999_000.0,
        containers=tuple(
            ContainerUsage(name=c, start_time=1_699_999_001.5, usage=usage(rate=2.5e8))
            for c in containers
        ),
        usage=usage(2.5 * len(containers), 1024.0 * len(containers), rate=5e8),
    )


def test_resource_metrics_are_the_kubelets_series_and_labels() -> None:
    text = stats.resource_metrics(NodeUsage(pods=(pod(),), node=usage(10.0, 4096.0), complete=True))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    labels = '{namespace="team",pod="web",container="main"}'
    assert lines == [
        f"container_cpu_usage_seconds_total{labels} 2.5 {T}",
        f"container_memory_working_set_bytes{labels} 1024.0 {T}",
        f"container_start_time_seconds{labels} 1699999001.5",
        f"node_cpu_usage_seconds_total 10.0 {T}",
        f"node_memory_working_set_bytes 4096.0 {T}",
        f'pod_cpu_usage_seconds_total{{namespace="team",pod="web"}} 2.5 {T}',
        f'pod_memory_working_set_bytes{{namespace="team",pod="web"}} 1024.0 {T}',
        "resource_scrape_error 0.0",
        "scrape_error 0.0",
    ]
    assert "# TYPE container_cpu_usage_seconds_total counter" in text
    assert "# TYPE container_memory_working_set_bytes gauge" in text
    assert text.endswith("\n")


def test_an_incomplete_answer_says_so_and_an_empty_node_has_no_usage_series() -> None:
    text = stats.resource_metrics(NodeUsage(pods=(), node=None, complete=False))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["resource_scrape_error 1.0", "scrape_error 1.0"]


# Names with what the text format must escape (\\, ", newline), its own syntax, and non-ASCII.
label_text = st.text(st.sampled_from('az09-._\\"\n{}=,# \u00e9\u20ac\U0001f600'), max_size=12)
positive = st.floats(min_value=1e-9, max_value=1e15, allow_nan=False, allow_infinity=False)


@st.composite
def node_usages(draw: st.DrawFn) -> NodeUsage:
    pods = []
    for i in range(draw(st.integers(0, 3))):
        names = draw(st.lists(label_text, min_size=1, max_size=3, unique=True))
        containers = tuple(
            ContainerUsage(
                name=n,
                start_time=draw(positive),
                usage=Usage(
                    time_ms=draw(st.integers(1, 2**42)),
                    cpu_seconds=draw(positive),
                    memory_bytes=draw(positive),
                ),
            )
            for n in names
        )
        pods.append(
            PodUsage(
                namespace=draw(label_text),
                name=f"{draw(label_text)}-{i}",
                uid=str(i),
                start_time=None,
                containers=containers,
                usage=Usage(
                    time_ms=draw(st.integers(1, 2**42)),
                    cpu_seconds=draw(positive),
                    memory_bytes=draw(positive),
                ),
            )
        )
    node = None
    if draw(st.booleans()):
        node = Usage(time_ms=1, cpu_seconds=draw(positive), memory_bytes=draw(positive))
    return NodeUsage(pods=tuple(pods), node=node, complete=draw(st.booleans()))


@given(node_usages())
def test_resource_metrics_parse_back_to_the_same_values(node: NodeUsage) -> None:
    """Whatever names and values come, the text parses (with the Prometheus text parser)
    back to exactly the series, labels, values and millisecond timestamps rendered."""
    parsed = {
        (s.name, tuple(sorted(s.labels.items()))): s
        for family in text_string_to_metric_families(stats.resource_metrics(node))
        for s in family.samples
    }
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, int | None]] = {}
    for p in node.pods:
        labels = {"pod": p.name, "namespace": p.namespace}
        for c in p.containers:
            key = tuple(sorted({**labels, "container": c.name}.items()))
            expected[("container_cpu_usage_seconds_total", key)] = (
                c.usage.cpu_seconds,
                c.usage.time_ms,
            )
            expected[("container_memory_working_set_bytes", key)] = (
                c.usage.memory_bytes,
                c.usage.time_ms,
            )
            expected[("container_start_time_seconds", key)] = (c.start_time, None)
        key = tuple(sorted(labels.items()))
        expected[("pod_cpu_usage_seconds_total", key)] = (p.usage.cpu_seconds, p.usage.time_ms)
        expected[("pod_memory_working_set_bytes", key)] = (p.usage.memory_bytes, p.usage.time_ms)
    if node.node is not None:
        expected[("node_cpu_usage_seconds_total", ())] = (node.node.cpu_seconds, 1)
        expected[("node_memory_working_set_bytes", ())] = (node.node.memory_bytes, 1)
    error = 0.0 if node.complete else 1.0
    expected[("scrape_error", ())] = (error, None)
    expected[("resource_scrape_error", ())] = (error, None)
    assert set(parsed) == set(expected)
    for key, (value, time_ms) in expected.items():
        sample = parsed[key]
        assert sample.value == value
        if time_ms is None:
            assert sample.timestamp is None
        else:
            assert sample.timestamp is not None
            assert math.isclose(float(sample.timestamp) * 1000, time_ms, abs_tol=0.5)


def test_the_summary_has_the_stats_v1alpha1_shape() -> None:
    node = NodeUsage(pods=(pod(containers=("a", "b")),), node=usage(10.0, 4096.0), complete=True)
    body = json.loads(json.dumps(stats.summary(node, node_name="vn-1")))
    assert body["node"] == {
        "nodeName": "vn-1",
        "cpu": {"time": "2023-11-14T22:13:20Z", "usageCoreNanoSeconds": 10_000_000_000},
        "memory": {"time": "2023-11-14T22:13:20Z", "workingSetBytes": 4096},
    }
    [entry] = body["pods"]
    assert entry["podRef"] == {"name": "web", "namespace": "team", "uid": "uid-web"}
    assert entry["startTime"] == "2023-11-14T21:56:40Z"
    assert [c["name"] for c in entry["containers"]] == ["a", "b"]
    assert entry["containers"][0] == {
        "name": "a",
        "startTime": "2023-11-14T21:56:41Z",
        "cpu": {
            "time": "2023-11-14T22:13:20Z",
            "usageCoreNanoSeconds": 2_500_000_000,
            "usageNanoCores": 250_000_000,
        },
        "memory": {"time": "2023-11-14T22:13:20Z", "workingSetBytes": 1024},
    }
    assert entry["cpu"]["usageNanoCores"] == 500_000_000
    assert entry["memory"]["workingSetBytes"] == 2048
    empty = stats.summary(NodeUsage(pods=(), node=None, complete=False), node_name="vn-1")
    assert empty == {"node": {"nodeName": "vn-1"}, "pods": []}


def test_running_pods_are_those_with_a_running_container() -> None:
    def upper(name: str, *states: str) -> dict[str, object]:
        return {
            "metadata": {"name": name, "namespace": "team", "uid": f"u-{name}", "labels": {}},
            "spec": {"containers": [{"name": f"c{i}", "image": "ignored"} for i in range(3)]},
            "status": {
                "containerStatuses": [
                    {"name": f"c{i}", "image": f"img{i}", "state": {s: {}}}
                    for i, s in enumerate(states)
                ]
            },
        }

    body = stats.running_pods(
        [
            upper("b", "running", "waiting"),
            upper("a", "terminated"),
            upper("c"),
            upper("a2", "running"),
        ]
    )
    assert body["kind"] == "PodList"
    assert body["items"] == [
        {
            "metadata": {"name": "a2", "namespace": "team", "uid": "u-a2"},
            "spec": {"containers": [{"name": "c0", "image": "img0"}]},
            "status": {},
        },
        {
            "metadata": {"name": "b", "namespace": "team", "uid": "u-b"},
            "spec": {"containers": [{"name": "c0", "image": "img0"}]},
            "status": {},
        },
    ]


@pytest.mark.parametrize(
    ("cmd", "argv"),
    [("echo hello", ("echo", "hello")), ("ls  -l", ("ls", "", "-l")), ("date", ("date",))],
)
def test_run_splits_cmd_on_single_spaces_as_the_kubelet(cmd: str, argv: tuple[str, ...]) -> None:
    assert run.command({"cmd": cmd}) == RemoteCommand(
        command=argv, stdin=False, stdout=True, stderr=True, tty=False
    )


@pytest.mark.parametrize("query", [{}, {"cmd": ""}, {"cmd": "  "}])
def test_run_needs_a_command(query: dict[str, str]) -> None:
    with pytest.raises(run.RunError, match="cmd is required") as info:
        run.command(query)
    assert info.value.status == 400


def _status(**fields: object) -> bytes:
    return json.dumps({"metadata": {}, **fields}).encode()


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (_status(status="Success"), None),
        (
            _status(
                status="Failure",
                reason="NonZeroExitCode",
                message="command terminated with non-zero exit code: exit status 3",
                details={"causes": [{"reason": "ExitCode", "message": "3"}]},
            ),
            "command 'sh -c x' exited with 3: oops\n",
        ),
        (
            _status(status="Failure", reason="InternalError", message="exec: not found"),
            "exec: not found",
        ),
        (b"", "command 'sh -c x' ended without a status from the lower cluster"),
        (b"plain old message", "plain old message"),
    ],
    ids=["success", "exit-code", "failure", "no-status", "pre-v4"],
)
def test_run_failures_read_as_the_kubelet_words_them(status: bytes, message: str | None) -> None:
    assert run.failure_message(status, command="sh -c x", stderr=b"oops\n") == message


class _StatusFlood:
    """A session whose lower side sends exec status bytes without end (never a command's
    real status: that is well under 1 KiB)."""

    def __init__(self) -> None:
        self.sent = 0
        self.closed = False

    async def receive(self) -> tuple[int, bytes] | None:
        self.sent += 1
        if self.sent > 10_000:
            return None  # 640 MiB would have been kept by then
        return (run.ERROR, b"x" * 65536)

    async def send(self, channel: int, data: bytes) -> None:
        raise AssertionError("/run sends no input")

    async def close_stdin(self) -> None:
        raise AssertionError("/run sends no input")

    async def close(self) -> None:
        self.closed = True


async def test_run_bounds_the_error_channel_too() -> None:
    flood = _StatusFlood()
    options = RemoteCommand(command=("true",), stdin=False, stdout=True, stderr=True, tty=False)
    with pytest.raises(run.RunError, match=f"more than {run.STATUS_LIMIT} bytes of exec status"):
        await run.collect(flood, options=options)
    assert flood.sent == run.STATUS_LIMIT // 65536 + 1
    assert flood.closed
