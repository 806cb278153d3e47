"""Leader election (tensile.kube.leaderelection) against a real kube-apiserver: two electors
in this process, each with a client of its own, compete for one Lease.

What is checked is what a program built on it relies on: at most one elector runs its work
at any time; a stopped leader releases the Lease and the other takes over at once; a
crashed one (no release) is replaced after the lease duration, not before; the Lease reads
as client-go writes it; a client fenced by an elector cut off from its apiserver writes
nothing (to another cluster) from its renew deadline on, before the other one leads. A
leader whose apiserver goes away and comes back is the descheduler's test
(tests/e2e/test_descheduler.py, on its fleet rather than one of its own here); late answers
and shutdowns at awkward moments are tests/unit/test_leader_election.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import REGISTRY

from devcluster.fleet import Fleet
from devcluster.tcpproxy import FreezableProxy
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.kube.leaderelection import LeaderElectionSettings, LeaderElector
from tensile.kube.resources import LEASES

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 4.0, 0.5
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


class Candidate:
    """An elector whose work marks when it leads; `overlaps` counts works running at once."""

    running: set[str]
    overlaps: int

    def __init__(
        self,
        fleet: Fleet,
        *,
        identity: str,
        namespace: str,
        lease: str,
        release: bool = True,
        server: str | None = None,
    ):
        self.identity = identity
        info = config.load(str(fleet.upper.kubeconfig))
        if server is not None:  # e.g. through a proxy the test freezes
            info = dataclasses.replace(info, server=server)
        self.client = ApiClient(info, name=identity)
        self.elector = LeaderElector(
            self.client,
            settings=LeaderElectionSettings(
                namespace=namespace,
                name=lease,
                identity=identity,
                lease_duration=LEASE_DURATION,
                renew_deadline=RENEW_DEADLINE,
                retry_period=RETRY_PERIOD,
                release_on_cancel=release,
            ),
        )
        self.leading = asyncio.Event()
        self.stopped = asyncio.Event()
        self.terms = 0
        self.stopped_leading_at: float | None = None
        self.leading_at: float | None = None
        self.task: asyncio.Task[None] | None = None

    async def work(self) -> None:
        self.leading_at = time.monotonic()
        self.terms += 1
        Candidate.running.add(self.identity)
        if len(Candidate.running) > 1:
            Candidate.overlaps += 1
        self.stopped.clear()
        self.leading.set()
        try:
            await asyncio.Event().wait()
        finally:
            Candidate.running.discard(self.identity)
            self.leading.clear()
            self.stopped.set()
            self.stopped_leading_at = time.monotonic()

    async def start(self) -> None:
        await self.client.__aenter__()
        self.task = asyncio.create_task(
            self.elector.run(self.work), name=f"elector-{self.identity}"
        )

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        await self.client.close()


@pytest.fixture
async def candidates(fleet: Fleet, namespace: str) -> AsyncIterator[Callable[..., Candidate]]:
    Candidate.running, Candidate.overlaps = set(), 0
    made: list[Candidate] = []
    lease = f"lease-{secrets.token_hex(3)}"

    def make(
        identity: str, *, release: bool = True, on: Fleet = fleet, server: str | None = None
    ) -> Candidate:
        candidate = Candidate(
            on, identity=identity, namespace=namespace, lease=lease, release=release, server=server
        )
        made.append(candidate)
        return candidate

    try:
        yield make
    finally:
        for candidate in made:
            await candidate.stop()
    assert Candidate.overlaps == 0, "two electors ran their work at the same time"


async def _lease(candidate: Candidate) -> dict[str, object]:
    settings = candidate.elector._settings
    lease = await candidate.client.request(
        "GET", LEASES.path(namespace=settings.namespace, name=settings.name)
    )
    spec = lease["spec"]
    assert isinstance(spec, dict)
    return spec


async def _wait(event: asyncio.Event, timeout: float) -> float:
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        await event.wait()
    return time.monotonic() - started


async def test_one_of_two_leads_and_a_stopped_leader_hands_over_at_once(
    candidates: Callable[..., Candidate],
) -> None:
    a, b = candidates("replica-a"), candidates("replica-b")
    # Both race for a Lease that does not exist yet: exactly one creates it.
    await asyncio.gather(a.start(), b.start())
    done, _ = await asyncio.wait(
        [asyncio.create_task(a.leading.wait()), asyncio.create_task(b.leading.wait())],
        timeout=10,
        return_when=asyncio.FIRST_COMPLETED,
    )
    assert done, "nobody acquired the Lease"
    leader, follower = (a, b) if a.leading.is_set() else (b, a)
    # The follower stays out for longer than a lease duration: the leader keeps renewing.
    await asyncio.sleep(LEASE_DURATION + 2 * RETRY_PERIOD)
    assert leader.leading.is_set()
    assert not follower.leading.is_set()
    spec = await _lease(leader)
    assert spec["holderIdentity"] == leader.identity
    assert spec["leaseDurationSeconds"] == 6
    assert MICRO_TIME.fullmatch(str(spec["renewTime"]))
    assert MICRO_TIME.fullmatch(str(spec["acquireTime"]))
    transitions = int(spec.get("leaseTransitions") or 0)  # type: ignore[call-overload]
    acquired = spec["acquireTime"]
    assert leader.elector.is_leader()
    assert not follower.elector.is_leader()

    # SIGTERM-like stop: the Lease is released and taken over at the follower's next try,
    # well within one lease duration.
    stopped = time.monotonic()
    await leader.stop()
    assert leader.stopped_leading_at is not None
    assert leader.stopped_leading_at - stopped < 2
    took = await _wait(follower.leading, timeout=LEASE_DURATION)
    assert took < 2 * RETRY_PERIOD * 2.2 + 1
    spec = await _lease(follower)
    assert spec["holderIdentity"] == follower.identity
    # Released (transitions kept), then acquired by another holder (+1).
    assert spec["leaseTransitions"] == transitions + 1
    assert spec["acquireTime"] != acquired


async def test_a_crashed_leader_is_replaced_after_the_lease_duration_not_before(
    candidates: Callable[..., Candidate],
) -> None:
    a = candidates("replica-a", release=False)
    await a.start()
    await _wait(a.leading, timeout=10)
    b = candidates("replica-b")
    await b.start()
    await asyncio.sleep(2 * RETRY_PERIOD)
    transitions = int((await _lease(b)).get("leaseTransitions") or 0)  # type: ignore[call-overload]
    # A crash: the work and the renewals stop, nothing is released.
    killed = time.monotonic()
    await a.stop()
    took = await _wait(b.leading, timeout=LEASE_DURATION + 10)
    # A renewed at most one retry period before it died; B waits a whole lease duration
    # from the last change it saw, and retries every period (with client-go's jitter).
    assert took >= LEASE_DURATION - RETRY_PERIOD - 0.5
    assert took <= LEASE_DURATION + RETRY_PERIOD * 2.2 + 3
    assert time.monotonic() - killed >= took
    spec = await _lease(b)
    assert spec["holderIdentity"] == "replica-b"
    assert spec["leaseTransitions"] == transitions + 1


async def test_a_fenced_client_writes_nothing_from_the_renew_deadline_on(
    fleet: Fleet, namespace: str, candidates: Callable[..., Candidate]
) -> None:
    """Replica A reaches the upper apiserver through a proxy the test freezes; a writer of
    A's keeps creating ConfigMaps in the LOWER cluster through a client fenced by A's
    elector (`ApiClient.fenced`), whatever A's election says: it stands for a task the
    cancellation has not reached, or an event loop that stalled. B competes directly.
    Once A is cut off, its writes go out until its renew deadline and are refused from
    then on, which is before B leads: no write of A's is sent while B leads, the writer
    did try (refused, counted), and the lower cluster holds exactly the writes A's client
    said it sent."""
    with FreezableProxy(fleet.upper.server) as proxy:
        a = candidates("replica-a", server=proxy.url)
        await a.start()
        await _wait(a.leading, timeout=10)
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        sent: list[tuple[float, str]] = []
        refused: list[float] = []
        before = REGISTRY.get_sample_value(
            "tensile_api_fenced_writes_total", {"cluster": "lower-of-a", "verb": "POST"}
        )

        async def write(lower: ApiClient) -> None:
            for i in itertools.count():
                at = time.monotonic()
                try:
                    await lower.request("POST", path, body={"metadata": {"name": f"from-a-{i}"}})
                    sent.append((at, f"from-a-{i}"))
                except errors.Fenced:
                    refused.append(at)
                await asyncio.sleep(0.1)

        info = config.load(str(fleet.lower.kubeconfig))
        async with ApiClient(info, name="lower-of-a") as lower:
            writer = asyncio.create_task(write(lower.fenced(a.elector)), name="writer-of-a")
            try:
                await asyncio.sleep(1.0)
                assert sent, "A wrote nothing while leading"
                proxy.freeze()
                frozen = time.monotonic()
                b = candidates("replica-b")
                await b.start()
                await _wait(b.leading, timeout=LEASE_DURATION + 10)
                await asyncio.sleep(1.0)
            finally:
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
        assert b.leading_at is not None
        print(
            f"A: {len(sent)} writes sent, the last {sent[-1][0] - frozen:.2f} s after the cut; "
            f"refused from {refused[0] - frozen:.2f} s; B led {b.leading_at - frozen:.2f} s "
            "after the cut"
        )
        # Sent until the renew deadline (counted from A's last renewal, at most a retry
        # before the cut), refused from it on; B led only after that.
        assert refused, "A's writer never tried past its deadline"
        assert sent[-1][0] < refused[0] < b.leading_at
        assert all(at < refused[0] for at, _ in sent)
        assert refused[0] - frozen <= RENEW_DEADLINE + 0.5
        after = REGISTRY.get_sample_value(
            "tensile_api_fenced_writes_total", {"cluster": "lower-of-a", "verb": "POST"}
        )
        assert (after or 0.0) - (before or 0.0) == len(refused)
        # What the lower cluster has is what A's client said it sent, nothing more.
        found = await _names_below(fleet, path)
        assert found == {name for _, name in sent}
        proxy.thaw()


async def _names_below(fleet: Fleet, path: str) -> set[str]:
    async with ApiClient(config.load(str(fleet.lower.kubeconfig)), name="check") as lower:
        listed = await lower.request("GET", path)
    return {
        str(item["metadata"]["name"])
        for item in listed.get("items") or []
        if str(item["metadata"]["name"]).startswith("from-a-")
    }
