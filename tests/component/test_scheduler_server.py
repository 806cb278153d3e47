"""The extender's HTTP side (`scheduler.server`) on a real socket on 127.0.0.1: answers in
kube-scheduler's extender/v1 shapes, precise 400s for what is not an ExtenderArgs, a
fallback when a decision raises, and metrics. The summaries are filled from Node objects as the
informer would (the informer itself runs against the real apiserver in
tests/e2e/test_scheduler.py); a decision that raises is injected through summaries whose
lookup raises, a fault no real cluster produces on demand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from fractions import Fraction
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from scheduler import extender
from scheduler.server import Judge, make_app
from scheduler.summaries import NodeSummary, Summaries
from tensile.placement import fit, summary
from tensile.serving import endpoints


def _virtual(name: str, cpu: str) -> dict[str, Any]:
    lower = {
        "metadata": {"name": f"{name}-1"},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    room = fit.node_room(lower, requested={"pods": Fraction(0)})
    text = summary.render(summary.summarize([room]))
    return {"metadata": {"name": name, "annotations": {summary.ANNOTATION: text}}}


@contextlib.asynccontextmanager
async def serving(summaries: Summaries) -> AsyncIterator[str]:
    app = make_app(
        Judge(summaries=summaries, policy=extender.Policy()),
        health=endpoints.Health(),
        max_request_bytes=64 * 1024,
    )
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


POD = {
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
}


async def test_filter_and_prioritize_answer_in_the_extender_shapes() -> None:
    summaries = Summaries()
    summaries.put(_virtual("small", "1"))
    summaries.put(_virtual("big", "4"))
    async with serving(summaries) as url, aiohttp.ClientSession() as session:
        args = {"Pod": POD, "NodeNames": ["small", "big", "plain"]}
        async with session.post(f"{url}/filter", json=args) as answer:
            assert answer.status == 200
            body = await answer.json()
        assert body["NodeNames"] == ["big", "plain"]
        assert body["FailedNodes"] == {
            "small": "lower cluster of small: 0/1 nodes are available: 1 Insufficient cpu."
        }
        async with session.post(f"{url}/prioritize", json=args) as answer:
            assert await answer.json() == [
                {"Host": "small", "Score": 0},
                {"Host": "big", "Score": 5},  # 1 + round(9 * 0.5), half to even
                {"Host": "plain", "Score": 0},
            ]


@pytest.mark.parametrize(
    ("data", "content_type", "status", "text"),
    [
        (b"{", "application/json", 400, "not JSON"),
        (b"[]", "application/json", 400, "not an ExtenderArgs: the body must be a JSON object"),
        (b'{"pod": {"spec": {}}}', "application/json", 400, 'neither "NodeNames"'),
        (b'{"NodeNames": []}', "application/json", 400, '"Pod" must be a Pod'),
        (b"{}", "text/plain", 415, "is not application/json"),
        (b"[" * 70_000, "application/json", 413, ""),
    ],
)
async def test_what_is_not_extender_args_gets_a_precise_4xx(
    data: bytes, content_type: str, status: int, text: str
) -> None:
    async with serving(Summaries()) as url, aiohttp.ClientSession() as session:
        for verb in ("filter", "prioritize"):
            async with session.post(
                f"{url}/{verb}", data=data, headers={"Content-Type": content_type}
            ) as answer:
                assert answer.status == status
                assert text in await answer.text()


class _Broken(Summaries):
    def get(self, name: str) -> NodeSummary | None:
        raise RuntimeError("a bug")


async def test_a_decision_that_raises_lets_every_node_pass() -> None:
    async with serving(_Broken()) as url, aiohttp.ClientSession() as session:
        args = {"Pod": POD, "NodeNames": ["a", "b"]}
        async with session.post(f"{url}/filter", json=args) as answer:
            assert answer.status == 200
            assert (await answer.json())["NodeNames"] == ["a", "b"]
        async with session.post(f"{url}/prioritize", json=args) as answer:
            assert await answer.json() == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]
        async with session.get(f"{url}/metrics") as answer:
            text = await answer.text()
        assert 'tensile_scheduler_extender_requests_total{result="error",verb="filter"}' in text
