"""Reflector and Informer against a scripted FAKE apiserver (aiohttp on 127.0.0.1, plain HTTP).

A fake is used on purpose: these scenarios are faults a real kube-apiserver cannot produce
on demand -- a 410 Gone in the middle of a watch stream or on a `continue` token at a chosen
moment, a stream that goes silent without closing, 500s on the n-th watch, a refused
connection that later recovers. Each answer is scripted, and every request the reflector
makes is recorded so the tests can check its parameters (resourceVersion, bookmarks,
continue tokens). What a real apiserver does in the same situations (compaction expiring a
watch, an unreachable lower cluster) is covered by tests/e2e/test_faults.py and
tests/e2e/test_partitions.py.

Every test cancels and awaits the informer/reflector task it started, closes its ApiClient
and the fake server, so the suite's leak check stays quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from tensile.contracts.objects import Obj
from tensile.kube import cacheaudit, errors, reflector
from tensile.kube.backoff import ExponentialBackoff
from tensile.kube.client import METADATA_LIST, ApiClient, Page
from tensile.kube.config import ConnectionInfo
from tensile.kube.informer import Handlers, Informer, compact
from tensile.kube.reflector import Event, Reflector, ReflectorSettings
from tensile.kube.resources import PODS
from tensile.kube.store import Store

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]

FAST = ReflectorSettings(backoff=ExponentialBackoff(base=0.01, cap=0.05))


def pod(name: str, rv: str, *, namespace: str = "default", **extra: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv, **extra},
        "spec": {"nodeName": "n1"},
    }


def ev(kind: str, obj: Obj) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: str) -> dict[str, Any]:
    return ev("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}})


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


EXPIRED = status_body(410, "Expired", "too old resource version: 10 (50)")


class FakeApiServer:
    """Serves /api/v1/pods and /api/v1/namespaces/{ns}/pods from two scripts of answers.

    Lists take the next answer of `lists` (a 500 when it is empty); watches the next of
    `watches` (a stream that stays open and silent when it is empty). Every request's
    query is recorded in `list_requests` / `watch_requests`.
    """

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.lists: deque[Answer] = deque()
        self.watches: deque[Answer] = deque()
        self.list_requests: list[dict[str, str]] = []
        self.watch_requests: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.accepts: list[str] = []
        """The Accept header of every request."""
        self.released = asyncio.Event()
        """Set at close: streams that hold end."""
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)
        if sock is None:
            self._server = TestServer(app, host="127.0.0.1")
        else:
            self._server = TestServer(
                app, host="127.0.0.1", port=sock.getsockname()[1], socket_factory=lambda *_: sock
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    async def start(self) -> None:
        await self._server.start_server(shutdown_timeout=1.0)

    async def close(self) -> None:
        self.released.set()
        await self._server.close()

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        self.accepts.append(request.headers.get("Accept", ""))
        query = dict(request.query)
        if query.get("watch") in ("1", "true"):
            self.watch_requests.append(query)
            answer = self.watches.popleft() if self.watches else self.stream()
        else:
            self.list_requests.append(query)
            answer = (
                self.lists.popleft()
                if self.lists
                else reply(500, status_body(500, "InternalError", "unscripted list"))
            )
        return await answer(request)

    # --- answers ---------------------------------------------------------------------------

    def page(
        self,
        items: list[Obj],
        *,
        rv: str,
        cont: str = "",
        gate: asyncio.Event | None = None,
    ) -> Answer:
        """A list page (waiting for `gate` first, if given)."""

        async def answer(request: web.Request) -> web.StreamResponse:
            if gate is not None:
                await gate.wait()
            meta: dict[str, Any] = {"resourceVersion": rv}
            if cont:
                meta["continue"] = cont
            return web.json_response(
                {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
            )

        return answer

    def stream(
        self,
        *events: dict[str, Any] | bytes | float,
        end: bool = False,
    ) -> Answer:
        """A watch stream: each event as a JSON line (bytes are written raw, a float sleeps),
        then the stream ends (`end`) or stays open and silent until the client leaves."""

        async def answer(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.content_type = "application/json"
            await response.prepare(request)
            for event in events:
                if isinstance(event, float):
                    await asyncio.sleep(event)
                elif isinstance(event, bytes):
                    await response.write(event)
                else:
                    await response.write(json.dumps(event).encode() + b"\n")
            if not end:
                await self.released.wait()
            await response.write_eof()
            return response

        return answer


def reply(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=code, headers=headers)

    return answer


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def client_for(url: str) -> ApiClient:
    return ApiClient(ConnectionInfo(server=url, ssl_context=None), name="fake")


@contextlib.asynccontextmanager
async def running(runnable: Informer | Reflector) -> AsyncIterator[asyncio.Task[None]]:
    """Run the informer/reflector as a task; cancel and await it on the way out."""
    task = asyncio.create_task(runnable.run(), name=f"run-{runnable.name}")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the fake has no event per condition
            await asyncio.sleep(0.005)


class Recorder:
    """Handlers that record (type, name, resourceVersion); updates as "old->new"."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.handlers = Handlers(
            on_add=lambda o: self._note("ADDED", o, rv(o)),
            on_update=lambda old, new: self._note("MODIFIED", new, f"{rv(old)}->{rv(new)}"),
            on_delete=lambda o: self._note("DELETED", o, rv(o)),
        )

    def _note(self, kind: str, obj: Obj, version: str) -> None:
        self.events.append((kind, obj["metadata"]["name"], version))


