"""Start-up recovers only from what it should, and never signals a stranger's process: the
test harness's components, and the virtual node's read of the upper cluster's identity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster import netns, ports, processes
from devcluster.cluster import FleetSettings
from devcluster.startup import Startup
from tensile.kube import errors
from tensile.kube.resources import NAMESPACES
from vnode import __main__ as main
from vnode.testing.fakeapi import FakeApi


def _startup(tmp_path: Path) -> Startup:
    startup = Startup(
        directory=tmp_path,
        settings=FleetSettings(startup_timeout=20),
        paths={},
        network=netns.HOST,
    )
    startup.logs.mkdir(parents=True)
    startup.data.mkdir(parents=True)
    return startup


def test_a_lost_port_race_restarts_that_component_on_another_port(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    attempts: list[int] = []

    def spawn(port: int) -> processes.Process:
        attempts.append(port)
        script = "echo 'listen tcp: bind: address already in use'; exit 1"
        if len(attempts) > 1:
            script = "sleep 30"
        return startup._spawn("comp", ["sh", "-c", script])

    try:
        port = startup._start_with_port_retry(
            "comp", preferred=0, spawn=spawn, ready=lambda p: len(attempts) > 1
        )
    finally:
        startup.stop_all()
    assert len(attempts) == 2
    assert port == attempts[1] != attempts[0]


def test_another_components_death_is_not_taken_for_our_lost_port(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    startup._spawn("lower", ["sh", "-c", "echo 'bind: address already in use'; exit 1"])
    upper_starts: list[int] = []

    def spawn_upper(port: int) -> processes.Process:
        upper_starts.append(port)
        return startup._spawn("upper", ["sleep", "30"])

    spawn_upper(ports.pick())
    try:
        with pytest.raises(processes.ComponentDied) as info:
            startup._wait_or_respawn(
                "upper", port=upper_starts[0], spawn=spawn_upper, ready=lambda p: False
            )
    finally:
        startup.stop_all()
    assert info.value.name == "lower"
    assert len(upper_starts) == 1
    assert not [p for p in startup.every_process if p.alive()]


def test_a_recorded_pid_that_now_names_another_process_is_left_alone() -> None:
    me = processes.ProcessRef(pid=os.getpid(), start=1)  # our pid, but not our start time
    assert not me.matches()
    processes.stop_recorded(me, timeout=0.1)  # would SIGTERM this very test if it matched
    assert not processes.recorded_alive(me)


def test_a_recorded_process_is_stopped(tmp_path: Path) -> None:
    proc = processes.Process(name="s", argv=["sleep", "30"], log=tmp_path / "s.log")
    assert processes.recorded_alive(proc.ref)
    processes.stop_recorded(proc.ref, timeout=2)
    assert not processes.recorded_alive(proc.ref)
    proc.stop()


def test_a_plain_child_is_stopped_even_though_it_leads_no_group(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    processes.stop_group(child.pid, timeout=2)
    assert child.wait(timeout=5) is not None


# -- the upper cluster's identity, read at the node's start ---------------------------------


def upper_failing(*faults: Exception) -> FakeApi:
    """An upper apiserver (a fake: these faults cannot be had on demand from a real one)
    whose reads of namespaces fail with each of `faults` in turn, then answer."""
    upper = FakeApi(name="upper")
    for fault in faults:
        upper.fail("GET", "namespaces", error=fault, times=1)
    upper.put(
        NAMESPACES,
        {"metadata": {"name": "kube-system", "uid": "0f0e0d0c-0000-4000-8000-000000000001"}},
    )
    return upper


async def test_transient_failures_of_the_cluster_identity_read_are_retried(
    slept: list[float],
) -> None:
    upper = upper_failing(
        errors.ServerError(code=500, status={"message": "etcdserver: leader changed"}),
        errors.ApiUnavailable("connection reset by peer"),
        errors.TooManyRequests(code=429, status={"message": "too many requests"}),
    )
    cluster_id = await main._upper_cluster_id(upper)
    assert cluster_id == "0f0e0d0c-0000-4000-8000-000000000001"
    assert [(r.method, r.path) for r in upper.requests] == [
        ("GET", "/api/v1/namespaces/kube-system")
    ] * 4
    assert len(slept) == 3
    assert 0.5 <= slept[0] <= 1.5  # the registration's backoff: 0.5 s doubling (+ jitter)


async def test_a_refused_cluster_identity_read_stops_the_start_saying_what_to_grant(
    slept: list[float],
) -> None:
    upper = upper_failing(errors.Forbidden(code=403, status={"message": "cannot get namespaces"}))
    with pytest.raises(errors.Forbidden) as refused:
        await main._upper_cluster_id(upper)
    assert "grant get on it" in refused.value.message
    assert "--cluster-id" in refused.value.message
    assert (len(upper.requests), slept) == (1, [])
