"""The kubelet API of the virtual node: `kubectl logs` through the upper apiserver, and auth."""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import select
import subprocess
import time
from pathlib import Path

import pytest

from devcluster import cluster, kwok
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import kubelet_request


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], list(cluster.LOG_LINES)),
        (["--tail=2"], list(cluster.LOG_LINES[-2:])),
        (["--tail=0"], []),
        (["--previous"], list(cluster.PREVIOUS_LOG_LINES)),
        (["--since=1h", "--tail=3"], list(cluster.LOG_LINES[-3:])),
        (["--limit-bytes=20"], ["tensile log line 1", "t"]),  # 19 bytes + 1
    ],
    ids=["plain", "tail", "tail-0", "previous", "since", "limit-bytes"],
)
def test_kubectl_logs_through_the_upper_cluster(
    fleet: Fleet, namespace: str, running_pod: str, flags: list[str],
    expected: list[str],
) -> None:  # fmt: skip
    out = fleet.upper.kubectl("logs", running_pod, "-n", namespace, *flags).stdout
    assert out.splitlines() == expected


def test_kubectl_logs_with_timestamps_and_since_time(
    fleet: Fleet, namespace: str, running_pod: str
) -> None:
    out = fleet.upper.kubectl(
        "logs", running_pod, "-n", namespace, "--timestamps", "--tail=1"
    ).stdout
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z tensile log line 10\n", out)
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    recent = fleet.upper.kubectl(
        "logs", running_pod, "-n", namespace, f"--since-time={since}"
    ).stdout
    assert recent == ""  # every line of the fixed log is ten minutes old


def test_kubectl_logs_follow_streams_new_lines_and_stops(
    fleet: Fleet, namespace: str, running_pod: str
) -> None:
    proc = subprocess.Popen(
        [cluster.kubectl_binary(), f"--kubeconfig={fleet.upper.kubeconfig}",
         "logs", "-f", "--tail=1", "-n", namespace, running_pod],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    original = fleet.logs_file.read_text()
    try:
        assert proc.stdout is not None
        assert _readline(proc, timeout=20) == "tensile log line 10\n"
        fresh = f"followed line {dt.datetime.now(dt.UTC).timestamp()}"
        with fleet.logs_file.open("a") as log:
            log.write(kwok.cri_log_lines([fresh], start=dt.datetime.now(dt.UTC)))
        assert _readline(proc, timeout=20) == fresh + "\n"
        assert _lower_log_streams(fleet) >= 1
        proc.terminate()
        proc.communicate(timeout=10)
        # The client went away: the node cancels its request to the lower cluster.
        deadline = time.monotonic() + 20
        while (streams := _lower_log_streams(fleet)) > 0:
            assert time.monotonic() < deadline, f"{streams} lower log streams still open"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=10)
        fleet.logs_file.write_text(original)  # every container shares this log


def _lower_log_streams(fleet: Fleet) -> float:
    """Log requests the lower apiserver is serving now (its long-running request gauge)."""
    _, text = fleet.lower.rest().get_text("/metrics")
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("apiserver_longrunning_requests{") and 'subresource="log"' in line
    )


