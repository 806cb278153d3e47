"""Replicas, one leader (`tensile.serving.leadership`): what a standby runs, what a takeover
hands to the handlers, and how a leader stops, and which of the node's components lead.

Fakes on purpose: the elector is scripted (the test says when the Lease is acquired or
lost, which a real apiserver cannot be made to do at one precise moment) and the
components record what is called; informers are real, their stores filled by the test.
The election against a real apiserver is tests/e2e/test_leader_election.py, the node's
replicas on the real fleet tests/e2e/test_replicas.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

import pytest

from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.leaderelection import LeaderElectionSettings, LeaderElector, LeaseLost
from tensile.kube.reflector import Event
from tensile.kube.resources import PODS
from tensile.serving.leadership import Leadership
from tensile.serving.lifecycle import Runner
from vnode.node import IN_EVERY_REPLICA, UpperClients, VirtualNode
from vnode.providers.mock import MockProvider
from vnode.settings import Settings
from vnode.testing.fakeapi import FakeApi


def _pod(name: str) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"}}


class ScriptedElector:
    """Stands for a LeaderElector: leads once `acquire()` is called, loses on `lose()`."""

    def __init__(self) -> None:
        self._acquired = asyncio.Event()
        self._lost = asyncio.Event()
        self.released = False
        self.compete_again: bool | None = None

    def acquire(self) -> None:
        self._acquired.set()

    def lose(self) -> None:
        self._lost.set()

    def lease_informer(self, client: FakeApi) -> Informer:
        return _informer("lease")

    async def run(self, work: Callable[[], Awaitable[None]], *, compete_again: bool) -> None:
        self.compete_again = compete_again
        await self._acquired.wait()
        worker = asyncio.create_task(work(), name="work")
        lost = asyncio.create_task(self._lost.wait(), name="lost")
        await asyncio.wait([worker, lost], return_when=asyncio.FIRST_COMPLETED)
        if lost.done():
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            raise LeaseLost("lease ns/lease lost by me: taken over")
        lost.cancel()
        await worker
        self.released = True  # the real elector releases when the work returns


class Recorder:
    """A leading component: records its calls; its informer's handlers record events."""

    def __init__(self, name: str, log: list[str], informer: Informer) -> None:
        self.name = name
        self.log = log
        self.informer = informer
        self._shut = asyncio.Event()
        informer.add_handlers(
            Handlers(
                on_add=lambda o: log.append(f"{name} add {o['metadata']['name']}"),
                on_delete=lambda o: log.append(f"{name} delete {o['metadata']['name']}"),
            )
        )

    def informers(self) -> Sequence[Informer]:
        return [self.informer]

    async def start(self) -> None:
        self.log.append(f"start {self.name}")

    def ready(self) -> bool:
        return True

    async def run(self) -> None:
        self.log.append(f"run {self.name}")
        await self._shut.wait()
        self.log.append(f"done {self.name}")

    async def shut_down(self) -> None:
        self.log.append(f"shut down {self.name}")
        self._shut.set()


class FilledInformer(Informer):
    """An informer whose store the test fills (FakeApi serves no watches): `run` only
    waits, as a watch with nothing to say."""

    async def run(self) -> None:
        await asyncio.Event().wait()


def _informer(name: str) -> Informer:
    informer = FilledInformer(FakeApi(), PODS, name=name)
    informer._synced.set()
    return informer


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - the fakes' log has no event to wait on
            await asyncio.sleep(0.01)


@pytest.fixture
def log() -> list[str]:
    return []


