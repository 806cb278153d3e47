"""A small synchronous HTTPS client for the harness's own calls to its apiservers.

The harness only needs a handful of calls (readiness, create nodes, list them), made
before any event loop exists and from the `tensile-devcluster` command; the library's
async client lives in `tensile.kube`.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ApiStatusError(RuntimeError):
    """The apiserver answered with an HTTP error; `code` and the Status `reason` are kept."""

    def __init__(self, *, method: str, path: str, code: int, body: str) -> None:
        self.code = code
        try:
            self.reason = str(json.loads(body).get("reason", ""))
        except (ValueError, AttributeError):
            self.reason = ""
        super().__init__(f"{method} {path}: HTTP {code}: {body[:500]}")


class RestClient:
    """Client-certificate authenticated JSON requests to one kube-apiserver."""

    def __init__(self, *, server: str, ca: Path, cert: Path, key: Path) -> None:
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme != "https" or not parsed.hostname or not parsed.port:
            raise ValueError(f"server must be https://host:port, got {server!r}")
        self._host = parsed.hostname
        self._port = parsed.port
        self._context = ssl.create_default_context(cafile=str(ca))
        self._context.load_cert_chain(str(cert), str(key))

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON body (`{}` for an empty one).

        `timeout` is in seconds. Raises ApiStatusError for HTTP >= 400 and OSError for
        connection failures.
        """
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=timeout
        )
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            text = response.read().decode("utf-8", errors="replace")
        finally:
            conn.close()
        if response.status >= 400:
            raise ApiStatusError(method=method, path=path, code=response.status, body=text)
        if not text or not text.lstrip().startswith(("{", "[")):
            return {}
        result = json.loads(text)
        return result if isinstance(result, dict) else {"items": result}

    def get_text(self, path: str, *, timeout: float = 5.0) -> tuple[int, str]:
        """GET `path` and return (HTTP status, body text) without raising on HTTP errors."""
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=timeout
        )
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode("utf-8", errors="replace")
        finally:
            conn.close()
