"""The mock provider's pure parts: the Running status it shows, its config file; and the
provider as the pod controller drives it and as the node runs it, a component (in memory: it
talks to nothing)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from vnode import provider_errors
from vnode.provider import RemoteCommand
from vnode.providers.mock import DEFAULT_CAPACITY, MockProvider, load_config, running_status

NOW = "2026-11-20T10:00:00Z"


def upper_pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "team-a", "uid": "uid-1"},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}], **spec},
        "status": {
            "phase": "Pending",
            "qosClass": "BestEffort",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastTransitionTime": "2026-11-20T09:59:59Z",
                }
            ],
        },
    }


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_pod_runs_as_a_kubelet_would_show_it() -> None:
    pod = upper_pod(initContainers=[{"name": "setup", "image": "busybox"}])
    status = running_status(pod, node_ip="192.0.2.1", now=NOW)
    assert status["phase"] == "Running"
    assert (status["hostIP"], status["podIP"]) == ("192.0.2.1", "192.0.2.1")
    assert status["startTime"] == NOW
    assert status["qosClass"] == "BestEffort"
    [main] = status["containerStatuses"]
    assert main["name"] == "main"
    assert main["image"] == "nginx:1.27"
    assert main["ready"]
    assert main["state"] == {"running": {"startedAt": NOW}}
    [setup] = status["initContainerStatuses"]
    assert setup["state"]["terminated"]["exitCode"] == 0
    conditions = by_type(status)
    assert {t: c["status"] for t, c in conditions.items()} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert conditions["PodScheduled"]["lastTransitionTime"] == "2026-11-20T09:59:59Z"


def test_an_unmet_readiness_gate_keeps_the_pod_unready() -> None:
    pod = upper_pod(readinessGates=[{"conditionType": "example.com/lb"}])
    status = running_status(pod, node_ip="192.0.2.1", now=NOW)
    assert by_type(status)["Ready"]["status"] == "False"
    assert by_type(status)["Ready"]["reason"] == "ReadinessGatesNotReady"
    pod["status"]["conditions"].append({"type": "example.com/lb", "status": "True"})
    status = running_status(pod, node_ip="192.0.2.1", now=NOW)
    assert by_type(status)["Ready"]["status"] == "True"
    assert by_type(status)["example.com/lb"]["status"] == "True", "upper conditions are kept"


def test_the_config_is_virtual_kubelets_mock_format(tmp_path: Path) -> None:
    path = tmp_path / "mock.json"
    path.write_text(json.dumps({"vn-1": {"cpu": "2", "pods": "500"}, "other": {"cpu": "9"}}))
    assert load_config(str(path), node_name="vn-1").capacity == {
        "cpu": "2",
        "memory": "100Gi",
        "pods": "500",
    }
    assert load_config("", node_name="vn-1").capacity == DEFAULT_CAPACITY


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the mock provider config"),
        ("{not json", "cannot read the mock provider config"),
        ('{"other": {}}', "has no object for node 'vn-1'"),
        ('{"vn-1": {"cpu": 2}}', "cpu must be a quantity string"),
        ('{"vn-1": {"memory": "lots"}}', "memory: "),
    ],
)
def test_a_bad_config_is_refused_with_the_reason(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "mock.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_config(str(path), node_name="vn-1")


async def test_the_provider_runs_forgets_and_adopts_pods() -> None:
    provider = MockProvider(node_ip="192.0.2.1")
    told: list[str] = []
    provider.notify_pods(told.append)
    pod = upper_pod()
    assert provider.backend_pod(pod) is None
    assert provider.pod_status(pod) is None
    assert await provider.create_pod(pod) == []
    assert told == ["team-a/web"]
    status = provider.pod_status(pod)
    assert status is not None
    assert status["phase"] == "Running"
    other_uid = {**pod, "metadata": {**pod["metadata"], "uid": "uid-2"}}
    assert provider.backend_pod(other_uid) is None, "a new pod of the same name is not it"
    assert await provider.delete_pod(other_uid, grace_period=None)
    assert provider.pod_status(pod) is not None, "deleting another UID leaves it alone"
    assert await provider.delete_pod(pod, grace_period=30)
    assert provider.backend_pod(pod) is None

    # After a restart the pod is taken back exactly as the upper cluster shows it: the
    # status to write equals the current one, so nothing is written.
    fresh = MockProvider(node_ip="192.0.2.1")
    running = {**pod, "status": status}
    await fresh.create_pod(running)
    assert fresh.pod_status(running) == status


async def test_nothing_runs_so_exec_and_port_forward_are_refused() -> None:
    provider = MockProvider(node_ip="192.0.2.1")
    pod = upper_pod()
    with pytest.raises(provider_errors.PodNotFound):
        [c async for c in provider.container_logs(pod, container="main", options={})]
    await provider.create_pod(pod)
    assert [c async for c in provider.container_logs(pod, container="main", options={})] == []
    command = RemoteCommand(command=("ls",), stdin=False, stdout=True, stderr=True, tty=False)
    with pytest.raises(provider_errors.ProviderError, match="runs no containers"):
        await provider.open_exec(pod, container="main", options=command, attach=False)
    with pytest.raises(provider_errors.ProviderError, match="nothing listens on port 80"):
        await provider.open_port_forward(pod, port=80)
    usage = await provider.resource_usage()
    assert (usage.pods, usage.node, usage.complete) == ((), None, True)
    assert provider.capacity() == DEFAULT_CAPACITY


async def test_the_mock_is_a_component_the_node_runs() -> None:
    provider = MockProvider(node_ip="192.0.2.1")
    assert not provider.ready(), "not ready before the node started it"
    assert list(provider.informers()) == []
    assert list(provider.components()) == [], "no mirrors: nothing is copied anywhere"
    await provider.start()
    assert provider.ready()
    async with asyncio.TaskGroup() as group:
        running = group.create_task(provider.run(), name="mock-provider")
        await asyncio.sleep(0)
        assert not running.done(), "runs until shut down"
        await provider.shut_down()
    assert running.done()