def rv(obj: Obj) -> str:
    return str(obj["metadata"]["resourceVersion"])


def contents(store: Store) -> dict[str, str]:
    return {o["metadata"]["name"]: rv(o) for o in store}


_informers = iter(range(10**6))


def informer_name() -> str:
    return f"test-informer-{next(_informers)}"


def relists(name: str) -> float:
    return REGISTRY.get_sample_value("tensile_reflector_relists_total", {"informer": name}) or 0.0


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- list and watch ----------------------------------------------------------------------


async def test_paged_list_then_watch_with_bookmarks(fake: FakeApiServer) -> None:
    gate = asyncio.Event()
    fake.lists.extend(
        [
            fake.page([pod("a", "1"), pod("b", "2")], rv="10", cont="tok-1", gate=gate),
            fake.page([pod("c", "3")], rv="10"),
        ]
    )
    added_d = json.dumps(ev("ADDED", pod("d", "11"))).encode() + b"\n"
    fake.watches.extend(
        [
            fake.stream(
                added_d[:15],
                0.02,
                added_d[15:],  # one event split across two chunks
                ev("MODIFIED", pod("a", "12")),
                ev("DELETED", pod("b", "13")),
                ev("MODIFIED", pod("c", "3")),  # same resourceVersion: nothing changed
                bookmark("20"),
                end=True,  # the server-side timeout ends the watch
            ),
            fake.stream(ev("ADDED", pod("e", "21"))),
        ]
    )
    recorder = Recorder()
    name = informer_name()
    async with client_for(fake.url) as client:
        informer = Informer(
            client,
            PODS,
            name=name,
            namespace="default",
            label_selector="app=web",
            field_selector="spec.nodeName=n1",
            settings=ReflectorSettings(page_size=2),
        )
        informer.add_handlers(recorder.handlers)
        assert not informer.has_synced()
        async with running(informer) as task:
            with pytest.raises(TimeoutError):
                await informer.wait_synced(timeout=0.05)
            assert not informer.has_synced(), "synced before the list finished"
            gate.set()
            await informer.wait_synced(timeout=2.0)
            assert informer.has_synced()
            assert contents(informer.store) == {"a": "1", "b": "2", "c": "3"}
            await wait_until(lambda: len(recorder.events) == 7)
            assert not task.done()

    assert recorder.events == [
        ("ADDED", "a", "1"),
        ("ADDED", "b", "2"),
        ("ADDED", "c", "3"),
        ("ADDED", "d", "11"),
        ("MODIFIED", "a", "1->12"),
        ("DELETED", "b", "13"),
        ("ADDED", "e", "21"),
    ]
    assert contents(informer.store) == {"a": "12", "c": "3", "d": "11", "e": "21"}
    assert informer.last_sync_error is None
    assert set(fake.paths) == {"/api/v1/namespaces/default/pods"}
    selectors = {"labelSelector": "app=web", "fieldSelector": "spec.nodeName=n1"}
    assert fake.list_requests == [
        {**selectors, "limit": "2"},
        {**selectors, "limit": "2", "continue": "tok-1"},
    ]
    first, second = fake.watch_requests
    assert first.pop("timeoutSeconds").isdigit()
    assert 300 <= int(second.pop("timeoutSeconds")) <= 600
    assert first == {
        **selectors,
        "watch": "1",
        "allowWatchBookmarks": "true",
        "resourceVersion": "10",
    }
    assert second == {**first, "resourceVersion": "20"}, "resume from the bookmark"
    assert relists(name) == 1


async def test_the_watch_resumes_from_the_last_event_when_it_ends(fake: FakeApiServer) -> None:
    fake.lists.append(fake.page([], rv="5"))
    fake.watches.append(fake.stream(ev("ADDED", pod("a", "7")), end=True))
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name())
        async with running(informer):
            await wait_until(lambda: len(fake.watch_requests) == 2)
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["5", "7"]
    assert fake.paths[0] == "/api/v1/pods"
    assert len(fake.list_requests) == 1


async def test_a_relist_stores_each_page_as_it_arrives(fake: FakeApiServer) -> None:
    # 10,000 pods must not be held as one list of full objects: each page goes into the
    # (compact) store at once; deletions wait for the list's end.
    gate = asyncio.Event()
    fake.lists.extend(
        [
            fake.page([pod("a", "1"), pod("b", "2"), pod("c", "3")], rv="10"),
            fake.page([pod("a", "1"), pod("c", "30")], rv="50", cont="tok-1"),
            fake.page([pod("e", "31")], rv="50", gate=gate),
        ]
    )
    fake.watches.append(fake.stream(ev("ERROR", EXPIRED), end=True))
    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=FAST)
        informer.add_handlers(recorder.handlers)
        async with running(informer):
            await wait_until(lambda: len(fake.list_requests) == 3)
            await wait_until(lambda: ("MODIFIED", "c", "3->30") in recorder.events)
            # The second page is in the store while the third is still coming; b, gone
            # from the list, is not deleted before the list is complete.
            assert contents(informer.store) == {"a": "1", "b": "2", "c": "30"}
            gate.set()
            await wait_until(lambda: len(recorder.events) == 6)
    assert recorder.events[3:] == [
        ("MODIFIED", "c", "3->30"),
        ("ADDED", "e", "31"),
        ("DELETED", "b", "2"),
    ]
    assert contents(informer.store) == {"a": "1", "c": "30", "e": "31"}


