"""Leader election's timing and task handling against a scripted Lease API and a clock moved
by hand.

Fakes on purpose: what is checked here is what happens when an answer of the apiserver
arrives late (a renewal answered seconds after it was stored) or a shutdown arrives at one
precise moment, which a real apiserver cannot be made to produce on demand. The election
against a real kube-apiserver (two electors, a crash, a release, an apiserver restart) is
tests/e2e/test_leader_election.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.leaderelection import LeaderElectionSettings, LeaderElector, LeaseLost
from tensile.kube.reflector import Event
from tensile.kube.resources import CONFIG_MAPS
from vnode.testing.fakeapi import FakeApi

LEASE_DURATION, RENEW_DEADLINE = 15.0, 10.0
Started = tuple["asyncio.Task[None]", LeaderElector]


class Clock:
    """Seconds, moved by hand (the elector's monotonic clock)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _status(code: int, reason: str) -> errors.ApiError:
    return errors.from_response(
        code=code, body=f'{{"kind":"Status","code":{code},"reason":"{reason}"}}'
    )


class LeaseApi:
    """One Lease, absent at first (the elector creates it). Renewals (PUTs) succeed
    `renewals_answered` times, each answered `delay` seconds (on `clock`) after it was
    stored; later ones fail with 500. `competing` is set when the elector reads the Lease
    again after acquiring it (it lost it and competes anew)."""

    def __init__(self, clock: Clock, *, renewals_answered: int = 1, delay: float = 0.0) -> None:
        self.clock = clock
        self.delay = delay
        self.renewals_answered = renewals_answered
        self.lease: dict[str, Any] | None = None
        self.renewals = 0
        self.renewed = asyncio.Event()
        self.competing = asyncio.Event()

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        await asyncio.sleep(0)
        if method == "GET":
            if self.lease is None:
                raise _status(404, "NotFound")
            self.competing.set()
            return self.lease
        if method == "POST":
            self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
            return self.lease
        assert method == "PUT", (method, path)
        self.renewals += 1
        if self.renewals > self.renewals_answered:
            raise _status(500, "InternalError")
        version = str(self.renewals + 1)
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
        self.clock.now += self.delay  # stored now, answered this much later
        self.renewed.set()
        return self.lease


class Work:
    """The leader's work: marks when it runs and when it is stopped; its clean-up takes
    until `finish` is set."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.stopping = asyncio.Event()
        self.finish = asyncio.Event()
        self.finish.set()

    async def __call__(self) -> None:
        self.running.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.stopping.set()
            await self.finish.wait()


def elector(
    api: LeaseApi,
    clock: Clock,
    *,
    lease_duration: float = LEASE_DURATION,
    renew_deadline: float = RENEW_DEADLINE,
) -> LeaderElector:
    """An elector of Lease ns/lease on `api` and `clock`, retrying every 10 ms (real time)."""
    return LeaderElector(
        cast(ApiClient, api),
        settings=LeaderElectionSettings(
            namespace="ns",
            name="lease",
            identity="me",
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=0.01,
        ),
        clock=clock,
    )


@pytest.fixture
async def elect() -> AsyncIterator[Callable[[LeaseApi, Clock, Work], Started]]:
    """Start `LeaderElector.run(work)` in a task; cancelled and awaited after the test."""
    started: list[asyncio.Task[None]] = []

    def start(api: LeaseApi, clock: Clock, work: Work) -> Started:
        candidate = elector(api, clock)
        task = asyncio.create_task(candidate.run(work), name="elector")
        started.append(task)
        return task, candidate

    try:
        yield start
    finally:
        for task in started:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                async with asyncio.timeout(5):
                    await task


async def test_a_late_answer_to_a_renewal_does_not_stretch_the_leadership(
    elect: Callable[[LeaseApi, Clock, Work], Started],
) -> None:
    """The renew deadline counts from when the renewal was sent: the apiserver may have
    stored it at once, and another replica may take over lease_duration after that, however
    late the answer reached the leader."""
    clock = Clock()
    api = LeaseApi(clock, delay=LEASE_DURATION - RENEW_DEADLINE + 1.0)
    work = Work()
    task, elector = elect(api, clock, work)
    async with asyncio.timeout(5):
        await work.running.wait()
        sent = clock.now  # the renewal goes out without the clock moving
        await api.renewed.wait()
    assert elector.is_leader()
    # Stored at `sent`: from sent + lease_duration another replica may lead, so this one
    # must have stopped by sent + renew_deadline.
    clock.now = sent + RENEW_DEADLINE + 0.5
    assert not elector.is_leader()
    async with asyncio.timeout(5):
        await work.stopping.wait()
        await api.competing.wait()
    assert not task.done()


async def test_a_shutdown_while_the_work_is_being_stopped_is_not_lost(
    elect: Callable[[LeaseApi, Clock, Work], Started],
) -> None:
    """The Lease is lost, the work is being cancelled and takes a moment to clean up, and
    the program is told to stop just then: the elector stops too (once the work has), and
    does not go back to competing with its work left behind."""
    clock = Clock()
    api = LeaseApi(clock, renewals_answered=0)
    work = Work()
    work.finish.clear()
    task, _ = elect(api, clock, work)
    async with asyncio.timeout(5):
        await work.running.wait()
    clock.now += RENEW_DEADLINE  # renewals fail (500) past the deadline: the Lease is lost
    async with asyncio.timeout(5):
        await work.stopping.wait()
    task.cancel()
    await asyncio.sleep(0.05)
    work.finish.set()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert not api.competing.is_set()


@pytest.mark.parametrize("duration", [6.0, 10.4, 10.5, 12.9])
async def test_the_lease_never_tells_others_a_shorter_duration_than_it_is_held_for(
    duration: float,
) -> None:
    """leaseDurationSeconds is whole seconds: a fractional --leader-elect-lease-duration is
    rounded up, never down (written 10 for 10.4 s, others could take over while this
    replica still acts, up to a renew deadline of 10.2 s)."""
    clock = Clock()
    api = LeaseApi(clock)
    written: list[object] = []

    async def work() -> None:
        assert api.lease is not None
        written.append(api.lease["spec"]["leaseDurationSeconds"])

    async with asyncio.timeout(5):
        await elector(api, clock, lease_duration=duration, renew_deadline=duration - 0.2).run(work)
    [seconds] = written
    assert isinstance(seconds, int)
    assert duration <= seconds < duration + 1


async def test_without_competing_again_a_lost_lease_is_raised_once_the_work_stopped() -> None:
    """`compete_again=False` (the virtual node's replicas): the work is cancelled as ever,
    then LeaseLost is raised instead of competing anew with what the work left in memory."""
    clock = Clock()
    api = LeaseApi(clock, renewals_answered=0)
    work = Work()
    task = asyncio.create_task(elector(api, clock).run(work, compete_again=False))
    async with asyncio.timeout(5):
        await work.running.wait()
    clock.now += RENEW_DEADLINE  # renewals fail (500) past the deadline: the Lease is lost
    with pytest.raises(LeaseLost, match="lease ns/lease lost by me"):
        async with asyncio.timeout(5):
            await task
    assert work.stopping.is_set()
    assert not api.competing.is_set()


def _held_lease(*, holder: str, duration: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "lease", "namespace": "ns", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": "2026-01-01T00:00:00.000000Z",
            "leaseTransitions": 3,
        },
    }


def _slow_retrying(api: LeaseApi) -> LeaderElector:
    """An elector on the real monotonic clock that retries only every 3 to 6.6 s."""
    return LeaderElector(
        cast(ApiClient, api),
        settings=LeaderElectionSettings(
            namespace="ns", name="lease", identity="me", renew_deadline=10.0, retry_period=3.0
        ),
    )


async def test_a_standby_tries_again_when_the_lease_expires_not_at_the_retry_after() -> None:
    api = LeaseApi(Clock(), renewals_answered=5)
    api.lease = _held_lease(holder="other", duration=1)
    candidate = _slow_retrying(api)
    work = Work()
    started = asyncio.get_running_loop().time()
    task = asyncio.create_task(candidate.run(work))
    try:
        async with asyncio.timeout(2.5):  # a retry would come after 3 s at the earliest
            await work.running.wait()
        took = asyncio.get_running_loop().time() - started
        assert 1.0 <= took < 2.5
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_watched_release_is_competed_for_at_once() -> None:
    api = LeaseApi(Clock(), renewals_answered=5)
    api.lease = _held_lease(holder="other", duration=15)
    candidate = _slow_retrying(api)
    informer = candidate.lease_informer(cast(ApiClient, api))
    work = Work()
    task = asyncio.create_task(candidate.run(work))
    try:
        await asyncio.sleep(0.1)  # it read the Lease held, and waits
        assert not work.running.is_set()
        released = _held_lease(holder="", duration=1)
        api.lease = released
        informer._dispatch(Event(type="MODIFIED", obj=released))  # as its watch would
        async with asyncio.timeout(1.0):
            await work.running.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_writes_fenced_by_the_elector_stop_at_the_renew_deadline_while_the_work_runs(
    elect: Callable[[LeaseApi, Clock, Work], Started],
) -> None:
    """A client fenced by the elector (`ApiClient.fenced`) sends a write only while the last
    renewal was sent less than the renew deadline ago, on the elector's clock: here the
    clock jumps past it (a stalled event loop, a renewal stuck in the network) while the
    work still runs, not yet cancelled, and tries to write below. The write is refused
    before it is sent (the fake below records nothing) and counted; reads still go.

    A fake below on purpose: the moment between the deadline and the work's cancellation
    cannot be hit on demand with real processes; tests/e2e/test_leader_election.py shows the
    fence against real apiservers."""
    clock = Clock()
    api = LeaseApi(clock, renewals_answered=1000)
    work = Work()
    _task, candidate = elect(api, clock, work)
    async with asyncio.timeout(5):
        await work.running.wait()
    below = FakeApi(name="fenced-below")
    fenced = below.fenced(candidate)
    path = CONFIG_MAPS.path(namespace="ns")
    await fenced.request("POST", path, body={"metadata": {"name": "while-leading"}})
    assert candidate.may_write()

    clock.now += RENEW_DEADLINE  # no renewal sent for the whole renew deadline
    assert not work.stopping.is_set()  # the work has not been told yet
    refused = REGISTRY.get_sample_value(
        "tensile_api_fenced_writes_total", {"cluster": "fenced-below", "verb": "DELETE"}
    )
    with pytest.raises(errors.Fenced, match="past the renew deadline") as info:
        await fenced.request("DELETE", CONFIG_MAPS.path(namespace="ns", name="while-leading"))
    assert isinstance(info.value, errors.ApiUnavailable)  # every caller's "not now"
    assert below.requests_of("DELETE") == []
    assert below.get(CONFIG_MAPS, "while-leading", namespace="ns") is not None
    assert (
        REGISTRY.get_sample_value(
            "tensile_api_fenced_writes_total", {"cluster": "fenced-below", "verb": "DELETE"}
        )
        == (refused or 0.0) + 1
    )
    listed = await fenced.request("GET", path)  # reads are never fenced
    assert [i["metadata"]["name"] for i in listed["items"]] == ["while-leading"]
    async with asyncio.timeout(5):
        await work.stopping.wait()
    with pytest.raises(errors.Fenced, match="does not hold the lease ns/lease"):
        await fenced.request("POST", path, body={"metadata": {"name": "after"}})
    # The same client unfenced (every replica's own writes, e.g. its serving certificate's
    # CSR) is not held back.
    assert below.fenced(None) is below
    await below.request("POST", path, body={"metadata": {"name": "unfenced"}})
