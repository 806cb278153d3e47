"""A fake Kubernetes API for unit tests of controllers and providers: `FakeApi`.

It is a FAKE, not an apiserver: it keeps objects per resource in memory and answers the
requests `tensile.kube.client.ApiClient.request` makes with the errors of `tensile.kube.errors`
a real apiserver gives for the same cases (404, 409 AlreadyExists and Conflict, 405), but
it runs no admission, no validation (no 422 unless injected), no defaulting, no graceful
deletion and no garbage collection; a strategic merge patch is applied as a JSON merge
patch. Use it to test controller logic in isolation, and for the faults a real server
cannot produce on demand (a 5xx, an unreachable server, a slow answer: `fail`, `delay`).
What crosses a real control plane is tested against one (the local fleet, `devcluster`, in
the end-to-end suite).

`FakeApi` is an `ApiClient` (it overrides every method that would do I/O), so it goes
wherever the code takes one; it never opens a connection. Streams (`stream`: watches,
logs) and WebSockets (`websocket`) are not served: they raise an injected fault, else
NotImplementedError. Informers are therefore not run against it: a test fills their stores
itself (`Informer.store.update`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import itertools
import json
import urllib.parse
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tensile.contracts.objects import Obj, meta_of, resource_version_of, uid_of
from tensile.kube import errors
from tensile.kube.client import JSON, ApiClient
from tensile.kube.config import ConnectionInfo
from tensile.kube.resources import Resource

ANY = "*"
"""Matches every verb or resource in `fail` and `delay`."""


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """One request the fake received (faulted ones included)."""

    method: str
    """"GET", "POST", "PUT", "PATCH", "DELETE", or "STREAM" / "WEBSOCKET"."""
    path: str
    params: Mapping[str, str] | None = None
    body: Any = None
    """A deep copy of the body sent."""
    content_type: str = JSON

    @property
    def target(self) -> Target:
        """The resource, namespace, name and subresource the path names."""
        return parse_path(self.path)


@dataclass(frozen=True, kw_only=True)
class Target:
    """What a request path names: a collection, an object, or a subresource of one."""

    api: str
    """"/api/v1" or "/apis/<group>/<version>"; "" for a path that is not a resource's."""
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> Target:
    """Split an API path (`Resource.path`'s shape, percent-encoded segments) into a Target;
    a path of no resource (/version, /readyz) has api "" and the path as `plural`."""
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts[:1] == ["api"] and len(parts) >= 3:
        api, rest = "/" + "/".join(parts[:2]), parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        api, rest = "/" + "/".join(parts[:3]), parts[3:]
    else:
        return Target(api="", plural=path)
    # namespaces/<ns>/<plural>/...: a namespaced resource; namespaces[/<name>[/status]]:
    # the Namespace itself.
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        ns, rest = rest[1], rest[2:]
    else:
        ns = None
    return Target(
        api=api,
        plural=rest[0],
        namespace=ns,
        name=rest[1] if len(rest) > 1 else None,
        subresource=rest[2] if len(rest) > 2 else None,
    )


def status_error(code: int, *, reason: str, message: str, **details: Any) -> errors.ApiError:
    """Return the ApiError an apiserver's Status of `code` and `reason` becomes (as
    `tensile.kube.errors.from_response` builds it); `details` go into the Status's details
    (e.g. `causes=[{"reason": "NamespaceTerminating"}]`)."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        "details": details,
    }
    return errors.from_response(code=code, body=json.dumps(status))


def server_error(code: int = 500, message: str = "injected server error") -> errors.ApiError:
    """Return a 5xx ServerError, as a failing apiserver answers."""
    return status_error(code, reason="InternalError", message=message)


def unreachable(message: str = "injected: connection refused") -> errors.ApiUnavailable:
    """Return the error of a server that cannot be reached."""
    return errors.ApiUnavailable(message)


@dataclass(kw_only=True)
class _Fault:
    method: str
    plural: str
    error: BaseException | None
    delay: float
    gate: asyncio.Event | None
    times: int | None
    """Requests left to fault (None: every one)."""

    def matches(self, method: str, target: Target) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        return self.method in (ANY, method) and self.plural in (ANY, target.plural)


@dataclass
class _Collection:
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(namespace or "", name) -> object."""