# --- 410 Gone ------------------------------------------------------------------------------


async def test_gone_in_the_stream_relists_and_reports_what_vanished(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake.lists.extend(
        [
            fake.page([pod("a", "1"), pod("b", "2"), pod("c", "3")], rv="10"),
            # After compaction: b and d were deleted in the gap, c changed, e appeared.
            fake.page([pod("a", "1"), pod("c", "30"), pod("e", "31")], rv="50"),
        ]
    )
    fake.watches.append(fake.stream(ev("ADDED", pod("d", "11")), ev("ERROR", EXPIRED)))
    seen: list[Event] = []
    synced = 0

    def on_synced() -> None:
        nonlocal synced
        synced += 1

    store = Store()
    name = informer_name()
    async with client_for(fake.url) as client:
        reflector = Reflector(
            client, PODS, name=name, store=store, on_event=seen.append, on_synced=on_synced
        )
        async with running(reflector):
            await wait_until(lambda: len(fake.watch_requests) == 2)

    assert [(e.type, e.obj["metadata"]["name"]) for e in seen[:4]] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("ADDED", "c"),
        ("ADDED", "d"),
    ]
    relist = {(e.type, e.obj["metadata"]["name"]): e for e in seen[4:]}
    assert set(relist) == {("DELETED", "b"), ("DELETED", "d"), ("MODIFIED", "c"), ("ADDED", "e")}
    assert relist["DELETED", "b"].obj == pod("b", "2"), "DELETED carries the last known state"
    assert relist["DELETED", "d"].obj == pod("d", "11")
    assert relist["MODIFIED", "c"].old == pod("c", "3")
    assert relist["MODIFIED", "c"].obj == pod("c", "30")
    assert relist["ADDED", "e"].old is None
    assert contents(store) == {"a": "1", "c": "30", "e": "31"}
    assert len(fake.list_requests) == 2
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10", "50"]
    assert synced == 2
    assert relists(name) == 2
    assert reflector.last_error is None
    assert warnings_of(caplog) == [], "a 410 is routine, not a warning"


async def test_gone_as_the_watch_status_relists(fake: FakeApiServer) -> None:
    fake.lists.extend(
        [
            fake.page([pod("a", "1"), pod("b", "2")], rv="10"),
            fake.page([pod("a", "1")], rv="40"),
        ]
    )
    fake.watches.append(reply(410, EXPIRED))
    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name())
        informer.add_handlers(recorder.handlers)
        async with running(informer):
            await wait_until(lambda: len(fake.watch_requests) == 2)
    assert recorder.events == [("ADDED", "a", "1"), ("ADDED", "b", "2"), ("DELETED", "b", "2")]
    assert contents(informer.store) == {"a": "1"}
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10", "40"]
    assert len(fake.list_requests) == 2


async def test_gone_on_a_continue_token_restarts_the_list(fake: FakeApiServer) -> None:
    expired_token = status_body(410, "Expired", "The provided continue parameter is too old")
    fake.lists.extend(
        [
            fake.page([pod("stale", "1")], rv="10", cont="tok-1"),
            reply(410, expired_token),
            fake.page([pod("a", "11")], rv="12", cont="tok-2"),
            fake.page([pod("c", "5")], rv="12"),
        ]
    )
    recorder = Recorder()
    name = informer_name()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=name, settings=ReflectorSettings(page_size=1))
        informer.add_handlers(recorder.handlers)
        async with running(informer):
            await informer.wait_synced(timeout=2.0)
            await wait_until(lambda: len(fake.watch_requests) == 1)
    assert [r.get("continue") for r in fake.list_requests] == [None, "tok-1", None, "tok-2"]
    assert all(r["limit"] == "1" for r in fake.list_requests)
    assert contents(informer.store) == {"a": "11", "c": "5"}, "no item of the aborted list"
    # Pages are stored as they come: the aborted list's object was seen, and its absence
    # from the complete list is its deletion, as a watch would have reported it.
    assert recorder.events == [
        ("ADDED", "stale", "1"),
        ("ADDED", "a", "11"),
        ("ADDED", "c", "5"),
        ("DELETED", "stale", "1"),
    ]
    assert fake.watch_requests[0]["resourceVersion"] == "12"
    assert relists(name) == 1, "one list, restarted inside"


# --- the pager -------------------------------------------------------------------------------

CONTINUE_EXPIRED = status_body(410, "Expired", "The provided continue parameter is too old")

PageSeen = tuple[list[str], bool, bool, str]
"""(item names, restarted, last, resourceVersion) of a page the pager yielded."""

