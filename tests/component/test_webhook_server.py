"""The webhook's HTTP side (`webhook.server`) on a real socket on 127.0.0.1: answers,
refusals, the deadline, and metrics.

The lookups are plain functions here (the informers behind them are tested against the real
apiserver in tests/e2e/test_webhook.py); two faults a real cluster cannot produce on demand
are injected through them: caches that never list, and a lookup that raises.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from tensile.contracts import clusterselector
from tensile.serving import endpoints
from webhook import patches
from webhook.mutation import Lookups, MutationSettings
from webhook.server import Admission, budget, make_app

URL = "/mutate"


def review(*, version: str = "admission.k8s.io/v1", **request: Any) -> dict[str, Any]:
    pod = {
        "metadata": {"name": "web", "labels": {"virtual-pod": "true"}},
        "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "c", "image": "i"}]},
    }
    base = {
        "uid": "uid-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "shop",
        "object": pod,
        **request,
    }
    return {"apiVersion": version, "kind": "AdmissionReview", "request": base}


async def _never() -> None:
    await asyncio.Event().wait()


async def _at_once() -> None:
    return None


@contextlib.asynccontextmanager
async def serving(
    *,
    lookups: Lookups | None = None,
    ready: bool = True,
    wait_ready: Callable[[], Awaitable[None]] = _at_once,
    max_request_bytes: int = 64 * 1024,
) -> AsyncIterator[str]:
    admission = Admission(
        settings=MutationSettings(),
        lookups=lookups or Lookups(),
        ready=lambda: ready,
        wait_ready=wait_ready,
    )
    app = make_app(admission, health=endpoints.Health(), max_request_bytes=max_request_bytes)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def post(
    base: str, document: object, *, path: str = URL, content_type: str = "application/json"
) -> tuple[int, str]:
    data = document if isinstance(document, bytes) else json.dumps(document).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + path, data=data, headers={"Content-Type": content_type}) as r,
    ):
        return r.status, await r.text()


def counted(operation: str, result: str) -> float:
    value = REGISTRY.get_sample_value(
        "tensile_webhook_admission_requests_total", {"operation": operation, "result": result}
    )
    return value or 0.0


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
async def test_a_pod_is_answered_with_a_patch_in_the_version_asked(version: str) -> None:
    document = review(version=version)
    before = counted("CREATE", "mutated")
    async with serving() as base:
        status, text = await post(base, document)
    assert status == 200
    answer = json.loads(text)
    assert (answer["apiVersion"], answer["kind"]) == (version, "AdmissionReview")
    response = answer["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "uid-1",
        True,
        "JSONPatch",
    )
    operations = json.loads(base64.b64decode(response["patch"]))
    pod = patches.apply(document["request"]["object"], operations)
    assert "nodeSelector" not in pod["spec"]
    annotation = pod["metadata"]["annotations"][clusterselector.ANNOTATION]
    assert clusterselector.parse(annotation) is not None
    assert json.loads(annotation)["nodeSelector"] == {"disk": "ssd"}
    assert counted("CREATE", "mutated") == before + 1


async def test_pods_not_converted_are_allowed_without_a_patch() -> None:
    async with serving() as base:
        for document in (
            review(operation="UPDATE"),
            review(namespace="kube-system"),
            review(kind={"group": "apps", "version": "v1", "kind": "Deployment"}),
        ):
            status, text = await post(base, document)
            assert status == 200
            assert json.loads(text)["response"] == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize(
    ("document", "content_type", "status", "message"),
    [
        (b"{oops", "application/json", 400, "not an AdmissionReview: the body is not JSON"),
        ({**review(), "apiVersion": "v1"}, "application/json", 400, 'apiVersion "v1" is not'),
        (review(), "text/plain", 415, "Content-Type text/plain is not application/json"),
        (review(object=None), "application/json", 400, "request.object is missing"),
        (b"x" * 70_000, "application/json", 413, "Maximum request body size 65536 exceeded"),
    ],
)
async def test_bad_requests_get_a_4xx_with_a_message(
    document: object, content_type: str, status: int, message: str
) -> None:
    before = counted("", "rejected")
    async with serving() as base:
        got, text = await post(base, document, content_type=content_type)
    assert got == status
    assert message in text
    assert counted("", "rejected") == before + 1


async def test_operations_no_apiserver_sends_are_refused_and_make_no_metric_series() -> None:
    """Metric labels come from a closed set: a caller inventing operations must not grow the
    process's metrics without bound."""
    invented = [f"OP-{i}" for i in range(3)]
    async with serving() as base:
        for operation in invented:
            status, text = await post(base, review(operation=operation))
            assert status == 400
            assert f'request.operation "{operation}" is not one of' in text
    samples = {
        sample.labels.get("operation")
        for metric in REGISTRY.collect()
        if metric.name.startswith("tensile_webhook_admission")
        for sample in metric.samples
    }
    assert not samples & set(invented)


