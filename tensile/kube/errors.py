"""Errors of the Kubernetes API, built from the `Status` bodies it answers with.

One class per reason a caller branches on (client-go's `apierrors.IsNotFound` & co.); the
original Status is kept. Only `is_transient` errors are worth retrying as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """The API answered with an HTTP error. `status` is its Status object (possibly synthetic)."""

    code: int

    def __init__(
        self, *, code: int, status: Mapping[str, Any], retry_after: float | None = None
    ) -> None:
        self.code = code
        self.status = dict(status)
        self.reason = str(status.get("reason") or "")
        self.message = str(status.get("message") or "")
        self.retry_after = retry_after
        """Seconds the server asked us to wait (Retry-After), if it said."""
        super().__init__(f"HTTP {code} {self.reason}: {self.message}".rstrip(": "))

    @property
    def causes(self) -> list[dict[str, Any]]:
        """The `details.causes` of an Invalid (422) answer: field, reason, message."""
        details = self.status.get("details") or {}
        return list(details.get("causes") or [])

    @property
    def namespace_terminating(self) -> bool:
        """Whether the answer refuses new content in a namespace being deleted (the
        NamespaceLifecycle admission's cause "NamespaceTerminating"): wait, don't report."""
        return any(cause.get("reason") == "NamespaceTerminating" for cause in self.causes)


class BadRequest(ApiError):
    """400: the request itself is malformed."""


class Unauthorized(ApiError):
    """401: no or invalid credentials."""


class Forbidden(ApiError):
    """403: authorization or admission (e.g. quota, namespace terminating) refused it."""


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409 Conflict: the resourceVersion or a precondition (e.g. UID) did not match."""


class AlreadyExists(ApiError):
    """409 AlreadyExists: an object of that name exists."""


class Gone(ApiError):
    """410: the resourceVersion is too old (compacted); the caller must list again."""


class Invalid(ApiError):
    """422: validation failed; `causes` says which fields."""


class TooManyRequests(ApiError):
    """429: throttled (API priority and fairness); `retry_after` says how long to wait."""


class ServerError(ApiError):
    """5xx: the server failed; usually worth retrying."""


class WatchIdle(Exception):
    """A watch stream stayed silent (no event, no bookmark) longer than its idle timeout."""


class ApiUnavailable(Exception):
    """The API could not be reached (connection refused, reset, TLS failure, timeout)."""


class Fenced(ApiUnavailable):
    """A write refused before it was sent, because this process may not write now: it does
    not hold its leader-election Lease within the renew deadline (`ApiClient.fenced`).
    Nothing reached the server. It is an ApiUnavailable, so every caller takes it as "not
    now" (the key is retried with backoff, nothing is marked as done or refused); by then
    this process has stopped leading, and the replica holding the Lease does the work."""


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def from_response(*, code: int, body: bytes | str, retry_after: str | None = None) -> ApiError:
    """Build the ApiError for an HTTP error answer (`body` should be a Status object).

    Non-JSON bodies (proxies, load balancers) become a synthetic Status with the text as
    message. `retry_after` is the raw Retry-After header (seconds form only).
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        status = json.loads(text)
        if not isinstance(status, dict) or status.get("kind") != "Status":
            raise ValueError("not a Status")
    except ValueError:
        status = {
            "kind": "Status",
            "status": "Failure",
            "code": code,
            "message": text.strip()[:2000],
        }
    after: float | None = None
    if retry_after:
        try:
            after = max(0.0, float(retry_after))
        except ValueError:
            after = None
    if code == 409:
        cls: type[ApiError] = AlreadyExists if status.get("reason") == "AlreadyExists" else Conflict
    elif code >= 500:
        cls = ServerError
    else:
        cls = _BY_CODE.get(code, ApiError)
    return cls(code=code, status=status, retry_after=after)


TRANSIENT: tuple[type[Exception], ...] = (ApiUnavailable, TooManyRequests, ServerError)
"""Failures that retrying the same request later may not have (unreachable, 429, 5xx): for
`except` clauses; `is_transient` tells of one."""


def is_transient(exc: BaseException) -> bool:
    """Tell whether retrying the same request later may succeed (unreachable, 429, 5xx)."""
    return isinstance(exc, TRANSIENT)