def _readline(proc: subprocess.Popen[str], *, timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output in {timeout}s"
    return proc.stdout.readline()


def test_missing_pods_and_containers_are_not_found(
    fleet: Fleet, namespace: str, running_pod: str
) -> None:
    result = fleet.upper.kubectl("logs", "nope", "-n", namespace, check=False)
    assert result.returncode == 1
    assert "NotFound" in result.stderr


# -- the API itself, called directly as the apiserver and others would -------------------


def _call(fleet: Fleet, node: VirtualNodeProcess, path: str, *, cert: bool = False,
          token: str | None = None) -> tuple[int, str]:  # fmt: skip
    return kubelet_request(fleet, node.kubelet_port, path, cert=cert, token=token)


def test_anonymous_callers_get_401(fleet: Fleet, virtual_node: VirtualNodeProcess) -> None:
    assert _call(fleet, virtual_node, "/pods") == (401, "Unauthorized")


def test_a_token_without_nodes_proxy_gets_403(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    fleet.upper.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = fleet.upper.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    status, body = _call(fleet, virtual_node, "/pods", token=token)
    assert status == 403
    assert f"user=system:serviceaccount:{namespace}:nobody" in body
    assert "subresource(s)=[pods proxy]" in body  # fine-grained first, as kubelets >= 1.36
    garbage = _call(fleet, virtual_node, "/pods", token="not-a-token")
    assert garbage[0] == 401


def test_anonymous_auth_lets_callers_in_as_system_anonymous_for_rbac_to_decide(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    node = VirtualNodeProcess(
        fleet, name=f"vn-anon-{secrets.token_hex(3)}", log_dir=tmp_path,
        args=["--anonymous-auth=true"],
    )  # fmt: skip
    role = f"anonymous-pods-{node.name}"
    node.start()
    try:
        status, body = _call(fleet, node, f"/containerLogs/{namespace}/web/c")
        assert status == 403
        assert "user=system:anonymous" in body
        assert "subresource(s)=[proxy]" in body
        # nodes/pods (KEP-2862) allows the pod lists, and nothing that reaches a container.
        fleet.upper.kubectl(
            "create", "clusterrole", role, "--verb=get", "--resource=nodes/pods",
            f"--resource-name={node.name}",
        )  # fmt: skip
        fleet.upper.kubectl(
            "create", "clusterrolebinding", role, f"--clusterrole={role}", "--user=system:anonymous"
        )
        status, body = _call(fleet, node, "/pods")
        assert status == 200, body
        assert json.loads(body)["kind"] == "PodList"
        assert _call(fleet, node, "/runningpods/")[0] == 200
        assert _call(fleet, node, f"/exec/{namespace}/web/c?command=id")[0] == 403
        assert _call(fleet, node, "/pods", token="not-a-token")[0] == 401  # bad is not absent
    finally:
        fleet.upper.kubectl("delete", "clusterrolebinding,clusterrole", role, check=False)
        assert node.stop() == 0
        node.delete_node()


def test_the_apiservers_client_certificate_is_allowed(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    status, body = _call(fleet, virtual_node, "/pods", cert=True)
    assert status == 200
    names = [p["metadata"]["name"] for p in json.loads(body)["items"]]
    assert names == [running_pod]
    assert _call(fleet, virtual_node, "/healthz", cert=True) == (200, "ok")


def test_bad_requests_get_kubelet_statuses(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    base = f"/containerLogs/{namespace}/{running_pod}/main"
    assert _call(fleet, virtual_node, base + "?tailLines=-1", cert=True)[0] == 400
    both = base + "?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z"
    assert _call(fleet, virtual_node, both, cert=True)[0] == 422
    assert _call(fleet, virtual_node, base + "?follow=perhaps", cert=True)[0] == 400
    # A pod of another node, a container the pod does not have, a route that does not exist.
    other = "/containerLogs/kube-system/kube-apiserver/main"
    assert _call(fleet, virtual_node, other, cert=True)[0] == 404
    assert _call(fleet, virtual_node, base.replace("/main", "/nope"), cert=True)[0] == 404
    assert _call(fleet, virtual_node, "/nowhere", cert=True)[0] == 404
    exec_path = f"/exec/{namespace}/{running_pod}/main?command=true&output=1"
    assert _call(fleet, virtual_node, exec_path, cert=True) == (
        400,
        "this endpoint needs Upgrade: SPDY/3.1 or Upgrade: websocket",
    )
    port_forward = f"/portForward/{namespace}/{running_pod}"
    assert _call(fleet, virtual_node, port_forward, cert=True)[0] == 400
    run = f"/run/{namespace}/{running_pod}/main?cmd=true"
    assert _call(fleet, virtual_node, run, cert=True)[0] == 405  # POST only
