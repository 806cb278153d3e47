"""The pure pieces of the client plumbing: Store, backoff arithmetic, API errors, resources."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensile.contracts.objects import Obj
from tensile.kube import errors
from tensile.kube.backoff import ExponentialBackoff, TokenBucket, jittered
from tensile.kube.client import ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.resources import (
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    Resource,
    object_key,
    split_key,
)
from tensile.kube.store import Store

# --- Store -------------------------------------------------------------------------------


def pod(
    name: str, *, namespace: str = "default", node: str = "", rv: str = "1", **labels: str
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": rv,
            "labels": dict(labels),
        },
        "spec": {"nodeName": node},
    }


def by_node(obj: Obj) -> list[str]:
    node = obj.get("spec", {}).get("nodeName")
    return [node] if node else []


def by_label_value(obj: Obj) -> list[str]:
    return sorted(set(obj["metadata"].get("labels", {}).values()))


def names(objs: list[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


@pytest.fixture(params=[False, True], ids=["dicts", "encoded"])
def store(request: pytest.FixtureRequest) -> Store:
    return Store(indexers={"node": by_node, "label": by_label_value}, encoded=request.param)


def test_upsert_get_delete(store: Store) -> None:
    assert len(store) == 0
    assert store.get("default/a") is None
    a = pod("a", node="n1")
    assert store.upsert(a) is None
    assert store.upsert(pod("b", namespace="kube-system")) is None
    assert store.upsert({"metadata": {"name": "n1"}, "kind": "Node"}) is None
    assert len(store) == 3
    assert sorted(store.keys()) == ["default/a", "kube-system/b", "n1"]
    assert store.get("default/a") == a
    assert store.get("n1") == {"metadata": {"name": "n1"}, "kind": "Node"}
    assert sorted(o["metadata"]["name"] for o in store) == ["a", "b", "n1"]

    a2 = pod("a", node="n1", rv="2")
    assert store.upsert(a2) == a, "upsert returns the object it replaced"
    assert len(store) == 3
    assert store.get("default/a") == a2

    assert store.delete("default/a") == a2
    assert store.get("default/a") is None
    assert store.delete("default/a") is None
    assert store.delete("nope") is None
    assert len(store) == 2
    assert sorted(store.keys()) == ["kube-system/b", "n1"]


def test_indexes_follow_updates_and_deletes(store: Store) -> None:
    store.upsert(pod("a", node="n1", app="web", tier="front"))
    store.upsert(pod("b", node="n1", app="db"))
    store.upsert(pod("c", node="n2", app="web"))
    store.upsert(pod("unscheduled"))
    assert names(store.by_index("node", "n1")) == ["a", "b"]
    assert names(store.by_index("node", "n2")) == ["c"]
    assert names(store.by_index("label", "web")) == ["a", "c"]
    assert names(store.by_index("label", "front")) == ["a"]
    assert store.by_index("node", "") == []
    assert store.by_index("node", "n9") == []

    # The index value changes on update: the old entry goes, the new one appears.
    store.upsert(pod("a", node="n2", rv="2", app="web"))
    assert names(store.by_index("node", "n1")) == ["b"]
    assert names(store.by_index("node", "n2")) == ["a", "c"]
    assert store.by_index("label", "front") == []
    store.upsert(pod("b", node="n2", rv="2", app="db"))
    assert store.by_index("node", "n1") == []
    assert "n1" not in store._indexes["node"], "an emptied index value must not linger"
    assert names(store.by_index("node", "n2")) == ["a", "b", "c"]

    store.delete("default/c")
    assert names(store.by_index("node", "n2")) == ["a", "b"]
    assert names(store.by_index("label", "web")) == ["a"]
    store.delete("default/a")
    store.delete("default/b")
    assert store.by_index("label", "web") == []
    assert store._indexes == {"node": {}, "label": {}}


def test_index_keys_name_the_objects_without_reading_them(store: Store) -> None:
    store.upsert(pod("a", node="n1", app="web"))
    store.upsert(pod("b", node="n1", app="db"))
    assert store.index_keys("node", "n1") == {"default/a", "default/b"}
    assert store.index_keys("node", "n9") == frozenset()
    store.delete("default/a")
    assert store.index_keys("node", "n1") == {"default/b"}


def test_an_unknown_index_raises_key_error(store: Store) -> None:
    with pytest.raises(KeyError):
        store.by_index("namespace", "default")
    with pytest.raises(KeyError):
        store.index_keys("namespace", "default")


def test_a_store_without_indexers() -> None:
    store = Store()
    store.upsert(pod("a"))
    assert store.keys() == ["default/a"]
    with pytest.raises(KeyError):
        store.by_index("node", "n1")


def test_a_plain_store_shares_its_objects() -> None:
    store = Store()
    a = pod("a")
    store.upsert(a)
    assert store.get("default/a") is a
    assert next(iter(store)) is a


def test_an_encoded_store_without_kept_objects_returns_fresh_decoded_dicts() -> None:
    store = Store(indexers={"node": by_node}, encoded=True, hot=0)
    a = pod("a", node="n1", app="web")
    store.upsert(a)
    a["metadata"]["labels"]["app"] = "changed after the upsert"
    first = store.get("default/a")
    second = store.get("default/a")
    assert first is not None
    assert second is not None
    assert first == second == pod("a", node="n1", app="web")
    assert first is not second
    assert first is not a
    first["metadata"]["name"] = "scribbled"
    assert store.get("default/a") == pod("a", node="n1", app="web"), "reads are copies"
    assert store.by_index("node", "n1") == [pod("a", node="n1", app="web")]
    assert store.by_index("node", "n1")[0] is not store.by_index("node", "n1")[0]
    assert [o["metadata"]["name"] for o in store] == ["a"]
    # Stored as compact JSON.
    raw = store._items["default/a"]
    assert isinstance(raw, bytes)
    assert json.loads(raw) == pod("a", node="n1", app="web")
    assert b", " not in raw
    assert b": " not in raw


def test_an_encoded_store_keeps_its_most_recently_used_objects_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(indexers={"node": by_node}, encoded=True, hot=2)
    decodes: list[object] = []
    real_loads = json.loads

    def counted(data: Any) -> Any:
        decodes.append(data)
        return real_loads(data)

    monkeypatch.setattr("tensile.kube.codec.loads", counted)
    a1, b1, c1 = pod("a", node="n1"), pod("b", node="n1"), pod("c", node="n2")
    for obj in (a1, b1, c1):
        assert store.update(obj)[0]
    # The last two given are kept as given; the first was pushed out and is decoded.
    assert store.get("default/c") is c1
    assert store.get("default/b") is b1
    assert decodes == []
    a_read = store.get("default/a")
    assert a_read == a1
    assert a_read is not a1
    assert len(decodes) == 1
    # Reading `a` made it the most recent: `c` (least recently used) was pushed out.
    assert store.get("default/a") is a_read
    assert len(decodes) == 1
    c_read = store.get("default/c")
    assert c_read == c1
    assert len(decodes) == 2
    # The next state's old one is handed back decoded while kept: no decoding.
    decodes.clear()
    c2 = pod("c", node="n1", rv="2")
    changed, previous = store.update(c2)
    assert changed
    assert previous is c_read
    assert decodes == []
    assert store.get("default/c") is c2
    assert sorted(o["metadata"]["name"] for o in store.by_index("node", "n1")) == ["a", "b", "c"]
    assert len(decodes) == 1  # `b` only
    # An unchanged state changes nothing, and hands back what is kept.
    assert store.update(pod("c", node="n1", rv="2")) == (False, c2)
    # A walk reads kept objects as kept and does not make the others kept.
    decodes.clear()
    assert sorted(o["metadata"]["name"] for o in store) == ["a", "b", "c"]
    assert len(decodes) == 1  # `b`
    assert store.get("default/a") is a_read
    assert len(decodes) == 1
    # A deletion hands back the kept dict, and forgets it.
    assert store.delete("default/c") is c2
    assert store.get("default/c") is None
    assert store.version("default/c") is None
    # An old state no longer kept is handed back as stored (bytes), for `decoded`.
    changed, previous = store.update(pod("b", node="n2", rv="3"))
    assert changed
    assert isinstance(previous, bytes)
    assert real_loads(previous) == b1
    # What is stored is still the compact text, whatever is kept.
    raw = store._items["default/a"]
    assert isinstance(raw, bytes)
    assert real_loads(raw) == a1


def test_version_follows_upserts_updates_and_deletes_without_decoding(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.upsert(pod("a", rv="1"))
    store.update(pod("b", rv="5"))
    store.upsert({"metadata": {"name": "n1"}, "kind": "Node"})

    def no_decoding(data: object) -> object:
        raise AssertionError("version decoded a stored object")

    # The patrol's cache audit asks every object's resourceVersion: an encoded store
    # answers from what it keeps beside the text, not by decoding the object.
    monkeypatch.setattr("tensile.kube.codec.loads", no_decoding)
    assert store.version("default/a") == "1"
    assert store.version("default/b") == "5"
    assert store.version("n1") == "", "an object without one has an empty resourceVersion"
    assert store.version("default/nope") is None
    monkeypatch.undo()

    store.upsert(pod("a", rv="2"))
    assert store.update(pod("b", rv="6"))[0]
    assert not store.update(pod("b", rv="6"))[0]
    store.delete("n1")
    monkeypatch.setattr("tensile.kube.codec.loads", no_decoding)
    assert store.version("default/a") == "2"
    assert store.version("default/b") == "6"
    assert store.version("n1") is None, "a deleted object has no version"


# --- backoff -------------------------------------------------------------------------------


def test_exponential_backoff_doubles_up_to_the_cap() -> None:
    backoff = ExponentialBackoff(base=0.5, cap=30.0)
    assert [backoff.delay(n) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(10**6) == 30.0
    assert ExponentialBackoff(base=0.0, cap=1.0).delay(5) == 0.0


def test_exponential_backoff_refuses_negative_failures() -> None:
    with pytest.raises(ValueError, match="failures must be >= 0"):
        ExponentialBackoff(base=1.0, cap=2.0).delay(-1)


@given(
    base=st.floats(min_value=1e-6, max_value=1e6),
    cap=st.floats(min_value=1e-6, max_value=1e9),
    failures=st.integers(min_value=0, max_value=10_000),
)
def test_exponential_backoff_is_monotonic_and_capped(
    base: float, cap: float, failures: int
) -> None:
    backoff = ExponentialBackoff(base=base, cap=cap)
    assert backoff.delay(failures) <= cap
    assert backoff.delay(failures) <= backoff.delay(failures + 1)
    assert backoff.delay(0) == min(base, cap)


def test_jittered_stays_within_its_bounds() -> None:
    rng = random.Random(42)
    draws = [jittered(10.0, rng=rng) for _ in range(1000)]
    assert all(10.0 <= d < 12.0 for d in draws)
    assert max(draws) - min(draws) > 1.5, "the jitter spreads the delays"
    wide = [jittered(1.0, factor=1.0, rng=rng) for _ in range(1000)]
    assert all(1.0 <= d < 2.0 for d in wide)
    assert jittered(0.0, rng=rng) == 0.0
    # Reproducible with the same seed.
    assert jittered(3.0, rng=random.Random(7)) == jittered(3.0, rng=random.Random(7))
    assert jittered(3.0, rng=random.Random(7)) == 3.0 * (1 + 0.2 * random.Random(7).random())


def test_token_bucket_spends_its_burst_then_paces_at_its_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=3)
    assert [bucket.reserve(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = [bucket.reserve(100.0) for _ in range(3)]
    assert waits == pytest.approx([0.1, 0.2, 0.3])


def test_token_bucket_refills_over_time_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=3)
    for _ in range(6):
        bucket.reserve(0.0)  # 3 tokens owed
    # After 0.3 s the debt is paid; the next token comes 0.1 s later.
    assert bucket.reserve(0.3) == pytest.approx(0.1)
    # After a long pause the bucket is full again, but never more than `burst`.
    assert [bucket.reserve(60.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(60.0) == pytest.approx(0.1)
    # Partial refill: half a token after 0.05 s.
    bucket = TokenBucket(rate=10.0, burst=1)
    assert bucket.reserve(5.0) == 0.0
    assert bucket.reserve(5.05) == pytest.approx(0.05)
    assert bucket.reserve(5.25) == pytest.approx(0.0, abs=1e-9)


def test_token_bucket_takes_back_abandoned_reservations() -> None:
    bucket = TokenBucket(rate=10.0, burst=2)
    bucket.reserve(0.0)
    bucket.reserve(0.0)
    abandoned = [bucket.reserve(0.0) for _ in range(100)]  # 10 s of waits queued
    assert abandoned[-1] == pytest.approx(10.0)
    for _ in abandoned:
        bucket.give_back()
    # The next caller waits as if the abandoned ones had never asked.
    assert bucket.reserve(0.0) == pytest.approx(0.1)
    # Giving back never fills the bucket past its burst.
    for _ in range(10):
        bucket.give_back()
    assert [bucket.reserve(0.0) for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])


async def test_a_request_cancelled_while_throttled_gives_its_slot_back() -> None:
    info = ConnectionInfo(server="https://192.0.2.1", ssl_context=None)
    client = ApiClient(info, name="t", qps=1.0, burst=1)
    await client._throttle()  # the burst
    waiters = [asyncio.create_task(client._throttle()) for _ in range(50)]
    await asyncio.sleep(0.01)
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    # Without the give-back, this caller would wait behind 50 abandoned slots (50 s).
    async with asyncio.timeout(2.0):
        await client._throttle()


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_token_bucket_refuses_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="need rate > 0 and burst >= 1"):
        TokenBucket(rate=rate, burst=burst)


# --- errors --------------------------------------------------------------------------------


def status(code: int, reason: str, message: str = "", **extra: Any) -> bytes:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        **extra,
    }
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (400, "BadRequest", errors.BadRequest),
        (401, "Unauthorized", errors.Unauthorized),
        (403, "Forbidden", errors.Forbidden),
        (404, "NotFound", errors.NotFound),
        (409, "Conflict", errors.Conflict),
        (409, "AlreadyExists", errors.AlreadyExists),
        (410, "Expired", errors.Gone),
        (410, "Gone", errors.Gone),
        (422, "Invalid", errors.Invalid),
        (429, "TooManyRequests", errors.TooManyRequests),
        (500, "InternalError", errors.ServerError),
        (503, "ServiceUnavailable", errors.ServerError),
        (504, "Timeout", errors.ServerError),
        (418, "Teapot", errors.ApiError),
        (405, "MethodNotAllowed", errors.ApiError),
    ],
)
def test_from_response_picks_the_class_by_code_and_reason(
    code: int, reason: str, cls: type[errors.ApiError]
) -> None:
    exc = errors.from_response(code=code, body=status(code, reason, "it went wrong"))
    assert type(exc) is cls
    assert exc.code == code
    assert exc.reason == reason
    assert exc.message == "it went wrong"
    assert exc.status["kind"] == "Status"
    assert exc.retry_after is None
    assert str(exc) == f"HTTP {code} {reason}: it went wrong"


def test_not_found_keeps_the_status() -> None:
    body = status(
        404, "NotFound", 'pods "web-0" not found', details={"name": "web-0", "kind": "pods"}
    )
    exc = errors.from_response(code=404, body=body.decode())
    assert isinstance(exc, errors.NotFound)
    assert exc.status == json.loads(body)
    assert exc.causes == []


def test_conflict_and_already_exists_are_told_apart() -> None:
    conflict = errors.from_response(code=409, body=status(409, "Conflict", "modified"))
    exists = errors.from_response(code=409, body=status(409, "AlreadyExists", "exists"))
    assert type(conflict) is errors.Conflict
    assert type(exists) is errors.AlreadyExists
    assert not isinstance(exists, errors.Conflict)
    # A 409 without a usable Status is a conflict.
    assert type(errors.from_response(code=409, body=b"conflict")) is errors.Conflict


def test_invalid_has_its_causes() -> None:
    causes = [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"},
        {"reason": "FieldValueInvalid", "message": "bad", "field": "metadata.name"},
    ]
    exc = errors.from_response(
        code=422,
        body=status(422, "Invalid", "Pod is invalid", details={"name": "x", "causes": causes}),
    )
    assert isinstance(exc, errors.Invalid)
    assert exc.causes == causes
    assert errors.from_response(code=422, body=status(422, "Invalid")).causes == []
    no_causes = status(422, "Invalid", details={"name": "x", "causes": None})
    assert errors.from_response(code=422, body=no_causes).causes == []


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("3", 3.0),
        ("0.5", 0.5),
        (" 7 ", 7.0),
        ("-2", 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ("", None),
        (None, None),
    ],
)
def test_too_many_requests_carries_retry_after(header: str | None, expected: float | None) -> None:
    exc = errors.from_response(
        code=429, body=status(429, "TooManyRequests", "slow down"), retry_after=header
    )
    assert isinstance(exc, errors.TooManyRequests)
    assert exc.retry_after == expected


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>502 Bad Gateway</body></html>\n",
        "upstream connect error",
        b'{"kind": "Pod", "metadata": {}}',
        b"[1, 2]",
        b"null",
        b'{"kind": "Status", "code": 500',  # truncated
    ],
)
def test_non_status_bodies_become_a_synthetic_status(body: bytes | str) -> None:
    exc = errors.from_response(code=502, body=body)
    assert isinstance(exc, errors.ServerError)
    text = body.decode() if isinstance(body, bytes) else body
    assert exc.status == {
        "kind": "Status",
        "status": "Failure",
        "code": 502,
        "message": text.strip(),
    }
    assert exc.reason == ""
    assert exc.message == text.strip()
    assert str(exc) == f"HTTP 502 : {text.strip()}"


def test_synthetic_status_edge_cases() -> None:
    empty = errors.from_response(code=503, body=b"")
    assert empty.message == ""
    assert str(empty) == "HTTP 503"
    garbled = errors.from_response(code=500, body=b"\xff\xfe oops")
    assert "oops" in garbled.message
    long = errors.from_response(code=500, body=b"x" * 5000)
    assert len(long.message) == 2000
    proxied_404 = errors.from_response(code=404, body=b"404 page not found")
    assert isinstance(proxied_404, errors.NotFound)
    assert proxied_404.message == "404 page not found"


def test_is_transient() -> None:
    def make(code: int, reason: str) -> errors.ApiError:
        return errors.from_response(code=code, body=status(code, reason))

    assert errors.is_transient(errors.ApiUnavailable("connection refused"))
    assert errors.is_transient(make(429, "TooManyRequests"))
    assert errors.is_transient(make(500, "InternalError"))
    assert errors.is_transient(make(503, "ServiceUnavailable"))
    for code, reason in [
        (400, "BadRequest"),
        (403, "Forbidden"),
        (404, "NotFound"),
        (409, "Conflict"),
        (409, "AlreadyExists"),
        (410, "Expired"),
        (422, "Invalid"),
        (418, "Teapot"),
    ]:
        assert not errors.is_transient(make(code, reason)), code
    assert not errors.is_transient(errors.WatchIdle("quiet"))
    assert not errors.is_transient(ValueError("not JSON"))
    assert not errors.is_transient(TimeoutError())


# --- resources -----------------------------------------------------------------------------


def test_core_resource_paths() -> None:
    assert PODS.api_version == "v1"
    assert PODS.path() == "/api/v1/pods"
    assert PODS.path(namespace="default") == "/api/v1/namespaces/default/pods"
    assert PODS.path(namespace="default", name="web-0") == "/api/v1/namespaces/default/pods/web-0"
    assert (
        PODS.path(namespace="default", name="web-0", subresource="status")
        == "/api/v1/namespaces/default/pods/web-0/status"
    )
    assert NODES.path() == "/api/v1/nodes"
    assert NODES.path(name="vnode") == "/api/v1/nodes/vnode"
    assert NODES.path(name="vnode", subresource="status") == "/api/v1/nodes/vnode/status"
    assert NAMESPACES.path(name="kube-system") == "/api/v1/namespaces/kube-system"


def test_group_resource_paths() -> None:
    assert LEASES.api_version == "coordination.k8s.io/v1"
    assert LEASES.path() == "/apis/coordination.k8s.io/v1/leases"
    assert (
        LEASES.path(namespace="kube-node-lease", name="vnode")
        == "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/vnode"
    )
    crd = Resource(
        group="example.com", version="v1beta1", plural="widgets", kind="Widget", namespaced=False
    )
    assert crd.api_version == "example.com/v1beta1"
    assert crd.path(name="w", subresource="scale") == "/apis/example.com/v1beta1/widgets/w/scale"


def test_paths_quote_names_and_namespaces() -> None:
    assert PODS.path(namespace="a b", name="x/y?z#%") == (
        "/api/v1/namespaces/a%20b/pods/x%2Fy%3Fz%23%25"
    )
    assert NODES.path(name="ünïcode") == "/api/v1/nodes/%C3%BCn%C3%AFcode"


def test_path_errors() -> None:
    with pytest.raises(ValueError, match="nodes is not namespaced"):
        NODES.path(namespace="default")
    with pytest.raises(ValueError, match="nodes is not namespaced"):
        NODES.path(namespace="default", name="n1")
    with pytest.raises(ValueError, match="a subresource needs an object name"):
        PODS.path(namespace="default", subresource="status")
    with pytest.raises(ValueError, match="a subresource needs an object name"):
        NODES.path(subresource="status")


def test_object_key_and_split_key() -> None:
    assert object_key(pod("web-0", namespace="shop")) == "shop/web-0"
    assert object_key({"metadata": {"name": "n1"}}) == "n1"
    assert object_key({"metadata": {"name": "n1", "namespace": ""}}) == "n1"
    assert object_key({"metadata": {"name": "n1", "namespace": None}}) == "n1"
    assert object_key({}) == ""
    assert split_key("shop/web-0") == ("shop", "web-0")
    assert split_key("n1") == (None, "n1")
    for key in ("shop/web-0", "n1"):
        namespace, name = split_key(key)
        meta = {"name": name} | ({"namespace": namespace} if namespace else {})
        assert object_key({"metadata": meta}) == key