PAGER_TABLE: list[
    tuple[str, list[tuple[str, Any]], int, list[PageSeen], list[str | None], bool]
] = [
    # (case, the server's answers, restarts allowed, pages yielded, continue sent, raises 410)
    (
        "one page",
        [("page", ([pod("a", "1")], "10", ""))],
        3,
        [(["a"], False, True, "10")],
        [None],
        False,
    ),
    (
        "pages follow their tokens",
        [
            ("page", ([pod("a", "1")], "10", "t1")),
            ("page", ([pod("b", "2")], "10", "t2")),
            ("page", ([], "10", "")),
        ],
        3,
        [(["a"], False, False, "10"), (["b"], False, False, "10"), ([], False, True, "10")],
        [None, "t1", "t2"],
        False,
    ),
    (
        "an expired token starts the list over, once per expiry",
        [
            ("page", ([pod("a", "1")], "10", "t1")),
            ("410", CONTINUE_EXPIRED),
            ("page", ([pod("a", "11")], "20", "t2")),
            ("410", CONTINUE_EXPIRED),
            ("page", ([pod("a", "11")], "30", "t3")),
            ("page", ([pod("b", "12")], "30", "")),
        ],
        3,
        [
            (["a"], False, False, "10"),
            (["a"], True, False, "20"),
            (["a"], True, False, "30"),
            (["b"], False, True, "30"),
        ],
        [None, "t1", None, "t2", None, "t3"],
        False,
    ),
    (
        "a 410 on the first page is the caller's",
        [("410", EXPIRED)],
        3,
        [],
        [None],
        True,
    ),
    (
        "a list slower than compaction gives up after its restarts",
        [
            ("page", ([pod("a", "1")], "10", "t1")),
            ("410", CONTINUE_EXPIRED),
            ("page", ([pod("a", "1")], "20", "t2")),
            ("410", CONTINUE_EXPIRED),
        ],
        1,
        [(["a"], False, False, "10"), (["a"], True, False, "20")],
        [None, "t1", None, "t2"],
        True,
    ),
]


@pytest.mark.parametrize(
    ("answers", "restarts", "pages", "tokens", "gone"),
    [row[1:] for row in PAGER_TABLE],
    ids=[row[0] for row in PAGER_TABLE],
)
async def test_the_pager(
    fake: FakeApiServer,
    answers: list[tuple[str, Any]],
    restarts: int,
    pages: list[PageSeen],
    tokens: list[str | None],
    gone: bool,
) -> None:
    """`ApiClient.pages` against the fake: an expired continue token is a fault a real
    apiserver gives only after etcd compacts the list's revision mid-list (minutes by
    default), so the fake scripts it at a chosen page."""
    for kind, script in answers:
        if kind == "page":
            items, version, token = script
            fake.lists.append(fake.page(items, rv=version, cont=token))
        else:
            fake.lists.append(reply(410, script))
    seen: list[Page] = []
    async with client_for(fake.url) as client:
        listing = client.pages(
            "/api/v1/pods",
            limit=2,
            params={"labelSelector": "app=web"},
            accept=METADATA_LIST,
            restarts=restarts,
        )

        async def read() -> None:
            async for page in listing:
                seen.append(page)

        if gone:
            with pytest.raises(errors.Gone):
                await read()
        else:
            await read()
    assert [
        ([o["metadata"]["name"] for o in p.items], p.restarted, p.last, p.resource_version)
        for p in seen
    ] == pages
    assert [r.get("continue") for r in fake.list_requests] == tokens
    assert all(r["limit"] == "2" and r["labelSelector"] == "app=web" for r in fake.list_requests), (
        "every page asks the same list"
    )
    assert set(fake.accepts) == {METADATA_LIST}


async def test_an_audit_whose_list_expires_compares_the_new_list_only(
    fake: FakeApiServer,
) -> None:
    """The cache audit's continue token expires (scripted on the fake: see `test_the_pager`):
    the list starts over, and what only the abandoned pages named is no suspect."""
    fake.lists.append(fake.page([pod("a", "1"), pod("b", "2")], rv="10"))
    informer = Informer(client_for(fake.url), PODS, name=informer_name(), settings=FAST)
    async with informer.selection.client as client, running(informer):
        await informer.wait_synced(timeout=2)
        fake.lists.extend(
            [
                # The abandoned list: "x" existed then (deleted since), "a" at another version.
                fake.page([pod("a", "0"), pod("x", "3")], rv="20", cont="t1"),
                reply(410, CONTINUE_EXPIRED),
                fake.page([pod("a", "1")], rv="30", cont="t2"),
                fake.page([pod("b", "2")], rv="30"),
            ]
        )
        drift = await cacheaudit.audit(
            informer, client=client, settings=cacheaudit.AuditSettings(settle=0.0)
        )
    assert drift == []
    audit_lists = fake.list_requests[1:]
    assert [q.get("continue") for q in audit_lists] == [None, "t1", None, "t2"], (
        "the list started over, and no suspect was looked up again"
    )


# --- silent streams -----------------------------------------------------------------------


