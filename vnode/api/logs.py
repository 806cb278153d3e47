"""Options of a kubelet `/containerLogs` request (pure), as kube-apiserver sends them.

The apiserver forwards `kubectl logs` flags as query parameters (pod LogLocation): follow,
previous, timestamps, sinceSeconds, sinceTime, tailLines, limitBytes and, with
PodLogsQuerySplitStreams, stream; kubelets also accept the legacy `tail`. Invalid values
raise LogOptionsError with the HTTP status a kubelet answers: 400 for malformed values,
422 for combinations the API rejects (both sinceSeconds and sinceTime).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

STREAMS = ("All", "Stdout", "Stderr")


class LogOptionsError(ValueError):
    """An invalid log option; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        self.status = status
        super().__init__(message)


@dataclass(frozen=True, kw_only=True)
class LogOptions:
    """What to read of a container's log. None means "not given"."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    since_seconds: int | None = None
    since_time: str | None = None
    """RFC 3339 time, as given."""
    tail_lines: int | None = None
    """Last N lines; 0 means no lines at all (not "everything")."""
    limit_bytes: int | None = None
    stream: str | None = None
    """All, Stdout or Stderr (None: All)."""

    def query(self) -> dict[str, str]:
        """Return the options as query parameters of the pods/log subresource."""
        params: dict[str, str] = {}
        for name, flag in (
            ("follow", self.follow),
            ("previous", self.previous),
            ("timestamps", self.timestamps),
        ):
            if flag:
                params[name] = "true"
        for name, value in (
            ("sinceSeconds", self.since_seconds),
            ("sinceTime", self.since_time),
            ("tailLines", self.tail_lines),
            ("limitBytes", self.limit_bytes),
        ):
            if value is not None:
                params[name] = str(value)
        if self.stream and self.stream != "All":
            params["stream"] = self.stream
        return params


def parse(query: Mapping[str, str]) -> LogOptions:
    """Parse `/containerLogs` query parameters. Raises LogOptionsError."""
    since_seconds = _int(query, "sinceSeconds", minimum=1)
    since_time = query.get("sinceTime")
    if since_time is not None:
        try:
            dt.datetime.fromisoformat(since_time.replace("Z", "+00:00"))
        except ValueError:
            raise LogOptionsError(f"sinceTime: not an RFC 3339 time: {since_time!r}") from None
    if since_seconds is not None and since_time is not None:
        raise LogOptionsError(
            "at most one of sinceTime or sinceSeconds may be specified", status=422
        )
    tail_lines = _int(query, "tailLines", minimum=0)
    if tail_lines is None and "tail" in query:
        legacy = query["tail"]
        if legacy != "all":
            tail_lines = _int({"tail": legacy}, "tail", minimum=0)
    stream = query.get("stream")
    if stream is not None and stream not in STREAMS:
        raise LogOptionsError(f"stream: must be one of {', '.join(STREAMS)}, got {stream!r}")
    if stream not in (None, "All") and tail_lines is not None:
        raise LogOptionsError("tailLines cannot be combined with a single stream", status=422)
    return LogOptions(
        follow=_bool(query, "follow"),
        previous=_bool(query, "previous"),
        timestamps=_bool(query, "timestamps"),
        since_seconds=since_seconds,
        since_time=since_time,
        tail_lines=tail_lines,
        limit_bytes=_int(query, "limitBytes", minimum=1),
        stream=stream,
    )


def _bool(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    lowered = value.lower()
    if lowered in ("1", "t", "true"):
        return True
    if lowered in ("0", "f", "false"):
        return False
    raise LogOptionsError(f"{name}: not a boolean: {value!r}")


def _int(query: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise LogOptionsError(f"{name}: not an integer: {value!r}") from None
    if number < minimum:
        raise LogOptionsError(f"{name}: must be >= {minimum}, got {number}")
    return number