async def test_a_standby_starts_its_components_keeps_caches_and_tells_no_handler(
    log: list[str],
) -> None:
    pods = _informer("pods")
    elector = ScriptedElector()
    leadership = Leadership(
        elector=cast(LeaderElector, elector), watch=FakeApi(), leading=[Recorder("pods", log, pods)]
    )
    await leadership.start()
    task = asyncio.create_task(leadership.run())
    pods.store.upsert(_pod("a"))
    pods._dispatch(Event(type="ADDED", obj=_pod("a")))
    await asyncio.sleep(0.05)
    assert log == ["start pods"]  # started, not run, and no handler told
    assert leadership.ready()  # a warm standby is ready (a PDB counts it)
    assert not leadership.leading.is_set()
    assert elector.compete_again is False  # a lost Lease ends the process

    # The program stops while standing by: nothing ran, nothing to release.
    await leadership.shut_down()
    async with asyncio.timeout(5):
        await task
    assert log == ["start pods", "shut down pods"]
    assert not elector.released


async def test_a_takeover_tells_the_handlers_of_every_cached_object_then_runs_in_order(
    log: list[str],
) -> None:
    pods, copies = _informer("pods"), _informer("copies")
    elector = ScriptedElector()
    leadership = Leadership(
        elector=cast(LeaderElector, elector),
        watch=FakeApi(),
        leading=[Recorder("pods", log, pods), Recorder("copies", log, copies)],
    )
    await leadership.start()
    task = asyncio.create_task(leadership.run())
    for name in ("a", "b"):
        pods.store.upsert(_pod(name))
    pods._dispatch(Event(type="ADDED", obj=_pod("b")))
    gone = _pod("c")
    pods._dispatch(Event(type="DELETED", obj=gone))
    copies.store.upsert(_pod("x"))
    log.clear()

    elector.acquire()
    await _until(lambda: len(log) == 5)
    # Each cached object once, as a fresh process's first list; a deletion seen while
    # standing by is not replayed (the leading components find what is left over as a
    # fresh process does); then every component runs.
    assert log == ["pods add a", "pods add b", "copies add x", "run pods", "run copies"]
    assert leadership.leading.is_set()

    # After the takeover, events reach the handlers directly.
    pods._dispatch(Event(type="DELETED", obj=_pod("a")))
    assert log[-1] == "pods delete a"

    # A leader that stops lets its components finish, then releases the Lease.
    await leadership.shut_down()
    async with asyncio.timeout(5):
        await task
    assert log[-4:-2] == ["shut down copies", "shut down pods"]  # reverse order
    assert sorted(log[-2:]) == ["done copies", "done pods"]
    assert elector.released


async def test_a_lost_lease_stops_the_leading_components_and_ends_the_run(
    log: list[str],
) -> None:
    elector = ScriptedElector()
    leadership = Leadership(
        elector=cast(LeaderElector, elector),
        watch=FakeApi(),
        leading=[Recorder("pods", log, _informer("pods"))],
    )
    await leadership.start()
    task = asyncio.create_task(leadership.run())
    elector.acquire()
    await _until(lambda: "run pods" in log)
    elector.lose()
    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.timeout(5):
            await task
    assert raised.group_contains(LeaseLost)
    assert "done pods" not in log  # cancelled: it does not finish as if still leading


async def test_under_a_runner_a_lost_lease_fails_the_program_with_lease_lost(
    log: list[str],
) -> None:
    elector = ScriptedElector()
    leadership = Leadership(
        elector=cast(LeaderElector, elector),
        watch=FakeApi(),
        leading=[Recorder("pods", log, _informer("pods"))],
    )
    runner = Runner(startup_timeout=5, shutdown_timeout=5)
    task = asyncio.create_task(runner.run([leadership]))
    elector.acquire()
    await _until(lambda: "run pods" in log)
    elector.lose()
    with pytest.raises(LeaseLost):
        async with asyncio.timeout(5):
            await task
    assert "shut down pods" in log


def _election() -> LeaderElectionSettings:
    return LeaderElectionSettings(namespace="ns", name="lease", identity="me")