async def test_a_silent_stream_is_dropped_and_watched_again_quietly(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tensile.kube")
    fake.lists.append(fake.page([pod("a", "1")], rv="10"))
    fake.watches.extend(
        [
            fake.stream(),  # silent from the start
            # Data every 0.15 s keeps it alive past the 0.3 s idle timeout; then it goes quiet.
            fake.stream(
                0.15, bookmark("15"), 0.15, ev("ADDED", pod("b", "16")), 0.15, bookmark("17")
            ),
        ]
    )
    name = informer_name()
    async with client_for(fake.url) as client:
        informer = Informer(
            client,
            PODS,
            name=name,
            settings=ReflectorSettings(idle_timeout=0.3, backoff=FAST.backoff),
        )
        async with running(informer) as task:
            await wait_until(lambda: len(fake.watch_requests) == 3)
            assert not task.done()
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10", "10", "17"]
    assert len(fake.list_requests) == 1, "a silent stream is no reason to list again"
    assert relists(name) == 1
    assert contents(informer.store) == {"a": "1", "b": "16"}
    assert informer.last_sync_error is None
    assert warnings_of(caplog) == []
    assert any("no events for" in r.getMessage() for r in caplog.records)


# --- failures and recovery -----------------------------------------------------------------


async def test_watch_errors_back_off_and_resume_without_relisting(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake.lists.append(fake.page([pod("a", "1")], rv="10"))
    fake.watches.extend(
        [
            reply(500, status_body(500, "InternalError", "etcd is sulking")),
            fake.stream(ev("ERROR", status_body(500, "InternalError", "in-stream failure"))),
            fake.stream(b"<html>not json</html>\n"),
            reply(503, {"not": "a status"}, headers={"Retry-After": "1"}),
            fake.stream(ev("ADDED", pod("b", "11"))),
        ]
    )
    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=FAST)
        informer.add_handlers(recorder.handlers)
        async with running(informer) as task:
            await wait_until(lambda: ("ADDED", "b", "11") in recorder.events)
            assert not task.done()
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10"] * 5
    assert len(fake.list_requests) == 1
    warned = warnings_of(caplog)
    assert len(warned) == 4
    assert "HTTP 500 InternalError: etcd is sulking" in warned[0]
    assert "in-stream failure" in warned[1]
    assert "HTTP 503" in warned[3]


async def test_consecutive_watch_failures_end_in_a_relist(fake: FakeApiServer) -> None:
    fake.lists.extend(
        [
            fake.page([pod("a", "1"), pod("b", "2")], rv="10"),
            fake.page([pod("a", "1")], rv="30"),
        ]
    )
    fake.watches.extend([reply(500, status_body(500, "InternalError", "down"))] * 3)
    recorder = Recorder()
    settings = ReflectorSettings(backoff=FAST.backoff, relist_after_failures=3)
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=settings)
        informer.add_handlers(recorder.handlers)
        async with running(informer):
            await wait_until(lambda: len(fake.watch_requests) == 4)
    assert len(fake.list_requests) == 2
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10", "10", "10", "30"]
    assert recorder.events[-1] == ("DELETED", "b", "2")


async def test_a_failing_list_backs_off_and_recovers(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    down = reply(500, status_body(500, "InternalError", "list failed"))
    # The client retries a GET itself (3 attempts); the reflector then backs off and lists
    # again.
    fake.lists.extend([down, down, down, fake.page([pod("a", "1")], rv="10")])
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=FAST)
        async with running(informer):
            await informer.wait_synced(timeout=3.0)
            await wait_until(lambda: len(fake.watch_requests) == 1)
    assert len(fake.list_requests) == 4
    assert contents(informer.store) == {"a": "1"}
    assert any("list failed" in m for m in warnings_of(caplog))


async def test_a_refused_connection_backs_off_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A socket bound but not listening: connections to its port are refused until the fake
    # server starts listening on it (no race for the port).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = FakeApiServer(sock=sock)
    server.lists.append(server.page([pod("a", "1")], rv="10"))
    try:
        async with client_for(server.url) as client:
            informer = Informer(client, PODS, name=informer_name(), settings=FAST)
            async with running(informer) as task:
                await wait_until(
                    lambda: isinstance(informer.last_sync_error, errors.ApiUnavailable)
                )
                assert not informer.has_synced()
                assert not task.done()
                await server.start()
                await informer.wait_synced(timeout=2.0)
                await wait_until(lambda: len(server.watch_requests) == 1)
    finally:
        await server.close()
        sock.close()
    assert contents(informer.store) == {"a": "1"}
    warned = warnings_of(caplog)
    assert warned
    assert "cannot reach the fake cluster" in warned[0]


# --- handlers and the cache ----------------------------------------------------------------