async def test_wrong_methods_and_paths() -> None:
    async with serving() as base, aiohttp.ClientSession() as session:
        async with session.get(base + URL) as r:
            assert r.status == 405
        async with session.post(base + "/validate", data=b"{}") as r:
            assert r.status == 404
        async with session.get(base + "/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok")


async def test_caches_that_do_not_list_in_time_get_allowed_unchanged_before_the_deadline() -> None:
    before = counted("CREATE", "timeout")
    async with serving(ready=False, wait_ready=_never) as base:
        started = time.monotonic()
        status, text = await post(base, review(), path=URL + "?timeout=1s")
        took = time.monotonic() - started
    assert status == 200
    response = json.loads(text)["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert "caches of the cluster are not ready" in response["warnings"][0]
    assert took < 1.0  # answered before the apiserver's own deadline
    assert counted("CREATE", "timeout") == before + 1


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [(None, 8.0), ("5s", 4.0), ("1s", 0.8), ("0s", 8.0), ("bogus", 8.0), ("30s", 24.0)],
)
def test_the_budget_is_the_apiservers_deadline_less_a_margin(
    timeout: str | None, seconds: float
) -> None:
    assert budget(timeout) == pytest.approx(seconds)


@pytest.mark.parametrize("timeout", ["31s", "1h", "1000000h"])
def test_a_deadline_past_what_the_api_allows_is_cut_to_it(timeout: str) -> None:
    """timeoutSeconds is at most 30 (admissionregistration.k8s.io/v1): a caller asking for
    more is not the apiserver, and must not hold a body read (a slow upload) longer."""
    assert budget(timeout) == budget("30s")


async def test_caches_that_list_during_the_call_are_waited_for() -> None:
    synced = asyncio.Event()

    async def wait_ready() -> None:
        await synced.wait()

    async with serving(ready=False, wait_ready=wait_ready) as base:
        call = asyncio.create_task(post(base, review(), path=URL + "?timeout=10s"))
        await asyncio.sleep(0.2)
        assert not call.done()
        synced.set()
        status, text = await call
    assert status == 200
    assert "patch" in json.loads(text)["response"]


async def test_a_failing_decision_is_allowed_unchanged_and_counted() -> None:
    def broken(_name: str) -> bool:
        raise RuntimeError("lookup failed")

    document = review()
    document["request"]["object"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n"}
    before = counted("CREATE", "error")
    async with serving(lookups=Lookups(is_virtual_node=broken)) as base:
        status, text = await post(base, document)
    assert status == 200
    assert json.loads(text)["response"] == {
        "uid": "uid-1",
        "allowed": True,
        "warnings": ["tensile-webhook: internal error; the pod was admitted unchanged"],
    }
    assert counted("CREATE", "error") == before + 1


def latency(operation: str, le: str | None = None) -> float:
    """tensile_webhook_admission_duration_seconds of `operation`: its bucket `le`, or its
    count (le None)."""
    name = "tensile_webhook_admission_duration_seconds"
    if le is None:
        value = REGISTRY.get_sample_value(f"{name}_count", {"operation": operation})
    else:
        value = REGISTRY.get_sample_value(f"{name}_bucket", {"operation": operation, "le": le})
    return value or 0.0


async def test_the_latency_histogram_times_each_answer_by_operation() -> None:
    """A decision taken at once falls in the lowest buckets; one that waited for caches
    until its deadline (0.8 s of a 1 s timeout) in the bucket of its wait, not below; a
    request refused before its operation is known is timed under operation ""."""
    fast, slow, refused = latency("CREATE"), latency("CREATE", "0.1"), latency("")
    async with serving() as base:
        assert (await post(base, review()))[0] == 200
    assert latency("CREATE") == fast + 1
    assert latency("CREATE", "0.1") == slow + 1
    below, within = latency("CREATE", "0.5"), latency("CREATE", "1.0")
    async with serving(ready=False, wait_ready=_never) as base:
        assert (await post(base, review(), path=URL + "?timeout=1s"))[0] == 200
    assert latency("CREATE", "0.5") == below  # waited 0.8 s: not counted as fast
    assert latency("CREATE", "1.0") == within + 1
    async with serving() as base:
        assert (await post(base, b"not json"))[0] == 400
    assert latency("") == refused + 1
    total = REGISTRY.get_sample_value(
        "tensile_webhook_admission_duration_seconds_sum", {"operation": "CREATE"}
    )
    assert total is not None
    assert total >= 0.8