@pytest.mark.parametrize(
    ("election", "expected"),
    [
        (None, None),
        (_election(), ["leadership", "kubelet-api"]),
    ],
    ids=["alone", "replicas"],
)
async def test_with_leader_election_everything_but_the_kubelet_api_leads(
    election: LeaderElectionSettings | None, expected: list[str] | None
) -> None:
    """The node's own list: only what is named in IN_EVERY_REPLICA runs in a standby."""
    node = VirtualNode(
        settings=Settings(provider="mock", leader_election=election),
        upper=UpperClients.sharing(FakeApi()),
        provider=MockProvider(node_ip="10.0.0.1"),
        informers=InformerFactory(),
    )
    names = [c.name for c in node.components]
    if expected is None:
        assert node.leadership is None
        assert names == [
            "mock-provider",
            "pod-controller",
            "kubelet-api",
            "node-controller",
            "patrol",
        ]
        return
    assert names == expected
    assert node.leadership is not None
    assert [c.name for c in node.leadership.members] == [
        "mock-provider",
        "pod-controller",
        "node-controller",
        "patrol",
    ]
    assert all(not isinstance(c, IN_EVERY_REPLICA) for c in node.leadership.members)


class TakingOver(Recorder):
    """A leading component with writes to make once, when its replica may first write
    (`lifecycle.TakesOver`, e.g. --adopt-tensile-kube's adoption)."""

    async def take_over(self) -> None:
        self.log.append(f"take over {self.name}")


async def test_a_take_over_runs_once_leading_before_any_handler_or_run(log: list[str]) -> None:
    pods = _informer("pods")
    elector = ScriptedElector()
    leadership = Leadership(
        elector=cast(LeaderElector, elector),
        watch=FakeApi(),
        leading=[Recorder("pods", log, pods), TakingOver("adoption", log, _informer("none"))],
    )
    await leadership.start()
    task = asyncio.create_task(leadership.run())
    pods.store.upsert(_pod("a"))
    await asyncio.sleep(0.05)
    assert log == ["start pods", "start adoption"]  # a standby takes nothing over
    elector.acquire()
    await _until(lambda: "run adoption" in log)
    assert log[2:4] == ["take over adoption", "pods add a"]
    await leadership.shut_down()
    async with asyncio.timeout(5):
        await task


async def test_without_election_a_take_over_runs_after_every_start_before_the_caches(
    log: list[str],
) -> None:
    pods = _informer("pods")
    pods.store.upsert(_pod("a"))
    # Its informer holds "a" from the start: told to the handler once the informers run.
    runner = Runner(startup_timeout=5, shutdown_timeout=5)
    components = [TakingOver("adoption", log, _informer("none")), Recorder("pods", log, pods)]
    task = asyncio.create_task(runner.run(components))
    await _until(lambda: "run pods" in log)
    assert log[:3] == ["start adoption", "start pods", "take over adoption"]
    runner.stop()
    async with asyncio.timeout(5):
        await task


def test_the_leading_components_write_upstairs_through_the_electors_fence() -> None:
    """The pod and node controllers get the upper clients fenced by the node's elector;
    the kubelet API (every replica's: its CSR) and the elector itself do not."""
    upper = FakeApi(name="upper")
    elector = LeaderElector(upper, settings=_election())
    node = VirtualNode(
        settings=Settings(provider="mock", leader_election=_election()),
        upper=UpperClients.sharing(upper),
        provider=MockProvider(node_ip="10.0.0.1"),
        informers=InformerFactory(),
        elector=elector,
    )
    assert node.elector is elector
    assert node.pods._upper is not upper
    assert node.pods._upper.unfenced is upper
    assert node.pods._upper._gate is elector
    kubelet_api = next(c for c in node.components if isinstance(c, IN_EVERY_REPLICA))
    assert kubelet_api._upper is upper
    with pytest.raises(ValueError, match="elect no leader"):
        VirtualNode(
            settings=Settings(provider="mock"),
            upper=UpperClients.sharing(upper),
            provider=MockProvider(node_ip="10.0.0.1"),
            informers=InformerFactory(),
            elector=elector,
        )