async def test_a_failing_handler_does_not_stop_the_informer(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake.lists.append(fake.page([pod("a", "1"), pod("b", "2")], rv="10"))
    fake.watches.append(
        fake.stream(
            ev("ADDED", pod("c", "11")),
            ev("MODIFIED", pod("a", "12")),
            0.02,
            ev("DELETED", pod("b", "13")),
        )
    )

    def explode(*objs: Obj) -> None:
        raise RuntimeError("handler bug")

    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name())
        informer.add_handlers(Handlers(on_add=explode, on_update=explode, on_delete=explode))
        informer.add_handlers(recorder.handlers)
        async with running(informer) as task:
            await wait_until(lambda: len(recorder.events) == 5)
            await asyncio.sleep(0.02)
            assert not task.done()
            assert len(fake.watch_requests) == 1, "the watch was not interrupted"
    assert recorder.events == [
        ("ADDED", "a", "1"),
        ("ADDED", "b", "2"),
        ("ADDED", "c", "11"),
        ("MODIFIED", "a", "1->12"),
        ("DELETED", "b", "13"),
    ]
    assert contents(informer.store) == {"a": "12", "c": "11"}
    failures = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert len(failures) == 5
    assert all(r.levelno == logging.ERROR and r.exc_info for r in failures)


async def test_cached_objects_lose_managed_fields_and_share_key_strings(
    fake: FakeApiServer,
) -> None:
    managed = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    labels = {"app.kubernetes.io/name": "web", "tensile.example/long-label-key": "x"}

    def full(name: str, version: str) -> Obj:
        return pod(name, version, managedFields=managed, labels=labels)

    for _ in range(2):
        # One object from the list, one from the watch: separate JSON documents.
        fake.lists.append(fake.page([full("a", "1")], rv="10"))
        fake.watches.append(fake.stream(ev("ADDED", full("b", "11"))))

    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name())  # default transform: compact
        plain = Informer(client, PODS, name=informer_name(), transform=None)
        async with running(informer), running(plain):
            await wait_until(lambda: len(informer.store) == 2 and len(plain.store) == 2)

    a, b = informer.store.get("default/a"), informer.store.get("default/b")
    assert a is not None
    assert b is not None
    for obj in (a, b):
        assert "managedFields" not in obj["metadata"]
        assert obj["metadata"]["labels"] == labels

    def same_key(x: dict[str, Any], y: dict[str, Any], key: str) -> bool:
        kx = next(k for k in x if k == key)
        ky = next(k for k in y if k == key)
        return kx is ky

    # Thousands of cached pods hold one copy of each key: the codec shares the key strings
    # of the documents it decodes (json.loads would make fresh ones for every document).
    assert same_key(a, b, "metadata")
    assert same_key(a["metadata"], b["metadata"], "resourceVersion")
    assert same_key(a["metadata"]["labels"], b["metadata"]["labels"], "app.kubernetes.io/name")
    assert same_key(
        a["metadata"]["labels"], b["metadata"]["labels"], "tensile.example/long-label-key"
    )
    pa = plain.store.get("default/a")
    assert pa is not None
    assert pa["metadata"]["managedFields"] == managed


def test_compact_leaves_its_input_alone() -> None:
    obj = pod("a", "1", managedFields=[{"manager": "m"}])
    before = json.loads(json.dumps(obj))
    out = compact(obj)
    assert obj == before
    assert out == {
        **before,
        "metadata": {k: v for k, v in before["metadata"].items() if k != "managedFields"},
    }
    assert compact({"kind": "Thing"}) == {"kind": "Thing"}
    assert compact({"metadata": None}) == {"metadata": None}


async def test_an_encoded_informer_sees_the_same_events(fake: FakeApiServer) -> None:
    fake.lists.append(fake.page([pod("a", "1"), pod("b", "2")], rv="10"))
    fake.watches.append(fake.stream(ev("MODIFIED", pod("a", "11")), ev("DELETED", pod("b", "12"))))
    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), encoded=True)
        informer.add_handlers(recorder.handlers)
        async with running(informer):
            await wait_until(lambda: len(recorder.events) == 4)
    assert recorder.events == [
        ("ADDED", "a", "1"),
        ("ADDED", "b", "2"),
        ("MODIFIED", "a", "1->11"),
        ("DELETED", "b", "12"),
    ]
    assert contents(informer.store) == {"a": "11"}
    # Kept as JSON, and the object just written also as a dict (read without decoding).
    assert isinstance(informer.store._items["default/a"], bytes)
    assert informer.store.get("default/a") is informer.store.get("default/a")


async def test_an_encoded_store_decodes_the_old_state_only_for_who_asks(
    fake: FakeApiServer,
) -> None:
    for _ in range(2):  # one list and one watch for each of the two below
        fake.lists.append(fake.page([pod("a", "1")], rv="10"))
        same = pod("a", "1")  # the same object again (a resent event): nothing to tell
        fake.watches.append(fake.stream(ev("MODIFIED", same), ev("MODIFIED", pod("a", "11"))))
    events: list[Event] = []
    modified: list[str] = []
    store = Store(encoded=True, hot=0)  # nothing kept decoded: the old state is read back
    async with client_for(fake.url) as client:
        reflector = Reflector(
            client, PODS, name=informer_name(), store=store, on_event=events.append
        )
        informer = Informer(client, PODS, name=informer_name(), encoded=True)
        informer.add_handlers(Handlers(on_modify=lambda new: modified.append(rv(new))))
        async with running(reflector), running(informer):
            await wait_until(lambda: len(events) == 2 and modified == ["11"])
    added, changed = events
    assert (added.type, added.previous, added.old) == ("ADDED", None, None)
    assert changed.type == "MODIFIED"
    assert isinstance(changed.previous, bytes), "kept as the store held it"
    assert changed.old == pod("a", "1")


