"""Process-wide logging: text for people, JSON lines for log pipelines (`--log-format`)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from aiohttp import http_exceptions

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (RFC 3339, UTC), level, logger, msg, and exc if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


def quiet_bad_requests(record: logging.LogRecord) -> bool:
    """Turn aiohttp's ERROR-with-traceback for a malformed HTTP request (already answered
    400) into one INFO line: anyone who can reach a served port (the kubelet API, the
    webhook) could otherwise fill the logs with tracebacks. Other records pass unchanged."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, http_exceptions.HttpProcessingError):
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = (
            "malformed request answered %s: %s",
            (
                exc.code,
                exc.message.strip().splitlines()[0] if exc.message.strip() else type(exc).__name__,
            ),
        )
        record.exc_info = record.exc_text = None
    return True


def configure(*, level: str, fmt: str) -> None:
    """Send logs to stderr at `level` (debug, info, warn, error) as `fmt` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    # One line per request would drown everything else (the kubelet API is polled, the
    # webhook called for every pod).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    if quiet_bad_requests not in server.filters:
        server.addFilter(quiet_bad_requests)
