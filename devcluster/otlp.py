"""An OTLP/HTTP trace receiver for tests and benchmarks: what a collector's `otlp` receiver
does with `POST /v1/traces` (protobuf), minus the forwarding.

A virtual node started with `--trace-exporter otlp` and OTEL_EXPORTER_OTLP_ENDPOINT set to
`endpoint` sends its spans here; `spans()` returns them decoded with opentelemetry-proto's
generated classes (ExportTraceServiceRequest), ids in hex. It answers as the OTLP/HTTP
specification says: 200 with an empty ExportTraceServiceResponse for a request it took,
400 for a body that is no ExportTraceServiceRequest, 415 for a content type other than
application/x-protobuf (gzip request bodies are inflated by aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
STATUS_ERROR = 2
"""Status.StatusCode STATUS_CODE_ERROR of the OTLP protocol."""


@dataclass(frozen=True, kw_only=True)
class ReceivedSpan:
    """One span as the exporter sent it; times in ns since the epoch, ids in hex."""

    trace_id: str
    span_id: str
    parent_span_id: str
    """"" for a root."""
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]
    scope: str
    status_code: int
    """0 unset, 1 ok, 2 error (`STATUS_ERROR`)."""
    status_message: str
    links: tuple[tuple[str, str], ...]
    """(trace id, span id) of each link."""
    events: tuple[str, ...]


class OtlpReceiver:
    """Keeps every span POSTed to `PATH` (see the module docstring)."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self._host = host
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        """Export requests taken."""
        self.endpoint = ""
        """http://host:port, once serving: the value for OTEL_EXPORTER_OTLP_ENDPOINT."""

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order."""
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, what: str, condition: Callable[[list[ReceivedSpan]], bool], *, timeout: float
    ) -> list[ReceivedSpan]:
        """Return the spans once `condition(spans)` holds; raise TimeoutError naming `what`
        (and how many spans did come) after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if condition(spans):
                return spans
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not received in {timeout:g}s ({len(spans)} spans)")
            time.sleep(0.2)

    def app(self) -> web.Application:
        """The aiohttp application answering `PATH`."""
        app = web.Application()
        app.router.add_post(PATH, self._export)
        return app

    async def _export(self, request: web.Request) -> web.Response:
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        try:
            export = ExportTraceServiceRequest.FromString(await request.read())
        except DecodeError as exc:
            return web.Response(status=400, text=f"not an ExportTraceServiceRequest: {exc}")
        received = list(_decoded(export))
        with self._lock:
            self._spans.extend(received)
            self.requests += 1
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type=PROTOBUF)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Serve on a free port of `host` on the running loop for the block; yields (and
        sets) `endpoint`."""
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self._host, 0))
        try:
            site = web.SockSite(runner, sock)
            await site.start()
            self.endpoint = f"http://{self._host}:{sock.getsockname()[1]}"
            yield self.endpoint
        finally:
            await runner.cleanup()
            sock.close()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[str]:
        """Serve from a thread of its own (for code without an event loop) for the block;
        yields `endpoint`. Raises RuntimeError when it cannot start."""
        started = threading.Event()
        loops: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        failures: list[BaseException] = []

        async def serve() -> None:
            stop = asyncio.Event()
            loops.append((asyncio.get_running_loop(), stop))
            async with self.serving():
                started.set()
                await stop.wait()

        def run() -> None:
            try:
                asyncio.run(serve())
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                failures.append(exc)
            finally:
                started.set()

        thread = threading.Thread(target=run, name="otlp-receiver", daemon=True)
        thread.start()
        started.wait(timeout=30)
        if failures or not loops or not self.endpoint:
            raise RuntimeError(f"the OTLP receiver did not start: {failures}")
        try:
            yield self.endpoint
        finally:
            loop, stop = loops[0]
            loop.call_soon_threadsafe(stop.set)
            thread.join(timeout=30)


def _decoded(export: ExportTraceServiceRequest) -> Iterable[ReceivedSpan]:
    for resource_spans in export.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield ReceivedSpan(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    name=span.name,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes=_attributes(span.attributes),
                    resource=resource,
                    scope=scope_spans.scope.name,
                    status_code=int(span.status.code),
                    status_message=span.status.message,
                    links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                    events=tuple(event.name for event in span.events),
                )


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)