class FakeApi(ApiClient):
    """An in-memory Kubernetes API (a fake: see the module docstring).

    Objects live per resource (API group/version and plural) and namespace. Creates assign
    `uid`, `resourceVersion` (one counter for all, as etcd's revision) and
    `creationTimestamp`; every write bumps `resourceVersion`; a PUT or PATCH whose
    `resourceVersion` differs is a 409 Conflict, a DELETE whose `preconditions` differ
    too. `requests` records what was asked, in order.
    """

    def __init__(self, *, name: str = "fake", objects: Iterable[tuple[Resource, Obj]] = ()) -> None:
        """`name` labels it as an ApiClient's name does; `objects` are (resource, object)
        pairs stored before the first request (`put`)."""
        super().__init__(ConnectionInfo(server=f"fake://{name}", ssl_context=None), name=name)
        self.requests: list[Recorded] = []
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._faults: list[_Fault] = []
        self._answers: dict[tuple[str, str], Any] = {}
        self._revision = itertools.count(1)
        self._uids = itertools.count(1)
        for resource, obj in objects:
            self.put(resource, obj)

    # -- set-up and inspection --------------------------------------------------------------

    def put(self, resource: Resource, obj: Obj) -> Obj:
        """Store `obj` (a copy) as `resource`, replacing one of the same name, without a
        request being recorded; assigns what a create would. Returns the stored copy."""
        stored = self._stamp(copy.deepcopy(dict(obj)), new=True)
        meta = meta_of(stored)
        self._collection(_api(resource), resource.plural).objects[
            (meta.get("namespace") or "", meta["name"])
        ] = stored
        return copy.deepcopy(stored)

    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Obj | None:
        """Return a copy of the stored object, or None."""
        found = self._collection(_api(resource), resource.plural).objects.get(
            (namespace or "", name)
        )
        return copy.deepcopy(found) if found is not None else None

    def objects(self, resource: Resource, *, namespace: str | None = None) -> list[Obj]:
        """Return copies of the stored objects of `resource` (in `namespace` if given), in
        the order they were stored."""
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in self._collection(_api(resource), resource.plural).objects.items()
            if namespace is None or ns == namespace
        ]

    def answer(self, method: str, path: str, body: Obj) -> None:
        """Answer `method` `path` with `body` from now on (for paths that are not a
        resource's, e.g. GET /version), instead of what the store would."""
        self._answers[(method, path)] = copy.deepcopy(body)

    def fail(
        self,
        method: str = ANY,
        plural: str = ANY,
        *,
        error: BaseException,
        times: int | None = None,
    ) -> None:
        """Make requests of `method` ("POST", ... or ANY) on resource `plural` ("pods", or
        ANY) raise `error` (e.g. `server_error()`, `unreachable()`, `status_error(...)`),
        the next `times` of them (None: every one until `heal`). The store is left as it
        was: the request did not happen."""
        self._faults.append(
            _Fault(method=method, plural=plural, error=error, delay=0.0, gate=None, times=times)
        )

    def delay(
        self,
        method: str = ANY,
        plural: str = ANY,
        *,
        seconds: float = 0.0,
        until: asyncio.Event | None = None,
        times: int | None = None,
    ) -> None:
        """Make requests of `method` on `plural` wait `seconds` (0: one turn of the event
        loop, so other tasks run while they are in flight), then until `until` is set if
        given, before they are answered (the next `times`, None: every one until `heal`)."""
        self._faults.append(
            _Fault(method=method, plural=plural, error=None, delay=seconds, gate=until, times=times)
        )

    def remove(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        """Delete a stored object without a request being recorded (someone else's
        delete); nothing happens when there is none."""
        self._collection(_api(resource), resource.plural).objects.pop((namespace or "", name), None)

    def heal(self) -> None:
        """Remove every injected fault and delay."""
        self._faults.clear()

    def requests_of(self, method: str, plural: str | None = None) -> list[Recorded]:
        """The recorded requests of `method` (on resource `plural`, if given)."""
        return [
            r
            for r in self.requests
            if r.method == method and (plural is None or r.target.plural == plural)
        ]

    # -- ApiClient ----------------------------------------------------------------------------

    async def __aenter__(self) -> FakeApi:
        return self

    async def close(self) -> None:
        """Nothing to close."""

    @property
    def session(self) -> aiohttp.ClientSession:
        """A fake has no HTTP session: raises RuntimeError."""
        raise RuntimeError(f"{self.name} is a FakeApi: it has no HTTP session")

    def sibling(
        self, *, name: str, qps: float, burst: int, timeout: float, connections: int
    ) -> ApiClient:
        """The same fake (one cluster, one record): limits and connections do not apply."""
        return self

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
        retry_throttled: bool = True,
        accept: str = JSON,
        decode: bool = True,
    ) -> dict[str, Any]:
        """Answer as an apiserver would (see the class docstring); raises the ApiError of
        the case, or an injected fault. Returns a copy: the caller may keep or change it
        (`{}` for a success with `decode=False`, as the real client).
        `accept` is ignored: whole objects answer a metadata-only request too (their
        metadata is what the caller reads). A write a fenced view's gate refuses raises
        `errors.Fenced` and is not recorded (`ApiClient.fenced`: nothing was sent)."""
        self.admit(method, path)
        self.requests.append(
            Recorded(
                method=method,
                path=path,
                params=dict(params) if params is not None else None,
                body=copy.deepcopy(body),
                content_type=content_type,
            )
        )
        target = parse_path(path)
        await self._inject(method, target)
        if (method, path) in self._answers:
            answer = self._answers[(method, path)]
        elif not target.api:
            raise status_error(404, reason="NotFound", message=f"the server could not find {path}")
        else:
            answer = self._serve(method, target, params=params or {}, body=body)
        return copy.deepcopy(answer) if decode else {}

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        accept: str = JSON,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Not served: raises an injected fault for "STREAM", else NotImplementedError."""
        yield await self._refuse("STREAM", path, params=params)

    async def websocket(
        self, path: str, *, params: Sequence[tuple[str, str]], protocols: Sequence[str]
    ) -> aiohttp.ClientWebSocketResponse:
        """Not served: raises an injected fault for "WEBSOCKET", else NotImplementedError."""
        await self._refuse("WEBSOCKET", path, params=dict(params))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _refuse(
        self, method: str, path: str, *, params: Mapping[str, str] | None
    ) -> aiohttp.ClientResponse:
        """Record a stream or WebSocket request and raise: an injected fault, else
        NotImplementedError (never returns)."""
        self.requests.append(Recorded(method=method, path=path, params=params))
        await self._inject(method, parse_path(path))
        raise NotImplementedError(f"FakeApi serves no {method.lower()} requests ({path})")

    # -- the fake server ----------------------------------------------------------------------

    async def _inject(self, method: str, target: Target) -> None:
        for fault in self._faults:
            if fault.matches(method, target):
                if fault.times is not None:
                    fault.times -= 1
                if fault.error is not None:
                    raise fault.error
                await asyncio.sleep(fault.delay)
                if fault.gate is not None:
                    await fault.gate.wait()

    def _collection(self, api: str, plural: str) -> _Collection:
        return self._collections.setdefault((api, plural), _Collection())

    def _stamp(self, obj: dict[str, Any], *, new: bool) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if new:
            meta.setdefault("uid", f"fake-uid-{next(self._uids)}")
            meta.setdefault(
                "creationTimestamp",
                datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        meta["resourceVersion"] = str(next(self._revision))
        return obj

    def _serve(
        self, method: str, target: Target, *, params: Mapping[str, str], body: Any
    ) -> dict[str, Any]:
        objects = self._collection(target.api, target.plural).objects
        if target.name is None:
            if method == "GET":
                return self._list(objects, target, params)
            if method == "POST":
                return self._create(objects, target, body)
            raise _not_allowed(method, target)
        key = (target.namespace or "", target.name)
        current = objects.get(key)
        if current is None:
            raise _not_found(target)
        if target.subresource is not None and method == "POST":
            return {}  # eviction, binding, ...: the fake only checks the object is there
        if method == "GET":
            return current
        if method == "DELETE":
            _check_preconditions(current, body, target)
            return objects.pop(key)
        if method == "PUT":
            objects[key] = self._stamp(_replaced(current, body, target), new=False)
        elif method == "PATCH":
            _check_version(current, body, target)  # a patch naming one is conditional too
            objects[key] = self._stamp(merge_patch(current, body), new=False)
        else:
            raise _not_allowed(method, target)
        return objects[key]

    def _list(
        self,
        objects: Mapping[tuple[str, str], dict[str, Any]],
        target: Target,
        params: Mapping[str, str],
    ) -> dict[str, Any]:
        selector = params.get("labelSelector") or ""
        items = [
            obj
            for (ns, _), obj in objects.items()
            if (target.namespace is None or ns == target.namespace)
            and _selects(selector, meta_of(obj).get("labels") or {})
        ]
        revision = str(next(self._revision))
        return {"kind": "List", "metadata": {"resourceVersion": revision}, "items": items}

    def _create(
        self, objects: dict[tuple[str, str], dict[str, Any]], target: Target, body: Any
    ) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if target.namespace is not None:
            meta["namespace"] = target.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._uids):05d}"
        key = (meta.get("namespace") or "", str(meta.get("name")))
        if key in objects:
            raise status_error(
                409,
                reason="AlreadyExists",
                message=f'{target.plural} "{key[1]}" already exists',
                name=key[1],
                kind=target.plural,
            )
        objects[key] = self._stamp(obj, new=True)
        return objects[key]


def _api(resource: Resource) -> str:
    return f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"


def _not_allowed(method: str, target: Target) -> errors.ApiError:
    return status_error(405, reason="MethodNotAllowed", message=f"{method} {target.plural}")


def _replaced(current: Mapping[str, Any], body: Any, target: Target) -> dict[str, Any]:
    """What a PUT of `body` makes of `current` (the status only, for /status); raises a
    409 Conflict when the body's resourceVersion is set and not the current one."""
    _check_version(current, body, target)
    if target.subresource == "status":
        return {**copy.deepcopy(dict(current)), "status": copy.deepcopy(body.get("status"))}
    replaced = copy.deepcopy(dict(body))
    replaced["metadata"] = {
        **meta_of(replaced),
        "uid": uid_of(current),
        "creationTimestamp": meta_of(current).get("creationTimestamp"),
    }
    return replaced