async def test_a_request_told_not_to_decode_skips_the_body_of_a_success_not_of_an_error(
    fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.lists.extend(
        [
            fake.page([pod("a", "1")], rv="10"),
            fake.page([pod("a", "1")], rv="10"),
            reply(404, status_body(404, "NotFound", 'pods "a" not found')),
        ]
    )
    decoded: list[object] = []
    real_loads = json.loads
    monkeypatch.setattr(
        "tensile.kube.codec.loads", lambda data: decoded.append(data) or real_loads(data)
    )
    async with client_for(fake.url) as client:
        answer = await client.request("GET", "/api/v1/pods")
        assert [item["metadata"]["name"] for item in answer["items"]] == ["a"]
        assert len(decoded) == 1
        assert await client.request("GET", "/api/v1/pods", decode=False) == {}
        assert len(decoded) == 1, "a success's body was decoded"
        with pytest.raises(errors.NotFound, match='pods "a" not found'):
            await client.request("GET", "/api/v1/pods", decode=False)


# --- failure counting -------------------------------------------------------------------


async def test_last_sync_error_is_cleared_once_the_watch_works_again(
    fake: FakeApiServer,
) -> None:
    fake.lists.append(fake.page([], rv="10"))
    fake.watches.extend(
        [
            reply(500, status_body(500, "InternalError", "blip")),
            fake.stream(ev("ADDED", pod("a", "11"))),
        ]
    )
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=FAST)
        async with running(informer):
            await wait_until(lambda: len(informer.store) == 1)
            await asyncio.sleep(0.05)
            error = informer.last_sync_error
    assert error is None, f"stale error after recovery: {error!r}"


async def test_failures_separated_by_a_working_watch_are_not_consecutive(
    fake: FakeApiServer,
) -> None:
    fake.lists.extend([fake.page([], rv="10"), fake.page([], rv="99")])
    down = reply(500, status_body(500, "InternalError", "blip"))
    fake.watches.extend([down, fake.stream(ev("ADDED", pod("a", "11"))), down])
    settings = ReflectorSettings(idle_timeout=0.2, backoff=FAST.backoff, relist_after_failures=2)
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=settings)
        async with running(informer):
            await wait_until(lambda: len(fake.watch_requests) == 4)
    # failure, a working watch (an event, then quiet), failure: not two in a row.
    assert len(fake.list_requests) == 1
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10", "10", "11", "11"]


# --- hostile streams ----------------------------------------------------------------------


async def test_watch_lines_that_are_not_events_restart_the_watch(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    fake.lists.append(fake.page([pod("a", "1")], rv="10"))
    fake.watches.extend(
        [
            fake.stream(b"[1, 2, 3]\n"),
            fake.stream(b'{"type": "ADDED", "object": [1]}\n'),
            fake.stream(b'{"type": "ADDED", "object": {"metadata": "x"}}\n'),
            fake.stream(b'{"object": {}}\n'),
            fake.stream(ev("ADDED", pod("b", "11"))),
        ]
    )
    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=FAST)
        informer.add_handlers(recorder.handlers)
        async with running(informer) as task:
            await wait_until(lambda: ("ADDED", "b", "11") in recorder.events)
            assert not task.done()
    assert contents(informer.store) == {"a": "1", "b": "11"}
    assert len(fake.list_requests) == 1
    assert len(warnings_of(caplog)) == 4


async def test_an_endless_watch_line_is_cut_off_and_the_watch_restarts(
    fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reflector, "MAX_EVENT_BYTES", 64 * 1024)
    fake.lists.append(fake.page([pod("a", "1")], rv="10"))
    chunk = b"x" * 16 * 1024
    fake.watches.extend([fake.stream(*([chunk] * 64)), fake.stream(ev("ADDED", pod("b", "11")))])
    recorder = Recorder()
    async with client_for(fake.url) as client:
        informer = Informer(client, PODS, name=informer_name(), settings=FAST)
        informer.add_handlers(recorder.handlers)
        async with running(informer) as task:
            await wait_until(lambda: ("ADDED", "b", "11") in recorder.events)
            assert not task.done()
    assert informer.last_sync_error is None


async def test_gone_on_the_first_list_page_backs_off(fake: FakeApiServer) -> None:
    fake.lists.extend(
        [reply(410, EXPIRED), reply(410, EXPIRED), fake.page([pod("a", "1")], rv="10")]
    )
    async with client_for(fake.url) as client:
        settings = ReflectorSettings(backoff=ExponentialBackoff(base=0.2, cap=0.2))
        informer = Informer(client, PODS, name=informer_name(), settings=settings)
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with running(informer):
            await informer.wait_synced(timeout=5.0)
        took = loop.time() - started
    assert len(fake.list_requests) == 3
    assert took >= 0.2, "two 410s on the first page must not be retried in a tight loop"


# --- relist on demand and the cache audit (the patrol's) ----------------------------------


