"""Port choice and child-process handling of the harness."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from devcluster import ports, processes


def test_an_occupied_preferred_port_gives_another(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind((ports.LOOPBACK, 0))
        s.listen()
        busy = s.getsockname()[1]
        chosen = ports.pick(busy)
        assert chosen != busy
        assert ports.is_free(chosen)
    assert f"port {busy} on 127.0.0.1 is in use" in caplog.text


def test_a_free_preferred_port_is_used_and_never_handed_out_twice() -> None:
    free = ports.pick()
    taken: set[int] = set()
    assert ports.pick(free, taken=taken) == free
    assert ports.pick(free, taken=taken) != free
    assert len(taken) == 2


@pytest.mark.parametrize(
    ("kernel_range", "ephemeral"),
    [
        ("32768\t60999\n", range(32768, 61000)),  # Linux's default
        ("25000\t60999\n", range(25000, 61000)),  # lower than the default
        ("15000\t29999\n", range(15000, 30000)),  # covering all of ports.CHOSEN
    ],
)
def test_chosen_ports_are_outside_the_kernels_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_range: str, ephemeral: range
) -> None:
    """An outgoing connection's local port comes from the ephemeral range, and can take a
    port chosen for a program between the choice and its bind (the chart's webhook once
    failed to listen that way): no port handed out lies in it, whatever the kernel's range,
    nor in the NodePort range or among the ports Kubernetes programs listen on."""
    path = tmp_path / "ip_local_port_range"
    path.write_text(kernel_range)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)
    chosen = [ports.pick() for _ in range(50)]
    assert not [p for p in chosen if p in ephemeral or p in ports.NODE_PORTS]
    assert not [p for p in chosen if p in ports.KUBE_PORTS]


def test_a_process_hands_no_port_out_twice_before_going_round_the_range() -> None:
    """Ports are chosen before they are bound (a fleet picks dozens, then starts its
    programs): chosen at random each time, two of 300 would share a port almost surely
    (a virtual node of the fleet benchmark once found its metrics port taken)."""
    chosen = [ports.pick() for _ in range(300)]
    assert len(set(chosen)) == len(chosen)


def test_a_host_whose_ephemeral_range_covers_every_port_gets_a_kernel_port_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)
    assert ports.is_free(ports.pick())
    assert "outside the ephemeral range" in caplog.text


def test_a_dead_component_is_reported_with_its_log_tail(tmp_path: Path) -> None:
    proc = processes.Process(
        name="doomed", argv=["sh", "-c", "echo starting; echo 'fatal: no etcd'; exit 7"],
        log=tmp_path / "doomed.log",
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(processes.ComponentDied) as info:
        proc.check()
    assert "doomed exited with code 7" in str(info.value)
    assert "fatal: no etcd" in str(info.value)


def test_stop_takes_the_whole_process_group(tmp_path: Path) -> None:
    # The child starts a grandchild that ignores SIGTERM: stop must still end both.
    ready = tmp_path / "ready"
    script = (
        "import subprocess, time\n"
        f"subprocess.Popen(['sh', '-c', 'trap \"\" TERM; touch {ready}; sleep 60'])\n"
        "time.sleep(60)\n"
    )
    proc = processes.Process(
        name="tree", argv=[sys.executable, "-c", script], log=tmp_path / "t.log"
    )
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready.exists()
    assert processes.group_alive(proc.pid)
    proc.stop(timeout=0.5)
    assert not processes.group_alive(proc.pid)
    assert proc.pid not in processes.children_of(os.getpid())