def _check_version(current: Mapping[str, Any], body: Any, target: Target) -> None:
    """Raise a 409 Conflict when `body` names a resourceVersion that is not `current`'s."""
    wanted = resource_version_of(body) if isinstance(body, Mapping) else ""
    if wanted and wanted != resource_version_of(current):
        raise status_error(
            409,
            reason="Conflict",
            message=f'Operation cannot be fulfilled on {target.plural} "{target.name}": the '
            "object has been modified; please apply your changes to the latest version",
        )


def _not_found(target: Target) -> errors.ApiError:
    return status_error(
        404,
        reason="NotFound",
        message=f'{target.plural} "{target.name}" not found',
        name=target.name,
        kind=target.plural,
    )


def _check_preconditions(current: Mapping[str, Any], body: Any, target: Target) -> None:
    wanted = (body or {}).get("preconditions") or {}
    meta = meta_of(current)
    for field_name in ("uid", "resourceVersion"):
        if wanted.get(field_name) and wanted[field_name] != meta.get(field_name):
            raise status_error(
                409,
                reason="Conflict",
                message=f'Operation cannot be fulfilled on {target.plural} "{target.name}": '
                f"Precondition failed: {field_name}: {wanted[field_name]}, "
                f"ObjectMeta.{field_name}: {meta.get(field_name)}",
            )


def merge_patch(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Return `current` with JSON merge patch `patch` applied (RFC 7386: null deletes, a
    mapping merges, anything else replaces); `current` is left as it was."""
    merged = copy.deepcopy(dict(current))
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality-based label selectors only ("a=b,c!=d,e,!f"); set-based ones are not."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True