async def test_relist_ends_the_watch_and_reports_what_the_cache_missed(
    fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The second list differs from the store although the watch told nothing: b was
    # deleted and c created behind its back (a missed event).
    fake.lists.extend(
        [
            fake.page([pod("a", "1"), pod("b", "2")], rv="10"),
            fake.page([pod("a", "1"), pod("c", "3")], rv="20"),
        ]
    )
    informer = Informer(client_for(fake.url), PODS, name=informer_name(), settings=FAST)
    recorder = Recorder()
    informer.add_handlers(recorder.handlers)
    async with informer.selection.client, running(informer):
        await informer.wait_synced(timeout=2)
        await wait_until(lambda: len(fake.watch_requests) == 1)
        await asyncio.wait_for(informer.relist(), 2)
        assert contents(informer.store) == {"a": "1", "c": "3"}
        await wait_until(lambda: len(fake.watch_requests) == 2)
    assert recorder.events[2:] == [("ADDED", "c", "3"), ("DELETED", "b", "2")]
    assert [w["resourceVersion"] for w in fake.watch_requests] == ["10", "20"]
    assert warnings_of(caplog) == [], "a relist asked for is no failure"


async def test_the_cache_audit_confirms_drift_and_not_changes_after_its_list(
    fake: FakeApiServer,
) -> None:
    fake.lists.append(fake.page([pod("a", "1"), pod("b", "2")], rv="10"))
    informer = Informer(client_for(fake.url), PODS, name=informer_name(), settings=FAST)
    async with informer.selection.client as client, running(informer):
        await informer.wait_synced(timeout=2)
        fake.lists.extend(
            [
                # The audit's list: b gone (a missed deletion), c new.
                fake.page([pod("a", "1"), pod("c", "3")], rv="20"),
                # Looked up again: c is gone already (deleted after the list: no drift),
                # b is still gone (drift).
                fake.page([], rv="21"),
                fake.page([], rv="21"),
            ]
        )
        drift = await cacheaudit.audit(
            informer, client=client, settings=cacheaudit.AuditSettings(settle=0.0)
        )
    assert drift == [cacheaudit.Suspect(key="default/b", reason="missed_delete", cached="2")]
    audit_list, *lookups = fake.list_requests[1:]
    assert audit_list["limit"] == "500"
    assert [q["fieldSelector"] for q in lookups] == ["metadata.name=c", "metadata.name=b"]


async def test_the_cache_audit_waits_longer_for_a_watch_that_lags_past_its_first_look(
    fake: FakeApiServer,
) -> None:
    """A loaded apiserver's watch lags by seconds (4.6 s at p99 under the fleet benchmark):
    a store that catches up between the audit's looks is not drift; one that has not moved
    by `settle_max` is."""
    fake.lists.append(fake.page([pod("a", "1"), pod("b", "2")], rv="10"))
    informer = Informer(client_for(fake.url), PODS, name=informer_name(), settings=FAST)
    async with informer.selection.client as client, running(informer):
        await informer.wait_synced(timeout=2)
        fake.lists.extend(
            [
                fake.page([pod("a", "5"), pod("b", "6")], rv="20"),  # the audit's list
                # First look, after `settle`: both still differ from the store.
                fake.page([pod("a", "5")], rv="21"),
                fake.page([pod("b", "6")], rv="21"),
                # Second look: a's event has come meanwhile; b's never does.
                fake.page([pod("a", "5")], rv="22"),
                fake.page([pod("b", "6")], rv="22"),
                fake.page([pod("b", "6")], rv="23"),  # the last look, b only
            ]
        )
        settings = cacheaudit.AuditSettings(settle=0.2, settle_max=1.4)
        audit = asyncio.create_task(cacheaudit.audit(informer, client=client, settings=settings))
        await wait_until(lambda: len(fake.list_requests) >= 4)  # the first look is done
        informer.store.update(pod("a", "5"))  # a's event, late
        drift = await audit
    assert drift == [cacheaudit.Suspect(key="default/b", reason="missed_update", cached="2")]
    lookups = [q["fieldSelector"] for q in fake.list_requests[2:]]
    assert lookups == ["metadata.name=a", "metadata.name=b"] * 2 + ["metadata.name=b"], (
        "each suspect still disagreeing is looked at again, the store's catch-up ends it"
    )


async def test_a_cache_audit_told_to_stop_looks_no_more(fake: FakeApiServer) -> None:
    """A patrol shutting down (`stopped`) waits for no second look: what the first look
    confirmed is returned."""
    fake.lists.append(fake.page([pod("a", "1")], rv="10"))
    informer = Informer(client_for(fake.url), PODS, name=informer_name(), settings=FAST)
    async with informer.selection.client as client, running(informer):
        await informer.wait_synced(timeout=2)
        fake.lists.extend(
            [fake.page([pod("a", "5")], rv="20"), fake.page([pod("a", "5")], rv="21")]
        )
        settings = cacheaudit.AuditSettings(settle=0.01, settle_max=60.0)
        drift = await asyncio.wait_for(
            cacheaudit.audit(informer, client=client, settings=settings, stopped=lambda: True),
            5,
        )
    assert drift == [cacheaudit.Suspect(key="default/a", reason="missed_update", cached="1")]
    assert len(fake.list_requests) == 3, "the list and one look"
