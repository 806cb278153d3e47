"""`vnode.testing.fakeprovider`: the scripted provider behaves as its docstring says."""

from __future__ import annotations

import pytest

from vnode import provider_errors
from vnode.provider import NodeUsage, RemoteCommand
from vnode.testing.fakeprovider import FakeProvider, FakeSession

POD = {"metadata": {"name": "web", "namespace": "ns", "uid": "u1"}}
LS = RemoteCommand(command=("ls",), stdin=False, stdout=True, stderr=False, tty=False)


async def test_a_scripted_session_plays_its_script_then_stays_ended() -> None:
    provider = FakeProvider(script=[(1, b"out")])
    session = await provider.open_exec(POD, container="main", options=LS, attach=False)
    assert [await session.receive() for _ in range(3)] == [(1, b"out"), None, None]
    assert provider.execs[0].container == "main"
    assert provider.opened.is_set()


async def test_an_unscripted_session_says_what_the_test_feeds_it() -> None:
    provider = FakeProvider()
    session = await provider.open_exec(POD, container="main", options=LS, attach=True)
    await session.send(0, b"in")
    session.output.put_nowait((1, b"fed"))
    assert await session.receive() == (1, b"fed")
    await session.close()
    assert await session.receive() is None
    assert session.sent == [(0, b"in")]
    assert provider.sessions == [session]
    assert provider.execs[0].attach


async def test_exec_errors_ports_and_logs_fail_as_told() -> None:
    provider = FakeProvider(refused_ports=(81,))
    provider.exec_error = provider_errors.BackendUnavailable("down")
    with pytest.raises(provider_errors.BackendUnavailable):
        await provider.open_exec(POD, container="main", options=LS, attach=False)
    assert provider.sessions == []
    with pytest.raises(provider_errors.ProviderError, match="nothing listens on 81"):
        await provider.open_port_forward(POD, port=81)
    port = await provider.open_port_forward(POD, port=80)
    await port.send(b"hi")
    assert [await port.receive(), await port.receive()] == [b"HI", None]
    provider.logs["main"] = [b"a\n", b"b\n"]
    chunks = [c async for c in provider.container_logs(POD, container="main", options={})]
    assert chunks == [b"a\n", b"b\n"]
    with pytest.raises(provider_errors.PodNotFound):
        async for _ in provider.container_logs(POD, container="other", options={}):
            pass


async def test_usage_is_empty_until_the_test_sets_it() -> None:
    provider = FakeProvider()
    assert await provider.resource_usage() == NodeUsage(pods=(), node=None, complete=True)
    provider.usage = NodeUsage(pods=(), node=None, complete=False)
    assert not (await provider.resource_usage()).complete


async def test_a_session_made_ended_ends_after_its_output() -> None:
    session = FakeSession([(2, b"err")], ended=True)
    assert [await session.receive(), await session.receive()] == [(2, b"err"), None]
