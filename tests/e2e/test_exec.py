"""`kubectl exec` through the upper cluster: the apiserver speaks SPDY/3.1 to the virtual node,
which bridges to the lower pod. Each test runs as kubectl does by default (WebSocket to the
apiserver, translated to SPDY) and with KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false (SPDY end to end).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from devcluster.cluster import kubectl_binary
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess

MODES = pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket", "spdy"])


def _exec(
    fleet: Fleet, namespace: str, websockets: str, *args: str, input: str | None = None
) -> tuple[int, str, str]:
    result = fleet.upper.kubectl(
        "exec",
        *args,
        check=False,
        input=input,
        timeout=60,
        env={**os.environ, "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets},
    )
    return result.returncode, result.stdout, result.stderr


@MODES
def test_exec_returns_output_and_the_exit_code(
    fleet: Fleet, namespace: str, running_pod: str, websockets: str
) -> None:
    code, out, err = _exec(
        fleet,
        namespace,
        websockets,
        "-n",
        namespace,
        running_pod,
        "--",
        "sh",
        "-c",
        "echo hello; echo oops >&2; exit 3",
    )
    assert code == 3
    assert out == "hello\n"
    assert err.startswith("oops\n")


@MODES
def test_exec_success_exits_0(
    fleet: Fleet, namespace: str, running_pod: str, websockets: str
) -> None:
    code, out, _ = _exec(
        fleet, namespace, websockets, "-n", namespace, running_pod, "--", "echo", "fine"
    )
    assert (code, out) == (0, "fine\n")


@MODES
def test_exec_stdin_is_piped_and_its_end_reaches_the_command(
    fleet: Fleet, namespace: str, running_pod: str, websockets: str
) -> None:
    code, out, _ = _exec(
        fleet,
        namespace,
        websockets,
        "-i",
        "-n",
        namespace,
        running_pod,
        "--",
        "sh",
        "-c",
        "wc -c; echo done",
        input="x" * 100_000,
    )
    assert (code, out.split()) == (0, ["100000", "done"])


@MODES
def test_a_large_output_arrives_whole(
    fleet: Fleet, namespace: str, running_pod: str, websockets: str
) -> None:
    code, out, err = _exec(
        fleet,
        namespace,
        websockets,
        "-n",
        namespace,
        running_pod,
        "--",
        "sh",
        "-c",
        "head -c 3000000 /dev/zero | tr '\\0' 'a'",
    )
    assert code == 0, f"kubectl exec exited {code} after {len(out)} bytes: {err}"
    assert out == "a" * 3_000_000


def test_a_missing_command_is_a_clear_error(fleet: Fleet, namespace: str, running_pod: str) -> None:
    code, _, err = _exec(
        fleet, namespace, "true", "-n", namespace, running_pod, "--", "no-such-command-here"
    )
    assert code != 0
    assert "no-such-command-here" in err


@MODES
def test_kubectl_cp_both_ways(
    fleet: Fleet, namespace: str, running_pod: str, tmp_path: Path, websockets: str
) -> None:
    # kwok runs the pod's commands in the fleet's scratch directory: relative paths land there.
    name = f"cp-{namespace}-{websockets}"
    env = {**os.environ, "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets}
    content = os.urandom(300_000)  # binary, and larger than any one frame
    (tmp_path / "up.bin").write_bytes(content)
    fleet.upper.kubectl(
        "cp", str(tmp_path / "up.bin"), f"{namespace}/{running_pod}:{name}-up", env=env
    )
    assert (fleet.exec_dir / f"{name}-up").read_bytes() == content
    (fleet.exec_dir / f"{name}-down").write_text("from the pod\n")
    fleet.upper.kubectl(
        "cp", f"{namespace}/{running_pod}:{name}-down", str(tmp_path / "down.txt"), env=env
    )
    assert (tmp_path / "down.txt").read_text() == "from the pod\n"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_reader_that_stalls_does_not_grow_the_nodes_memory(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str, running_pod: str
) -> None:
    # 200 MB of output while kubectl's stdout is not read: every hop must hold back, so the
    # node keeps a bounded amount in flight rather than buffering what kubectl has not taken.
    size = 200_000_000
    assert virtual_node.process is not None
    pid = virtual_node.process.pid
    before = _rss_mib(pid)
    proc = subprocess.Popen(
        [kubectl_binary(), f"--kubeconfig={fleet.upper.kubeconfig}", "exec", "-n",
         namespace, running_pod, "--", "sh", "-c", f"head -c {size} /dev/zero"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(8)  # the pipe, kubectl and both apiservers fill up; then the node must wait
        stalled = _rss_mib(pid)
        assert proc.stdout is not None
        received = 0
        while chunk := proc.stdout.read(1 << 20):
            received += len(chunk)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert received == size
    assert stalled - before < 64, f"node RSS grew {stalled - before:.0f} MiB while stalled"
